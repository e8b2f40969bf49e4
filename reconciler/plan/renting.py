"""Renting: boxes for the runs nothing can take, and for the min_instances floor; never past a cap.

Runs that boxes already on their way (booting, bootstrapping, briefly unreachable) will take are not rented
for, nor runs that a held GPU slot takes sooner than a new box of the pool would be ready (``WAIT_FOR_BUSY_GPU``:
each busy slot's predicted free time after this plan's queue, ``Placement.slot_free_s``, against the pool's
measured ``Forecast.ready_s``; a slot absorbs runs in turn, its free time growing by each run's ``Forecast.run_s``).
Renting happens only for work no held GPU will take sooner. For the rest, the best offer by the fleet's ranking
that passes the filters (``reconciler.core.offers``, the one definition the Vast query is built from too), fits the
per-box $/h cap and keeps the fleet under its $/h cap; or a box of several GPUs when it is cheaper per run (its
$/h share per slot times ``Forecast.run_s`` on it) and enough pending runs remain to fill every slot
(``RENT_MULTI_GPU``). Nothing is rented once a daily or total cap is reached. What could not be rented says which
cap held.

Contracts end (``reconciler.core.contract``): an offer whose contract would end before the work it is rented for
could finish (the pool's ``Forecast.ready_s`` plus the run's ``Forecast.run_s`` on it), plus the fleet's
``contract_margin``, is passed over (``CONTRACT_TOO_SHORT``, one no-op per offer naming its time left and the
work's); for min_instances, the margin alone. An offer that says no end is not limited.

Renting is also bounded in time (``rent_gate``), from the host ledger (``observed/hosts.yaml``): at most
``max_rents_per_hour`` rents in any hour, and after ``RENT_BACKOFF_AFTER`` failures in a row (boxes that never came
up: boot timeout, bootstrap failed or timed out; rents that failed; a launch ends the run) nothing is rented for
``rent_backoff``, doubling with each further failure up to ``MAX_RENT_BACKOFF_S``. So a bootstrap that always fails,
or a market of ghosts, cannot turn into a rent storm. Both say why in the plan (a no-op on the fleet) and in
`rigsync status` (a ``renting:`` warning).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

from reconciler.core import contract
from reconciler.core.actions import ReasonCode, Rent
from reconciler.core.identity import rent_label
from reconciler.core.ledger import RENT_WINDOW_S
from reconciler.core.model import Fleet, Offer, Pool, RentMade, RunSpec, Sweep
from reconciler.core.offers import box_cap_dph, normalize_gpu_name
from reconciler.core.throughput import Exploration
from reconciler.plan.attempts import PendingRun
from reconciler.plan.boxes import BoxState, BoxTable
from reconciler.plan.common import EPS, Decisions, count_cap, fleet_dph_cap, fmt_duration, gpus_text, usd, usd_h
from reconciler.plan.forecast import Forecast
from reconciler.plan.money import Purse, Spending, runtime_of
from reconciler.plan.world import World
from reconciler.remote.commands import watchdog_onstart

_ON_THEIR_WAY = frozenset({BoxState.BOOTING, BoxState.BOOTSTRAPPING, BoxState.UNREACHABLE})
RENT_BACKOFF_AFTER = 2  # failures in a row before renting backs off (one vanish or ghost is the market's noise)
MAX_RENT_BACKOFF_S = 3600.0


def rent_backoff(world: World) -> tuple[ReasonCode, str] | None:
    """Why renting waits after failures in a row, or None (the backoff half of ``rent_gate``)."""
    f, ledger, now = world.desired.fleet, world.observed.memory.hosts, world.now
    k, last = ledger.failures_in_a_row, ledger.last_failure_at
    if k < RENT_BACKOFF_AFTER or last is None or f.rent_backoff_s <= 0:
        return None
    wait = min(f.rent_backoff_s * 2.0 ** (k - RENT_BACKOFF_AFTER), MAX_RENT_BACKOFF_S)
    left = last + wait - now
    if left <= 0:
        return None
    return ReasonCode.RENT_BACKOFF, (
        f"rent backoff: {k} failures in a row (boxes that never came up or rents that failed), the last "
        f"{fmt_duration(now - last)} ago; renting again in {fmt_duration(left)} (backoff {fmt_duration(wait)})"
    )


def rents_per_hour(fleet: Fleet) -> int:
    """The fleet's rent rate cap: ``max_rents_per_hour``, by default ten times ``max_instances`` (at least 10): far
    above a healthy fleet's churn, far below one rent per cycle (a storm at a 60 s interval is 60 an hour)."""
    if fleet.max_rents_per_hour is not None:
        return max(0, fleet.max_rents_per_hour)
    return max(10, 10 * count_cap(fleet.max_instances))


def rent_onstart(fleet: Fleet) -> str:
    """What a box rented for ``fleet`` runs at every boot: its own kill switch, the watchdog with the fleet's limits
    (``remote.watchdog_onstart``: it names no key)."""
    return _watchdog_onstart(fleet.ttl_s, fleet.idle_timeout_s, fleet.orphan_timeout_s)


