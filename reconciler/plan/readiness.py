"""Readiness: how long a new box of a pool takes from its rent to being ready for work, as measured.

Renting against waiting (``WAIT_FOR_BUSY_GPU``) compares a busy GPU's predicted free time with this: a guess here
rents boxes for work a held GPU would have taken sooner, or leaves work waiting that a box would have done. So it is
the pool's own measure, not a constant: the median of (first ready - rental start) over the pool's most recent boxes
(``BoxMemory.ready_at``, kept by ``remember.update_box_memory``; a box gone from the list keeps its memory while its
bill is open); ``Forecast.ready_s`` falls back to ``forecast.DEFAULT_READY_S`` until one of them has been ready.
Pure.
"""

from __future__ import annotations

import statistics

from reconciler.plan.world import World

RECENT_BOXES = 7  # the pool's latest boxes a measure is taken over: a market's boots drift, an old one says little


def ready_samples(world: World, pool: str) -> list[tuple[float, float]]:
    """(rental start, seconds from it to ready) of each of ``pool``'s rented boxes that has been ready, listed or
    gone with its bill still open, oldest first."""
    out: list[tuple[float, float]] = []
    listed = set()
    for box in world.boxes.values():
        listed.add(box.id)
        m = box.memory
        if box.own_box or box.pool != pool or m is None or m.ready_at is None:
            continue
        out.append((box.inst.start_date, max(0.0, m.ready_at - box.inst.start_date)))
    spend = world.observed.memory.spend
    for m in world.observed.memory.boxes:
        if m.instance_id in listed or m.pool != pool or m.ready_at is None:
            continue
        bill = spend.box(m.instance_id)
        started = bill.started_at if bill is not None else None
        if started is not None:
            out.append((started, max(0.0, m.ready_at - started)))
    return sorted(out)


def measured_ready_s(world: World, pool: str) -> float | None:
    """Seconds from renting a box in ``pool`` to that box being ready for work (boot + bootstrap), as measured on
    its ``RECENT_BOXES`` latest boxes (the median); None before any was ready."""
    samples = ready_samples(world, pool)[-RECENT_BOXES:]
    if not samples:
        return None
    return float(statistics.median(s for _, s in samples))
