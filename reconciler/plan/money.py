"""Money: what the budget leaves before the next decision point, and what a new launch or rent would cost.

Caps hold before the fact. The *horizon* is the time until rigsync decides again (its cycle plus the time a
destroy takes to stop the billing, ``Controller.cycle_s``); the *headroom* is what the tightest cap (daily or
total) leaves after the boxes held now have billed to that horizon (at the rates that apply: an increase this
fleet accepted bills its new rate from its ``applies_at``, ``reconciler.core.contract``). Every launch must fit in the
headroom with its share of its box up to the run's expected runtime, and every rent with the new box's $/h to the
horizon plus the launch it is rented for; what has been committed earlier in the same plan counts. Rents must also fit
the account's credit (a Vast account at zero credit stops its boxes, which then bill storage).

When the headroom is gone (the boxes held would pass a cap before the next decision), every box is destroyed
now, whatever ``on_exceed`` says: this is how the ledger never passes a cap. Before that, once the budget
*binds* (the cheapest new work no longer fits), ``on_exceed`` decides:

* ``drain``: nothing new is rented or launched; boxes with no running attempt are destroyed (they could only
  idle); running attempts go on while the headroom lasts, then their boxes are destroyed too.
* ``halt``: every box is destroyed at once, running attempts included: spending stops as early as it can.

A run's expected runtime, in order of preference: its sweep's ``progress`` total over the sweep's learned progress
rate (``reconciler.core.throughput``, all its measured attempts pooled, scaled by the DLPerf of the GPUs they ran on),
the median duration of its sweep's succeeded attempts in the archive (scaled by the GPU's DLPerf when the market
says what the GPUs are worth), the sweep's ``expected_runtime``, or its ``max_runtime`` as the upper bound. The
plan's price (``plan.estimate``), its ETA and review's price use the same figures.
"""

from __future__ import annotations

import enum
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from reconciler.core.contract import cost_between, mean_rate, rate_from
from reconciler.core.model import AttemptOutcome, Desired, Observed, OnExceed, PriceIncrease, RunSpec, Sweep
from reconciler.core.offers import box_cap_dph, normalize_gpu_name
from reconciler.core.runphase import UNTOUCHED, live_attempts, run_phase
from reconciler.core.throughput import Rates, archive_samples, learn
from reconciler.plan.attempts import Recorded, plan_tallies
from reconciler.plan.common import cap, fmt_duration, usd
from reconciler.plan.world import World


class RuntimeSource(enum.StrEnum):
    RATE = "learned_rate"  # the sweep's progress total over its learned progress rate
    ARCHIVE = "archive"  # median duration of the sweep's succeeded attempts
    EXPECTED = "expected_runtime"  # the sweep says so
    MAX_RUNTIME = "max_runtime"  # the upper bound


@dataclass(frozen=True)
class Runtime:
    """How long one run of a sweep is expected to take, on a GPU like the ones it ran on."""

    hours: float
    source: RuntimeSource
    samples: int = 0  # succeeded attempts behind an archive estimate
    dlperf_per_gpu: float | None = None  # of the GPUs those attempts ran on, when the market says

    def on(self, dlperf_per_gpu: float | None) -> float:
        """Hours on a GPU with this DLPerf: faster GPUs take proportionally less (when both sides are known)."""
        if self.dlperf_per_gpu and dlperf_per_gpu and dlperf_per_gpu > 0:
            return self.hours * self.dlperf_per_gpu / dlperf_per_gpu
        return self.hours


def sweep_runtimes(
    desired: Desired, observed: Observed, dlperf: Mapping[str, float], rates: Rates | None = None
) -> dict[str, Runtime]:
    """Sweep name -> expected runtime of one of its runs. ``rates``: the sweeps' learned progress rates (None:
    learned here from the archive)."""
    if rates is None:
        rates = learn(archive_samples(observed.history, normalize_gpu_name))
    durations: dict[str, list[float]] = {}
    gpus_seen: dict[str, list[float]] = {}
    for rec in observed.history:
        if rec.phase is not AttemptOutcome.SUCCEEDED or rec.started_at is None or rec.ended_at is None:
            continue
        if rec.ended_at <= rec.started_at:
            continue
        durations.setdefault(rec.sweep, []).append((rec.ended_at - rec.started_at) / 3600.0)
        per = dlperf.get(normalize_gpu_name(rec.gpu_name)) if rec.gpu_name else None
        if per:
            gpus_seen.setdefault(rec.sweep, []).append(per)
    out: dict[str, Runtime] = {}
    for sweep in {s.name: s for s in (*desired.sweeps, *(r.sweep for r in desired.runs))}.values():
        learned = _learned_runtime(sweep, rates, dlperf)
        if learned is not None:
            out[sweep.name] = learned
    for name, seen in durations.items():
        if name in out:
            continue
        dl = gpus_seen.get(name)
        median_dl = statistics.median(dl) if dl else None
        out[name] = Runtime(statistics.median(seen), RuntimeSource.ARCHIVE, len(seen), median_dl)
    for sweep in desired.sweeps:
        if sweep.name in out:
            continue
        if sweep.expected_runtime_s is not None and sweep.expected_runtime_s > 0:
            out[sweep.name] = Runtime(sweep.expected_runtime_s / 3600.0, RuntimeSource.EXPECTED)
        else:
            out[sweep.name] = Runtime(max(0.0, sweep.max_runtime_s) / 3600.0, RuntimeSource.MAX_RUNTIME)
    return out


