"""The emulator's lying instance list and its per-identity rate limits (issue 33), through the real vastai 1.9.1 client
and through ``VastProvider`` on top of it: what the SDK's ``show_instances`` makes of each fault (the trap), and
that the adapter refuses every one of them as ``ObservationFailed`` instead of reading an empty account."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
from vastai import VastAI

from reconciler.adapters.vast import VastProvider
from reconciler.emulator import Emulator
from reconciler.errors import ObservationFailed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def quietly(fn: Callable[[], Any]) -> Any:
    with contextlib.redirect_stdout(io.StringIO()):
        return fn()


def sdk(emu: Emulator) -> VastAI:
    return VastAI(api_key=emu.api_key, server_url=emu.url, quiet=True)


def sdk_ids(emu: Emulator) -> list[int]:
    """What the SDK's own ``show_instances`` lists: the call that reads a lie as the truth."""
    return [int(r["id"]) for r in quietly(sdk(emu).show_instances)]


def admin(emu: Emulator, path: str, body: dict[str, Any], key: str | None = None) -> requests.Response:
    return requests.post(f"{emu.url}/_emulator/{path}", json=body,
                         headers={"Authorization": f"Bearer {key or emu.api_key}"}, timeout=10)


@pytest.fixture
def provider(emulator: Emulator) -> VastProvider:
    return VastProvider(api_key=emulator.api_key, server_url=emulator.url, sleep=lambda _s: None)


@pytest.fixture
def boxes(emulator: Emulator) -> Iterator[list[int]]:
    """Three rented instances (not waited for: the list shows them from the create on); every fault and every
    rented box is undone after the test."""
    v = sdk(emulator)
    offers = quietly(lambda: v.search_offers(query="num_gpus=1", order="dph_total", limit=3))
    ids = [int(quietly(lambda o=o: v.create_instance(id=o["id"], image="x", disk=10))["new_contract"]) for o in offers]
    yield ids
    emulator.set_list_fault(None)
    emulator.hide_new(False)
    emulator.rate_limit(None, path_prefix="/api/")
    emulator.rate_limit(None, path_prefix="/api/v0/instances/")
    for iid in emulator.instance_ids():
        emulator.unhide(iid)
        emulator.destroy_instance(iid)


def limited_so_far(emu: Emulator) -> int:
    return sum(e["type"] == "rate_limited" for e in emu.ledger.events)


def refused(provider: VastProvider) -> ObservationFailed:
    with pytest.raises(ObservationFailed) as info:
        provider.list_instances()
    return info.value


def test_success_false_with_http_200_is_an_empty_account_to_the_sdk_and_refused_by_the_adapter(
    emulator: Emulator, provider: VastProvider, boxes: list[int]
) -> None:
    assert set(boxes) <= {i.id for i in provider.list_instances()}
    emulator.set_list_fault("success_false")
    raw = requests.get(f"{emulator.url}/api/v1/instances/", headers={"Authorization": f"Bearer {emulator.api_key}"},
                       timeout=10)
    assert raw.status_code == 200 and raw.json()["success"] is False and raw.json()["error"] == "deprecated_endpoint"
    assert sdk_ids(emulator) == []  # the trap: three billing boxes read as none
    for _ in range(3):  # every time it lies, not just once
        exc = refused(provider)
        assert exc.reason == "success_false" and "deprecated_endpoint" in str(exc)
    assert set(emulator.instance_ids()) == set(boxes)  # nothing about the boxes changed: only the list lies
    emulator.set_list_fault(None)
    assert set(boxes) <= {i.id for i in provider.list_instances()}


def test_a_reply_without_the_list_is_refused(emulator: Emulator, provider: VastProvider, boxes: list[int]) -> None:
    emulator.set_list_fault("no_list", n=1)
    assert sdk_ids(emulator) == []
    emulator.set_list_fault("no_list", n=1)
    assert refused(provider).reason == "no_list"
    assert set(boxes) <= {i.id for i in provider.list_instances()}  # n=1: the next list tells the truth


def test_pages_cut_short_are_fewer_boxes_to_the_sdk_and_refused_by_the_adapter(
    emulator: Emulator, provider: VastProvider, boxes: list[int]
) -> None:
    emulator.set_list_fault("cut_short")
    assert len(sdk_ids(emulator)) == len(emulator.instance_ids()) - 1  # one box gone, as far as the SDK can tell
    exc = refused(provider)
    assert exc.reason == "cut_short" and provider.calls == 1


def test_a_page_token_that_never_ends_loops_the_sdk_and_is_refused_by_the_adapter(
    emulator: Emulator, provider: VastProvider, boxes: list[int]
) -> None:
    # bounded here (n=4 lying pages): unbounded, the SDK's show_instances would never return
    emulator.set_list_fault("endless_token", n=4)
    listed = sdk_ids(emulator)
    assert len(listed) == 5 * len(emulator.instance_ids())  # the same page, read five times over
    emulator.set_list_fault("endless_token")
    exc = refused(provider)
    assert exc.reason == "endless_pages" and "listed twice" in str(exc)
    assert provider.calls == 2  # the second page gave it away