@functools.lru_cache(maxsize=8)
def _watchdog_onstart(ttl_s: float | None, idle_timeout_s: float, orphan_timeout_s: float) -> str:
    return watchdog_onstart(ttl_s=ttl_s, idle_timeout_s=idle_timeout_s, orphan_timeout_s=orphan_timeout_s)


# A rent's box is expected in the provider's list (or answering) within this: until then renting for its pool waits
# on it (one rent in flight per pool), so a list that hides new boxes cannot multiply them; past it the rent did not
# produce a box, the pool may rent once more, and that rent no longer counts against max_rents_per_hour.
RENT_SEEN_WITHIN_S = 300.0


def _unseen_rents(world: World) -> list[RentMade]:
    """The last hour's rents whose box has not been seen (listed, or answering its probe), oldest first."""
    now = world.now
    return [r for r in world.observed.memory.rents if not r.seen and now - r.at < RENT_WINDOW_S]


def rent_in_flight(world: World, pool: str) -> tuple[ReasonCode, str] | None:
    """Why renting for ``pool`` waits on a rent already made (its box not seen yet, within ``RENT_SEEN_WITHIN_S``)."""
    now = world.now
    waiting = [r for r in _unseen_rents(world) if r.pool == pool and now - r.at < RENT_SEEN_WITHIN_S]
    if not waiting:
        return None
    r = waiting[-1]
    return ReasonCode.RENT_IN_FLIGHT, (
        f"the rent of instance/{r.instance_id} made {fmt_duration(now - r.at)} ago is not listed yet: renting for "
        f"pool {pool} waits on it (up to {fmt_duration(RENT_SEEN_WITHIN_S)}, then it rents once more)"
    )


def rents_never_seen(world: World, pool: str | None = None) -> list[RentMade]:
    """The last hour's rents (of ``pool``, or any) whose box was not seen within ``RENT_SEEN_WITHIN_S``: they did not
    produce a box."""
    now = world.now
    return [
        r for r in _unseen_rents(world) if now - r.at >= RENT_SEEN_WITHIN_S and (pool is None or r.pool == pool)
    ]


def rent_gate(world: World, rented_now: int) -> tuple[ReasonCode, str] | None:
    """Why no further rent may happen in this plan (``rented_now`` rents already in it), or None. The rents that
    did not produce a box (``rents_never_seen``) do not count against the rate."""
    backoff = rent_backoff(world)
    if backoff is not None:
        return backoff
    limit = rents_per_hour(world.desired.fleet)
    now = world.now
    recent = sorted(t for t in world.observed.memory.hosts.rents_at if now - t < RENT_WINDOW_S)
    recent = recent[min(len(recent), len(rents_never_seen(world))):]  # the oldest go first: the rate lifts sooner
    if len(recent) + rented_now < max(0, limit):
        return None
    oldest = recent[0] if recent else now
    return ReasonCode.RENT_RATE_LIMITED, (
        f"rent rate: {len(recent) + rented_now} rent(s) in the last hour >= max_rents_per_hour {limit}; "
        f"the next in {fmt_duration(max(0.0, oldest + RENT_WINDOW_S - now))}"
    )


@dataclass
class _Bin:
    """Remaining GPU capacity of a box on its way or an offer rented in this plan."""

    free_gpus: int
    gpu_ram_mib: int


@dataclass
class _Bins:
    """First fit over boxes-to-be. Bins only fill up, so a bin too small for a request shape stays too small:
    each shape keeps a cursor past the bins it has given up on, keeping packing near O(n)."""

    items: list[_Bin] = field(default_factory=list)
    cursor: dict[tuple[int, int], int] = field(default_factory=dict)

    def add(self, b: _Bin) -> None:
        self.items.append(b)

    def fit(self, g: int, ram: int) -> bool:
        i = self.cursor.get((g, ram), 0)
        items = self.items
        while i < len(items):
            b = items[i]
            if b.free_gpus >= g and b.gpu_ram_mib >= ram:
                b.free_gpus -= g
                self.cursor[(g, ram)] = i
                return True
            i += 1
        self.cursor[(g, ram)] = i
        return False


@dataclass
class _Fleetwide:
    """What every pool's market shares: the fleet's box count and $/h as rents are added, the offers taken."""

    count: int
    fleet_dph: float
    used: set[int] = field(default_factory=set)
    rented: int = 0
    renting: list[Offer] = field(default_factory=list)  # the offers this plan rents, in order


