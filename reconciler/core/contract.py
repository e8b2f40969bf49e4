"""A rented box's contract in time: when it ends, what it costs until then and after.

Every Vast rental has a fixed end date chosen at rent (the offer's ``end_date``); when it passes, the host takes the
machine back. A host may raise the price of a live contract: accepted, the contract runs on past its current end at
the new rate; rejected or left unanswered, it ends there. These are the one home of those rules: the planner's
renting, placement, requeue and budget phases, the views and the emulator's tests all ask here. Pure: no I/O, no
clock (``now`` is passed in).
"""

from __future__ import annotations

from collections.abc import Iterable

from reconciler.core.model import Instance, Offer, PriceIncrease


def accepted_for(instance_id: int, accepted: Iterable[PriceIncrease]) -> PriceIncrease | None:
    """The increase this fleet accepted on the box, the latest one to apply when there are several."""
    mine = [p for p in accepted if p.instance_id == instance_id]
    return max(mine, key=lambda p: (p.applies_at, p.id)) if mine else None


def box_end(inst: Instance, accepted: Iterable[PriceIncrease] = ()) -> float | None:
    """When the box's contract ends: its ``end_date``, or the extended end of an increase this fleet accepted on it.
    None: no end (not said, or the lab's own machine)."""
    inc = accepted_for(inst.id, accepted)
    end = inst.end_date
    if inc is not None and inc.new_end is not None and (end is None or inc.new_end > end):
        return inc.new_end
    return end


def seconds_left(end: float | None, now: float) -> float | None:
    """Seconds from ``now`` until a contract ending at ``end`` ends (never negative); None: no end."""
    return None if end is None else max(0.0, end - now)


def time_left(inst: Instance, now: float, accepted: Iterable[PriceIncrease] = ()) -> float | None:
    """Seconds until the box's contract ends (never negative); None: no end."""
    return seconds_left(box_end(inst, accepted), now)


def ended(inst: Instance, now: float, accepted: Iterable[PriceIncrease] = ()) -> bool:
    """Whether the box's contract has ended at ``now`` (the host takes it back then)."""
    end = box_end(inst, accepted)
    return end is not None and now >= end


def offer_time_left(offer: Offer, now: float) -> float | None:
    """Seconds a contract rented on ``offer`` now would last; None: the offer says no end."""
    return seconds_left(offer.end_date, now)


def rate_at(inst: Instance, t: float, accepted: Iterable[PriceIncrease] = ()) -> float:
    """The box's $/h at time ``t``: its current rate, or an accepted increase's rate from the moment it applies."""
    inc = accepted_for(inst.id, accepted)
    if inc is not None and t >= inc.applies_at:
        return inc.new_dph
    return inst.dph_total


def cost_between(inst: Instance, start: float, end: float, accepted: Iterable[PriceIncrease] = ()) -> float:
    """What the box costs from ``start`` to ``end`` (seconds), $, at the rates that apply: an accepted increase
    bills its new rate from its ``applies_at``."""
    if end <= start:
        return 0.0
    inc = accepted_for(inst.id, accepted)
    if inc is None or inc.applies_at >= end:
        return inst.dph_total * (end - start) / 3600.0
    cut = max(start, inc.applies_at)
    return (inst.dph_total * (cut - start) + inc.new_dph * (end - cut)) / 3600.0


def room_for(
    inst: Instance, now: float, need_s: float, margin_s: float, accepted: Iterable[PriceIncrease] = ()
) -> bool:
    """Whether work of ``need_s`` seconds started on the box at ``now`` finishes at least ``margin_s`` before its
    contract ends (always, for a box with no end)."""
    left = time_left(inst, now, accepted)
    return left is None or left >= max(0.0, need_s) + max(0.0, margin_s)


def offer_room_for(offer: Offer, now: float, need_s: float, margin_s: float) -> bool:
    """Whether work of ``need_s`` seconds on a box rented on ``offer`` now finishes at least ``margin_s`` before the
    contract ends (always, for an offer that says no end)."""
    left = offer_time_left(offer, now)
    return left is None or left >= max(0.0, need_s) + max(0.0, margin_s)


def ending(inst: Instance, now: float, margin_s: float, accepted: Iterable[PriceIncrease] = ()) -> bool:
    """Whether the box's contract ends within ``margin_s`` of ``now`` (or has ended): its work is moved, and the box
    let go, before the host takes it back."""
    left = time_left(inst, now, accepted)
    return left is not None and left <= max(0.0, margin_s)

def mean_rate(inst: Instance, start: float, end: float, accepted: Iterable[PriceIncrease] = ()) -> float:
    """The box's average $/h from ``start`` to ``end`` at the rates that apply (its rate at ``start`` for an empty
    span): what the budget's burn to the next decision counts."""
    if end <= start:
        return rate_at(inst, start, accepted)
    return cost_between(inst, start, end, accepted) * 3600.0 / (end - start)


def rate_from(inst: Instance, start: float, accepted: Iterable[PriceIncrease] = ()) -> float:
    """The dearest $/h the box bills from ``start`` on (an accepted increase ahead counts): what work that may run
    past the increase is priced at."""
    return max(rate_at(inst, start, accepted), dearest_rate(inst.id, inst.dph_total, accepted))


def dearest_rate(instance_id: int, dph: float, accepted: Iterable[PriceIncrease] = ()) -> float:
    """The dearest $/h a box listed at ``dph`` may bill from now on: ``dph``, or the rate of an increase this fleet
    accepted on it (for what knows a box only by its id and listed price, as review does from observed/)."""
    inc = accepted_for(instance_id, accepted)
    return max(dph, inc.new_dph) if inc is not None else dph
