"""A bayes search through a real `rigsync run` daemon: the emulator's sshd boxes, a bare git remote, real processes.

The sweep searches ``lr`` (run_cap 6, batch 2, one seed): its first batch is known up front, each later batch is
suggested once the one before it is archived, recorded in observed/suggestions.yaml and committed; a daemon
restarted midway reads the record back and neither changes nor re-suggests what was recorded.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
from test_run_daemon import SWEEP, World, log_text, validate_observed, world_factory
from waiting import wait_for

pytestmark = pytest.mark.integration
__all__ = ["world_factory"]  # the fixture, imported for pytest

SEARCH_SWEEP = """\
# yaml-language-server: $schema=../../schemas/sweep.schema.json
name: tune
priority: 10
code: [experiments]
command: >-
  {{ python }} experiments/train.py --task walker-walk --lr {{ lr }} --seed {{ seed }}
  --seconds 1 --evals 3 --out {{ run_dir }}/metrics.jsonl
search:
  method: bayes
  metric: {key: episode_reward, goal: max}
  parameters:
    lr: {distribution: log_uniform, min: 1.0e-4, max: 1.0e-1}
  run_cap: 6
  batch: 2
  seed: 7
seeds: [1]
""" + SWEEP[SWEEP.index("resources:"):]  # the daemon tests' resources, runtime, retries and metrics


def recorded(w: World) -> list[dict[str, Any]]:
    doc = w.remote_yaml("observed/suggestions.yaml") or {}
    for entry in doc.get("sweeps") or []:
        if entry.get("sweep") == "tune":
            return list(entry.get("configurations") or [])
    return []


def archived_lrs(w: World) -> set[float]:
    return {
        float(line["params"]["lr"])
        for line in w.remote_archive_lines()
        if line.get("sweep") == "tune" and line.get("phase") == "succeeded"
    }


def test_a_bayes_search_reaches_run_cap_and_a_restart_keeps_what_was_suggested(
    world_factory: Callable[..., World],
) -> None:
    w = world_factory("t-bayes", max_instances=2)
    (w.work / "desired" / "sweeps" / "tdmpc.yaml").unlink()
    w.repo.write("desired/sweeps/tune.yaml", SEARCH_SWEEP)
    w.repo.commit("a bayes search")

    proc, log = w.start("--interval", "0.5")
    midway = wait_for("the second batch recorded at the remote", lambda: len(recorded(w)) >= 4 and recorded(w), 180)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, log_text(log)[-3000:]
    before = recorded(w)
    assert before[: len(midway)] == midway
    assert len(before) < 6, "the daemon was to be restarted midway, before the last batch"
    assert [(c["trial"], c["batch"]) for c in before[:4]] == [(0, 0), (1, 0), (2, 1), (3, 1)]

    proc, log = w.start("--interval", "0.5", tag="restarted")
    wait_for("six configurations, each archived", lambda: len(recorded(w)) == 6 and len(archived_lrs(w)) == 6, 240)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, log_text(log)[-3000:]
    after = recorded(w)
    assert after[: len(before)] == before, "the restarted daemon changed what was recorded"
    assert [(c["trial"], c["batch"]) for c in after] == [(0, 0), (1, 0), (2, 1), (3, 1), (4, 2), (5, 2)]
    lrs = [float(c["params"]["lr"]) for c in after]
    assert len(set(lrs)) == 6 and all(1e-4 <= lr <= 1e-1 for lr in lrs)
    assert archived_lrs(w) == set(lrs), "every run archived is one of the recorded configurations, and each ran"
    assert len([line for line in w.remote_archive_lines() if line.get("phase") == "succeeded"]) == 6
    validate_observed(w)
    messages = subprocess.run(
        ["git", "log", "--format=%s", "refs/heads/main"], cwd=w.remote, capture_output=True, text=True, check=True
    ).stdout
    assert "tune: suggested 2 configurations (batch 2)" in messages, messages
    assert "Traceback" not in log_text(log)
    w.assert_never_forced()
