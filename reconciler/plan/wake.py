"""Wake: when the planner wants to decide again, if sooner than the controller's interval (``Plan.wake_at``).

A box-side queue keeps a slot working between cycles, but some moments still wait for a decision: a slot that frees
with nothing queued behind it while runs wait for a GPU (the next launch), a draining box's last attempt (its
harvest and destroy), and a new box predicted ready (its rental start + ``Forecast.ready_s``, as measured for its
pool, and at least every ``BOOT_POLL_S`` while it comes up) while runs of its pool wait (its bootstrap, then its
first launch: at the interval, each of those waited a cycle). Deciding at the interval wastes the gap to it every
time; deciding at the predicted moment (``Forecast.remaining_s``) plus ``WAKE_MARGIN_S`` does not. An end already
overdue asks for nothing (its forecast was wrong: the interval decides, so a run slower than predicted cannot make
the loop cycle every few seconds), the daemon floors the sleep and never sleeps past its interval. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from reconciler.core.actions import Action, Drain, Launch, Rent
from reconciler.plan.attempts import SeenAttempts
from reconciler.plan.boxes import BoxState, BoxTable, work_left_s
from reconciler.plan.forecast import Forecast
from reconciler.plan.world import World

WAKE_MARGIN_S = 5.0  # past the predicted end: the attempt's exit code is written and its heartbeat stops
# While a box comes up (booting, bootstrapping) and runs wait for it, decide again at least this often: only a
# cycle sees it answer or finish its bootstrap, and a pool not measured yet predicts minutes (``DEFAULT_READY_S``).
BOOT_POLL_S = 10.0


def wake_at(
    world: World,
    fc: Forecast,
    seen: SeenAttempts,
    table: BoxTable,
    actions: Sequence[Action],
    waiting: Mapping[str, int],
) -> float | None:
    """The earliest predicted end of a live attempt whose end matters now, plus ``WAKE_MARGIN_S``; None if none.

    An end matters when its slot has nothing queued behind it (on the box or by this plan) and runs of its pool
    wait for a GPU (``waiting``, per pool), or when it is the last work of a box that is draining (or is told to
    drain by this plan); and the predicted readiness of a box still booting or bootstrapping (or rented by this
    plan) while runs of its pool wait."""
    queued_now = {(a.instance_id, a.gpu_mask) for a in actions if isinstance(a, Launch) and a.queued}
    drained_now = {a.instance_id for a in actions if isinstance(a, Drain)}
    ends: list[float] = []
    for box_id, runs in seen.live.items():
        box = world.boxes.get(box_id)
        if box is None or box_id in table.destroyed or box.probe is None:
            continue
        if box.probe.draining or box_id in drained_now:
            ends.append(work_left_s(world, fc, seen, box))
            continue
        if not waiting.get(box.pool, 0):
            continue
        behind = {q.gpu_mask for q in box.probe.queued} | {m for i, m in queued_now if i == box_id}
        for rd in runs:
            spec = world.runs.get(rd.run_id)
            if spec is None or rd.gpu_mask in behind:
                continue
            ends.append(fc.remaining_s(spec, rd, box))
    ahead = [left + WAKE_MARGIN_S for left in ends if left > 0.0]  # an overdue end: the interval decides
    coming = (BoxState.BOOTING, BoxState.BOOTSTRAPPING)
    for box_id, box in world.boxes.items():  # a box coming up is looked at, not waited for: no margin
        if table.states.get(box_id) in coming and waiting.get(box.pool, 0):
            left = box.inst.start_date + fc.ready_s(box.pool) - world.now
            ahead.append(min(left, BOOT_POLL_S) if left > 0.0 else BOOT_POLL_S)
    if any(isinstance(a, Rent) for a in actions) and any(waiting.values()):
        ahead.append(min(BOOT_POLL_S, *(fc.ready_s(pool) for pool in world.pools)))  # the soonest a new box is up
    if not ahead:
        return None
    return round(world.now + min(ahead), 3)
