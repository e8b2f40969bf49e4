"""The box-side queue in the fakes' world: real observe → plan → apply cycles, boxes that start their next queued
attempt the moment a slot frees. Three boxes run a 24-run sweep of runs shorter than the controller's interval:
across cycles no GPU slot sits idle between two runs, and every run succeeds once."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

from fakes import FakeArchive, FakeRun, FakeWorld, Work, desired_state, fake_reconciler, offer

from reconciler.core.actions import Launch
from reconciler.core.model import AttemptOutcome

RUN_S = 40.0  # shorter than a cycle: without the queue each GPU would wait for the controller between runs
CYCLE_S = 60.0


def test_three_boxes_run_a_24_run_sweep_with_no_idle_slot_between_runs() -> None:
    desired = desired_state(24, max_instances=3)
    world = FakeWorld([offer(i) for i in (1, 2, 3)], work=lambda job: Work(seconds=RUN_S, exit_code=0))
    archive = FakeArchive()
    rec = fake_reconciler(world, archive)
    queued = 0
    # what each box ran, kept after the box is destroyed at the tail
    runs_of: dict[int, dict[tuple[str, int], FakeRun]] = {}
    for _ in range(60):
        res = rec.cycle(desired)
        queued += sum(1 for a in res.plan.actions if isinstance(a, Launch) and a.queued)
        for box in world.boxes.values():
            runs_of.setdefault(box.instance_id, {}).update(box.runs)
            held = [g for r in box.runs.values() if r.holds_gpus for g in r.gpu_mask]
            assert len(held) == len(set(held)), f"a GPU of box {box.instance_id} holds two live runs"
        done = {r.run_id for r in archive.records() if r.phase is AttemptOutcome.SUCCEEDED}
        if done == {r.id for r in desired.runs}:
            break
        world.clock.advance(CYCLE_S)
    succeeded = Counter(r.run_id for r in archive.records() if r.phase is AttemptOutcome.SUCCEEDED)
    assert set(succeeded) == {r.id for r in desired.runs} and set(succeeded.values()) == {1}
    assert queued > 0
    assert len([iid for iid, runs in runs_of.items() if runs]) == 3
    for iid, ran in runs_of.items():
        runs = sorted((r for r in ran.values() if r.started_at is not None), key=lambda r: r.started_at or 0.0)
        assert len(runs) >= 2
        for before, after in pairwise(runs):
            assert before.ended_at is not None and after.started_at is not None
            assert after.started_at == before.ended_at, (
                f"box {iid}: GPU idle {after.started_at - before.ended_at:g}s between "
                f"{before.run_id} and {after.run_id}"
            )
