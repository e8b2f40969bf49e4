"""A stalled job on real parts: its process lives and its heartbeat is fresh, but its metrics stop growing.

The real probe reports how long ago the attempt's metrics file last grew; with the sweep's ``stall_timeout`` passed
the plan kills the attempt as ``stalled`` (drift class ``stalled``), the kill is archived as a failed attempt that
counts against the run's retries, and with none left the run is blocked.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from world import fleet_repo

from reconciler.cli._common import load_local_desired, open_reconciler
from reconciler.core.actions import Kill, ReasonCode
from reconciler.core.model import AttemptOutcome, DriftClass, RunPhase
from reconciler.core.runphase import run_phase, tally_runs
from reconciler.emulator import Emulator

pytestmark = pytest.mark.integration

SWEEP = """\
name: hang
code: [experiments]
command: >-
  echo '{"step": {{ seed }}, "episode_reward": 1.0}' >> {{ run_dir }}/metrics.jsonl && sleep 600
seeds: [1]
max_runtime: 10m
retries: 0
stall_timeout: 3s
stall_gpu_util: 0
metrics: {file: metrics.jsonl, key: episode_reward, goal: max}
"""


def test_a_job_whose_metrics_stop_growing_is_killed_as_stalled(
    emulator: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VAST_API_KEY", emulator.api_key)
    fleet = fleet_repo(tmp_path / "fleet")
    fleet.edit_fleet(name="itstall", max=1)
    fleet.set_sweeps({"hang": SWEEP})
    repo = fleet.work
    desired = load_local_desired(repo)
    rec = open_reconciler(repo, desired, str(tmp_path / "state"), emulator.url)

    killed = None
    for _ in range(80):  # bounded: rent, boot, bootstrap, launch, then 3s without metric progress
        res = rec.cycle(desired)
        hit = [a for a in res.plan.actions if isinstance(a, Kill)]
        if hit:
            killed = hit[0]
            assert [d.cls for d in res.plan.drift if d.subject == f"run/{killed.run_id}.1"] == [DriftClass.STALLED]
            break
        time.sleep(0.5)
    assert killed is not None, "the stalled job was never killed"
    assert killed.code is ReasonCode.STALLED
    assert "stalled: no metric progress: metrics.jsonl unchanged for" in killed.reason
    records = [r for r in rec.history if r.run_id == killed.run_id]
    assert [(r.attempt, r.phase) for r in records] == [(1, AttemptOutcome.FAILED)]
    assert records[0].reason == killed.reason
    # retries: 0, and the stall counted: the run is blocked, not launched again
    spec = desired.run(killed.run_id)
    assert spec is not None
    tally = tally_runs(rec.history, ()).get(killed.run_id)
    assert tally is not None and run_phase(spec, tally) is RunPhase.BLOCKED