class _Market:
    """One pool's ranked offers that pass its filters, and the pool's and the fleet's count and $/h as rents are
    added (the fleet's cap holds across pools)."""

    def __init__(self, world: World, table: BoxTable, pool: Pool, shared: _Fleetwide) -> None:
        self.world = world
        self.fleet = world.desired.fleet
        self.pool = pool
        self.shared = shared
        self.count = sum(1 for i in table.alive() if world.boxes[i].pool == pool.name and world.boxes[i].rented)
        self.instance_cap = box_cap_dph(pool, world.desired.budget)
        self.fleet_cap = fleet_dph_cap(world.desired)
        self.offers = list(world.pool_offers.get(pool.name, ()))
        self.pointers: dict[tuple[int, int], int] = {}
        self.explored: Exploration | None = None  # what the last ``pick`` explored with (None: not exploration)
        self.capped: dict[int, Exploration] = {}  # offer id -> the exploration the share refused
        self.short: dict[int, str] = {}  # offer id -> why its contract is too short (the first work it refused)
        self.margin = world.desired.fleet.contract_margin_s

    def lasts(self, o: Offer, need: Callable[[Offer], float] | None, what: str) -> bool:
        """Whether a contract rented on ``o`` now outlasts ``need(o)`` (the work's predicted seconds; None: no work,
        the margin alone) plus ``contract_margin``; a refused offer is kept in ``short`` with the figures."""
        need_s = need(o) if need is not None else 0.0
        if contract.offer_room_for(o, self.world.now, need_s, self.margin):
            return True
        left = contract.offer_time_left(o, self.world.now) or 0.0
        margin = f"contract_margin {fmt_duration(self.margin)}"
        work = f"{what} needs ~{fmt_duration(need_s)} + {margin}" if need is not None else f"{what} needs {margin}"
        self.short.setdefault(o.id, f"its contract ends in {fmt_duration(left)}; {work}")
        return False

    def pick(
        self,
        g: int,
        ram: int,
        sweeps: Sequence[Sweep] = (),
        need: Callable[[Offer], float] | None = None,
        what: str = "",
    ) -> Offer | None:
        """The best offer by the pool's ranking that fits a ``g``-GPU run and the caps, and whose contract outlasts
        the work (``lasts``: ``need``, ``what`` names it). An offer whose rent would be exploration for ``sweeps``
        (``World.exploration``) beyond ``exploration_share`` is passed over (kept in ``capped``); ``explored`` says
        whether the offer returned is exploration."""
        self.explored = None
        i = self.pointers.get((g, ram), 0)
        passed = False  # an offer passed over for this work only (its contract): the pointer must not move past it
        while i < len(self.offers):
            o = self.offers[i]
            if (
                o.id not in self.shared.used
                and o.num_gpus >= g
                and o.gpu_ram_mib >= ram
                and o.dph_total <= self.instance_cap
                and self.shared.fleet_dph + o.dph_total <= self.fleet_cap + EPS
            ):
                if not self.lasts(o, need, what):
                    passed = True
                    i += 1
                    continue
                ex = self.world.exploration(o, self.pool.name, sweeps, self.shared.renting) if sweeps else None
                if ex is not None and ex.explores and not ex.allowed:
                    self.capped.setdefault(o.id, ex)
                    i += 1  # the pointer stays: the share may allow it for the next shape
                    continue
                if not passed:
                    self.pointers[(g, ram)] = i
                self.explored = ex if ex is not None and ex.explores else None
                return o
            i += 1
        if not passed:
            self.pointers[(g, ram)] = i
        return None

    def multi_gpu(
        self,
        o: Offer,
        g: int,
        ram: int,
        fill: int,
        per_run: Callable[[Offer], float],
        need: Callable[[Offer], float] | None = None,
        what: str = "",
    ) -> Offer | None:
        """A box of several ``g``-GPU slots that is cheaper per run than ``o`` (the best by the pool's ranking) and
        that ``fill`` pending runs of the shape fill, the cheapest per run; None when there is none. ``per_run`` is
        an offer's $ for one run on one of its slots (its $/h share times ``Forecast.run_s`` on it)."""
        best, best_cost = None, per_run(o) - EPS
        for x in self.offers:
            slots = x.num_gpus // g if g > 0 else 0
            if (
                slots < 2
                or slots > fill
                or x.id in self.shared.used
                or x.gpu_ram_mib < ram
                or x.dph_total > self.instance_cap
                or self.shared.fleet_dph + x.dph_total > self.fleet_cap + EPS
            ):
                continue
            cost = per_run(x)
            if cost < best_cost and self.lasts(x, need, what):
                best, best_cost = x, cost
        return best

    def why_not(self, g: int, ram: int) -> tuple[ReasonCode, str]:
        fitting = [
            o for o in self.offers if o.id not in self.shared.used and o.num_gpus >= g and o.gpu_ram_mib >= ram
        ]
        if not fitting:
            return ReasonCode.NO_OFFER, f"no unused offer passes the filters for {g} GPU(s) with >= {ram} MiB each"
        cheapest = min(o.dph_total for o in fitting)
        capped = [o for o in fitting if o.dph_total <= self.instance_cap]
        if capped and all(o.id in self.short for o in capped):
            o = min(capped, key=lambda x: contract.offer_time_left(x, self.world.now) or 0.0)
            return ReasonCode.CONTRACT_TOO_SHORT, (
                f"contract too short: every fitting offer's contract ends before the work could finish (offer/{o.id}: "
                f"{self.short[o.id]})"
            )
        if cheapest > self.instance_cap:
            return ReasonCode.INSTANCE_PRICE_CAP, (
                f"instance price cap: cheapest fitting offer {usd_h(cheapest)} > {usd_h(self.instance_cap)} "
                f"(min of filters.dph_max and budget.max_instance_dph)"
            )
        return ReasonCode.FLEET_PRICE_CAP, (
            f"fleet cap: fleet {usd_h(self.shared.fleet_dph)} + cheapest fitting offer {usd_h(cheapest)} "
            f"> max_fleet_dph {usd_h(self.fleet_cap)}"
        )

    def count_cap(self) -> tuple[ReasonCode, str] | None:
        """Why no box more may be rented for this pool (the fleet's max, then the pool's), or None."""
        fleet_max = count_cap(self.fleet.max_instances)
        if self.shared.count >= fleet_max:
            return (
                ReasonCode.INSTANCE_COUNT_CAP,
                f"instance cap: {self.shared.count} owned or rented box(es) = max_instances {fleet_max}",
            )
        pool_max = count_cap(self.pool.max_instances)
        if self.fleet.named_pools and self.count >= pool_max:
            return (
                ReasonCode.INSTANCE_COUNT_CAP,
                f"instance cap: {self.count} box(es) of pool {self.pool.name} = its max_instances {pool_max}",
            )
        return None

    def rent(self, o: Offer, code: ReasonCode, reason: str) -> Rent:
        self.shared.used.add(o.id)
        self.shared.renting.append(o)
        self.shared.rented += 1
        self.shared.count += 1
        self.shared.fleet_dph += o.dph_total
        self.count += 1
        return Rent(
            reason=reason,
            code=code,
            offer_id=o.id,
            label=rent_label(self.fleet, o.id, self.pool),
            image=self.pool.image,
            disk_gb=self.pool.disk_gb,
            dph=o.dph_total,
            gpu_name=o.gpu_name,
            num_gpus=o.num_gpus,
            onstart=rent_onstart(self.fleet),
            bid_dph=o.bid_dph,
        )


