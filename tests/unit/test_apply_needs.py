"""The needs between actions: one declared table (``actions.NEEDS``), named on each action by the planner, checked
when it finishes a plan and when a saved plan is applied, and one rule in apply: an action whose needed action
failed or was not run is not run (``not run: ...``).

Worlds are the in-memory fakes of the ports (``fakes.FakeWorld``), planned by the real ``plan()`` and applied by the
real ``apply()``; faults are injected into the ports.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeArchive, FakeClock, FakeWorld, code_tar, desired_state, observe_and_plan, offer
from jsonschema import Draft202012Validator

from reconciler import plan as planner
from reconciler.apply import ApplyContext, ApplyResult, apply
from reconciler.core.actions import (
    APPLY_ORDER,
    NEEDS,
    Action,
    Bootstrap,
    CloseBill,
    Destroy,
    Kill,
    Launch,
    Plan,
    ReasonCode,
    Record,
    Rent,
    Requeue,
    needs_problems,
    with_needs,
)
from reconciler.core.identity import box_cache_key
from reconciler.core.model import BoxSpend, Controller, Desired, FleetMemory, InFlight, Observed, Spend
from reconciler.desired import schema_path
from reconciler.errors import PlanInconsistent, RemoteCommandFailed, RepoError
from reconciler.plan import plan
from reconciler.plan.executable import CACHE_UPLOAD_MARGIN_S
from reconciler.plan.renting import rent_onstart
from reconciler.plan.saved import SavedPlan, stale_reasons
from reconciler.remote import watchdog_onstart

try:
    from .plan_case_io import load_case
except ImportError:  # tests/unit is not a package: pytest put this directory on sys.path
    from plan_case_io import load_case  # type: ignore[no-redef]

CASES = Path(__file__).parent / "plan_cases"


class RefusingArchive(FakeArchive):
    """An archive that takes nothing: every append fails, as a push that cannot land does."""

    def append(self, records: list[Any]) -> list[Any]:
        if records:
            raise RepoError("push rejected: the remote moved")
        return []


def _apply(world: FakeWorld, desired: Desired, observed: Observed, actions: list[Action],
           archive: FakeArchive) -> ApplyResult:
    ctx = ApplyContext(provider=world.provider, boxes=world.box_control, desired=desired, observed=observed,
                       archive=archive, code_tar=code_tar, now=world.clock.now)
    return apply(Plan(actions=tuple(actions)), ctx)


def _launched_box(desired: Desired) -> tuple[FakeWorld, FakeArchive, Launch]:
    """A world where the fleet's one-GPU box booted and runs its first attempt (the launch that started it)."""
    world = FakeWorld([offer(1, gpus=1)], clock=FakeClock(), boot_s=10.0)
    archive = FakeArchive()
    for _ in range(2):
        observed, p = observe_and_plan(world, desired, archive)
        assert _apply(world, desired, observed, list(p.actions), archive).failures == []
        world.clock.advance(11.0)
    launches = [a for a in p.actions if isinstance(a, Launch)]
    assert len(launches) == 1 and len(world.live_runs()) == 1
    return world, archive, launches[0]


def _outcomes(result: ApplyResult) -> dict[str, tuple[bool, bool, str]]:
    return {o.action.kind.value: (o.ok, o.skipped, o.detail) for o in result.outcomes}


# ------------------------------------------------------------------------------------------------ the table


def test_each_need_is_declared_once_and_applied_before_what_needs_it() -> None:
    pairs = [(row.dependent, kind) for row in NEEDS for kind in row.prerequisites]
    assert len(pairs) == len(set(pairs))  # one row says why, for each kind an action may need
    for dependent, prerequisite in pairs:
        assert APPLY_ORDER[prerequisite] < APPLY_ORDER[dependent], (dependent, prerequisite)


def test_the_planner_names_the_needs_from_the_table() -> None:
    kill = Kill(reason="max runtime", code=ReasonCode.MAX_RUNTIME, instance_id=5, run_id="r1", attempt=1)
    requeue = Requeue(reason="lost", code=ReasonCode.BOX_VANISHED, run_id="r2", attempt=1, instance_id=6)
    launch = Launch(reason="pending", code=ReasonCode.PENDING_RUN, instance_id=5, run_id="r1", attempt=2,
                    gpu_mask=(0,), command="train", code_commit=None)
    other = replace(launch, run_id="r3", attempt=1)
    record = Record(reason="exited", code=ReasonCode.EXITED, run_id="r4", attempt=1, instance_id=5, phase="succeeded")
    drained = Destroy(reason="drained", code=ReasonCode.DRAINED, instance_id=5)
    surplus = Destroy(reason="surplus", code=ReasonCode.SURPLUS, instance_id=8)
    record_8 = replace(record, run_id="r5", instance_id=8)
    bill = CloseBill(reason="box ended", code=ReasonCode.BILL_FINAL, instance_id=6)
    named = with_needs([kill, requeue, launch, other, record, record_8, drained, surplus, bill])
    assert {a.key: a.needs for a in named if a.needs} == {
        "launch run/r1.2@5": ("kill run/r1.1@5",),  # its run's kill, not another run's
        "destroy instance/5": ("record run/r4.1",),  # a drained box's destroy only: the others keep their own rule
        "close_bill instance/6": ("requeue run/r2.1",),
    }
    assert needs_problems(named) == []


