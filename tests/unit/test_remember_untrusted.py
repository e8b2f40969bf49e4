"""remember.py against a box that lies: heartbeats on the controller's clock, failed actions, distrusted boxes."""

from __future__ import annotations

from dataclasses import replace

from reconciler.core.actions import ApplyResult, Kill, Launch, Outcome, ReasonCode, Record, Requeue, ShipCode
from reconciler.core.model import (
    BoxProbe,
    DistrustedBox,
    FailedAction,
    Fleet,
    FleetMemory,
    HeartbeatClock,
    InFlight,
    Instance,
    InstanceStatus,
    Observed,
    RunDirState,
)
from reconciler.core.remember import Applied, Observation, next_in_flight, remember, track_heartbeats

try:
    from .plan_case_io import build_desired
except ImportError:  # run as a top-level module
    from plan_case_io import build_desired  # type: ignore[no-redef]

NOW = 1_000_000.0
FLEET = Fleet(name="lab")
DESIRED = build_desired({"runs": [{"id": "r"}]})


def box(iid: int) -> Instance:
    return Instance(iid, f"rigsync:lab:abc-{iid}", InstanceStatus.RUNNING, "RTX 3090", 1, 24576, 0.2, NOW - 600)


def beating(run_id: str, age: float, attempt: int = 1) -> RunDirState:
    return RunDirState(run_id, attempt, (0,), pid_alive=True, started_at=NOW - 60, heartbeat_age_s=age, exit_code=None)


def probe(iid: int, *runs: RunDirState, reachable: bool = True) -> BoxProbe:
    return BoxProbe(iid, reachable=reachable, runs=runs)


FLYING = (InFlight("r", 1, 1, (0,), NOW - 600),)


def test_a_heartbeat_is_tracked_on_the_controllers_clock_from_first_sight() -> None:
    first = track_heartbeats((), FLYING, [probe(1, beating("r", 5.0))], NOW)
    assert first == (HeartbeatClock("r", 1, NOW - 5.0, NOW),)
    # it moved forward (written 30 s later by this clock): since moves to now
    moved = track_heartbeats(first, FLYING, [probe(1, beating("r", 5.0))], NOW + 30)
    assert moved == (HeartbeatClock("r", 1, NOW + 25.0, NOW + 30),)


def test_a_frozen_or_future_heartbeat_keeps_its_since() -> None:
    future = track_heartbeats((), FLYING, [probe(1, beating("r", -1000.0))], NOW)
    assert future == (HeartbeatClock("r", 1, NOW + 1000.0, NOW),)
    # a heartbeat file the box no longer touches ages with the box's clock: its implied time stays put
    later = track_heartbeats(future, FLYING, [probe(1, beating("r", -1000.0 + 120.0))], NOW + 120)
    assert later == future
    # jitter under a second is no movement either
    assert track_heartbeats(future, FLYING, [probe(1, beating("r", -990.5))], NOW + 10) == future


def test_only_our_attempts_on_their_own_box_are_tracked() -> None:
    probes = [probe(1, beating("x", 1.0), beating("r", 1.0, attempt=7)), probe(2, beating("r", 1.0))]
    assert track_heartbeats((), FLYING, probes, NOW) == ()


def test_an_attempt_not_shown_this_cycle_keeps_its_clock_while_in_flight_and_goes_after() -> None:
    old = (HeartbeatClock("r", 1, NOW - 100.0, NOW - 90.0), HeartbeatClock("gone", 1, NOW - 100.0, NOW - 90.0))
    assert track_heartbeats(old, FLYING, [probe(1, reachable=False)], NOW) == (old[0],)


def test_an_observation_keeps_the_heartbeats_and_drops_distrust_of_unlisted_boxes() -> None:
    distrusted = (DistrustedBox(1, NOW - 30, "kill failed"), DistrustedBox(2, NOW - 30, "kill failed"))
    memory = FleetMemory(in_flight=FLYING, distrusted=distrusted)
    seen = Observation(DESIRED, (box(1),), (box(1),), (probe(1, beating("r", 2.0)),), None, NOW)
    after = remember(memory, seen)
    assert after.heartbeats == (HeartbeatClock("r", 1, NOW - 2.0, NOW),)
    assert after.distrusted == (distrusted[0],)