@dataclass
class _Tally:
    """Per sweep, what became of its unplaced runs (for the NOT_LAUNCHED no-op), across pools."""

    waits_for_booting: dict[str, int] = field(default_factory=dict)
    waits_for_busy: dict[str, int] = field(default_factory=dict)
    covered_by_rent: dict[str, int] = field(default_factory=dict)
    no_capacity: dict[str, int] = field(default_factory=dict)

    @staticmethod
    def add(into: dict[str, int], sweep: str, n: int = 1) -> None:
        into[sweep] = into.get(sweep, 0) + n


def rent_for(
    world: World,
    unplaced: tuple[PendingRun, ...],
    table: BoxTable,
    budget: Purse,
    launched: float,
    *,
    fc: Forecast,
    slots: tuple[tuple[int, tuple[int, ...], float], ...] = (),
) -> Decisions:
    """Rent for ``unplaced`` runs; ``launched`` is what this plan's launches already committed of the budget.

    Each pool rents for its own sweeps' runs, in fleet order; the budget, the fleet's $/h and count caps and the
    rent rate are shared by all pools.
    """
    out = Decisions()
    if budget.stop:
        return out
    spending = Spending(budget, committed=launched)
    alive = [world.boxes[i] for i in table.alive() if world.boxes[i].rented]
    shared = _Fleetwide(count=len(alive), fleet_dph=sum(b.inst.dph_total for b in alive))
    tally = _Tally()
    by_pool: dict[str, list[PendingRun]] = {name: [] for name in world.pools}
    for run in unplaced:
        by_pool.setdefault(world.pool_of_run(run.spec), []).append(run)
    for name, pool in world.pools.items():
        if pool.own:  # never rented for: its runs wait for a GPU on its machines
            if by_pool[name]:
                for run in by_pool[name]:
                    tally.add(tally.no_capacity, run.spec.sweep.name)
                out.noop(
                    f"pool/{name}",
                    ReasonCode.OWN_POOL_FULL,
                    f"{len(by_pool[name])} pending run(s) wait for a free GPU on the pool's own machines "
                    f"({len(pool.hosts)} host(s), provider ssh): rigsync never rents for it",
                )
            continue
        runs = _wait_for_busy(world, pool, tuple(by_pool[name]), table, fc, slots, tally, out)
        if _waits_on_rents(world, name, runs, tally, out):
            continue
        _rent_pool(world, pool, runs, table, budget, spending, shared, tally, out, fc)
    kinds = (tally.waits_for_booting, tally.waits_for_busy, tally.covered_by_rent, tally.no_capacity)
    for sweep in sorted(set().union(*kinds)):
        parts = []
        if tally.waits_for_booting.get(sweep):
            parts.append(f"{tally.waits_for_booting[sweep]} wait for boxes already booting")
        if tally.waits_for_busy.get(sweep):
            parts.append(f"{tally.waits_for_busy[sweep]} wait for a busy GPU")
        if tally.covered_by_rent.get(sweep):
            parts.append(f"{tally.covered_by_rent[sweep]} wait for boxes rented now")
        if tally.no_capacity.get(sweep):
            parts.append(f"{tally.no_capacity[sweep]} have no capacity")
        total = sum(d.get(sweep, 0) for d in kinds)
        out.noop(
            f"sweep/{sweep}",
            ReasonCode.NOT_LAUNCHED,
            f"{total} pending run(s) not launched: " + ", ".join(parts),
        )
    return out