def test_a_plan_whose_action_lacks_a_declared_need_is_refused() -> None:
    kill = Kill(reason="max runtime", code=ReasonCode.MAX_RUNTIME, instance_id=5, run_id="r1", attempt=1)
    launch = Launch(reason="pending", code=ReasonCode.PENDING_RUN, instance_id=5, run_id="r1", attempt=2,
                    gpu_mask=(0,), command="train", code_commit=None)
    assert needs_problems([kill, launch]) == ["launch run/r1.2@5 does not name kill run/r1.1@5, which it needs"]
    named = with_needs([kill, launch])[1]
    backwards = replace(kill, needs=(launch.key,))
    assert needs_problems([backwards, named]) == ["kill run/r1.1@5 needs launch run/r1.2@5, which is applied after it"]
    twice = "launch run/r1.2@5 needs kill run/r1.1@5, which the plan holds 2 times"
    assert needs_problems([kill, kill, named]) == [twice]
    assert needs_problems([named]) == ["launch run/r1.2@5 needs kill run/r1.1@5, which the plan does not hold"]
    assert needs_problems([named], suspended=True) == []  # a suspended plan withholds it: what needs it is not run


def test_the_planner_refuses_to_finish_a_plan_that_breaks_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    case = load_case(CASES / "stale_heartbeat.json")
    made = plan(case.desired, case.observed, case.controller, case.now)
    assert [(a.kind.value, a.needs) for a in made.actions] == [("requeue", ()), ("launch", ("requeue run/r1.1",))]
    monkeypatch.setattr(planner, "with_needs", list)  # a planner that forgets to name them
    with pytest.raises(PlanInconsistent, match=re.escape("launch run/r1.2@1 does not name requeue run/r1.1, which")):
        plan(case.desired, case.observed, case.controller, case.now)


def test_a_saved_plan_edited_to_drop_a_need_is_refused() -> None:
    case = load_case(CASES / "stale_heartbeat.json")
    doc = json.loads(json.dumps(plan(case.desired, case.observed, case.controller, case.now).to_json()))
    doc["actions"][1]["needs"] = []
    assert stale_reasons(SavedPlan(Plan.from_json(doc)), case.desired, case.observed, case.controller) == [
        "launch run/r1.2@1 does not name requeue run/r1.1, which it needs"
    ]


# --------------------------------------------------------------------------------------------- the one rule


def test_a_failed_kill_skips_its_runs_launch() -> None:
    desired = desired_state(1, max_instances=1)
    world, archive, first = _launched_box(desired)
    observed, _ = observe_and_plan(world, desired, archive)
    kill = Kill(reason="max runtime", code=ReasonCode.MAX_RUNTIME, instance_id=first.instance_id,
                run_id=first.run_id, attempt=1)
    again = replace(first, attempt=2)
    world.fail_next("kill", RemoteCommandFailed("exit 1: kill.sh: not permitted"))
    world.calls.clear()
    result = _apply(world, desired, observed, with_needs([kill, again]), archive)
    assert _outcomes(result) == {
        "kill": (False, False, "RemoteCommandFailed: exit 1: kill.sh: not permitted"),
        "launch": (False, True, "not run: kill of attempt 1 failed (RemoteCommandFailed: exit 1: kill.sh: not "
                                "permitted)"),
    }
    assert not [c for c in world.calls if c.startswith("launch")] and len(world.live_runs()) == 1
    # the kill succeeds: the run's next attempt is launched in the same apply
    result = _apply(world, desired, observed, with_needs([kill, again]), archive)
    assert result.failures == [] and [(r.run_id, r.attempt) for _, r in world.live_runs()] == [(first.run_id, 2)]


