"""`kill -9` of `rigsync run` in the middle of a sweep, then a restart: nothing is lost, nothing happens twice.

The daemon keeps no state that matters in memory: after a crash it rebuilds the world from the provider's
instance list, the run directories on the boxes and the archive in git. So across the kill every attempt is
archived exactly once (locally and at the remote), no run succeeds twice, no run ever has two live attempts,
and once the sweep is done no box is left behind.
"""

from __future__ import annotations

import itertools
import signal
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import pytest
from test_run_daemon import BoxRuns, World, git, log_text, run_ids_by_seed, validate_observed, world_factory
from waiting import wait_for

from reconciler.adapters.archive import ShardedRunArchive

pytestmark = pytest.mark.integration
__all__ = ["world_factory"]  # the fixture, shared with test_run_daemon


def test_kill_9_mid_sweep_then_restart(world_factory: Callable[..., World]) -> None:
    w = world_factory("t-crash", seeds="1, 2, 3, 4, 5, 6", seconds=2.0, max_instances=2, idle_timeout="3s")
    ids = set(run_ids_by_seed(w).values())
    assert len(ids) == 6
    boxes = BoxRuns(w.emu, w.name).start()
    first, _ = w.start("--interval", "1", tag="first")
    try:
        wait_for("three launches", lambda: len(boxes.dirs()) >= 3, 90, every=0.05)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        killed_at_dirs = set(boxes.dirs())
        second, second_log = w.start("--interval", "1", tag="second")

        def converged() -> bool:
            done = {r["run_id"] for r in w.remote_archive_lines() if r["phase"] == "succeeded"}
            return ids <= done and not w.owned_instances()

        wait_for("the sweep to finish and every box to be destroyed", converged, 150, every=0.5)
        # The cycle that destroyed the last boxes may still be finishing; the next observes them gone and closes
        # their bills in the archive (a commit of its own); two more after that: no orphan box, nothing to commit.
        settled = log_text(second_log).count("cycle:") + 2
        wait_for("a settling cycle", lambda: log_text(second_log).count("cycle:") >= settled, 30)
        tip = w.tip()
        wait_for("two more cycles", lambda: log_text(second_log).count("cycle:") >= settled + 2, 30)
        assert not w.owned_instances()
        assert w.tip() == tip, "a cycle after convergence committed:\n" + git(
            w.remote, "log", "-p", "--format=%s", f"{tip}..refs/heads/main"
        )[-4000:]
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=60) == 0, log_text(second_log)[-3000:]
    finally:
        boxes.stop()

    assert "Traceback" not in log_text(second_log)
    assert killed_at_dirs, "the kill came after some launches"

    # Exactly one archive line per (run_id, attempt), at the remote and in the checkout.
    lines = w.remote_archive_lines()
    keys = Counter((r["run_id"], r["attempt"]) for r in lines)
    assert all(n == 1 for n in keys.values()), [k for k, n in keys.items() if n > 1]
    local = list(ShardedRunArchive(w.work).records())
    assert sorted(r.key for r in local) == sorted(keys)
    successes = Counter(r["run_id"] for r in lines if r["phase"] == "succeeded")
    assert set(successes) == ids and all(n == 1 for n in successes.values()), successes

    # Every attempt directory on a box is one archived attempt, on one box only.
    where: dict[str, list[int]] = defaultdict(list)
    for iid, name in boxes.seen:
        where[name].append(iid)
    assert all(len(v) == 1 for v in where.values()), where
    by_key = {(r["run_id"], r["attempt"]): r for r in lines}
    for name in where:
        run_id, attempt = name.rsplit(".", 1)
        assert (run_id, int(attempt)) in by_key, f"attempt {name} ran on a box but was never archived"

    # No run ever had two live attempts: the attempts' [start, end] intervals never overlap.
    intervals: dict[str, list[tuple[float, float, Any]]] = defaultdict(list)
    for (run_id, attempt), r in by_key.items():
        start, end = r["started_at"], r["ended_at"]
        if start is not None and end is not None:
            intervals[run_id].append((float(start), float(end), attempt))
    for run_id, spans in intervals.items():
        spans.sort()
        for (_, end_a, att_a), (start_b, _, att_b) in itertools.pairwise(spans):
            assert start_b >= end_a, f"{run_id}: attempts {att_a} and {att_b} were live at the same time"
    box_spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for (_, name), info in boxes.seen.items():
        if info.get("started_at") and info.get("ended_at"):
            box_spans[name.rsplit(".", 1)[0]].append((float(info["started_at"]), float(info["ended_at"])))
    for run_id, box_list in box_spans.items():
        box_list.sort()
        for (_, end_a), (start_b, _) in itertools.pairwise(box_list):
            assert start_b >= end_a, f"{run_id} had two live attempt directories at once"

    validate_observed(w)
    w.assert_never_forced()