def test_a_hidden_instance_is_missing_from_the_list_and_still_shown_by_id(
    emulator: Emulator, provider: VastProvider, boxes: list[int]
) -> None:
    emulator.hide(boxes[0])
    assert boxes[0] not in sdk_ids(emulator) and boxes[0] not in {i.id for i in provider.list_instances()}
    assert quietly(lambda: sdk(emulator).show_instance(id=boxes[0]))["id"] == boxes[0]
    assert boxes[0] in emulator.instance_ids()  # alive and billed
    emulator.unhide(boxes[0])
    assert boxes[0] in {i.id for i in provider.list_instances()}

    emulator.hide_new(True)
    v = sdk(emulator)
    offer = quietly(lambda: v.search_offers(query="num_gpus=1", order="dph_total", limit=1))[0]
    new_id = int(quietly(lambda: v.create_instance(id=offer["id"], image="x", disk=10))["new_contract"])
    assert new_id not in {i.id for i in provider.list_instances()} and set(boxes) <= set(sdk_ids(emulator))
    emulator.hide_new(False)
    assert new_id not in sdk_ids(emulator)  # hidden until unhidden, like any other
    emulator.unhide(new_id)
    assert new_id in sdk_ids(emulator)
    kinds = [e["type"] for e in emulator.ledger.events]
    assert {"hide", "unhide", "hide_new"} <= set(kinds)


def test_the_admin_api_sets_every_list_fault(emulator: Emulator, provider: VastProvider, boxes: list[int]) -> None:
    assert admin(emulator, "list_fault", {"fault": "success_false", "n": 1, "error": "maintenance"}).status_code == 200
    exc = refused(provider)
    assert exc.reason == "success_false" and "maintenance" in str(exc)
    assert admin(emulator, "list_fault", {"fault": "cut_short"}).status_code == 200
    assert refused(provider).reason == "cut_short"
    assert admin(emulator, "list_fault", {"fault": None}).status_code == 200
    assert set(boxes) <= {i.id for i in provider.list_instances()}
    assert admin(emulator, f"instances/{boxes[1]}/hide", {}).status_code == 200
    assert boxes[1] not in {i.id for i in provider.list_instances()}
    assert admin(emulator, f"instances/{boxes[1]}/unhide", {}).status_code == 200
    assert admin(emulator, "hide_new", {"on": False}).status_code == 200
    for bad in ({"fault": "lies"}, {"fault": 3}, {"fault": "cut_short", "n": 0}, {"fault": "no_list", "n": "2"}):
        reply = admin(emulator, "list_fault", bad)
        assert reply.status_code == 400 and reply.json()["error"] == "invalid_args", bad
    assert admin(emulator, "hide_new", {"on": "yes"}).status_code == 400
    assert admin(emulator, "rate_limit", {"per_s": "fast"}).status_code == 400
    assert set(boxes) <= {i.id for i in provider.list_instances()}  # a refused setting changed nothing
    assert any(e["type"] == "list_lied" for e in emulator.ledger.events)


def test_rate_limits_are_per_identity_and_per_endpoint_like_vasts(emulator: Emulator, boxes: list[int]) -> None:
    box = boxes[0]
    before = limited_so_far(emulator)
    own_key = emulator._get(box).api_key  # the box's CONTAINER_API_KEY: another identity than the account's

    def get(path: str, key: str) -> requests.Response:
        return requests.get(f"{emulator.url}{path}", headers={"Authorization": f"Bearer {key}"}, timeout=10)

    assert admin(emulator, "rate_limit", {"path_prefix": "/api/", "per_s": 0.01, "burst": 2}).status_code == 200
    show = f"/api/v0/instances/{box}/"
    assert [get(show, emulator.api_key).status_code for _ in range(3)] == [200, 200, 429]
    limited = get(show, emulator.api_key)
    assert limited.status_code == 429 and limited.text == "API requests too frequent"
    assert "Retry-After" not in limited.headers  # as Vast: no hint how long
    assert [get(show, own_key).status_code for _ in range(3)] == [200, 200, 429]  # the box's key: its own bucket
    assert get(f"/api/v0/instances/{boxes[1]}/", emulator.api_key).status_code == 429  # ids fold: one endpoint
    assert get("/api/v0/users/current", emulator.api_key).status_code == 200  # another endpoint: its own bucket
    emulator.rate_limit(None, path_prefix="/api/")
    assert get(show, emulator.api_key).status_code == 200
    assert limited_so_far(emulator) - before == 4


def test_the_adapter_lists_through_a_rate_limit_with_its_backoff(emulator: Emulator, boxes: list[int]) -> None:
    waits: list[float] = []
    provider = VastProvider(api_key=emulator.api_key, server_url=emulator.url, sleep=waits.append, max_tries=8,
                            max_total_s=60.0)
    emulator.rate_limit(4.0, burst=1, path_prefix="/api/v1/instances")
    before = limited_so_far(emulator)
    found = [provider.list_instances() for _ in range(4)]  # one page each, four in a row against a 1-request bucket
    assert all({i.id for i in f} >= set(boxes) for f in found)
    assert limited_so_far(emulator) > before  # it was limited, and got through