def test_a_failed_record_keeps_the_drained_box() -> None:
    desired = desired_state(1, max_instances=1)
    world, archive, first = _launched_box(desired)
    ((box_id, run),) = world.live_runs()
    run.end(world.clock.now(), 0)
    observed, _ = observe_and_plan(world, desired, archive)
    record = Record(reason="exited", code=ReasonCode.EXITED, run_id=first.run_id, attempt=1, instance_id=box_id,
                    phase="succeeded", exit_code=0)
    drained = Destroy(reason="drained", code=ReasonCode.DRAINED, instance_id=box_id, dph=0.2)
    result = _apply(world, desired, observed, with_needs([record, drained]), RefusingArchive())
    assert _outcomes(result) == {
        "record": (False, False, "RepoError: push rejected: the remote moved"),
        "destroy": (False, True, f"not run: run/{first.run_id}.1 was not harvested"),
    }
    assert box_id in world.rentals and result.destroyed == []
    result = _apply(world, desired, observed, with_needs([record, drained]), archive)
    assert result.failures == [] and result.destroyed == [box_id] and box_id not in world.rentals


def test_a_failed_requeue_keeps_the_bill_of_its_box_open() -> None:
    desired = desired_state(1, max_instances=1)
    world = FakeWorld([], clock=FakeClock())
    now = world.clock.now()
    gone = BoxSpend(7, usd=0.25, at=now, gone_at=now - 60, dph=0.2, num_gpus=1)
    flying = InFlight(desired.runs[0].id, 1, 7, (0,), now - 600)
    observed = Observed(memory=FleetMemory(spend=Spend(total_usd=0.25, boxes=(gone,)), in_flight=(flying,)))
    p = plan(desired, observed, Controller(), now)
    assert [(a.kind.value, a.target, a.needs) for a in p.actions] == [
        ("requeue", f"run/{flying.run_id}.1", ()),
        ("close_bill", "instance/7", (f"requeue run/{flying.run_id}.1",)),
    ]
    result = _apply(world, desired, observed, list(p.actions), RefusingArchive())
    assert _outcomes(result) == {
        "requeue": (False, False, "RepoError: push rejected: the remote moved"),
        "close_bill": (False, True, f"not run: run/{flying.run_id}.1 is not archived"),
    }


# ------------------------------------------------------------------------------------ a complete saved plan


def test_a_saved_plan_carries_its_rents_onstart_and_round_trips() -> None:
    case = load_case(CASES / "fresh_rent.json")
    made = plan(case.desired, case.observed, case.controller, case.now)
    rents = [a for a in made.actions if isinstance(a, Rent)]
    f = case.desired.fleet
    want = watchdog_onstart(ttl_s=f.ttl_s, idle_timeout_s=f.idle_timeout_s, orphan_timeout_s=f.orphan_timeout_s)
    assert rents and all(r.onstart == want == rent_onstart(f) for r in rents)
    doc = json.loads(json.dumps(made.to_json()))  # as `rigsync plan --out` writes it
    assert list(Draft202012Validator(json.loads(schema_path("plan").read_text())).iter_errors(doc)) == []
    saved = Plan.from_json(doc)
    assert saved == made and stale_reasons(SavedPlan(saved), case.desired, case.observed, case.controller) == []
    del doc["actions"][0]["onstart"]  # a rent that does not say how its box starts is no plan
    assert list(Draft202012Validator(json.loads(schema_path("plan").read_text())).iter_errors(doc))


def test_a_saved_requeue_and_bootstrap_carry_what_apply_reads() -> None:
    case = load_case(CASES / "launch_never_happened.json")
    made = plan(case.desired, case.observed, case.controller, case.now)
    saved = Plan.from_json(json.loads(json.dumps(made.to_json())))
    (requeue,) = [a for a in saved.actions if isinstance(a, Requeue)]
    assert requeue.unreached is None and requeue.talks_to == requeue.instance_id  # its box answered: contacted
    assert requeue.keep_checkpoints == case.desired.fleet.keep_checkpoints

    case = load_case(CASES / "bootstrap_pending.json")
    pool = replace(case.desired.fleet.pools[0], bootstrap_script="echo hi\n", bootstrap_cache=("/opt/venv",))
    desired = replace(case.desired, fleet=replace(case.desired.fleet, pools=(pool,)))
    made = plan(desired, case.observed, case.controller, case.now)
    (bootstrap,) = made.actions
    assert isinstance(bootstrap, Bootstrap) and bootstrap.script_hash == pool.bootstrap_hash
    box = next(i for i in case.observed.instances if i.id == bootstrap.instance_id)
    assert (bootstrap.script, bootstrap.cache_key, bootstrap.cache_paths, bootstrap.cache_upload_ttl_s) == (
        "echo hi\n", box_cache_key(pool, box), ("/opt/venv",), desired.fleet.bootstrap_timeout_s + CACHE_UPLOAD_MARGIN_S
    )
    assert Plan.from_json(json.loads(json.dumps(made.to_json()))) == made
