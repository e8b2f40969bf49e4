"""The price of a plan: for every sweep, what its unfinished work will take in GPU-hours, dollars and time.

GPU-hours come from the same expected runtime the budget uses (``money``: the sweep's progress total over its
learned progress rate, the archive's median, the sweep's ``expected_runtime``, or ``max_runtime`` as the upper
bound — the estimate says which); a running attempt's GPU-hours left are the forecast's (``Forecast.remaining_s``:
its progress left at its box's learned rate, when it reports progress). Dollars are a range
over where the work could run: every offer that passes its pool's filters under the pool's per-box price cap
(``offers.box_cap_dph``), and the pool's boxes held, each at its $/h per GPU (the dearest it bills from now on:
an increase this fleet accepted counts, ``contract.rate_from``) with the runtime scaled by its DLPerf. The ETA
assumes the sweep has its pool to itself at its full size (``max_instances`` boxes like the best-ranked offer, or
the boxes held).
What the budget leaves after the work is the tightest cap's remaining minus the range; a warning says so when
the work does not fit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from reconciler.core.actions import SweepEstimate
from reconciler.core.contract import rate_from
from reconciler.core.model import Pool, RunSpec
from reconciler.core.offers import box_cap_dph, normalize_gpu_name
from reconciler.plan.attempts import LiveVerdicts, RunQueue
from reconciler.plan.common import count_cap, usd
from reconciler.plan.forecast import Forecast, forecast
from reconciler.plan.money import Purse, Runtime, RuntimeSource, runtime_of
from reconciler.plan.world import World


@dataclass(frozen=True)
class _Prices:
    """The extremes of where the work could run, so a sweep's range costs O(1) however large the market.

    A place's cost for a sweep is gpu_hours x ($/h per GPU) x (the sweep's measured DLPerf / the place's DLPerf,
    when both are known; else 1): its extremes are those of $/h (places without a DLPerf, or every place when the
    sweep has none) and of $/h / DLPerf (the others).
    """

    dph: tuple[float, float] | None  # min, max $/h per GPU over every place
    dph_no_dl: tuple[float, float] | None  # ... over places whose DLPerf is unknown
    per_dl: tuple[float, float] | None  # min, max ($/h per GPU) / (DLPerf per GPU) over the others

    def cost_range(self, gpu_hours: float, rt: Runtime) -> tuple[float, float] | None:
        if self.dph is None:
            return None
        if not rt.dlperf_per_gpu:
            return gpu_hours * self.dph[0], gpu_hours * self.dph[1]
        costs = []
        if self.per_dl is not None:
            costs += [gpu_hours * rt.dlperf_per_gpu * x for x in self.per_dl]
        if self.dph_no_dl is not None:
            costs += [gpu_hours * x for x in self.dph_no_dl]
        return min(costs), max(costs)


def _span(values: list[float]) -> tuple[float, float] | None:
    return (min(values), max(values)) if values else None


Place = tuple[float, int, str]  # a box the work could run on: ($/h of the box, its GPUs, its GPU name)


def market_places(world: World) -> dict[str, list[Place]]:
    """Per pool, every place its work could run: its offers under its per-box cap, and its boxes held."""
    budget = world.desired.budget
    out: dict[str, list[Place]] = {}
    for name, pool in world.pools.items():
        limit = box_cap_dph(pool, budget)
        offers = [o for o in world.pool_offers.get(name, ()) if o.dph_total <= limit]
        held = [b.inst for b in world.boxes.values() if b.pool == name]
        out[name] = [(o.dph_total, o.num_gpus, o.gpu_name) for o in offers]
        # a box held is priced at the dearest rate it bills from now on: an accepted increase ahead counts
        accepted = world.observed.memory.accepted_increases
        out[name] += [(rate_from(i, world.now, accepted), i.num_gpus, i.gpu_name) for i in held]
    return out


def _prices(world: World, places: list[Place]) -> _Prices:
    every: list[float] = []
    no_dl: list[float] = []
    per_dl: list[float] = []
    for dph, n, name in places:
        if n <= 0:
            continue
        price = dph / n
        every.append(price)
        dl = world.gpu_dlperf.get(normalize_gpu_name(name))
        if dl:
            per_dl.append(price / dl)
        else:
            no_dl.append(price)
    return _Prices(_span(every), _span(no_dl), _span(per_dl))


def _learned_prices(fc: Forecast, spec: RunSpec, rt: Runtime, places: list[Place]) -> _Prices | None:
    """The places priced per GPU-hour of the sweep's pooled learned rate: a place's $/h per GPU times the time one
    run takes there (``Forecast.run_s``: its model measured, or the nearest measured one scaled) over ``rt.hours``.
    Places with no prediction are left out; None when none has one (the DLPerf scaling of ``_prices`` holds)."""
    if rt.hours <= 0:
        return None
    priced = []
    for dph, n, name in places:
        if n > 0 and fc.rate(spec, name) is not None:
            priced.append(dph / n * fc.run_s(spec, name) / 3600.0 / rt.hours)
    span = _span(priced)
    return _Prices(span, span, None) if span is not None else None


def _pool_gpus(world: World, pool: Pool, places: list[Place]) -> int:
    """GPUs of a pool at its full size: as many boxes as it may hold (and the fleet) like its best-ranked offer (or
    its boxes held, or the first place given)."""
    boxes = [b for b in world.boxes.values() if b.pool == pool.name]
    held = sum(b.inst.num_gpus for b in boxes)
    offers = world.pool_offers.get(pool.name, ())
    per_box = offers[0].num_gpus if offers else 0
    if not per_box and not boxes and places:
        per_box = places[0][1]
    if not per_box and boxes:
        per_box = max(1, held // len(boxes))
    fleet = world.desired.fleet
    # the implicit pool of a fleet without pools: is bounded by the fleet alone
    most = count_cap(fleet.max_instances)
    if fleet.named_pools:
        most = min(most, count_cap(pool.max_instances))
    return max(held, most * per_box)


def estimate(
    world: World,
    queue: RunQueue,
    live: LiveVerdicts,
    budget: Purse,
    places: Mapping[str, list[Place]] | None = None,
) -> tuple[tuple[SweepEstimate, ...], list[str]]:
    """Per sweep (in desired order), the price of its unfinished work; and warnings where it exceeds the budget.

    ``places`` are, per pool, where its work could run (default: ``market_places``, what the market and the fleet
    show now); ``rigsync review`` passes the places the committed files know instead, having no market to ask.
    A sweep is priced at its own pool's places and its ETA counts its own pool's GPUs.
    """
    if places is None:
        places = market_places(world)
    fc = forecast(world, budget.runtimes)
    work = _work_left(world, queue, live, budget, fc)
    pricing = _Pricing(world, budget, fc, places)
    out: list[SweepEstimate] = []
    warnings: list[str] = []
    for sweep in work.sweeps():
        est, warning = _price_sweep(work, sweep, pricing)
        out.append(est)
        if warning is not None:
            warnings.append(warning)
    return tuple(out), warnings


@dataclass(frozen=True)
class _WorkLeft:
    """Each sweep's unfinished work: one run of it (for its runtime, GPUs and order), its pending runs, the GPUs of
    its runs not started (pending, held, or queued on a box), and the GPU-hours left of each running attempt."""

    specs: Mapping[str, RunSpec]
    pending: Mapping[str, int]
    gpu_runs: Mapping[str, int]
    running: Mapping[str, list[float]]

    def sweeps(self) -> list[str]:
        """The sweeps with work left, in desired order."""
        return sorted(set(self.gpu_runs) | set(self.running), key=lambda n: (self.specs[n].sweep.order, n))


def _work_left(world: World, queue: RunQueue, live: LiveVerdicts, budget: Purse, fc: Forecast) -> _WorkLeft:
    specs, gpu_runs = _not_started(world, queue)
    running = _running_hours(world, live, budget, fc)
    for run_id in live.running:
        spec = world.runs.get(run_id)
        if spec is not None:
            specs.setdefault(spec.sweep.name, spec)
    return _WorkLeft(specs, queue.pending_by_sweep, gpu_runs, running)


def _not_started(world: World, queue: RunQueue) -> tuple[dict[str, RunSpec], dict[str, int]]:
    """One run of each sweep with runs not started, and per sweep the GPUs those runs take."""
    pending = queue.pending_by_sweep
    specs: dict[str, RunSpec] = {}  # one run of each sweep, for its runtime, GPUs and order
    for run in (*queue.pending, *queue.held):
        specs.setdefault(run.spec.sweep.name, run.spec)
        if len(specs) == len(pending):
            break
    gpu_runs = {name: n * max(1, specs[name].sweep.gpus_per_run) for name, n in pending.items()}  # the sweep's GPUs
    for f in queue.queued:  # queued on a box in an earlier plan: not started, a whole run of work still to pay for
        spec = world.runs.get(f.run_id)
        if spec is not None:
            specs.setdefault(spec.sweep.name, spec)
            gpu_runs[spec.sweep.name] = gpu_runs.get(spec.sweep.name, 0) + max(1, len(f.gpu_mask))
    return specs, gpu_runs


def _running_hours(world: World, live: LiveVerdicts, budget: Purse, fc: Forecast) -> dict[str, list[float]]:
    """Per sweep, the GPU-hours left of each running attempt: the forecast's where its box's rate is predicted, else
    the expected runtime less the time since launch (the controller's clock)."""
    running: dict[str, list[float]] = {}
    hours_of: dict[str, float] = {}
    for run_id, (box_id, rd) in live.running.items():
        spec = world.runs.get(run_id)
        if spec is None:
            continue
        box = world.boxes.get(box_id)
        if box is not None and fc.rate(spec, box.inst.gpu_name, box.inst.machine_id) is not None:
            left = fc.remaining_s(spec, rd, box) / 3600.0
            running.setdefault(spec.sweep.name, []).append(left * max(1, len(rd.gpu_mask)))
            continue
        hours = hours_of.get(spec.sweep.name)
        if hours is None:
            hours = hours_of[spec.sweep.name] = runtime_of(budget.runtimes, spec).hours
        elapsed = max(0.0, world.now - live.launched.get(run_id, world.now)) / 3600.0  # the controller's clock
        running.setdefault(spec.sweep.name, []).append(max(0.0, hours - elapsed) * max(1, len(rd.gpu_mask)))
    return running


class _Pricing:
    """What a sweep's work is priced at: its pool's places (``_prices``, one figure per pool; each place at the
    sweep's learned rate when its runtime is that rate) and its pool's GPUs at full size (``_pool_gpus``)."""

    def __init__(self, world: World, budget: Purse, fc: Forecast, places: Mapping[str, list[Place]]) -> None:
        self.world = world
        self.budget = budget
        self.fc = fc
        self.places = places
        self.by_pool: dict[str, tuple[_Prices, int]] = {}

    def terms(self, spec: RunSpec, rt: Runtime) -> tuple[_Prices, int]:
        name = self.world.pool_of_run(spec)
        if name not in self.by_pool:
            pool = self.world.pools.get(name) or next(iter(self.world.pools.values()))
            here = self.places.get(pool.name, [])
            self.by_pool[name] = (_prices(self.world, here), _pool_gpus(self.world, pool, here))
        if rt.source is RuntimeSource.RATE:  # each place at the sweep's rate predicted on it
            learned = _learned_prices(self.fc, spec, rt, self.places.get(name, []))
            return learned or self.by_pool[name][0], self.by_pool[name][1]
        return self.by_pool[name]


def _price_sweep(work: _WorkLeft, sweep: str, pricing: _Pricing) -> tuple[SweepEstimate, str | None]:
    """One sweep's estimate, and the warning when its work does not fit what the budget leaves."""
    budget = pricing.budget
    rt = runtime_of(budget.runtimes, work.specs[sweep])
    prices, slots = pricing.terms(work.specs[sweep], rt)
    not_started = work.gpu_runs.get(sweep, 0)
    running = work.running.get(sweep, ())
    gpu_hours = not_started * rt.hours + sum(running)
    low = high = None
    span = prices.cost_range(gpu_hours, rt)
    if span is not None:
        low, high = span
    eta = None
    if slots:
        waves = math.ceil(not_started / slots) if not_started else 0
        eta = waves * rt.hours + max(running, default=0.0)
    left_low, left_high = _budget_left(budget, low, high)
    est = SweepEstimate(
        sweep=sweep,
        pending_runs=work.pending.get(sweep, 0),
        running_runs=len(running),
        gpu_hours=round(gpu_hours, 4),
        runtime_h=round(rt.hours, 4),
        runtime_source=rt.source.value,
        runtime_samples=rt.samples,
        usd_low=_rounded(low),
        usd_high=_rounded(high),
        eta_h=_rounded(eta),
        fleet_gpus=slots,
        budget_left_low=_rounded(left_low),
        budget_left_high=_rounded(left_high),
    )
    return est, _budget_warning(est, low, high, budget)


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _budget_left(budget: Purse, low: float | None, high: float | None) -> tuple[float | None, float | None]:
    """What a capped budget leaves after the work (at worst, at best); None when uncapped or unpriced."""
    if not budget.capped:
        return None, None
    remaining = max(0.0, budget.remaining)
    return (remaining - high if high is not None else None), (remaining - low if low is not None else None)


def _budget_warning(est: SweepEstimate, low: float | None, high: float | None, budget: Purse) -> str | None:
    """The warning when a sweep's work needs more than the capped budget leaves (surely, or possibly)."""
    if not budget.capped:
        return None
    left = f"{usd(max(0.0, budget.remaining))} is left before {budget.tightest}"
    if low is not None and low > budget.remaining:
        return (
            f"budget: sweep {est.sweep} needs at least {usd(low)} for its {est.pending_runs} pending and "
            f"{est.running_runs} running run(s), {left}"
        )
    if high is not None and high > budget.remaining:
        return f"budget: sweep {est.sweep} may need up to {usd(high)} ({usd(low or 0.0)} at best), {left}"
    return None


def totals(estimates: tuple[SweepEstimate, ...]) -> Mapping[str, float]:
    """GPU-hours and the dollar range summed over the sweeps (for the plan's summary line)."""
    return {
        "gpu_hours": sum(e.gpu_hours for e in estimates),
        "usd_low": sum(e.usd_low or 0.0 for e in estimates),
        "usd_high": sum(e.usd_high or 0.0 for e in estimates),
    }