def _learned_runtime(sweep: Sweep, rates: Rates, dlperf: Mapping[str, float]) -> Runtime | None:
    """``progress.total`` over the sweep's pooled learned rate, with the attempts' GPUs' DLPerf (weighed by their
    seconds) for scaling; None without a progress key or a measurement."""
    found = rates.of(sweep.name)
    pooled = found.pooled if found is not None else None
    if sweep.progress is None or sweep.progress.total <= 0 or pooled is None or pooled.per_s <= 0:
        return None
    assert found is not None
    known = [(dlperf[g], r.seconds) for g, r in found.gpus.items() if dlperf.get(g)]
    weight = sum(sec for _, sec in known)
    dl = sum(d * sec for d, sec in known) / weight if weight > 0 else None
    hours = sweep.progress.total / pooled.per_s / 3600.0
    return Runtime(hours, RuntimeSource.RATE, pooled.attempts, dl)


def runtime_of(runtimes: Mapping[str, Runtime], spec: RunSpec) -> Runtime:
    found = runtimes.get(spec.sweep.name)
    if found is not None:
        return found
    if spec.sweep.expected_runtime_s is not None and spec.sweep.expected_runtime_s > 0:
        return Runtime(spec.sweep.expected_runtime_s / 3600.0, RuntimeSource.EXPECTED)
    return Runtime(max(0.0, spec.sweep.max_runtime_s) / 3600.0, RuntimeSource.MAX_RUNTIME)


@dataclass(frozen=True)
class Purse:
    """Where the budget stands for this plan."""

    remaining: float  # what the tightest cap leaves now (inf: no daily or total cap)
    tightest: str  # which cap that is, with its figures, for reasons
    horizon_s: float
    fleet_dph: float  # what the boxes held now bill
    credit: float | None  # the account's credit (None: the provider did not say)
    on_exceed: OnExceed
    binds: bool  # the cheapest new work does not fit in the headroom (or the headroom is gone)
    cheapest_work: float | None  # what the cheapest new launch would cost (None: no work waits, or no price)
    runtimes: Mapping[str, Runtime]  # sweep name -> expected runtime of one run

    @property
    def horizon_h(self) -> float:
        return self.horizon_s / 3600.0

    @property
    def headroom(self) -> float:
        """What is left before the tightest cap once the boxes held have billed to the next decision."""
        return self.remaining - self.fleet_dph * self.horizon_h

    @property
    def capped(self) -> bool:
        return math.isfinite(self.remaining)

    @property
    def exhausted(self) -> bool:
        """Keeping the boxes held to the next decision would pass a cap: destroy them all now."""
        return self.capped and self.headroom <= 0

    @property
    def halt(self) -> bool:
        return self.binds and self.on_exceed is OnExceed.HALT

    @property
    def stop(self) -> bool:
        """Every box goes now: the headroom is gone, or the budget binds and on_exceed is halt."""
        return self.exhausted or self.halt

    def verdict(self) -> str:
        """Why the budget binds, with the figures."""
        if self.exhausted:
            return f"exhausted: {self.describe()}"
        need = f"~{usd(self.cheapest_work)}" if self.cheapest_work is not None else "?"
        return (
            f"no new work fits: the cheapest launch needs {need}, {usd(max(0.0, self.headroom))} is left before "
            f"{self.tightest} once the fleet has billed to the next decision"
        )

    def describe(self) -> str:
        """One line with the figures: the tightest cap, what is left, what the fleet burns to the next decision."""
        if not self.capped:
            return "no daily or total cap"
        burn = self.fleet_dph * self.horizon_h
        return (
            f"{self.tightest}: {usd(max(0.0, self.remaining))} left; the fleet's ${self.fleet_dph:.3f}/h bills "
            f"{usd(burn)} to the next decision ({fmt_duration(self.horizon_s)})"
        )


