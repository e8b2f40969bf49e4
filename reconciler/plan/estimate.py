"""The price of a plan: for every sweep, what its unfinished work will take in GPU-hours, dollars and time.

GPU-hours come from the same expected runtime the budget uses (``money``: the archive's median, the sweep's
``expected_runtime``, or ``max_runtime`` as the upper bound — the estimate says which). Dollars are a range
over where the work could run: every offer that passes the fleet's filters under the per-box price cap, and
the boxes held, each at its $/h per GPU with the runtime scaled by its DLPerf. The ETA assumes the sweep has
the fleet to itself at its full size (``max_instances`` boxes like the best-ranked offer, or the boxes held).
What the budget leaves after the work is the tightest cap's remaining minus the range; a warning says so when
the work does not fit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from reconciler.actions import SweepEstimate
from reconciler.offers import normalize_gpu_name
from reconciler.plan.attempts import LiveVerdicts, RunQueue
from reconciler.plan.common import count_cap, effective_caps, usd
from reconciler.plan.money import Purse, Runtime, runtime_of
from reconciler.plan.world import World


def _where(world: World) -> list[tuple[float, float | None]]:
    """($/h of one GPU, DLPerf of one GPU) for every place the work could run."""
    instance_cap, _ = effective_caps(world.desired)
    places: list[tuple[float, float | None]] = []
    for o in world.offers:
        if o.num_gpus > 0 and o.dph_total <= instance_cap:
            places.append((o.dph_total / o.num_gpus, world.gpu_dlperf.get(normalize_gpu_name(o.gpu_name))))
    for box in world.boxes.values():
        inst = box.inst
        if inst.num_gpus > 0:
            places.append((inst.dph_total / inst.num_gpus, world.gpu_dlperf.get(normalize_gpu_name(inst.gpu_name))))
    return places


def _fleet_gpus(world: World) -> int:
    """GPUs of the fleet at its full size: max_instances boxes like the best-ranked offer (or the boxes held)."""
    f = world.desired.fleet
    held = sum(b.inst.num_gpus for b in world.boxes.values())
    per_box = world.offers[0].num_gpus if world.offers else 0
    if not per_box and world.boxes:
        per_box = max(1, held // len(world.boxes))
    return max(held, count_cap(f.max_instances) * per_box)


def estimate(
    world: World, queue: RunQueue, live: LiveVerdicts, budget: Purse
) -> tuple[tuple[SweepEstimate, ...], list[str]]:
    """Per sweep (in desired order), the price of its unfinished work; and warnings where it exceeds the budget."""
    pending: dict[str, int] = {}
    gpu_runs: dict[str, int] = {}  # GPU slots the pending runs need
    for run in queue.pending:
        pending[run.spec.sweep] = pending.get(run.spec.sweep, 0) + 1
        gpu_runs[run.spec.sweep] = gpu_runs.get(run.spec.sweep, 0) + run.gpus
    running: dict[str, list[float]] = {}  # sweep -> GPU-hours left of each running attempt
    for run_id, (_box, rd) in live.running.items():
        spec = world.runs.get(run_id)
        if spec is None:
            continue
        hours = runtime_of(budget.runtimes, spec).hours
        elapsed = (world.now - rd.started_at) / 3600.0 if rd.started_at is not None else 0.0
        running.setdefault(spec.sweep, []).append(max(0.0, hours - elapsed) * max(1, len(rd.gpu_mask)))
    places = _where(world)
    slots = _fleet_gpus(world)
    out: list[SweepEstimate] = []
    warnings: list[str] = []
    specs = {s.sweep: s for s in world.runs.values()}
    for sweep in sorted(set(pending) | set(running), key=lambda n: (specs[n].sweep_order, n)):
        rt: Runtime = runtime_of(budget.runtimes, specs[sweep])
        gpu_hours = gpu_runs.get(sweep, 0) * rt.hours + sum(running.get(sweep, ()))
        low = high = None
        if places:
            costs = [gpu_hours * (rt.on(dl) / rt.hours if rt.hours > 0 else 1.0) * dph for dph, dl in places]
            low, high = min(costs), max(costs)
        eta = None
        if slots:
            waves = math.ceil(gpu_runs.get(sweep, 0) / slots) if gpu_runs.get(sweep) else 0
            eta = waves * rt.hours + max((h for h in running.get(sweep, ())), default=0.0)
        left_low = left_high = None
        if budget.capped:
            remaining = max(0.0, budget.remaining)
            left_low = remaining - high if high is not None else None
            left_high = remaining - low if low is not None else None
        est = SweepEstimate(
            sweep=sweep,
            pending_runs=pending.get(sweep, 0),
            running_runs=len(running.get(sweep, ())),
            gpu_hours=round(gpu_hours, 4),
            runtime_h=round(rt.hours, 4),
            runtime_source=rt.source.value,
            runtime_samples=rt.samples,
            usd_low=None if low is None else round(low, 4),
            usd_high=None if high is None else round(high, 4),
            eta_h=None if eta is None else round(eta, 4),
            fleet_gpus=slots,
            budget_left_low=None if left_low is None else round(left_low, 4),
            budget_left_high=None if left_high is None else round(left_high, 4),
        )
        out.append(est)
        if budget.capped and low is not None and low > budget.remaining:
            warnings.append(
                f"budget: sweep {sweep} needs at least {usd(low)} for its {est.pending_runs} pending and "
                f"{est.running_runs} running run(s), {usd(max(0.0, budget.remaining))} is left before {budget.tightest}"
            )
        elif budget.capped and high is not None and high > budget.remaining:
            warnings.append(
                f"budget: sweep {sweep} may need up to {usd(high)} ({usd(low or 0.0)} at best), "
                f"{usd(max(0.0, budget.remaining))} is left before {budget.tightest}"
            )
    return tuple(out), warnings


def totals(estimates: tuple[SweepEstimate, ...]) -> Mapping[str, float]:
    """GPU-hours and the dollar range summed over the sweeps (for the plan's summary line)."""
    return {
        "gpu_hours": sum(e.gpu_hours for e in estimates),
        "usd_low": sum(e.usd_low or 0.0 for e in estimates),
        "usd_high": sum(e.usd_high or 0.0 for e in estimates),
    }
