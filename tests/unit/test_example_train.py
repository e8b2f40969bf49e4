"""The example sweep's job (experiments/train.py) resumes from a checkpoint the way the demo relies on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "experiments" / "train.py"


def _train(tmp_path: Path, resume: dict[str, object] | None) -> list[dict[str, float]]:
    env = {**os.environ, "RIGSYNC_DEMO_SECONDS": "0.05", "RIGSYNC_RUN_DIR": str(tmp_path / "run")}
    env.pop("RIGSYNC_RESUME_DIR", None)
    if resume is not None:
        ckpt = tmp_path / "resume" / "ckpt"
        ckpt.mkdir(parents=True)
        (ckpt / "state.json").write_text(json.dumps(resume))
        env["RIGSYNC_RESUME_DIR"] = str(tmp_path / "resume")
    out = tmp_path / "metrics.jsonl"
    subprocess.run([sys.executable, str(TRAIN), "--task", "walker", "--lr", "0.001", "--seed", "1", "--out", str(out),
                    "--evals", "5"], env=env, check=True, capture_output=True, timeout=60)
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_a_resumed_attempt_runs_only_the_evaluations_left(tmp_path: Path) -> None:
    fresh = _train(tmp_path / "a", None)
    assert [p["step"] for p in fresh] == [1000, 2000, 3000, 4000, 5000]
    state = {"task": "walker", "lr": 0.001, "seed": 1, "evals": 5, "done": 3, "step": 3000}
    assert _train(tmp_path / "b", state) == fresh[3:]


def test_a_checkpoint_of_a_finished_training_is_evaluated_once_more(tmp_path: Path) -> None:
    """Lost between its last evaluation and its exit, the attempt's successor still reports the final reward."""
    fresh = _train(tmp_path / "a", None)
    state = {"task": "walker", "lr": 0.001, "seed": 1, "evals": 5, "done": 5, "step": 5000}
    assert _train(tmp_path / "b", state) == fresh[-1:]