def purse(
    world: World,
    fleet_dph: float,
    runtimes: Mapping[str, Runtime],
    waiting: Iterable[RunSpec],
    gpu_prices: Mapping[str, Iterable[float]],
) -> Purse:
    """The budget position. ``waiting`` are runs that still need a launch; ``gpu_prices``, per pool, $/h of one
    GPU where its work could run (its boxes held, its offers under its per-box cap), for the cheapest new work:
    a run is priced on its own pool."""
    desired, observed = world.desired, world.observed
    remaining, tightest = left_at(world)
    cheapest_gpu = {name: min(prices) for name, given in gpu_prices.items() if (prices := list(given))}
    cheapest_work: float | None = None
    for spec in waiting:
        pool = desired.fleet.pool(spec.sweep.pool)
        price = cheapest_gpu.get(pool.name) if pool is not None else None
        if price is not None:
            cost = runtime_of(runtimes, spec).hours * max(1, spec.sweep.gpus_per_run) * price
            cheapest_work = cost if cheapest_work is None else min(cheapest_work, cost)
    position = Purse(
        remaining=remaining,
        tightest=tightest,
        horizon_s=max(0.0, world.controller.cycle_s),
        fleet_dph=fleet_dph,
        credit=observed.credit_usd,
        on_exceed=desired.budget.on_exceed,
        binds=False,
        cheapest_work=cheapest_work,
        runtimes=runtimes,
    )
    binds = position.exhausted or (
        position.capped and cheapest_work is not None and cheapest_work > position.headroom
    )
    return replace(position, binds=binds)


class Spending:
    """What this plan has committed so far (launches and rents), checked against the headroom and the credit."""

    def __init__(self, p: Purse, committed: float = 0.0) -> None:
        self.purse = p
        self.committed = committed  # launches' expected cost, and new boxes' $/h to the horizon
        self.new_dph = 0.0

    def left(self) -> float:
        return self.purse.headroom - self.committed

    def fits(self, cost: float) -> bool:
        return not self.purse.capped or cost <= self.left() + 1e-12

    def credit_fits(self, cost: float) -> bool:
        credit = self.purse.credit
        if credit is None:
            return True
        projected = (self.purse.fleet_dph + self.new_dph) * self.purse.horizon_h + self.committed + cost
        return projected <= credit + 1e-12

    def commit(self, cost: float, new_dph: float = 0.0) -> None:
        self.committed += cost
        self.new_dph += new_dph


def budget_position(world: World, recorded: Recorded, wanted: frozenset[str]) -> Purse:
    """The purse for this plan: runtimes from the archive, the fleet's $/h now, and the cheapest new work."""
    desired, observed = world.desired, world.observed
    runtimes = sweep_runtimes(desired, observed, world.gpu_dlperf, world.rates)
    accepted = observed.memory.accepted_increases
    horizon_end = world.now + max(0.0, world.controller.cycle_s)
    # what the boxes bill to the next decision, at the rates that apply (an accepted increase from its applies_at)
    fleet_dph = sum(mean_rate(b.inst, world.now, horizon_end, accepted) for b in world.boxes.values())
    waiting: list[RunSpec] = []
    prices: dict[str, list[float]] = {}
    b = desired.budget
    if b.daily_usd is not None or b.total_usd is not None:  # without a cap nothing binds: skip the walk
        # the runs that will need a launch: asked of the one run-phase rule, as the run queue does later
        tallies = plan_tallies(world, recorded, live_attempts(observed))
        waiting = [
            world.runs[r] for r in wanted if run_phase(world.runs[r], tallies.get(r, UNTOUCHED)).launchable
        ]
        for name, pool in world.pools.items():
            limit = box_cap_dph(pool, b)
            boxes = [box.inst for box in world.boxes.values() if box.pool == name]
            offers = [o for o in world.pool_offers.get(name, ()) if o.dph_total <= limit]
            prices[name] = [rate_from(i, world.now, accepted) / i.num_gpus for i in boxes if i.num_gpus > 0]
            prices[name] += [o.dph_total / o.num_gpus for o in offers if o.num_gpus > 0]
    return purse(world, fleet_dph, runtimes, waiting, prices)


DAY_S = 86400.0


def left_at(world: World, at: float | None = None, accepted: Iterable[PriceIncrease] = ()) -> tuple[float, str]:
    """What the tightest of the daily and total caps leaves (inf and "": neither is set), with that cap's figures:
    now (``at`` None: the purse's ``remaining``), or at ``at`` once the boxes held have billed until then at the rates
    that apply (``accepted``). The daily cap counts the UTC day ``at`` falls in: today's spend when it is today, else
    only what the boxes bill that day before ``at``."""
    b = world.desired.budget
    spend = world.observed.memory.spend
    now = world.now
    when = now if at is None else at
    boxes = [box.inst for box in world.boxes.values()]
    until = sum(cost_between(i, now, when, accepted) for i in boxes)  # nothing when ``at`` is now
    left: list[tuple[float, str]] = []
    if b.daily_usd is not None:
        daily = cap(b.daily_usd)
        day0 = when // DAY_S * DAY_S
        used = spend.today_usd + until if now >= day0 else sum(cost_between(i, day0, when, accepted) for i in boxes)
        day = "today" if at is None else "that day by then"
        left.append((daily - used, f"daily_usd {usd(daily)} ({usd(used)} spent {day})"))
    if b.total_usd is not None:
        total = cap(b.total_usd)
        used = spend.total_usd + until
        left.append((total - used, f"total_usd {usd(total)} ({usd(used)} spent{'' if at is None else ' by then'})"))
    return min(left, default=(math.inf, ""))