def _waits_on_rents(
    world: World, pool: str, runs: tuple[PendingRun, ...], tally: _Tally, out: Decisions
) -> bool:
    """Whether renting for ``pool`` waits on a rent in flight (``rent_in_flight``): its runs wait for that box, said
    once. Else, when its runs would rent again after a rent that never produced a box, that is said too."""
    f = world.desired.fleet
    subj = f"fleet/{f.name}" if not f.named_pools else f"pool/{pool}"
    waits = rent_in_flight(world, pool)
    if waits is not None:
        for run in runs:
            tally.add(tally.waits_for_booting, run.spec.sweep.name)
        out.noop(subj, *waits)
        return True
    lost = rents_never_seen(world, pool)
    if lost and runs:
        r = lost[-1]
        out.noop(
            subj,
            ReasonCode.RENT_UNSEEN,
            f"the rent of instance/{r.instance_id} {fmt_duration(world.now - r.at)} ago never appeared in the list "
            f"nor answered (within {fmt_duration(RENT_SEEN_WITHIN_S)}): renting for pool {pool} once more; it does "
            "not count against max_rents_per_hour",
        )
    return False


@dataclass
class _HeldSlot:
    """A busy GPU slot of a held box, and when it is predicted free of its work (and of the runs it absorbs)."""

    box_id: int
    mask: tuple[int, ...]
    free_s: float
    first_free_s: float
    gpu_ram_mib: int
    gpu_name: str
    machine_id: int
    took: list[str] = field(default_factory=list)


def _wait_for_busy(
    world: World,
    pool: Pool,
    unplaced: tuple[PendingRun, ...],
    table: BoxTable,
    fc: Forecast,
    slots: tuple[tuple[int, tuple[int, ...], float], ...],
    tally: _Tally,
    out: Decisions,
) -> tuple[PendingRun, ...]:
    """The runs of ``pool`` that no held GPU slot takes sooner than a new box would be ready; each of the others
    waits for the fitting slot that frees first (in launch order), whose free time then grows by that run's
    predicted run time on it. One ``WAIT_FOR_BUSY_GPU`` no-op per slot that absorbs runs, naming the slot and both
    times."""
    busy: list[_HeldSlot] = []
    for box_id, mask, free_s in slots:
        box = world.boxes.get(box_id)
        if box is None or box.pool != pool.name or box_id in table.destroyed or not mask:
            continue
        inst = box.inst
        busy.append(_HeldSlot(box_id, mask, free_s, free_s, inst.gpu_ram_mib, inst.gpu_name, inst.machine_id))
    if not busy or not unplaced:
        return unplaced
    ready = fc.ready_s(pool.name)
    rest: list[PendingRun] = []
    for n, run in enumerate(unplaced):
        if min(b.free_s for b in busy) >= ready:  # every slot is busy past a new box's readiness: rent for the rest
            rest.extend(unplaced[n:])
            break
        fitting = [
            b for b in busy
            if b.free_s < ready
            and len(b.mask) >= run.gpus
            and (not run.gpu_ram_mib or b.gpu_ram_mib >= run.gpu_ram_mib)
            and contract.room_for(
                world.boxes[b.box_id].inst, world.now, b.free_s + fc.run_s(run.spec, b.gpu_name, b.machine_id),
                world.desired.fleet.contract_margin_s, world.observed.memory.accepted_increases,
            )
        ]
        if not fitting:
            rest.append(run)
            continue
        slot = min(fitting, key=lambda b: (b.free_s, b.box_id, b.mask))
        slot.took.append(run.spec.id)
        slot.free_s += fc.run_s(run.spec, slot.gpu_name, slot.machine_id)
        tally.add(tally.waits_for_busy, run.spec.sweep.name)
    for slot in sorted(busy, key=lambda b: (b.box_id, b.mask)):
        if not slot.took:
            continue
        runs = slot.took
        names = ", ".join(f"run/{r}" for r in runs[:3]) + (f" and {len(runs) - 3} more" if len(runs) > 3 else "")
        out.noop(
            world.boxes[slot.box_id].subject,
            ReasonCode.WAIT_FOR_BUSY_GPU,
            f"{len(runs)} pending run(s) ({names}) wait for {gpus_text(slot.mask)}: predicted free in "
            f"{fmt_duration(slot.first_free_s)}, sooner than a new box of pool {pool.name} would be ready "
            f"({fmt_duration(ready)}); not rented for",
        )
    return tuple(rest)


