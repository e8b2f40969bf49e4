"""Caps that hold, on real parts: the emulator's ledger (what the provider bills) never passes a cap.

A fleet repository like the demo's (a bare remote beside it), the real daemon cycle (``FleetDaemon``), the real
``vastai`` SDK against the emulator and real sshd boxes. The budget is small enough to bind mid-sweep; the
test runs cycles until the fleet is empty and checks the emulator's books against the cap, and that observed/
and the git history say why work stopped.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path

import pytest
import yaml
from gitutil import git
from world import FleetRepo, ShiftedClock, fleet_repo

from reconciler.adapters.archive import ShardedRunArchive
from reconciler.core.model import AttemptOutcome
from reconciler.daemon import DaemonConfig, FleetDaemon
from reconciler.emulator import Emulator

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

MAX_WALL_S = 240.0


def _set_budget(repo: FleetRepo, **budget: object) -> None:
    def change(doc: dict[str, object]) -> None:
        doc.update(budget)
        for k in [k for k, v in doc.items() if v is None]:  # None: no such cap
            del doc[k]

    repo.edit("desired/budget.yaml", change)


def _short_runs(repo: FleetRepo) -> None:
    """Runs of a few seconds, priced by their expected runtime (the archive takes over once some finish);
    six seeds per cell: 24 runs."""

    def change(doc: dict[str, object]) -> None:
        doc["seeds"] = [1, 2, 3, 4, 5, 6]
        doc["max_runtime"] = "2m"
        doc["expected_runtime"] = "15s"
        doc.pop("promotion", None)

    repo.edit("desired/sweeps/tdmpc.yaml", change)
    # A rent is priced with the longest the box may bill before it is ready (boot_timeout): boxes here boot in
    # well under a second, so the fleet says so (the world's 2m would price every rent past these small caps).
    repo.edit_fleet(boot_timeout="10s")


def _drive(daemon: FleetDaemon, emu: Emulator) -> int:
    """Cycles until nothing is left to do and no box is held (or the wall bound); returns the cycle count."""
    deadline = time.monotonic() + MAX_WALL_S
    cycles = 0
    quiet = 0
    while time.monotonic() < deadline:
        cyc = daemon.cycle()
        cycles += 1
        acted = bool(cyc.result and cyc.result.plan.actions)
        quiet = 0 if acted or emu.instance_ids() else quiet + 1
        if quiet >= 2:
            break
        time.sleep(0.5)
    return cycles


def _run_capped(
    tmp_path: Path, clock: ShiftedClock | None, next_day: float | None = None, **budget: object
) -> tuple[Path, Emulator, float]:
    """The sweep under ``budget`` until the fleet stops; with ``next_day`` (on ``clock``), the clock is then moved
    there (the daemon's and the emulator's: nothing is billing, no box is held) and the fleet driven again."""
    workdir = tmp_path / "fleet"
    state = tmp_path / "state"
    emu = Emulator(seed=7, boot_delay=0.3, clock=clock.now if clock else None)
    emu.start()
    try:
        os.environ["VAST_API_KEY"] = emu.api_key
        repo = fleet_repo(workdir)
        _set_budget(repo, **budget)
        _short_runs(repo)
        repo.commit("a budget that binds mid-sweep")
        config = DaemonConfig(interval_s=0.5, lease_renew_s=30.0, destroy_latency_s=2.0)
        daemon = FleetDaemon(workdir, config=config, state_dir=str(state), clock=clock, api_url=emu.url)
        daemon.acquire()
        try:
            _drive(daemon, emu)
            if clock is not None and next_day is not None:
                assert emu.instance_ids() == [], "boxes left billing after the budget stopped the fleet for the day"
                clock.advance(next_day - clock.now())
                _drive(daemon, emu)
        finally:
            if daemon.reconciler is not None:
                daemon.reconciler.shell.close()
            daemon.release()
        billed = emu.ledger.total_usd()
        assert emu.instance_ids() == [], "boxes left billing after the budget stopped the fleet"
    finally:
        emu.close()
    return workdir, emu, billed


def _why_stopped(workdir: Path) -> str:
    status = yaml.safe_load((workdir / "observed" / "status.yaml").read_text())
    drift = yaml.safe_load((workdir / "observed" / "drift.yaml").read_text())
    log = git(workdir, "log", "--format=%s")
    lines = [w for w in status["last_plan"]["warnings"] if w.startswith("budget:")]
    assert any(d["class"] == "over_budget" for d in drift["drift"]) or lines or "budget:" in log
    return "\n".join(lines) + "\n" + log


def test_a_total_cap_that_binds_mid_sweep_holds_on_the_ledger(tmp_path: Path, api_key_env: None) -> None:
    cap = 0.0015
    workdir, _emu, billed = _run_capped(tmp_path, None, max_total_usd=cap, max_daily_usd=None, on_exceed="drain")
    records = list(ShardedRunArchive(workdir).records())
    succeeded = {r.run_id for r in records if r.phase is AttemptOutcome.SUCCEEDED}
    assert succeeded, "the budget allowed some work before it bound"
    assert len(succeeded) < 24, "the cap was meant to bind mid-sweep"
    assert billed <= cap + 1e-6, f"the ledger billed ${billed:.6f} past the total cap ${cap}"
    assert billed >= cap / 3, f"only ${billed:.6f} of the ${cap} cap was used: the cap refused too early"
    print(f"total cap ${cap}: billed ${billed:.6f}, {len(succeeded)} of 24 runs succeeded")
    assert "budget:" in _why_stopped(workdir)


def test_a_daily_cap_across_utc_midnight(tmp_path: Path, api_key_env: None) -> None:
    """The sweep starts an hour before a UTC midnight: the daily cap binds and the fleet stops for the day; then the
    clock (the daemon's and the emulator's) is moved past midnight rather than waited for, and work resumes."""
    now = time.time()
    midnight = (now // 86400 + 1) * 86400
    clock = ShiftedClock(midnight - 3600.0 - now)
    cap = 0.0006
    workdir, emu, billed = _run_capped(
        tmp_path, clock, midnight + 5.0, max_daily_usd=cap, max_total_usd=1.0, on_exceed="drain"
    )
    day = dt.datetime.fromtimestamp(midnight, tz=dt.UTC).date()
    before = emu.ledger.usd_between(midnight - 86400, midnight)
    after = emu.ledger.usd_between(midnight, midnight + 86400)
    assert before <= cap + 1e-6, f"the ledger billed ${before:.6f} on the day before {day}, past the cap ${cap}"
    assert after <= cap + 1e-6, f"the ledger billed ${after:.6f} on {day}, past the daily cap ${cap}"
    assert before > 0, "no work before midnight"
    print(f"daily cap ${cap}: billed ${before:.6f} before midnight, ${after:.6f} after")
    assert "budget:" in _why_stopped(workdir)
    records = list(ShardedRunArchive(workdir).records())
    ended_after = [r for r in records if r.ended_at and r.ended_at >= midnight]
    assert ended_after, f"no work finished after midnight UTC ({day}): the new day's budget was never used"
    assert billed <= 2 * cap + 1e-6
