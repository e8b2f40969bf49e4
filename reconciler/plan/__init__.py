"""The decision core: ``plan(desired, observed, controller, now) -> Plan``, a pure function of its inputs.

Everything rigsync does is decided here and nowhere else, so the whole behaviour can be tested as data
(``tests/unit/plan_cases``) and a saved plan can be reviewed before it spends money. It performs no I/O, reads
no clock and uses no randomness; iteration follows sorted keys, so equal inputs give equal plans. Every action
carries a reason (a ``ReasonCode`` and a text), and what was considered and left alone is returned as ``Noop``s.

``plan()`` is a straight line of named phases, each in its own module, passing frozen values forward:

    world      index the inputs; foreign instances set aside; the budget position
    attempts   what the boxes show (only what this fleet launched there: the rest is foreign); record finished
               attempts; which runs are wanted (promotion)
    boxes      limits that do not depend on the work (halt, status, ttl, boot, reachability, bootstrap)
    early_stop which live runs the sweeps' early termination (ASHA, Hyperband) stops at a rung
    attempts   kill or requeue live attempts that must end (those stopped early too); settle in-flight ones; queue
               the pending runs
    environment  hold back the runs of sweeps whose env references a variable the controller does not set
    boxes      replace drifted boxes, bootstrap new ones, find free GPUs
    placement  launch pending runs onto free GPU slots (shipping code first; the tail to the fastest GPUs), then
               queue the next ones on busy slots (the box starts them the moment a slot frees)
    boxes      destroy idle and surplus boxes
    renting    rent for what no box can take, and for min_instances, within every cap
    price_increases  accept a host's price increase on a box held when it still fits the caps, the budget and the
               ranking; reject it otherwise (a box this plan destroys is not answered)
    bookkeeping  pull the checkpoints that are due; close the bills of ended boxes
    wake       when to decide again, if sooner than the interval (a slot freeing while runs wait, a drain)
    executable what apply needs on each action (a bootstrap's script and cache, ...); then each names the actions
               it needs (``actions.NEEDS``), and the finished plan is checked against that table

Money is safety: caps are read defensively (a missing cap is "no cap", a negative or NaN cap is 0), an offer
with a nonsensical price is never rented, and only instances carrying this fleet's label are ever acted upon.
"""

from __future__ import annotations

from reconciler.core.actions import (
    SIGNS,
    Action,
    CloseBill,
    Destroy,
    Noop,
    Plan,
    ReasonCode,
    Record,
    Rent,
    SweepEstimate,
    SyncCheckpoint,
    apply_key,
    needs_problems,
    with_needs,
)
from reconciler.core.identity import fleet_spec_hash, rent_label, slot_spec_hash, spec_hash
from reconciler.core.model import Controller, Desired, Drift, DriftClass, Observed
from reconciler.errors import PlanInconsistent
from reconciler.plan.attempts import (
    collect_attempts,
    record_finished,
    report_foreign,
    run_queue,
    settle_in_flight,
    settle_live,
    unverified_lost,
    wanted_runs,
)
from reconciler.plan.bookkeeping import close_bills, sync_checkpoints
from reconciler.plan.boxes import BoxState, box_noops, classify_boxes, enforce_max_instances, prepare_boxes, retire_idle
from reconciler.plan.common import Decisions, fleet_dph_cap, fmt_duration
from reconciler.plan.early_stop import early_stops
from reconciler.plan.environment import withhold_missing_secrets
from reconciler.plan.estimate import estimate
from reconciler.plan.executable import executable
from reconciler.plan.forecast import forecast
from reconciler.plan.money import Purse, budget_position
from reconciler.plan.placement import place, without_free_gpus
from reconciler.plan.price_increases import answer_increases
from reconciler.plan.renting import rent_for
from reconciler.plan.wake import wake_at
from reconciler.plan.world import World, index_world

__all__ = [
    "BoxState",
    "fleet_dph_cap",
    "fleet_spec_hash",
    "fmt_duration",
    "plan",
    "rent_label",
    "slot_spec_hash",
    "spec_hash",
]