def _rent_pool(
    world: World,
    pool: Pool,
    unplaced: tuple[PendingRun, ...],
    table: BoxTable,
    budget: Purse,
    spending: Spending,
    shared: _Fleetwide,
    tally: _Tally,
    out: Decisions,
    fc: Forecast,
) -> None:
    """Rent for one pool's ``unplaced`` runs that no box on its way takes, then for its min_instances floor; what
    could not be rented says why once per reason."""
    shapes = len({(run.gpus, run.gpu_ram_mib) for run in unplaced})
    uncovered = _not_on_their_way(world, pool, unplaced, table, tally)
    renting = _PoolRenting(world, pool, budget, spending, tally, fc, _Market(world, table, pool, shared))
    renting.for_runs(uncovered, shapes, out)
    renting.keep_the_floor(out)
    renting.report(out)


def _not_on_their_way(
    world: World, pool: Pool, unplaced: tuple[PendingRun, ...], table: BoxTable, tally: _Tally
) -> list[PendingRun]:
    """The runs no box of the pool on its way (booting, bootstrapping, briefly unreachable) will take, first fit."""
    on_their_way = _Bins()
    for box_id in table.alive():
        if table.states.get(box_id) in _ON_THEIR_WAY and world.boxes[box_id].pool == pool.name:
            inst = world.boxes[box_id].inst
            left = inst.num_gpus - len(table.occupied.get(box_id, ()))
            if left > 0:
                on_their_way.add(_Bin(left, inst.gpu_ram_mib))
    uncovered: list[PendingRun] = []
    shapes = {(run.gpus, run.gpu_ram_mib) for run in unplaced}
    full: set[tuple[int, int]] = set()  # shapes no box on its way can take any more (bins only fill up)
    for n, run in enumerate(unplaced):
        if len(full) == len(shapes):
            uncovered.extend(unplaced[n:])
            break
        shape = (run.gpus, run.gpu_ram_mib)
        if shape not in full and on_their_way.fit(*shape):
            tally.add(tally.waits_for_booting, run.spec.sweep.name)
        else:
            full.add(shape)
            uncovered.append(run)
    return uncovered


_Why: TypeAlias = tuple[ReasonCode, str]
_Shape: TypeAlias = tuple[int, int]  # a run's GPUs and GPU memory (MiB)


