"""The fake box's queue behaves as the box's does (the unit tier's world depends on it): the next entry of a slot
starts the second the slot frees, a killed entry is tombstoned and never starts, a draining box takes no entry, and
the box's epoch fence refuses an older controller's launches and entries."""

from __future__ import annotations

import pytest
from fakes import FakeWorld, Work, offer

from reconciler.core.model import Instance, MetricGoal
from reconciler.errors import LaunchLockHeld, RemoteCommandFailed
from reconciler.ports import LaunchJob


def _job(run_id: str, *, queued: bool = False, epoch: int = 0, mask: tuple[int, ...] = (0,)) -> LaunchJob:
    return LaunchJob(run_id, 1, mask, f"train {run_id}", None, None, "s", (), 0, "metrics.jsonl", None,
                     MetricGoal.MAX, 3600.0, queued=queued, epoch=epoch)


def _box(world: FakeWorld) -> Instance:
    iid = world.provider.create_instance(1, image="i", disk_gb=10, label="l", onstart="", env={})
    world.clock.advance(world.boot_s)
    world.tick()
    return next(i for i in world.listed() if i.id == iid)


def test_the_next_entry_starts_the_moment_its_slot_frees() -> None:
    world = FakeWorld([offer(1, gpus=2)], work=lambda job: Work(seconds=100.0))
    box = _box(world)
    t0 = world.clock.now()
    boxes = world.box_control
    boxes.launch(box, _job("a"))
    assert boxes.launch(box, _job("b", queued=True)).queued
    assert boxes.launch(box, _job("c", queued=True)).queued
    assert boxes.launch(box, _job("d", queued=True, mask=(1,))).queued  # a free slot: started at once
    probe = boxes.probe_many([box], timeout=5)[0]
    assert [(q.run_id, q.position) for q in probe.queued] == [("b", 0), ("c", 1)]
    world.clock.advance(250.0)  # a ends at 100, b runs 100-200, c starts at 200
    probe = boxes.probe_many([box], timeout=5)[0]
    runs = {r.run_id: r for r in probe.runs}
    assert runs["b"].started_at == t0 + 100 and runs["b"].exit_code == 0
    assert runs["c"].started_at == t0 + 200 and runs["c"].exit_code is None and runs["c"].pid is not None
    assert runs["d"].started_at == t0 and probe.queued == ()
    with pytest.raises(LaunchLockHeld):
        boxes.launch(box, _job("c", queued=True))


def test_a_killed_entry_never_starts_and_a_draining_box_takes_none() -> None:
    world = FakeWorld([offer(1)], work=lambda job: Work(seconds=100.0))
    box = _box(world)
    boxes = world.box_control
    boxes.launch(box, _job("a"))
    boxes.launch(box, _job("b", queued=True))
    boxes.kill(box, "b", 1, exit_code=137, reason="no longer desired")
    world.clock.advance(150.0)
    probe = boxes.probe_many([box], timeout=5)[0]
    runs = {r.run_id: r for r in probe.runs}
    assert runs["b"].started_at is None and runs["b"].exit_code == 137 and probe.queued == ()
    boxes.drain(box)
    assert boxes.probe_many([box], timeout=5)[0].draining
    with pytest.raises(RemoteCommandFailed, match="draining"):
        boxes.launch(box, _job("c", queued=True))


def test_the_epoch_fence_refuses_an_older_controller() -> None:
    world = FakeWorld([offer(1)], work=lambda job: Work(seconds=100.0))
    box = _box(world)
    boxes = world.box_control
    boxes.launch(box, _job("a", epoch=3))
    assert boxes.probe_many([box], timeout=5)[0].epoch == 3
    with pytest.raises(RemoteCommandFailed, match="fenced"):
        boxes.launch(box, _job("b", queued=True, epoch=2))
    boxes.launch(box, _job("c", queued=True, epoch=4))
    assert boxes.probe_many([box], timeout=5)[0].epoch == 4
