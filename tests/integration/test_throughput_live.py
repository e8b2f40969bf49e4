"""Learned throughput on real parts: a sweep with a progress key runs on an emulator box (real sshd, real vastai
client), its archived attempt carries the progress it reached, and observed/throughput.yaml (written as a cycle
writes its observed files) shows the rate learned from it, valid against its schema; the sweep's runtime (price,
ETA) is then the learned one.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jsonschema
import pytest
import yaml
from world import fleet_repo

from reconciler.cli._common import load_local_desired, open_reconciler, write_observed_uncommitted
from reconciler.core.model import AttemptOutcome
from reconciler.emulator import Emulator
from reconciler.plan.money import RuntimeSource, sweep_runtimes

pytestmark = pytest.mark.integration

ROOT = Path(__file__).parents[2]

SWEEP = """\
name: steps
code: [experiments]
command: >-
  for i in 10 20 30 40; do echo "{\\"step\\": $i, \\"reward\\": 1.0}" >> {{ run_dir }}/metrics.jsonl; sleep 0.5; done
seeds: [1]
max_runtime: 10m
retries: 0
metrics: {file: metrics.jsonl, key: reward, goal: max}
progress: {key: step, total: 40}
"""


def test_an_attempts_progress_is_archived_and_learned(
    emulator: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VAST_API_KEY", emulator.api_key)
    fleet = fleet_repo(tmp_path / "fleet")
    fleet.edit_fleet(name="itrates", max=1)
    fleet.set_sweeps({"steps": SWEEP})
    repo = fleet.work
    desired = load_local_desired(repo)
    rec = open_reconciler(repo, desired, str(tmp_path / "state"), emulator.url)

    done = None
    for _ in range(120):  # bounded: rent, boot, bootstrap, launch, two seconds of work, record
        res = rec.cycle(desired)
        finished = [r for r in rec.history if r.sweep == "steps" and r.phase is AttemptOutcome.SUCCEEDED]
        if finished:
            done = finished[0]
            write_observed_uncommitted(repo, desired, res.observed, res.plan, rec, res.applied)
            break
        time.sleep(0.5)
    assert done is not None, "the run never succeeded"
    assert done.progress == 40.0
    assert done.started_at is not None and done.ended_at is not None and done.ended_at > done.started_at

    doc = yaml.safe_load((repo / "observed" / "throughput.yaml").read_text())
    schema = json.loads((ROOT / "schemas" / "observed-throughput.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)
    (sweep,) = doc["sweeps"]
    assert sweep["sweep"] == "steps"
    (gpu,) = sweep["gpus"]
    assert gpu["attempts"] == 1 and gpu["units"] == 40
    assert gpu["units_per_s"] == pytest.approx(40 / (done.ended_at - done.started_at), rel=1e-3)
    assert [m["machine_id"] for m in sweep["machines"]] == [done.machine_id]

    after = rec.cycle(desired)
    runtime = sweep_runtimes(desired, after.observed, {})["steps"]
    assert runtime.source is RuntimeSource.RATE
    assert runtime.hours == pytest.approx(40 / gpu["units_per_s"] / 3600, rel=1e-4)