@dataclass
class _PoolRenting:
    """One pool's renting in one plan: its market, the boxes it rented so far (as bins the next runs fill), and why
    the rest waits (``blocked``: by message, its code and the runs it left waiting)."""

    world: World
    pool: Pool
    budget: Purse
    spending: Spending
    tally: _Tally
    fc: Forecast
    market: _Market
    rented_bins: _Bins = field(default_factory=_Bins)
    blocked: dict[str, tuple[ReasonCode, int]] = field(default_factory=dict)
    blocked_req: dict[_Shape, _Why] = field(default_factory=dict)  # what the market refuses a shape, until a rent
    # Until the next rent nothing changes for a request shape that was just refused (no bin fits it, and the
    # same cap or market refuses it): its later runs are refused for the same reason without asking again.
    refused: dict[_Shape, _Why] = field(default_factory=dict)
    too_short: dict[tuple[int, int, str, float | None, float], _Why] = field(default_factory=dict)

    def block(self, code: ReasonCode, msg: str, runs: int) -> None:
        self.blocked[msg] = (code, self.blocked.get(msg, (code, 0))[1] + runs)

    def for_runs(self, uncovered: list[PendingRun], shapes: int, out: Decisions) -> None:
        """Rent for each run in turn, or say why it waits (``shapes``: how many request shapes the pool's runs have)."""
        to_go = Counter((r.gpus, r.gpu_ram_mib) for r in uncovered)  # runs of each shape from here on
        for n, run in enumerate(uncovered):
            to_go[(run.gpus, run.gpu_ram_mib)] -= 1
            if len(self.refused) == shapes:
                # every shape is refused and only a rent could change that, which a refused shape never makes
                rest = Counter((r.spec.sweep.name, r.gpus, r.gpu_ram_mib) for r in uncovered[n:])
                for (sweep, g, ram), k in rest.items():
                    self.block(*self.refused[(g, ram)], k)
                    self.tally.add(self.tally.no_capacity, sweep, k)
                return
            why = self._for_run(run, to_go[(run.gpus, run.gpu_ram_mib)], out)
            if why is not None:
                self.block(why[0], why[1], 1)
                self.tally.add(self.tally.no_capacity, run.spec.sweep.name)

    def _for_run(self, run: PendingRun, more: int, out: Decisions) -> _Why | None:
        """Why ``run`` waits (None: a box rented now takes it); ``more`` runs of its shape come after it."""
        spec = run.spec
        g, ram = shape = run.gpus, run.gpu_ram_mib
        # a contract too short for this work may not be for a shorter run of the shape: that refusal is kept per work
        work_key = (g, ram, spec.sweep.name, spec.sweep.expected_runtime_s, spec.sweep.max_runtime_s)
        known = self.refused.get(shape) or self.too_short.get(work_key)
        if known is not None:
            return known
        if self.rented_bins.fit(g, ram):
            self.tally.add(self.tally.covered_by_rent, spec.sweep.name)
            return None
        why = self._rent_or_why(run, more, out)
        if why is not None and why[0] is ReasonCode.CONTRACT_TOO_SHORT:
            self.too_short[work_key] = why
        elif why is not None:
            self.refused[shape] = why
        return why

    def _gate(self, shape: _Shape) -> _Why | None:
        """What refuses any rent for a run of ``shape`` before an offer is looked at (None: nothing)."""
        if self.budget.binds:
            return ReasonCode.BUDGET_REFUSED, f"budget: on_exceed drain, renting nothing: {self.budget.verdict()}"
        if shape in self.blocked_req:
            return self.blocked_req[shape]
        return self.market.count_cap() or rent_gate(self.world, self.market.shared.rented)

    def _rent_or_why(self, run: PendingRun, more: int, out: Decisions) -> _Why | None:
        """Rent for ``run``: a box of several GPUs when it is cheaper per run and fills, else the best offer; or why
        not (a cap, the market, the budget, the account's credit)."""
        spec, g, ram = run.spec, run.gpus, run.gpu_ram_mib
        gate = self._gate((g, ram))
        if gate is not None:
            return gate
        need, what = _work_s(self.fc, self.pool, spec), f"run {spec.id}"
        o = self.market.pick(g, ram, (spec.sweep,), need, what)
        if o is None:
            why = self.market.why_not(g, ram)
            if why[0] is not ReasonCode.CONTRACT_TOO_SHORT:  # the contract refuses this work, not every run's
                self.blocked_req[(g, ram)] = why
            return why
        many = self.market.multi_gpu(o, g, ram, more + 1, _per_run(self.fc, spec, g), need, what)
        if many is not None and self._affords(cost := _rent_cost(self.world, self.budget, many, spec, g)):
            reason = _multi_gpu_reason(self.fc, self.pool, spec, g, more, o, many)
            self._rent(out, spec, g, many, cost, ReasonCode.RENT_MULTI_GPU, reason)
            return None
        if not self.spending.fits(cost := _rent_cost(self.world, self.budget, o, spec, g)):
            return ReasonCode.BUDGET_REFUSED, (
                f"budget: renting {o.gpu_name} x{o.num_gpus} at {usd_h(o.dph_total)} would commit ~{usd(cost)} "
                f"(the box while it boots, up to boot_timeout, to the next decision, and the launch it is "
                f"rented for), "
                f"{usd(max(0.0, self.spending.left()))} is left before {self.budget.tightest}"
            )
        if not self.spending.credit_fits(cost):
            return ReasonCode.CREDIT_REFUSED, (
                f"account credit {usd(self.budget.credit or 0.0)} cannot cover the projected spend with "
                f"{o.gpu_name} x{o.num_gpus} at {usd_h(o.dph_total)}"
            )
        reason = (
            f"pending run {spec.id} needs {g} GPU(s); best by {self.pool.ranking.value}: {o.gpu_name} "
            f"x{o.num_gpus} at {usd_h(o.dph_total)} ({o.num_gpus // g} slot(s))" + _bid_text(o)
        )
        code = ReasonCode.RENT_FOR_PENDING
        if self.market.explored is not None:
            code, reason = ReasonCode.EXPLORE_UNMEASURED, f"{reason}; exploring: {self.market.explored.detail}"
        self._rent(out, spec, g, o, cost, code, reason)
        return None

    def _affords(self, cost: float) -> bool:
        return self.spending.fits(cost) and self.spending.credit_fits(cost)

    def _rent(
        self, out: Decisions, spec: RunSpec, g: int, o: Offer, cost: float, code: ReasonCode, reason: str
    ) -> None:
        """Rent ``o`` for a run of ``spec`` on ``g`` GPUs: its cost committed, its other slots a bin for the next."""
        self.spending.commit(cost, new_dph=o.dph_total)
        self.tally.add(self.tally.covered_by_rent, spec.sweep.name)
        out.act(self.market.rent(o, code, reason))
        self.rented_bins.add(_Bin(o.num_gpus - g, o.gpu_ram_mib))
        self.refused.clear()
        self.too_short.clear()

    def keep_the_floor(self, out: Decisions) -> None:
        """Rent up to the pool's min_instances boxes even with no work, within the caps, the budget and the rate."""
        f, pool, market, budget, spending = self.world.desired.fleet, self.pool, self.market, self.budget, self.spending
        min_n = min(count_cap(pool.min_instances), count_cap(pool.max_instances), count_cap(f.max_instances))
        while market.count < min_n and market.count_cap() is None:
            if budget.binds:
                self.block(ReasonCode.BUDGET_REFUSED, f"budget: not renting for min_instances {min_n}: "
                           f"{budget.verdict()}", 0)
                return
            gate = rent_gate(self.world, market.shared.rented)
            if gate is not None:
                self.block(gate[0], f"min_instances {min_n}: {gate[1]}", 0)
                return
            o = market.pick(1, 0, what="a box kept for min_instances")
            if o is None:
                code, text = market.why_not(1, 0)
                self.block(code, f"min_instances {min_n}: {text}", 0)
                return
            keep = o.dph_total * budget.horizon_h
            if not spending.fits(keep) or not spending.credit_fits(keep):
                self.block(
                    ReasonCode.BUDGET_REFUSED if not spending.fits(keep) else ReasonCode.CREDIT_REFUSED,
                    f"budget: not renting for min_instances {min_n}: {o.gpu_name} x{o.num_gpus} at "
                    f"{usd_h(o.dph_total)} would bill {usd(keep)} to the next decision, "
                    f"{usd(max(0.0, spending.left()))} left, credit {usd(budget.credit or 0.0)}",
                    0,
                )
                return
            spending.commit(keep, new_dph=o.dph_total)
            reason = (
                f"keeping min_instances {min_n} ({market.count} owned or rented); best by {pool.ranking.value}: "
                f"{o.gpu_name} x{o.num_gpus} at {usd_h(o.dph_total)}"
            )
            out.act(market.rent(o, ReasonCode.RENT_FOR_MIN_INSTANCES, reason))

    def report(self, out: Decisions) -> None:
        """What was not rented and why: offers whose contract is too short or exploration capped, each blocked reason
        once (with the runs it leaves waiting); the account's credit and the rent backoff and rate as warnings too."""
        f = self.world.desired.fleet
        subj = f"fleet/{f.name}" if not f.named_pools else f"pool/{self.pool.name}"
        for oid, text in sorted(self.market.short.items()):
            out.noop(f"offer/{oid}", ReasonCode.CONTRACT_TOO_SHORT, f"not rented: {text}")
        for oid, ex in sorted(self.market.capped.items()):
            out.noop(f"offer/{oid}", ReasonCode.EXPLORE_CAPPED, f"not rented, exploration_share used up: {ex.detail}")
        for msg, (code, n) in sorted(self.blocked.items()):
            tail = f"; {n} pending run(s) wait" if n else ""
            out.noop(subj, code, f"{msg}{tail}")
            if code is ReasonCode.CREDIT_REFUSED:
                out.warnings.append(f"budget: {msg}{tail}")  # the account itself is short: say it where people look
            if code in (ReasonCode.RENT_BACKOFF, ReasonCode.RENT_RATE_LIMITED):
                out.warnings.append(f"renting: {msg}{tail}")  # `rigsync status` shows these