def plan(desired: Desired, observed: Observed, controller: Controller, now: float) -> Plan:
    """Decide what to do to move ``observed`` towards ``desired`` at time ``now``, as ``controller`` (its cycle, the
    secrets it may pass, whether a store takes the harvests). Pure and deterministic."""
    decided = Decisions()
    world, found = index_world(desired, observed, controller, now)
    decided.extend(found)

    seen = collect_attempts(world)
    decided.extend(report_foreign(world, seen))
    recorded, found = record_finished(world, seen)
    decided.extend(found)
    wanted, found = wanted_runs(world, recorded)
    decided.extend(found)
    budget = budget_position(world, recorded, wanted)
    fc = forecast(world, budget.runtimes)

    table, found = classify_boxes(world, seen, budget)
    decided.extend(found)
    table, found = enforce_max_instances(world, seen, table)
    decided.extend(found)

    live, found = settle_live(world, seen, table.destroyed, wanted, early_stops(world), table.preempted)
    decided.extend(found)
    in_flight, found = settle_in_flight(
        world, seen, recorded.keys | live.settled, table.destroyed, table.states,
        wanted=wanted, running=live.running, over_budget=budget.verdict() if budget.binds else None,
        preempted=table.preempted,
    )
    decided.extend(found)
    queue, found = run_queue(world, seen, recorded, wanted, live, in_flight, unverified_lost(world, in_flight))
    decided.extend(found)
    launchable, found = withhold_missing_secrets(world, queue)
    decided.extend(found)

    table, found = prepare_boxes(world, seen, table, budget)
    decided.extend(found)
    placement, found = place(world, launchable, table, budget, fc=fc)
    decided.extend(found)
    estimates, price_warnings = estimate(world, queue, live, budget)
    decided.warnings.extend(price_warnings)
    waiting: dict[str, int] = {}
    for run in (*placement.unplaced, *queue.held):
        pool = world.pool_of_run(run.spec)
        waiting[pool] = waiting.get(pool, 0) + 1
    table, found = retire_idle(
        world, seen, placement.table, placement.launches, waiting, queue.live_work, budget, fc=fc
    )
    decided.extend(found)
    unplaced = placement.unplaced
    held = without_free_gpus(world, placement.table, queue.held)
    if held:  # renting sees them in launch order too
        order = world.run_index
        unplaced = tuple(
            sorted((*unplaced, *held), key=lambda r: (-r.spec.sweep.priority, r.spec.sweep.order, order[r.spec.id]))
        )
    decided.extend(rent_for(world, unplaced, table, budget, placement.spent, fc=fc, slots=placement.slot_free_s))
    decided.extend(box_noops(world, seen, table))
    decided.extend(answer_increases(world, decided.actions))
    decided.extend(sync_checkpoints(world, recorded.keys | live.settled, table.destroyed))
    decided.extend(close_bills(world))
    return _finish(world, budget, decided, estimates, wake_at(world, fc, seen, table, decided.actions, waiting))


def _finish(
    world: World, budget: Purse, decided: Decisions, estimates: tuple[SweepEstimate, ...], wake: float | None = None
) -> Plan:
    before = sum(b.inst.dph_total for b in world.boxes.values())
    destroyed = sum(a.dph for a in decided.actions if isinstance(a, Destroy))
    rented = sum(a.dph for a in decided.actions if isinstance(a, Rent))
    actions = with_needs(executable(world.desired, world.observed, decided.actions))
    noops = list(decided.noops)
    drift = list(decided.drift)
    if budget.binds:
        first = next((a for a in sorted(actions, key=_order) if isinstance(a, Destroy)), None)
        act = f"destroy {first.target}" if first and budget.stop else "none"
        drift.append(Drift(DriftClass.OVER_BUDGET, "budget", budget.describe(), act))
        decided.warnings.append(f"budget: {budget.verdict()}")
    suspended = world.desired.fleet.suspend
    withheld = _withholding(world)
    if withheld is not None:
        code, why = withheld
        kept: list[Action] = []
        for a in actions:
            if isinstance(a, Record | SyncCheckpoint | CloseBill):  # bookkeeping goes on while suspended
                kept.append(a)
            else:
                reason = f"{why}: would {SIGNS[a.kind]} {a.target} ({a.reason})"
                noops.append(Noop(reason=reason, subject=a.target, code=code))
        actions = kept
        drift = [Drift(x.cls, x.subject, x.detail, "none") for x in drift]
        destroyed = rented = 0.0
    if problems := needs_problems(actions, suspended=withheld is not None):  # a planner bug: never applied
        raise PlanInconsistent("the plan breaks the table of needs between actions: " + "; ".join(problems))
    return Plan(
        actions=tuple(sorted(actions, key=_order)),
        noops=tuple(sorted(noops, key=lambda n: (n.subject, n.reason))),
        # rounded like the JSON so a saved plan reads back equal (0.1 + 0.2 is not 0.3 in floats)
        fleet_dph_before=round(before, 6),
        fleet_dph_after=round(before - destroyed + rented, 6),
        desired_commit=world.desired.commit,
        suspended=suspended,
        warnings=tuple(decided.warnings),
        drift=tuple(sorted(drift, key=lambda x: (x.cls.value, x.subject, x.action))),
        estimates=estimates,
        wake_at=None if suspended else wake,  # the sooner decision (``plan.wake``): none while suspended
    )


def _withholding(world: World) -> tuple[ReasonCode, str] | None:
    """Why this plan takes no action but its bookkeeping, with the code its withheld actions are said with: the fleet
    is suspended, or this cycle's list is not believed (``World.doubted``). None: it acts."""
    if world.desired.fleet.suspend:
        return ReasonCode.SUSPENDED, "suspended"
    if world.doubted is not None:
        return ReasonCode.LIST_IMPLAUSIBLE, "the provider's list is not believed"
    return None


def _order(a: Action) -> tuple[int, bool, str]:
    return apply_key(a)
