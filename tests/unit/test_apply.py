"""The apply boundary over in-memory fakes of the ports: one action's exception, of any kind, fails that action only.

Plans come from the real ``plan()`` on what the real ``observe()`` sees of a ``FakeWorld``; the real ``apply()``
carries them out through the ``Provider`` and ``BoxControl`` ports, into which faults are injected.
"""

from __future__ import annotations

import logging

import pytest
from fakes import FakeArchive, FakeClock, FakeWorld, code_tar, desired_state, offer

from reconciler.actions import Launch, Plan, Rent, ShipCode
from reconciler.apply import ApplyContext, ApplyResult, apply
from reconciler.model import Desired, FleetMemory, Observed
from reconciler.observe import observe
from reconciler.plan import plan


def _observe_and_plan(world: FakeWorld, desired: Desired, archive: FakeArchive) -> tuple[Observed, Plan]:
    now = world.clock.now()
    observed, _ = observe(desired, world.provider, world.box_control, tuple(archive.records()), FleetMemory(), now)
    return observed, plan(desired, observed, now)


def _apply(world: FakeWorld, desired: Desired, observed: Observed, p: Plan, archive: FakeArchive) -> ApplyResult:
    ctx = ApplyContext(
        provider=world.provider,
        boxes=world.box_control,
        desired=desired,
        observed=observed,
        archive=archive,
        code_tar=code_tar,
        now=world.clock.now,
    )
    return apply(p, ctx)


def _ready_box(desired: Desired) -> tuple[FakeWorld, FakeArchive]:
    """A world where the fleet has rented one two-GPU box that has booted."""
    world = FakeWorld([offer(1, gpus=2)], clock=FakeClock(), boot_s=10.0)
    archive = FakeArchive()
    observed, p = _observe_and_plan(world, desired, archive)
    assert [type(a) for a in p.actions] == [Rent]
    assert _apply(world, desired, observed, p, archive).failures == []
    world.clock.advance(11.0)
    return world, archive


def test_an_oserror_from_the_shell_fails_that_launch_and_the_rest_of_the_plan_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    desired = desired_state(2, max_instances=1)
    world, archive = _ready_box(desired)
    observed, p = _observe_and_plan(world, desired, archive)
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
    observed, p = _observe_and_plan(world, desired, archive)
    assert [a.run_id for a in p.actions if isinstance(a, Launch)] == [lost.run_id]
    assert _apply(world, desired, observed, p, archive).failures == []
    assert len(world.live_runs()) == 2


def test_a_keyerror_from_the_provider_sdk_fails_that_rent_only(caplog: pytest.LogCaptureFixture) -> None:
    desired = desired_state(2, max_instances=2)
    world = FakeWorld([offer(1), offer(2)], clock=FakeClock())
    archive = FakeArchive()
    observed, p = _observe_and_plan(world, desired, archive)
    assert [type(a) for a in p.actions] == [Rent, Rent]

    world.fail_next("create_instance", KeyError("new_contract"))  # a reply without the field the SDK indexes
    with caplog.at_level(logging.WARNING, logger="rigsync.apply"):
        result = _apply(world, desired, observed, p, archive)

    assert [o.ok for o in result.outcomes] == [False, True]
    assert result.outcomes[0].detail == "KeyError: 'new_contract'"
    assert len(result.rented) == 1 and list(world.rentals) == result.rented
    assert any(r.exc_info and r.exc_info[0] is KeyError for r in caplog.records)


def test_our_own_errors_fail_the_action_without_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    desired = desired_state(2, max_instances=1)
    world, archive = _ready_box(desired)
    observed, p = _observe_and_plan(world, desired, archive)
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
    observed, p = _observe_and_plan(world, desired, archive)
    world.fail_next("launch", KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        _apply(world, desired, observed, p, archive)