def _multi_gpu_reason(fc: Forecast, pool: Pool, spec: RunSpec, g: int, more: int, o: Offer, many: Offer) -> str:
    """Why a box of several GPUs is rented for ``spec``'s run and ``more`` of its shape instead of ``o``."""
    per_run = _per_run(fc, spec, g)
    return (
        f"pending run {spec.id} and {more} more of its shape need {g} GPU(s) each; "
        f"{many.gpu_name} x{many.num_gpus} at {usd_h(many.dph_total)} ({many.num_gpus // g} slot(s)) is "
        f"{usd(per_run(many))} a run against {usd(per_run(o))} on the best "
        f"by {pool.ranking.value} ({o.gpu_name} x{o.num_gpus} at {usd_h(o.dph_total)})" + _bid_text(many)
    )


def _per_run(fc: Forecast, spec: RunSpec, gpus: int) -> Callable[[Offer], float]:
    """An offer's $ for one run of ``spec`` on one of its ``gpus``-GPU slots: its $/h share times the forecast run
    time on that GPU model and machine (``Forecast.run_s``: measured rates once learned, DLPerf until then)."""

    def cost(o: Offer) -> float:
        share = o.dph_total * gpus / max(1, o.num_gpus)
        return share * fc.run_s(spec, o.gpu_name, o.machine_id) / 3600.0

    return cost


def _work_s(fc: Forecast, pool: Pool, spec: RunSpec) -> Callable[[Offer], float]:
    """The seconds a box rented on an offer needs for the run it is rented for: the pool's predicted readiness
    (``Forecast.ready_s``) plus the run's predicted time on that GPU model and machine (``Forecast.run_s``)."""
    ready = fc.ready_s(pool.name)

    def need(o: Offer) -> float:
        return ready + fc.run_s(spec, o.gpu_name, o.machine_id)

    return need


def _bid_text(o: Offer) -> str:
    if o.bid_dph is None or o.min_bid is None:
        return ""
    bid, least = usd_h(o.bid_dph), usd_h(o.min_bid)
    return f"; interruptible: bid {bid} (minimum {least}), resumed from its checkpoint if outbid"


def _rent_cost(world: World, budget: Purse, o: Offer, spec: RunSpec, gpus: int) -> float:
    """A new box until it can work and to the next decision after, plus the launch it is rented for.

    A box bills from the rent while it boots and bootstraps, and may do so for up to ``boot_timeout`` before it is
    ready or destroyed: that allowance is part of its price. Without it a binding cap rents boxes whose launch no
    longer fits once they are ready, destroys them idle and rents again (found by bench/chaos.py, 1.12x the cap).
    """
    hours = runtime_of(budget.runtimes, spec).on(world.gpu_dlperf.get(normalize_gpu_name(o.gpu_name)))
    until_ready_h = world.desired.fleet.boot_timeout_s / 3600.0
    return o.dph_total * (budget.horizon_h + until_ready_h) + o.dph_total * gpus / max(1, o.num_gpus) * hours
