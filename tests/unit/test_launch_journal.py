"""The launch journal: a launch a crash kept out of git keeps its attempt number on restart.

Over the in-memory fakes (``fakes.py``) with the real ``Reconciler``: a launch, a crash before its cycle committed
anything, the box hangs before any controller probes it again. The restarted controller, rebuilt from what git
knows (nothing) plus the journal, must not launch that same attempt number elsewhere: the attempt waits through
the grace period, is archived lost, and the run finishes as the next attempt. (Found by bench/chaos.py's
``kill_launch_hang``: without the journal attempt 1 ran on two boxes.)
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from fakes import (
    FakeArchive,
    FakeClock,
    FakeWorld,
    Work,
    desired_state,
    fake_reconciler,
    offer,
)

from reconciler.adapters.launch_journal import FileLaunchJournal
from reconciler.core.actions import Launch
from reconciler.core.model import AttemptOutcome, FleetMemory, InFlight
from reconciler.core.remember import merge_in_flight

STEP_S = 20.0


def _flight(run: str, attempt: int, box: int = 7) -> InFlight:
    return InFlight(run_id=run, attempt=attempt, instance_id=box, gpu_mask=(0,), launched_at=100.0, sweep="s")


def test_the_journal_round_trips_skips_a_torn_line_and_is_reset(tmp_path: Path) -> None:
    j = FileLaunchJournal(tmp_path)
    assert j.read() == []
    j.note(_flight("r1", 1))
    j.note(_flight("r2", 3, box=9))
    with open(j.path, "a") as fh:
        fh.write('{"run_id": "r3", "att')  # a crash mid-write
    assert j.read() == [_flight("r1", 1), _flight("r2", 3, box=9)]
    j.reset([_flight("r2", 3, box=9)])
    assert j.read() == [_flight("r2", 3, box=9)]


def test_a_queued_launch_comes_back_queued(tmp_path: Path) -> None:
    j = FileLaunchJournal(tmp_path)
    queued = replace(_flight("r1", 2), queued=True, epoch=4, seen_started_at=130.5)
    j.note(queued)
    assert j.read() == [queued]


def test_merge_adds_only_what_neither_in_flight_nor_the_archive_knows() -> None:
    known = (_flight("r1", 1),)
    journal = [_flight("r1", 1, box=8), _flight("r2", 1), _flight("r3", 2)]
    merged = merge_in_flight(known, journal, archived={("r3", 2)})
    assert merged == (_flight("r1", 1), _flight("r2", 1))
    assert merge_in_flight(known, [], set()) is known



def test_a_launch_lost_to_a_crash_is_not_launched_again_under_the_same_number(tmp_path: Path) -> None:
    desired = desired_state(1, max_instances=2)
    world = FakeWorld([offer(1, gpus=1), offer(2, gpus=1), offer(3, gpus=1)], clock=FakeClock(), boot_s=30.0,
                      work=lambda job: Work(seconds=300.0))
    archive = FakeArchive()
    journal = FileLaunchJournal(tmp_path)
    first = fake_reconciler(world, archive, journal=journal, memory=FleetMemory())
    for _ in range(20):
        first.cycle(desired)
        if world.live_runs():
            break
        world.clock.advance(STEP_S)
    [(box, run)] = world.live_runs()
    assert [(f.run_id, f.attempt, f.instance_id) for f in journal.read()] == [(run.run_id, run.attempt, box)]

    # kill -9 before the cycle's commit: git knows nothing of the launch; then the box hangs.
    world.hang(box)
    archived = {r.key for r in archive.records()}
    second = fake_reconciler(
        world, archive, journal=journal, memory=FleetMemory(in_flight=merge_in_flight((), journal.read(), archived))
    )
    launches: list[str] = []
    for _ in range(60):
        res = second.cycle(desired)
        launches += [f"{a.run_id}.{a.attempt}" for a in res.plan.actions if isinstance(a, Launch)]
        if any(r.phase is AttemptOutcome.SUCCEEDED for r in archive.records()):
            break
        world.clock.advance(STEP_S)
    records = [(r.run_id, r.attempt, r.phase, r.instance_id) for r in archive.records()]
    assert f"{run.run_id}.{run.attempt}" not in launches, (launches, records)
    assert (run.run_id, run.attempt, AttemptOutcome.LOST, box) in records, records
    assert any(p is AttemptOutcome.SUCCEEDED and a == run.attempt + 1 for _, a, p, _ in records), records
