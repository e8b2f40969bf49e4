"""Rate limits on real parts: the emulator answers 429 bursts on one endpoint with no Retry-After (as Vast does),
and rigsync's Vast adapter, through the real vastai client, backs off on that endpoint only and, when its bound
is reached, says so in one line naming the endpoint and how long it tried."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
import requests
from world import emulator_env, fleet_repo, rigsync

from reconciler.adapters.vast import FIRST_WAIT_S as FIRST
from reconciler.adapters.vast import VastProvider, backoff_schedule
from reconciler.core.model import OfferFilters
from reconciler.emulator import Emulator
from reconciler.errors import ProviderTransient

pytestmark = pytest.mark.integration

SEARCH = "/api/v0/bundles"


def _injected(emu: Emulator, since: int) -> list[str]:
    return [str(e["path"]) for e in emu.ledger.events[since:] if e.get("type") == "injected_failure"]


def _provider(emu: Emulator, sleeps: list[float], **kw: float) -> VastProvider:
    def sleep(s: float) -> None:
        sleeps.append(s)
        time.sleep(s)

    return VastProvider(
        api_key=emu.api_key, server_url=emu.url, sdk_retry=1, sleep=sleep, rng=random.Random(5),
        max_tries=int(kw.get("max_tries", 5)), max_total_s=kw.get("max_total_s", 20.0),
    )


def test_the_emulator_rate_limits_one_endpoint_without_retry_after(emulator: Emulator) -> None:
    emulator.fail_next(SEARCH, 1, 429)
    headers = {"Authorization": f"Bearer {emulator.api_key}"}
    listed = requests.get(f"{emulator.url}/api/v0/instances/", headers=headers, timeout=10)
    assert listed.status_code == 200  # another endpoint is not limited
    limited = requests.post(f"{emulator.url}{SEARCH}/", headers=headers, json={}, timeout=10)
    assert limited.status_code == 429 and "Retry-After" not in limited.headers


def test_a_burst_on_one_endpoint_is_waited_out_with_jittered_backoff(emulator: Emulator) -> None:
    sleeps: list[float] = []
    provider = _provider(emulator, sleeps)
    since = len(emulator.ledger.events)
    emulator.fail_next(SEARCH, 3, 429)
    assert provider.list_instances() is not None and sleeps == []  # the list endpoint is not held back
    found = provider.search_offers(OfferFilters(), 10.0)
    assert found  # the search got through after the burst
    rng = random.Random(5)  # the provider's: each call draws its own schedule, the list's first, then the search's
    backoff_schedule(5, 20.0, rng)
    assert sleeps == backoff_schedule(5, 20.0, rng)[:3]
    assert _injected(emulator, since) == [f"{SEARCH}/"] * 3


def test_a_burst_longer_than_the_bound_is_one_line_naming_the_endpoint(emulator: Emulator) -> None:
    sleeps: list[float] = []
    provider = _provider(emulator, sleeps, max_tries=3, max_total_s=10.0)
    emulator.fail_next(SEARCH, 10, 429)
    try:
        with pytest.raises(ProviderTransient) as info:
            provider.search_offers(OfferFilters(), 10.0)
        line = str(info.value)
        assert line.startswith("POST /api/v0/bundles/: gave up after 3 tries in "), line
        assert "HTTP 429" in line and "\n" not in line and emulator.api_key not in line
        assert len(sleeps) == 2
        assert provider.list_instances() is not None  # other endpoints still answer
    finally:
        emulator.clear_failures(SEARCH)


def test_the_backoff_is_carried_to_the_next_call_of_the_same_endpoint_and_reset_by_a_success(
    emulator: Emulator,
) -> None:
    sleeps: list[float] = []
    provider = _provider(emulator, sleeps, max_tries=2, max_total_s=10.0)
    emulator.fail_next(SEARCH, 3, 429)
    try:
        with pytest.raises(ProviderTransient):
            provider.search_offers(OfferFilters(), 10.0)  # two tries, two 429s: gives up
        first_call = list(sleeps)
        assert len(first_call) == 1 and first_call[0] <= FIRST
        sleeps.clear()
        assert provider.list_instances() is not None and sleeps == []  # another endpoint is not held back
        found = provider.search_offers(OfferFilters(), 10.0)  # one more 429, then through
        assert found
        held, retry = sleeps  # held back before its first try, and its retry starts two doublings up
        assert 0 < held <= 2 * FIRST
        assert 2 * FIRST <= retry < 4 * FIRST
        sleeps.clear()
        assert provider.search_offers(OfferFilters(), 10.0) and sleeps == []  # the success reset it
    finally:
        emulator.clear_failures(SEARCH)


def test_a_wrong_api_url_is_named_in_the_cannot_reach_line(emulator: Emulator, tmp_path: Path) -> None:
    """The console script with RIGSYNC_API_URL where nothing listens: the line names the URL and the endpoint,
    never the key."""
    fleet = fleet_repo(tmp_path / "fleet")
    fleet.edit_fleet(name="itwrongurl")
    fleet.commit("a fleet")
    env = {**emulator_env(emulator, state_dir=tmp_path / "state"), "RIGSYNC_API_URL": "http://127.0.0.1:1"}
    got = rigsync(env, "run", "--once", "--repo", str(fleet.work))
    out = got.stdout + got.stderr
    assert got.returncode != 0
    assert "GET /api/v0/ssh/: gave up after" in out, out
    assert "cannot reach the Vast API at 'http://127.0.0.1:1'" in out and emulator.api_key not in out
