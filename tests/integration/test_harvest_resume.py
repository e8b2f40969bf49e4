"""Harvest and resume on real parts: a box vanishes mid-run, the next attempt resumes from the synced checkpoint.

The emulator's boxes are real sshd hosts, the provider the real ``vastai`` SDK, the shell paramiko; the sweep runs
``experiments/train.py``, which checkpoints into ``ckpt/`` after every evaluation. rigsync syncs that directory
home every second while the attempt runs; the box vanishes once a checkpoint with a few evaluations is home; the
requeued attempt gets it before launch and runs only what was left.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from gitutil import git as _git
from test_reconcile import drive, fleet_repo, owned_alive, successes

from reconciler.adapters.archive import ShardedRunArchive
from reconciler.adapters.store import LocalStore, attempt_dir, data_dir_for
from reconciler.cli._common import load_local_desired, open_reconciler
from reconciler.core.curves import curve_path
from reconciler.core.model import AttemptOutcome
from reconciler.emulator import Emulator
from reconciler.loop import CycleResult

pytestmark = pytest.mark.integration

EVALS = 8  # train.py's evaluations per run (step 1000 .. 8000), one a second
CHECKPOINTED = """
checkpoint: {path: ckpt/, every: 1s}
artifacts: ["ckpt/*.json"]
"""


def test_a_vanished_run_resumes_from_its_checkpoint_and_does_less_than_two_runs_of_work(
    emulator: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VAST_API_KEY", emulator.api_key)
    monkeypatch.setenv("RIGSYNC_DATA_DIR", str(tmp_path / "data"))
    repo = fleet_repo(tmp_path, emulator, "itresume", seconds=float(EVALS))
    sweep = repo / "desired" / "sweeps" / "tdmpc.yaml"
    text = sweep.read_text().replace("--evals 4", f"--evals {EVALS}").replace("lr: [3.0e-4, 1.0e-3]", "lr: [1.0e-3]")
    sweep.write_text(text + CHECKPOINTED)
    _git(repo, "commit", "-q", "-am", "test: one run, checkpointed every second")
    desired = load_local_desired(repo)
    assert desired.sweeps[0].checkpoint is not None and len(desired.runs) == 1
    store = LocalStore(data_dir_for("itresume"))
    rec = open_reconciler(repo, desired, str(tmp_path / "state"), emulator.url)
    victim: dict[str, Any] = {}

    def vanish_once_a_checkpoint_is_home(res: CycleResult) -> None:
        if victim:
            return
        for probe in res.observed.probes:
            live = [r for r in probe.runs if r.exit_code is None and r.pid_alive]
            synced = store.checkpoint_synced(live[0].run_id) if probe.reachable and live else None
            ck = store.checkpoint(live[0].run_id) if synced else None
            if ck is None or ck.attempt != live[0].attempt:
                continue
            state = json.loads((Path(store.fleet_data) / "checkpoints" / ck.run_id / "ckpt" / "state.json").read_text())
            if state["done"] >= 3:
                emulator.vanish(probe.instance_id)
                seen = dict(live[0].last_metrics).get("step")
                victim.update(instance_id=probe.instance_id, run_id=ck.run_id, attempt=ck.attempt,
                              done=state["done"], step=state["step"], seen=seen)
                return

    try:
        drive(rec, desired, emulator, vanish_once_a_checkpoint_is_home)
    finally:
        rec.shell.close()
        for iid in owned_alive(emulator, "itresume"):
            emulator.destroy_instance(iid)

    assert victim, "no checkpoint ever came home from a live run"
    records = list(ShardedRunArchive(repo).records())
    assert successes(records) == {victim["run_id"]: 1}
    lost = next(r for r in records if r.phase is AttemptOutcome.LOST)
    assert (lost.attempt, lost.instance_id) == (victim["attempt"], victim["instance_id"])
    assert lost.harvest in ("lost: box vanished", "lost: box unreachable")  # what the record says was lost
    won = next(r for r in records if r.phase is AttemptOutcome.SUCCEEDED)
    assert won.resumed_from == victim["attempt"] and won.harvest is not None and won.harvest.startswith("ok: ")
    # everything came home: the logs under their box names, meta.json, the metrics file, the declared artifacts
    home = attempt_dir(store.fleet_data, won.run_id, won.attempt)
    for name in ("stdout.log", "stderr.log", "meta.json", "metrics.jsonl", "ckpt/state.json"):
        assert (home / name).is_file(), name
    # the curve continues from the step the lost attempt had reached, not from zero
    steps = [json.loads(line)["step"] for line in (home / "metrics.jsonl").read_text().splitlines()]
    assert steps[0] > 1000 and steps[-1] == EVALS * 1000
    resumed_at = steps[0] // 1000 - 1  # the evaluations done by the checkpoint it resumed from
    assert resumed_at >= victim["done"]
    # the work done, summed over attempts: the lost one ran at most one evaluation past its last probe
    lost_evals = max(victim["done"], (victim["seen"] or 0) // 1000) + 1
    total = lost_evals + len(steps)
    assert total < 2 * EVALS
    print(f"resume figures: full run {EVALS} evals; lost attempt ~{lost_evals}, resumed attempt {len(steps)} "
          f"(from step {steps[0]}); total {total}")
    curve = rec.pending_curves[curve_path("tdmpc", won.run_id, won.attempt)]
    doc = json.loads(curve)
    assert doc["resumed_from"] == victim["attempt"] and doc["points"][0][0] == steps[0]
