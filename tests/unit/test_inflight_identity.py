"""The process group a launch recorded travels with its attempt: apply records it from launch's answer, the launch
journal and runs.yaml's ``in_flight`` keep it (older lines without it still read), and a kill carries it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from fakes import FakeArchive, FakeClock, FakeWorld, code_tar, desired_state, observe_and_plan, offer

from reconciler.adapters.launch_journal import FileLaunchJournal
from reconciler.apply import ApplyContext, apply
from reconciler.core.actions import Kill, Launch, Plan, ReasonCode, Rent, Requeue
from reconciler.core.model import Desired, FleetMemory, InFlight, Instance, Observed
from reconciler.observed.codec import RUNS
from reconciler.observed.memory import fleet_memory_from_files, in_flight_entries
from reconciler.plan.attempts import recorded_group
from reconciler.ports import Launched, LaunchJob
from reconciler.remote.launched import launch_answer

ROOT = Path(__file__).resolve().parents[2]


class AnsweringBoxes:
    """The fake boxes, answering a launch as ``launch.sh`` does (``PID START``) and noting each kill's identity."""

    def __init__(self, world: FakeWorld, answer: str) -> None:
        self.inner = world.box_control
        self.answer = answer
        self.kills: list[tuple[str, int, int | None, int | None]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def launch(self, box: Instance, job: LaunchJob) -> Launched:
        self.inner.launch(box, job)
        return launch_answer(self.answer.encode())  # read as the box-control adapter reads it

    def kill(
        self,
        box: Instance,
        run_id: str,
        attempt: int,
        *,
        exit_code: int,
        reason: str,
        pid: int | None = None,
        pid_started: int | None = None,
    ) -> None:
        self.kills.append((run_id, attempt, pid, pid_started))
        self.inner.kill(box, run_id, attempt, exit_code=exit_code, reason=reason)


def _ctx(
    world: FakeWorld, boxes: AnsweringBoxes, desired: Desired, observed: Observed, epoch: int = 0
) -> ApplyContext:
    return ApplyContext(
        epoch=lambda: epoch,
        provider=world.provider,
        boxes=boxes,
        desired=desired,
        observed=observed,  # type: ignore[arg-type]
        archive=FakeArchive(),
        code_tar=code_tar,
        now=world.clock.now,
    )


def _launch_on_a_ready_box(
    answer: str, epoch: int = 0, noted: list[InFlight] | None = None
) -> tuple[FakeWorld, AnsweringBoxes, Desired, InFlight, str]:
    desired = desired_state(1, max_instances=1)
    world = FakeWorld([offer(1, gpus=2)], clock=FakeClock(), boot_s=10.0)
    boxes = AnsweringBoxes(world, answer)
    archive = FakeArchive()
    observed, p = observe_and_plan(world, desired, archive)
    assert [type(a) for a in p.actions] == [Rent]
    apply(p, _ctx(world, boxes, desired, observed))
    world.clock.advance(11.0)
    observed, p = observe_and_plan(world, desired, archive)
    launches = [a for a in p.actions if isinstance(a, Launch)]
    assert len(launches) == 1
    ctx = _ctx(world, boxes, desired, observed, epoch)
    if noted is not None:
        ctx = replace(ctx, note_launch=noted.append)
    result = apply(Plan(actions=tuple(launches)), ctx)
    assert result.failures == []
    (flight,) = result.launched
    return world, boxes, desired, flight, result.outcomes[0].detail


def test_apply_records_the_launch_answer_as_the_attempts_process_group() -> None:
    _, _, _, flight, detail = _launch_on_a_ready_box("4321 987654\n")
    assert (flight.pid, flight.pid_started, flight.epoch) == (4321, 987654, 0)
    assert detail == "pid 4321 (started at tick 987654)"


def test_a_launch_is_stamped_with_the_lease_epoch_it_was_made_under() -> None:
    noted: list[InFlight] = []
    _, _, _, flight, _ = _launch_on_a_ready_box("4321 987654\n", epoch=1_790_000_000_123, noted=noted)
    assert flight.epoch == 1_790_000_000_123
    assert [f.epoch for f in noted] == [1_790_000_000_123]  # the journal has it before the launch is sent
    (entry,) = in_flight_entries((flight,))
    assert entry["epoch"] == 1_790_000_000_123


def test_a_launch_answer_that_names_no_group_of_ours_records_none() -> None:
    for answer in ("1 987654", "-1 5", "0 0", "1; rm -rf / 5", "", "garbage"):
        _, _, _, flight, detail = _launch_on_a_ready_box(answer)
        assert (flight.pid, flight.pid_started) == (None, None), answer
        assert detail == "launched"
    _, _, _, flight, _ = _launch_on_a_ready_box("4321")  # a pid without its start is no identity either
    assert (flight.pid, flight.pid_started) == (None, None)


def test_a_kill_carries_its_recorded_identity_to_the_box() -> None:
    world, boxes, desired, flight, _ = _launch_on_a_ready_box("4321 987654")
    observed, _ = observe_and_plan(world, desired, FakeArchive())
    observed = replace(observed, memory=FleetMemory(in_flight=(flight,)))
    kill = Kill(
        reason="past max_runtime",
        code=ReasonCode.MAX_RUNTIME,
        instance_id=flight.instance_id,
        run_id=flight.run_id,
        attempt=flight.attempt,
        pid=flight.pid,
        pid_started=flight.pid_started,
    )
    result = apply(Plan(actions=(kill,)), _ctx(world, boxes, desired, observed))
    assert result.failures == []
    assert boxes.kills == [(flight.run_id, flight.attempt, 4321, 987654)]


def test_the_journal_keeps_the_identity_and_reads_older_lines_without_it(tmp_path: Path) -> None:
    j = FileLaunchJournal(tmp_path)
    known = InFlight("r1", 1, 7, (0,), 100.0, sweep="s", pid=4321, pid_started=987654, epoch=3)
    j.reset([known])
    with open(j.path, "a") as fh:
        fh.write(
            json.dumps(
                {
                    "run_id": "r2",
                    "attempt": 2,
                    "instance_id": 7,
                    "gpu_mask": [1],
                    "launched_at": 5.0,
                    "sweep": "s",
                    "resumed_from": None,
                }
            )
            + "\n"
        )  # a line of an older version
        fh.write(
            json.dumps(
                {
                    "run_id": "r3",
                    "attempt": 1,
                    "instance_id": 7,
                    "gpu_mask": [],
                    "launched_at": 5.0,
                    "pid": 1,
                    "pid_started": -4,
                    "epoch": "x",
                }
            )
            + "\n"
        )  # a pid <= 1 is never kept
    assert j.read() == [
        known,
        InFlight("r2", 2, 7, (1,), 5.0, sweep="s"),
        InFlight("r3", 1, 7, (), 5.0),
    ]


def test_runs_yaml_in_flight_keeps_the_identity_and_validates() -> None:
    flights = (
        InFlight("r1", 1, 7, (0,), 1_800_000_000.0, sweep="s", pid=4321, pid_started=987654, epoch=2),
        InFlight("r2", 1, 7, (1,), 1_800_000_000.0, sweep="s"),
    )
    entries = in_flight_entries(flights)
    assert entries[0]["pid"] == 4321 and entries[0]["pid_started"] == 987654 and entries[0]["epoch"] == 2
    assert "pid" not in entries[1] and "epoch" not in entries[1]  # entries without it stay as they were
    schema = json.loads((ROOT / "schemas" / "observed-runs.schema.json").read_text())
    item = schema["properties"]["in_flight"]["items"]
    for e in entries:
        jsonschema.Draft202012Validator(item).validate(e)

    back = fleet_memory_from_files({RUNS: yaml.safe_dump({"in_flight": entries})}).in_flight
    assert back == flights
    forged = [{**entries[0], "pid": 1}]
    (read,) = fleet_memory_from_files({RUNS: yaml.safe_dump({"in_flight": forged})}).in_flight
    assert read.pid is None


def test_a_requeue_ends_the_attempt_by_the_identity_its_launch_recorded() -> None:
    world, boxes, desired, flight, _ = _launch_on_a_ready_box("4321 987654")
    observed, _ = observe_and_plan(world, desired, FakeArchive())
    observed = replace(observed, memory=FleetMemory(in_flight=(flight,)))
    requeue = Requeue(
        reason="heartbeat stale",
        code=ReasonCode.HEARTBEAT_STALE,
        run_id=flight.run_id,
        attempt=flight.attempt,
        instance_id=flight.instance_id,
        pid=flight.pid,  # the planner carries the launch's identity on the action (plan.attempts.recorded_group)
        pid_started=flight.pid_started,
    )
    result = apply(Plan(actions=(requeue,)), _ctx(world, boxes, desired, observed))
    assert result.failures == []
    assert boxes.kills == [(flight.run_id, flight.attempt, 4321, 987654)]


def test_a_kill_or_requeue_may_signal_only_the_group_its_launch_on_that_box_recorded() -> None:
    flight = InFlight("r", 1, 7, (0,), 100.0, pid=4321, pid_started=987654)
    assert recorded_group(flight, 7) == (4321, 987654)
    assert recorded_group(flight, 8) == (None, None)  # launched elsewhere: nothing of it to signal here
    assert recorded_group(None, 7) == (None, None)
    for forged in (1, 0, -1):
        assert recorded_group(replace(flight, pid=forged), 7) == (None, None)
