"""The apply boundary over in-memory fakes of the ports: one action's exception, of any kind, fails that action only.

Plans come from the real ``plan()`` on what the real ``observe()`` sees of a ``FakeWorld``; the real ``apply()``
carries them out through the ``Provider`` and ``BoxControl`` ports, into which faults are injected.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest
from fakes import (
    FakeArchive,
    FakeClock,
    FakeWorld,
    MemoryLeaseStore,
    code_tar,
    desired_state,
    observe_and_plan,
    offer,
)

from reconciler.adapters.lease import GitLease
from reconciler.apply import ApplyContext, ApplyResult, apply
from reconciler.core.actions import CloseBill, Launch, Plan, Rent, ShipCode
from reconciler.core.model import BoxSpend, Controller, Desired, FleetMemory, InFlight, MetricGoal, Observed, Spend
from reconciler.core.remember import next_in_flight
from reconciler.errors import HostUnreachable, LaunchLockHeld, LeaseLost
from reconciler.observe import observe
from reconciler.plan import plan
from reconciler.ports import Fence, LaunchJob, RentalAsk


def _ctx(world: FakeWorld, desired: Desired, observed: Observed, archive: FakeArchive) -> ApplyContext:
    return ApplyContext(
        provider=world.provider,
        boxes=world.box_control,
        desired=desired,
        observed=observed,
        archive=archive,
        code_tar=code_tar,
        now=world.clock.now,
    )


def _apply(world: FakeWorld, desired: Desired, observed: Observed, p: Plan, archive: FakeArchive) -> ApplyResult:
    return apply(p, _ctx(world, desired, observed, archive))


def _ready_box(desired: Desired) -> tuple[FakeWorld, FakeArchive]:
    """A world where the fleet has rented one two-GPU box that has booted."""
    world = FakeWorld([offer(1, gpus=2)], clock=FakeClock(), boot_s=10.0)
    archive = FakeArchive()
    observed, p = observe_and_plan(world, desired, archive)
    assert [type(a) for a in p.actions] == [Rent]
    assert _apply(world, desired, observed, p, archive).failures == []
    world.clock.advance(11.0)
    return world, archive


def test_an_oserror_from_the_shell_fails_that_launch_and_the_rest_of_the_plan_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    desired = desired_state(2, max_instances=1)
    world, archive = _ready_box(desired)
    observed, p = observe_and_plan(world, desired, archive)
    launches = [a for a in p.actions if isinstance(a, Launch)]
    assert len(launches) == 2 and any(isinstance(a, ShipCode) for a in p.actions)

    world.fail_next("launch", OSError("Socket is closed"))  # what paramiko raises when a channel dies
    with caplog.at_level(logging.WARNING, logger="rigsync.apply"):
        result = _apply(world, desired, observed, p, archive)

    assert len(result.outcomes) == len(p.actions)
    failed = result.failures
    assert len(failed) == 1
    lost = failed[0].action
    assert isinstance(lost, Launch) and failed[0].detail == "OSError: Socket is closed"
    assert result.failure_lines() == (f"launch {lost.target}: OSError: Socket is closed",)
    assert all(o.ok for o in result.outcomes if o is not failed[0])
    assert [f.run_id for f in result.launched] == [a.run_id for a in launches if a is not lost]
    assert len(world.live_runs()) == 1
    logged = [r for r in caplog.records if r.exc_info]
    assert len(logged) == 1 and logged[0].exc_info is not None and logged[0].exc_info[0] is OSError

    # The next cycle plans the failed launch again, and it succeeds.
    observed, p = observe_and_plan(world, desired, archive)
    assert [a.run_id for a in p.actions if isinstance(a, Launch)] == [lost.run_id]
    assert _apply(world, desired, observed, p, archive).failures == []
    assert len(world.live_runs()) == 2


def test_a_keyerror_from_the_provider_sdk_fails_that_rent_only(caplog: pytest.LogCaptureFixture) -> None:
    desired = desired_state(2, max_instances=2)
    world = FakeWorld([offer(1), offer(2)], clock=FakeClock())
    archive = FakeArchive()
    observed, p = observe_and_plan(world, desired, archive)
    assert [type(a) for a in p.actions] == [Rent, Rent]

    world.fail_next("create_instance", KeyError("new_contract"))  # a reply without the field the SDK indexes
    with caplog.at_level(logging.WARNING, logger="rigsync.apply"):
        result = _apply(world, desired, observed, p, archive)

    assert [o.ok for o in result.outcomes] == [False, True]
    assert result.outcomes[0].detail == "KeyError: 'new_contract'"
    assert len(result.rented) == 1 and list(world.rentals) == result.rented
    assert any(r.exc_info and r.exc_info[0] is KeyError for r in caplog.records)


def test_a_rent_tells_the_provider_what_it_asked_for_so_the_box_can_be_read_back() -> None:
    desired = desired_state(1, max_instances=1)
    world = FakeWorld([offer(1, gpus=2)], clock=FakeClock())
    archive = FakeArchive()
    observed, p = observe_and_plan(world, desired, archive)
    (rent,) = [a for a in p.actions if isinstance(a, Rent)]
    _apply(world, desired, observed, p, archive)
    assert world.rent_asks == {rent.offer_id: RentalAsk(rent.gpu_name, rent.num_gpus, rent.dph)}
    assert rent.gpu_name == world.rentals[next(iter(world.rentals))].instance.gpu_name


def test_our_own_errors_fail_the_action_without_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    desired = desired_state(2, max_instances=1)
    world, archive = _ready_box(desired)
    observed, p = observe_and_plan(world, desired, archive)
    assert _apply(world, desired, observed, p, archive).failures == []

    with caplog.at_level(logging.WARNING, logger="rigsync.apply"):
        again = _apply(world, desired, observed, p, archive)  # the same plan once more: the launch lock holds

    assert [o.detail.split(":")[0] for o in again.failures] == ["LaunchLockHeld", "LaunchLockHeld"]
    assert all(o.ok for o in again.outcomes if not isinstance(o.action, Launch))  # shipping code is idempotent
    assert not [r for r in caplog.records if r.exc_info]
    assert len(world.live_runs()) == 2


def test_keyboard_interrupt_is_not_an_action_failure() -> None:
    desired = desired_state(2, max_instances=1)
    world, archive = _ready_box(desired)
    observed, p = observe_and_plan(world, desired, archive)
    world.fail_next("launch", KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        _apply(world, desired, observed, p, archive)


# ------------------------------------------------------------------------------------------------ fencing


def _lease_fence(
    world: FakeWorld, store: MemoryLeaseStore, *, stale_after: float, action_s: float
) -> tuple[GitLease, Fence]:
    """Holder A's lease, acquired now and never renewed; each fenced action takes ``action_s`` of the world's time."""
    lease = GitLease(store, holder="a", host="hostA", pid=1, stale_after=stale_after, renew_every=10_000)
    lease.acquire(world.clock.now())

    def fence() -> None:
        lease.check(world.clock.now())
        world.clock.advance(action_s)  # the action about to run takes this long

    return lease, fence


def test_the_fence_stops_apply_at_the_deadline_and_the_rest_is_skipped(tmp_path: Path) -> None:
    desired = desired_state(2, max_instances=1)
    world, archive = _ready_box(desired)
    observed, p = observe_and_plan(world, desired, archive)
    assert [type(a) for a in p.actions] == [ShipCode, Launch, Launch]
    # stale after 100 s, margin 25 s: A may act until 75 s after its heartbeat; each action takes 40 s.
    lease, fence = _lease_fence(world, MemoryLeaseStore(), stale_after=100.0, action_s=40.0)
    assert lease.deadline() == world.clock.now() + 75.0

    result = apply(p, replace(_ctx(world, desired, observed, archive), fence=fence))

    assert [o.ok for o in result.outcomes] == [True, True, False]
    last = result.outcomes[-1]
    assert last.skipped and last.detail.startswith("not run: lease lost: the lease's fencing deadline passed")
    assert result.lease_lost is not None and result.failures == []  # skipped, not failed
    assert [c for c in world.calls if c.startswith("launch")] == [f"launch {last.action.target.split('@')[1]} "
                                                                   f"{result.launched[0].run_id}.1"]
    assert len(world.live_runs()) == 1


def test_holder_a_lost_mid_apply_holder_b_takes_over_and_no_run_is_launched_twice(tmp_path: Path) -> None:
    desired = desired_state(4, max_instances=1)
    world = FakeWorld([offer(1, gpus=4)], clock=FakeClock(), boot_s=10.0)
    archive = FakeArchive()
    observed, p = observe_and_plan(world, desired, archive)
    assert _apply(world, desired, observed, p, archive).failures == []
    world.clock.advance(11.0)

    # A plans 4 launches, then its apply is slow (25 s an action): its lease (stale after 100 s, so it may act
    # until 75 s) runs out after shipping the code and 2 launches.
    observed, p = observe_and_plan(world, desired, archive)
    assert sum(isinstance(a, Launch) for a in p.actions) == 4
    store = MemoryLeaseStore()
    a_lease, fence = _lease_fence(world, store, stale_after=100.0, action_s=25.0)
    a_result = apply(p, replace(_ctx(world, desired, observed, archive), fence=fence))
    assert a_result.lease_lost is not None and len(a_result.launched) == 2
    assert sum(o.skipped for o in a_result.outcomes) == 2

    # A acts no more. B takes the lease over once it is stale, and plans from the world alone: no memory of
    # what A launched this cycle (A committed nothing), the same archive in git.
    world.clock.advance(100.0)
    b_lease = GitLease(store, holder="b", host="hostB", pid=2, stale_after=100.0)
    decision = b_lease.acquire(world.clock.now())
    assert decision.takeover
    with pytest.raises(LeaseLost):
        a_lease.check(world.clock.now())
    observed, p = observe_and_plan(world, desired, archive)
    b_launches = [a for a in p.actions if isinstance(a, Launch)]
    assert {a.run_id for a in b_launches}.isdisjoint({f.run_id for f in a_result.launched})
    b_result = _apply(world, desired, observed, p, archive)
    assert b_result.failures == []

    launched = [c.split()[2] for c in world.calls if c.startswith("launch")]
    assert len(launched) == 4 and len(set(launched)) == 4  # every run once, each as attempt 1
    assert {run.run_id for _, run in world.live_runs()} == {r.id for r in desired.runs}


def _plan_with(
    world: FakeWorld, desired: Desired, archive: FakeArchive, in_flight: tuple[InFlight, ...]
) -> tuple[Observed, Plan]:
    now = world.clock.now()
    memory = FleetMemory(in_flight=in_flight)
    observed, _ = observe(desired, world.provider, world.box_control, tuple(archive.records()), memory, now)
    return observed, plan(desired, observed, Controller(), now)


def test_a_launch_that_failed_stays_in_flight_and_is_fenced_off_before_its_run_launches_again() -> None:
    """A launch whose command failed may still reach its box (a dropped connection, a box that hung with the
    command queued): its attempt stays in flight with its number, and the next cycle, finding no run directory,
    leaves a tombstone that a late arrival of that launch cannot pass before it starts the next attempt."""
    desired = desired_state(1, max_instances=1)
    world, archive = _ready_box(desired)
    observed, p = observe_and_plan(world, desired, archive)
    (launch,) = [a for a in p.actions if isinstance(a, Launch)]
    world.fail_next("launch", OSError("Socket is closed"))
    result = _apply(world, desired, observed, p, archive)
    assert [(f.run_id, f.attempt) for f in result.in_doubt] == [(launch.run_id, launch.attempt)]
    in_flight = next_in_flight((), observed, result, 0.0)
    assert [(f.run_id, f.attempt, f.instance_id) for f in in_flight] == [
        (launch.run_id, launch.attempt, launch.instance_id)
    ]

    observed, p = _plan_with(world, desired, archive, in_flight)
    kinds = [(a.kind.value, a.target, a.code.value) for a in p.actions]
    assert ("requeue", f"run/{launch.run_id}.1", "launch_never_happened") in kinds
    assert ("launch", f"run/{launch.run_id}.2@{launch.instance_id}", "pending_run") in kinds
    result = _apply(world, desired, observed, p, archive)
    assert result.failures == []
    assert [(r.run_id, r.attempt, r.phase.value) for r in archive.records()] == [(launch.run_id, 1, "lost")]

    box = next(i for i in observed.instances if i.id == launch.instance_id)
    late = LaunchJob(run_id=launch.run_id, attempt=1, gpu_mask=launch.gpu_mask, command=launch.command,
                     code_commit=launch.code_commit, desired_commit=None, sweep=launch.sweep, params=(), seed=0,
                     metrics_file="metrics.jsonl", metric_key=None, metric_goal=MetricGoal.MAX, max_runtime_s=60.0)
    with pytest.raises(LaunchLockHeld):
        world.box_control.launch(box, late)
    assert [(r.run_id, r.attempt) for _, r in world.live_runs()] == [(launch.run_id, 2)]


def test_a_requeue_whose_kill_fails_is_not_counted_and_its_run_is_not_launched_again_in_that_apply() -> None:
    desired = desired_state(1, max_instances=1)
    world, archive = _ready_box(desired)
    observed, p = observe_and_plan(world, desired, archive)
    (launch,) = [a for a in p.actions if isinstance(a, Launch)]
    world.fail_next("launch", OSError("Socket is closed"))
    in_flight = next_in_flight((), observed, _apply(world, desired, observed, p, archive), 0.0)

    observed, p = _plan_with(world, desired, archive, in_flight)
    assert {a.kind.value for a in p.actions} == {"requeue", "launch"}
    world.fail_next("kill", HostUnreachable("127.0.0.1:22: no answer within 10s"))  # the box stops answering
    result = _apply(world, desired, observed, p, archive)
    outcome = {o.action.kind.value: o for o in result.outcomes}
    assert not outcome["requeue"].ok and "no answer" in outcome["requeue"].detail
    assert outcome["launch"].skipped and outcome["launch"].detail.startswith("not run: requeue of attempt 1 failed")
    assert list(archive.records()) == [] and world.live_runs() == []
    # still in flight: the next cycle decides again
    assert [(f.run_id, f.attempt) for f in next_in_flight(in_flight, observed, result, 0.0)] == [(launch.run_id, 1)]


def test_a_close_bill_waits_while_an_attempt_on_the_box_is_not_archived_and_then_archives_its_overhead() -> None:
    """The planner decides which bill closes (``close_bill``) and that it needs the requeue of the attempt still in
    flight on its box (``actions.NEEDS``); apply only executes it, and holds it back while that attempt is not
    archived (its cost must be in the archive before the remainder): here a suspended fleet withholds the requeue
    (a failed requeue: ``test_apply_needs``)."""
    desired = desired_state(1, max_instances=1)
    suspended = replace(desired, fleet=replace(desired.fleet, suspend=True))
    world = FakeWorld([], clock=FakeClock())
    archive = FakeArchive()
    now = world.clock.now()
    gone = BoxSpend(7, usd=0.25, at=now, gone_at=now - 60, dph=0.2, num_gpus=1)
    flying = InFlight(desired.runs[0].id, 1, 7, (0,), now - 600)
    observed = Observed(memory=FleetMemory(spend=Spend(total_usd=0.25, boxes=(gone,)), in_flight=(flying,)))
    p = plan(suspended, observed, Controller(), now)
    (close,) = p.actions
    assert isinstance(close, CloseBill) and close.needs == (f"requeue run/{flying.run_id}.1",)
    held = _apply(world, suspended, observed, p, archive)
    assert held.failures == [] and held.outcomes[0].skipped and held.overheads == []
    assert held.outcomes[0].detail == f"not run: run/{flying.run_id}.1 is not archived"
    observed = replace(observed, memory=replace(observed.memory, in_flight=()))
    done = _apply(world, desired, observed, plan(suspended, observed, Controller(), now), archive)
    assert done.failures == [] and [(o.instance_id, o.cost_usd) for o in done.overheads] == [(7, 0.25)]
    assert list(archive.overheads()) == done.overheads


def test_a_box_that_stops_answering_is_sent_nothing_more_in_that_apply() -> None:
    desired = desired_state(2, max_instances=1)
    world, archive = _ready_box(desired)
    observed, p = observe_and_plan(world, desired, archive)
    launches = [a for a in p.actions if isinstance(a, Launch)]
    assert len(launches) == 2 and len({a.instance_id for a in launches}) == 1
    # the code is on the box already: only the launches are left, and the box hangs after its probe answered
    result = _apply(world, desired, observed, Plan(actions=tuple(a for a in p.actions if not isinstance(a, Launch))),
                    archive)
    assert result.failures == []
    world.hang(launches[0].instance_id)
    world.calls.clear()
    result = _apply(world, desired, observed, Plan(actions=tuple(launches)), archive)

    first, second = result.outcomes
    assert not first.ok and not first.skipped and "no answer within 60s" in first.detail
    assert second.skipped and not second.ok
    box_id = launches[0].instance_id
    assert second.detail.startswith(f"not run: instance/{box_id} stopped answering earlier in this apply (")
    assert second.detail.endswith("no answer within 60s)")
    assert [c for c in world.calls if c.startswith("launch")] == [
        f"launch {box_id} {launches[0].run_id}.{launches[0].attempt}"  # the second launch never reached the port
    ]
    assert [f.run_id for f in result.in_doubt] == [launches[0].run_id]  # the one sent may have reached it
    assert result.launched == []