def test_failed_actions_are_remembered_for_one_cycle_and_a_failed_kill_distrusts_its_box() -> None:
    kill = Kill(reason="max runtime", code=ReasonCode.MAX_RUNTIME, instance_id=1, run_id="r", attempt=1, pid=4242)
    record = Record(reason="exited", code=ReasonCode.EXITED, run_id="q", attempt=1, instance_id=2, phase="failed")
    observed = Observed(instances=(box(1), box(2)), fleet_name="lab")
    memory = FleetMemory(in_flight=FLYING)
    applied = ApplyResult(outcomes=[Outcome(kill, False, "kill.sh exited 3\x1b[2J"), Outcome(record, False, "tar")])
    after = remember(memory, Applied(observed, applied, FLEET, NOW))
    assert after.failed_actions == (
        FailedAction("kill", "run/r.1@1", "kill.sh exited 3\\x1b[2J"),
        FailedAction("record", "run/q.1", "tar"),
    )
    assert after.distrusted == (DistrustedBox(1, NOW, "kill run/r.1@1 failed: kill.sh exited 3\\x1b[2J"),)
    # the next apply succeeded: nothing failed last cycle, but the box stays distrusted from when it first was
    later = remember(after, Applied(observed, ApplyResult(), FLEET, NOW + 60))
    assert later.failed_actions == () and later.distrusted == after.distrusted
    # a skipped action did not fail
    skipped = ApplyResult(outcomes=[Outcome(record, False, "lease lost", skipped=True)])
    assert remember(memory, Applied(observed, skipped, FLEET, NOW)).failed_actions == ()


def test_what_a_box_shows_running_never_becomes_in_flight() -> None:
    observed = Observed(instances=(box(1),), probes=(probe(1, beating("forged", 1.0)),), fleet_name="lab")
    assert next_in_flight((), observed, ApplyResult(), 0.0) == ()
    assert next_in_flight(FLYING, replace(observed, memory=FleetMemory(in_flight=FLYING)), ApplyResult(), 0.0) == FLYING


def test_a_failed_requeue_from_a_box_that_answered_distrusts_it_too() -> None:
    requeue = Requeue(reason="lost", code=ReasonCode.HEARTBEAT_STALE, run_id="r", attempt=1, instance_id=1)
    applied = ApplyResult(outcomes=[Outcome(requeue, False, "ssh: connection closed")])
    after = remember(FleetMemory(in_flight=FLYING), Applied(Observed(instances=(box(1),)), applied, FLEET, NOW))
    assert after.distrusted == (DistrustedBox(1, NOW, "requeue run/r.1 failed: ssh: connection closed"),)


def test_a_distrusted_box_is_vetted_unreachable_with_its_reason() -> None:
    memory = FleetMemory(distrusted=(DistrustedBox(1, NOW - 30, "kill run/r.1@1 failed: x"),))
    vetted = memory.vetted(probe(1, beating("r", 1.0)))
    assert (vetted.reachable, vetted.unusable) == (False, "distrusted: kill run/r.1@1 failed: x")
    other = probe(2, beating("r", 1.0))
    assert memory.vetted(other) is other


def test_work_that_fails_on_a_box_that_answered_two_cycles_running_distrusts_the_box() -> None:
    ship = ShipCode(reason="code missing", code=ReasonCode.CODE_MISSING, instance_id=1, commit="c0ffee")
    observed = Observed(instances=(box(1), box(2)), fleet_name="lab")

    def cycle(memory: FleetMemory, *outcomes: Outcome) -> FleetMemory:
        return remember(memory, Applied(observed, ApplyResult(outcomes=list(outcomes)), FLEET, NOW))

    full = "RemoteCommandFailed: exit 1: tar: No space left on device"
    once = cycle(FleetMemory(), Outcome(ship, False, full))
    assert once.distrusted == ()  # one failure may pass
    twice = cycle(once, Outcome(ship, False, full))
    assert twice.distrusted == (DistrustedBox(1, NOW, f"ship_code instance/1 failed: {full}"),)
    # a launch of another attempt number on the same box is the same kind of work on it
    launch = [
        Launch(
            reason="pending", code=ReasonCode.PENDING_RUN, instance_id=2, run_id="r", attempt=n, gpu_mask=(0,),
            command="true", code_commit=None,
        )
        for n in (1, 2)
    ]
    first = cycle(FleetMemory(), Outcome(launch[0], False, "RemoteCommandFailed: exit 1: runs/r.1: disk full"))
    second = cycle(first, Outcome(launch[1], False, "RemoteCommandFailed: exit 1: runs/r.2: disk full"))
    assert [d.instance_id for d in second.distrusted] == [2]
    # a box that did not answer, or a launch fenced by its own lock, says nothing against the box
    down = "HostUnreachable: 127.0.1.9:22: no answer within 60s"
    assert cycle(cycle(FleetMemory(), Outcome(ship, False, down)), Outcome(ship, False, down)).distrusted == ()
    held = "LaunchLockHeld: launch lock held"
    lock = cycle(FleetMemory(), Outcome(launch[0], False, held))
    assert cycle(lock, Outcome(launch[1], False, held)).distrusted == ()
