"""Hosts raise prices on live contracts: the emulator's pending rows, accept and reject, through the real vastai CLI.

Accepted, the new rate bills from the contract's current end (not before) and the contract runs on to the ask's
end; rejected, the row is tombstoned and nothing changes; a stale row is a 404 ``no_pending_price_increase``; a
per-instance key sees and answers only its own contract's rows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from vastai import VastAI

from reconciler.emulator import Emulator

pytestmark = pytest.mark.integration

VASTAI = str(Path(sys.executable).parent / "vastai")


class Clock:
    def __init__(self) -> None:
        self.offset = 0.0

    def now(self) -> float:
        return time.time() + self.offset


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[Emulator, Clock]]:
    clock = Clock()
    with Emulator(seed=11, offers=60, boot_delay=0.1, clock=clock.now) as emu:
        yield emu, clock


def cli(emu: Emulator, home: Path, *args: str, key: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VAST", "XDG"))}
    env.update(HOME=str(home), VAST_URL=emu.url, VASTAI_NO_UPDATE_CHECK="1", NO_COLOR="1", COLUMNS="200")
    return subprocess.run([VASTAI, *args, "--api-key", key or emu.api_key], capture_output=True, text=True,
                          env=env, timeout=60)


def rent(emu: Emulator, gpus: int = 1) -> int:
    sdk = VastAI(api_key=emu.api_key, server_url=emu.url)
    offer = sorted(sdk.search_offers(query=f"num_gpus={gpus}", order="dph_total", limit=50), key=lambda o: o["id"])
    taken = {int(emu.instance(i)["bundle_id"]) for i in emu.instance_ids()}
    oid = next(o["id"] for o in offer if o["id"] not in taken)
    reply = sdk.create_instance(id=oid, image="pytorch/pytorch", disk=5, label="price-test", ssh=True, direct=True)
    iid = int(reply["new_contract"])
    emu.wait_running([iid], timeout=30)
    return iid


def pending(emu: Emulator, home: Path, key: str | None = None) -> dict[str, object]:
    r = cli(emu, home, "show", "pending-price-increases", "--raw", key=key)
    assert r.returncode == 0, r.stderr
    envelope: dict[str, object] = json.loads(r.stdout)
    return envelope


def test_accept_bills_the_new_rate_from_the_contract_end_and_extends_it(
    world: tuple[Emulator, Clock], tmp_path: Path
) -> None:
    emu, clock = world
    iid = rent(emu)
    iid_other = rent(emu)
    rec = emu.instance(iid)
    old, end = float(rec["dph_total"]), float(rec["end_date"])
    new = round(old * 1.5, 6)
    pid = emu.raise_price(iid, new, end + 86400)
    envelope = pending(emu, tmp_path)
    assert envelope["success"] is True and envelope["count"] == 1 and envelope["truncated"] is False
    [row] = envelope["pending_price_increases"]  # type: ignore[misc]
    assert row["pending_price_increase_id"] == pid and row["contract_id"] == iid
    assert row["contract_end_date"] == end and row["ask_end_date"] == end + 86400
    assert abs((row["new_gpu_costpersec"] - row["old_gpu_costpersec"]) * 3600 - (new - old)) < 1e-9
    # a per-instance key sees only its own contract's rows, and cannot answer another's
    other_key = emu._get(iid_other).api_key
    assert pending(emu, tmp_path, key=other_key)["pending_price_increases"] == []
    denied = requests.put(f"{emu.url}/api/v0/instances/accept-price-increase/",
                          json={"pending_price_increase_id": pid},
                          headers={"Authorization": f"Bearer {other_key}"}, timeout=10)
    assert denied.status_code == 404 and denied.json()["error"] == "no_pending_price_increase"
    own_key = emu._get(iid).api_key
    assert [r["pending_price_increase_id"] for r in pending(emu, tmp_path, key=own_key)["pending_price_increases"]] \
        == [pid]  # type: ignore[union-attr]
    # extra keys are refused, as the backend's extra='forbid' does
    extra = requests.put(f"{emu.url}/api/v0/instances/accept-price-increase/",
                         json={"pending_price_increase_id": pid, "instance_id": iid},
                         headers={"Authorization": f"Bearer {emu.api_key}"}, timeout=10)
    assert extra.status_code == 400

    r = cli(emu, tmp_path, "accept", "price-increase", str(iid), "--yes")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"pending_id={pid} contract_id={iid}" in r.stdout
    assert emu.increase_status(pid) == "accepted" and pending(emu, tmp_path)["count"] == 0
    # nothing changes before the contract's current end
    assert emu.instance(iid)["dph_total"] == old and emu.instance(iid)["end_date"] == end
    assert abs(emu.ledger.rate(iid) - old) < 1e-9

    clock.offset = end - time.time() + 30  # 30 s past the old end
    emu.price_cutovers()
    rec = emu.instance(iid)
    assert rec["dph_total"] == new and rec["end_date"] == end + 86400
    assert abs(emu.ledger.rate(iid) - new) < 1e-9
    # the cutover bills from the contract end itself: the 30 s after it at the new rate
    after = emu.ledger.charge(iid, end, end + 30)
    assert after is not None and abs(after.usd - new * 30 / 3600) < 1e-6
    types = [e["type"] for e in emu.ledger.events if e["instance_id"] == iid]
    assert types.index("price_increase") < types.index("price_increase_accepted") < types.index("price_cutover")

    # answering again: the row is stale (404 no_pending_price_increase; the CLI exits 2)
    stale = requests.put(f"{emu.url}/api/v0/instances/reject-price-increase/",
                         json={"pending_price_increase_id": pid},
                         headers={"Authorization": f"Bearer {emu.api_key}"}, timeout=10)
    assert stale.status_code == 404 and stale.json() == {
        "success": False, "error": "no_pending_price_increase", "msg": f"No pending price increase {pid}."}
    again = cli(emu, tmp_path, "reject", "price-increase", str(iid), "--yes")
    assert again.returncode == 2 and "no longer available" in again.stdout
    clock.offset = 0.0


def test_reject_tombstones_the_row_and_changes_nothing(world: tuple[Emulator, Clock], tmp_path: Path) -> None:
    emu, clock = world
    iid = rent(emu)
    rec = emu.instance(iid)
    old, end = float(rec["dph_total"]), float(rec["end_date"])
    r = requests.post(f"{emu.url}/_emulator/instances/{iid}/raise_price", json={"dph": old * 2,
                      "ask_end_date": end + 3600}, headers={"Authorization": f"Bearer {emu.api_key}"}, timeout=10)
    assert r.status_code == 200, r.text
    pid = r.json()["pending_price_increase_id"]
    got = cli(emu, tmp_path, "reject", "price-increase", str(iid), "--yes")
    assert got.returncode == 0, got.stdout + got.stderr
    assert emu.increase_status(pid) == "rejected"
    assert pid not in [row["pending_price_increase_id"] for row in pending(emu, tmp_path)["pending_price_increases"]]  # type: ignore[union-attr]
    clock.offset = end - time.time() - 1  # just before the end: nothing changed
    emu.price_cutovers()
    assert emu.instance(iid)["dph_total"] == old and emu.instance(iid)["end_date"] == end
    assert abs(emu.ledger.rate(iid) - old) < 1e-9
    assert "price_increase_rejected" in [e["type"] for e in emu.ledger.events if e["instance_id"] == iid]
    clock.offset = 0.0


def test_the_vast_adapter_reads_and_answers_rows_and_a_stale_one_is_gone(world: tuple[Emulator, Clock]) -> None:
    from reconciler.adapters.vast import VastProvider
    from reconciler.errors import PriceIncreaseGone

    emu, _clock = world
    provider = VastProvider(api_key=emu.api_key, server_url=emu.url, max_total_s=2.0)
    iid = rent(emu)
    rec = emu.instance(iid)
    old, end = float(rec["dph_total"]), float(rec["end_date"])
    pid = emu.raise_price(iid, round(old + 0.125, 6), end + 7200)
    [inc] = [p for p in provider.pending_price_increases() if p.id == pid]
    assert inc.instance_id == iid and inc.applies_at == end and inc.new_end == end + 7200
    assert abs(inc.old_dph - old) < 1e-9 and abs(inc.new_dph - (old + 0.125)) < 1e-6
    # a 429 on the list is retried by the adapter's backoff (per endpoint, no Retry-After), not a failure
    emu.fail_next("/api/v0/instances/pending-price-increases", n=1, status=429)
    assert [p.id for p in provider.pending_price_increases() if p.id == pid] == [pid]
    provider.answer_price_increase(pid, accept=True)
    assert emu.increase_status(pid) == "accepted"
    with pytest.raises(PriceIncreaseGone):
        provider.answer_price_increase(pid, accept=False)
    # a box of several GPUs: the row's GPU price is per GPU, and the adapter prices the whole box
    many = rent(emu, gpus=2)
    target = round(float(emu.instance(many)["dph_total"]) + 0.3, 6)
    pid3 = emu.raise_price(many, target, float(emu.instance(many)["end_date"]) + 3600)
    [inc3] = [p for p in provider.pending_price_increases() if p.id == pid3]
    assert abs(inc3.new_dph - target) < 1e-6
    # an older backend says 409 for a stale row
    other = rent(emu)
    pid2 = emu.raise_price(other, 9.0, float(emu.instance(other)["end_date"]) + 7200)
    emu.fail_next("/api/v0/instances/reject-price-increase", n=1, status=409)
    with pytest.raises(PriceIncreaseGone):
        provider.answer_price_increase(pid2, accept=False)
    assert emu.increase_status(pid2) == "pending"
