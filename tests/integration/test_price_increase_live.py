"""A host raises the price of a box rigsync runs, on real parts: the emulator, real sshd boxes, the real daemon cycle
through the real ``vastai`` SDK, a real fleet repository.

An increase over the fleet's caps is rejected (the emulator tombstones the row and bills on at the old rate); one
that still fits is accepted, and after the contract's end the emulator's ledger bills the new rate; each answer is
named in the cycle's commit on the fleet repository.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from gitutil import git
from world import FleetRepo, ShiftedClock, fleet_repo

from reconciler.daemon import DaemonConfig, FleetDaemon
from reconciler.emulator import Emulator
from reconciler.plan.price_increases import rates_text

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _one_long_run(repo: FleetRepo) -> None:
    def change(doc: dict[str, object]) -> None:
        doc["grid"] = {"task": ["walker-walk"], "lr": [1.0e-3]}
        doc["seeds"] = [1]
        doc["command"] = str(doc["command"]) + " --seconds 600"
        doc["expected_runtime"] = "10m"
        doc.pop("promotion", None)

    repo.edit("desired/sweeps/tdmpc.yaml", change)
    repo.edit_fleet(boot_timeout="1m")


def _cycle_until(daemon: FleetDaemon, done: object, what: str, wall_s: float = 90.0) -> None:
    deadline = time.monotonic() + wall_s
    while time.monotonic() < deadline:
        daemon.cycle()
        if callable(done) and done():
            return
        time.sleep(0.3)
    raise AssertionError(f"not reached in {wall_s:g}s: {what}")


def test_a_rejected_and_an_accepted_increase_through_real_cycles(tmp_path: Path, api_key_env: None) -> None:
    clock = ShiftedClock()
    workdir = tmp_path / "fleet"
    with Emulator(seed=7, boot_delay=0.3, clock=clock.now) as emu:
        os.environ["VAST_API_KEY"] = emu.api_key
        repo = fleet_repo(workdir)
        _one_long_run(repo)
        repo.commit("one long run")
        daemon = FleetDaemon(workdir, config=DaemonConfig(interval_s=0.5, lease_renew_s=30.0),
                             state_dir=str(tmp_path / "state"), clock=clock, api_url=emu.url)
        daemon.acquire()
        try:
            def live() -> bool:
                rec = daemon.reconciler
                return rec is not None and bool(rec.memory.in_flight) and bool(emu.instance_ids())

            _cycle_until(daemon, live, "a box with a live run")
            [iid] = emu.instance_ids()
            rec0 = emu.instance(iid)
            old, end = float(rec0["dph_total"]), float(rec0["end_date"])

            # over the fleet's caps (max_instance_dph $0.15/h): rejected, the row tombstoned, nothing changes
            dear = emu.raise_price(iid, 0.5, end + 86400)
            _cycle_until(daemon, lambda: emu.increase_status(dear) != "pending", "an answer to the dear increase")
            assert emu.increase_status(dear) == "rejected"
            assert emu.instance(iid)["dph_total"] == old and abs(emu.ledger.rate(iid) - old) < 1e-9
            log = git(workdir, "log", "-5", "--format=%B")
            assert f"rejected price increase on instance {iid}: {rates_text(old, 0.5)}" in log, log
            assert "over the per-box cap $0.150/h" in log, log

            # a cent a day more, under every cap and still the best the pool could rent: accepted
            new = round(old + 0.0004, 6)
            fair = emu.raise_price(iid, new, end + 86400)
            _cycle_until(daemon, lambda: emu.increase_status(fair) != "pending", "an answer to the fair increase")
            assert emu.increase_status(fair) == "accepted", git(workdir, "log", "-3", "--format=%B")
            log = git(workdir, "log", "-5", "--format=%B")
            assert f"accepted price increase on instance {iid}: {rates_text(old, new)}" in log, log
            assert "fits the caps and still ranks first" in log and "best alternative offer" in log, log
            assert daemon.reconciler is not None
            assert [p.id for p in daemon.reconciler.memory.accepted_increases] == [fair]
            fleet_yaml = (workdir / "observed" / "fleet.yaml").read_text()
            assert "accepted_price_increases" in fleet_yaml and f"id: {fair}" in fleet_yaml
            # billed at the old rate until the contract's end, at the new one from then on
            assert abs(emu.ledger.rate(iid) - old) < 1e-9
            clock.offset = end - time.time() + 60.0
            emu.price_cutovers()
            assert abs(emu.ledger.rate(iid) - new) < 1e-9 and emu.instance(iid)["end_date"] == end + 86400
            after = emu.ledger.charge(iid, end, end + 60.0)
            assert after is not None and abs(after.usd - new * 60.0 / 3600.0) < 1e-6
        finally:
            if daemon.reconciler is not None:
                daemon.reconciler.shell.close()
            daemon.release()
