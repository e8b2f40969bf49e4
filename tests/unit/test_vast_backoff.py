"""The Vast adapter's retries: the pure backoff schedule (seeded jitter), the endpoint each call names when its
bound is reached, the URL every "cannot reach" line names, and which fleets need a Vast key at all."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from reconciler.adapters import vast
from reconciler.core.model import OWN_PROVIDER, Fleet, OwnHost, Pool
from reconciler.errors import ProviderAuthError, ProviderTransient
from reconciler.fleet import NoMarket, open_provider


def test_the_schedule_doubles_with_jitter_and_is_reproducible_from_a_seed() -> None:
    waits = vast.backoff_schedule(6, 100.0, random.Random(7))
    assert waits == vast.backoff_schedule(6, 100.0, random.Random(7))
    assert waits != vast.backoff_schedule(6, 100.0, random.Random(8))  # jittered: two callers do not march together
    assert len(waits) == 5
    for n, w in enumerate(waits):
        base = min(vast.MAX_WAIT_S, vast.FIRST_WAIT_S * 2**n)
        assert 0.5 * base <= w < base


def test_the_schedule_is_bounded_by_tries_and_by_total_seconds() -> None:
    assert vast.backoff_schedule(1, 100.0, random.Random(1)) == []
    assert vast.backoff_schedule(0, 100.0, random.Random(1)) == []
    long = vast.backoff_schedule(50, 1e9, random.Random(1))
    assert len(long) == 49 and max(long) < vast.MAX_WAIT_S  # capped
    short = vast.backoff_schedule(50, 10.0, random.Random(1))
    assert sum(short) <= 10.0 and len(short) < 49
    assert short == long[: len(short)] and sum(short) + long[len(short)] > 10.0  # the next wait would cross it


def test_each_call_names_its_endpoint() -> None:
    assert vast.endpoint_of("list instances") == "GET /api/v1/instances/"  # the paged list the SDK 1.9.1 reads
    assert vast.endpoint_of("show instance 9") == "GET /api/v0/instances/{id}/"
    assert vast.endpoint_of("search offers") == "POST /api/v0/bundles/"
    assert vast.endpoint_of("rent offer 123") == "PUT /api/v0/asks/{id}/"
    assert vast.endpoint_of("destroy instance 9") == "DELETE /api/v0/instances/{id}/"
    assert vast.endpoint_of("list ssh keys") == "GET /api/v0/ssh/"
    assert vast.endpoint_of("show user") == "GET /api/v0/users/current/"
    assert vast.endpoint_of("list instancesX") == "list instancesX"
    assert vast.endpoint_of("something new") == "something new"


def test_an_unreachable_api_is_one_line_naming_the_endpoint_the_url_and_how_long_it_tried() -> None:
    sleeps: list[float] = []
    provider = vast.VastProvider(
        api_key="sekrit-key", server_url="http://127.0.0.1:1/", max_tries=3, max_total_s=60.0, sdk_retry=1,
        sleep=sleeps.append, rng=random.Random(3),
    )
    with pytest.raises(ProviderTransient) as info:
        provider.list_instances()
    line = str(info.value)
    assert "\n" not in line and "sekrit" not in line
    assert line.startswith("GET /api/v1/instances/: gave up after 3 tries in ")
    assert "cannot reach the Vast API at 'http://127.0.0.1:1'" in line
    assert sleeps == vast.backoff_schedule(3, 60.0, random.Random(3))


def _fleet(*pools: Pool) -> Fleet:
    return Fleet(name="f", pools=pools)


LAB = Pool(name="lab", provider=OWN_PROVIDER, hosts=(OwnHost(address="10.0.0.5"),))


def test_a_fleet_of_own_machines_needs_no_vast_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("VAST_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    provider = open_provider(_fleet(LAB), "https://console.vast.ai")
    assert isinstance(provider, NoMarket)
    assert provider.list_instances() == [] and provider.billed_costs(0, 1) == {}
    with pytest.raises(ProviderAuthError, match=r"^pool gpus \(provider vast\) needs a Vast API key: no Vast API key"):
        open_provider(_fleet(LAB, Pool(name="gpus")), "https://console.vast.ai")
    with pytest.raises(ProviderAuthError, match=r"^no Vast API key found"):
        open_provider(_fleet(Pool(name="gpus")), "https://console.vast.ai")
    monkeypatch.setenv("VAST_API_KEY", "k")
    assert isinstance(open_provider(_fleet(LAB, Pool(name="gpus")), "https://console.vast.ai"), vast.VastProvider)
