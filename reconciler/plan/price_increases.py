"""Price increases on live contracts: accept the ones that still fit, reject the rest.

A host may raise the price of a box this fleet holds (``Observed.price_increases``, read each cycle). Accepted,
the box bills the new rate from the contract's current end (``applies_at``) and runs on to the ask's end;
rejected or left unanswered, the contract ends at ``applies_at`` and the host takes the box back (the contract
rules of renting, placement and requeue then move the work off it before the end: not restated here).

An increase is accepted when, at the new rate, the box still passes:

* its pool's per-box cap and the fleet's ``max_instance_dph`` (``offers.box_cap_dph``, the one per-box cap);
* the fleet's ``max_fleet_dph`` with every box held at the rate it bills at ``applies_at`` (increases accepted
  earlier in this plan included);
* the budget: what the tightest of ``daily_usd``/``total_usd`` leaves at ``applies_at``, once the boxes held
  have billed until then at the rates that apply (``money.left_at``), still pays the fleet at the new rates to
  the decision after it (one cycle, ``Controller.cycle_s``). When nothing is left by then at the current rates,
  the budget's own rules stop the box before the new rate could bill: the budget does not decide (the reason
  says so);
* the ranking: no offer its pool could rent (passing its filters and the host ledger, under its per-box cap:
  ``World.pool_offers``) ranks better by the pool's ranking (``offers.rank_key``) than the box at its new price.
  The box is compared as an offer of its GPUs (its DLPerf as listed, else the market's median for its model), its
  machine (the host ledger's penalty), its reliability taken as the best (it is running for us) and the new
  price. For the rankings
  that do not look at the price (``dlperf``, ``reliability``) an offer decides only when it also costs no more
  than the new rate: the increase did not change the box's standing by them. ``work_per_dph`` scores the box
  among the offers with the pool's sweeps weighed alike.

Otherwise it is rejected. Each answer's reason says the old and new $/h, when the new rate applies, and the cap or
the offer that decided (the best alternative's figures either way). A box destroyed in this plan is not answered
(it is gone before the rate could apply); an increase already accepted is not answered again.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from reconciler.core.actions import AnswerPriceIncrease, Destroy, ReasonCode
from reconciler.core.contract import rate_at
from reconciler.core.model import Offer, PriceIncrease, Ranking, Sweep
from reconciler.core.offers import box_cap_dph, normalize_gpu_name, rank_key
from reconciler.core.throughput import work_score
from reconciler.plan.common import EPS, Decisions, fleet_dph_cap, fmt_duration, fmt_utc, usd, usd_h
from reconciler.plan.money import left_at
from reconciler.plan.world import OwnedBox, World

_PRICE_BLIND = (Ranking.DLPERF, Ranking.RELIABILITY)


@dataclass(frozen=True)
class PriceVerdict:
    accept: bool
    why: str  # what decided, with its figures


def answer_increases(world: World, decided_so_far: Iterable[object]) -> Decisions:
    """One answer per pending increase on a box this fleet holds (not destroyed by this plan), by increase id."""
    out = Decisions()
    destroyed = {a.instance_id for a in decided_so_far if isinstance(a, Destroy)}
    already = {p.id for p in world.observed.memory.accepted_increases}
    accepted = list(world.observed.memory.accepted_increases)
    for inc in sorted(world.observed.price_increases, key=lambda p: p.id):
        box = world.boxes.get(inc.instance_id)
        if box is None or box.own_box or inc.id in already:
            continue
        subject = f"instance/{inc.instance_id}"
        if inc.instance_id in destroyed:
            out.noop(subject, ReasonCode.PRICE_INCREASE_REJECTED,
                     f"price increase {inc.id} ({rates_text(box.inst.dph_total, inc.new_dph)} from "
                     f"{_when(world, inc)}) not answered: the box is destroyed by this plan")
            continue
        verdict = judge(world, box, inc, accepted)
        if verdict.accept:
            accepted.append(inc)
        old = box.inst.dph_total
        when = _when(world, inc)
        verb = "accept" if verdict.accept else "reject"
        out.act(
            AnswerPriceIncrease(
                reason=f"{verb} price increase on instance {inc.instance_id}: {rates_text(old, inc.new_dph)} "
                       f"from {when} ({verdict.why})",
                code=ReasonCode.PRICE_INCREASE_ACCEPTED if verdict.accept else ReasonCode.PRICE_INCREASE_REJECTED,
                pending_id=inc.id,
                instance_id=inc.instance_id,
                accept=verdict.accept,
                old_dph=old,
                new_dph=inc.new_dph,
                applies_at=inc.applies_at,
            )
        )
    return out


def rates_text(old: float, new: float) -> str:
    """``$0.200/h -> $0.240/h``; to the hundredth of a cent when the tenth would show no change."""
    if f"{old:.3f}" == f"{new:.3f}" and old != new:
        return f"${old:.4f}/h -> ${new:.4f}/h"
    return f"{usd_h(old)} -> {usd_h(new)}"


def _when(world: World, inc: PriceIncrease) -> str:
    ahead = inc.applies_at - world.now
    rel = f"in {fmt_duration(ahead)}" if ahead > 0 else "now"
    return f"{fmt_utc(inc.applies_at)}, {rel}"


def judge(world: World, box: OwnedBox, inc: PriceIncrease, accepted: list[PriceIncrease]) -> PriceVerdict:
    """Accept or reject ``inc`` on ``box``, with what decided and the best alternative the pool could rent (where
    the work could move); ``accepted``: the increases that apply besides it."""
    pool = world.pools.get(box.pool) or next(iter(world.pools.values()))
    new = inc.new_dph
    if not (math.isfinite(new) and new >= 0):
        return PriceVerdict(False, f"the new rate {new!r} is not a price")
    better, best = _better_offer(world, box, inc, pool.name)
    alt = f"best alternative offer {best.id}: {_offer_text(best)}" if best is not None else "no alternative offer"
    limit = box_cap_dph(pool, world.desired.budget)
    if new > limit:
        return PriceVerdict(False, f"over the per-box cap {usd_h(limit)} of pool {pool.name}; {alt}")
    with_it = [*accepted, inc]
    at = inc.applies_at
    fleet_at = sum(rate_at(b.inst, at, with_it) for b in world.boxes.values() if not b.own_box)
    fleet_cap = fleet_dph_cap(world.desired)
    if fleet_at > fleet_cap + EPS:
        why = f"the fleet would bill {usd_h(fleet_at)}, over max_fleet_dph {usd_h(fleet_cap)}; {alt}"
        return PriceVerdict(False, why)
    left, tightest = left_at(world, at, accepted)
    horizon = max(0.0, world.controller.cycle_s)
    need = fleet_at * horizon / 3600.0
    note = ""
    if math.isfinite(left) and left <= 0:
        # the budget stops the box at its current rates before the new one applies: it never bills the new rate
        note = f"; the budget stops the box before then at its current rate ({tightest})"
    elif math.isfinite(left) and need > left + 1e-12:
        return PriceVerdict(
            False,
            f"the budget would not pay it: {tightest}: {usd(max(0.0, left))} left then, the fleet at "
            f"{usd_h(fleet_at)} needs {usd(need)} to the next decision ({fmt_duration(horizon)}); {alt}",
        )
    if better is not None:
        return PriceVerdict(False, f"offer {better.id} ranks better by {pool.ranking.value}: {_offer_text(better)}")
    return PriceVerdict(True, f"fits the caps and still ranks first{note}; {alt}")


def _offer_text(o: Offer) -> str:
    return f"{o.num_gpus}x {o.gpu_name} at {usd_h(o.dph_total)}"


def _better_offer(world: World, box: OwnedBox, inc: PriceIncrease, pool_name: str) -> tuple[Offer | None, Offer | None]:
    """(the best offer that ranks better than the box at its new price, or None; the best alternative at all)."""
    pool = world.pools[pool_name]
    limit = box_cap_dph(pool, world.desired.budget)
    offers = [o for o in world.pool_offers.get(pool_name, ()) if o.dph_total <= limit]
    if not offers:
        return None, None
    inst = box.inst
    dlperf = inst.dlperf if inst.dlperf is not None and math.isfinite(inst.dlperf) and inst.dlperf > 0 else (
        world.gpu_dlperf.get(normalize_gpu_name(inst.gpu_name), 0.0) * max(1, inst.num_gpus)
    )
    me = Offer(
        id=-inst.id, machine_id=inst.machine_id, gpu_name=inst.gpu_name, num_gpus=inst.num_gpus,
        gpu_ram_mib=inst.gpu_ram_mib, dph_total=inc.new_dph, dlperf=dlperf,
        dlperf_per_dph=dlperf / inc.new_dph if inc.new_dph > 0 else math.inf, reliability=1.0,
        inet_down_mbps=0.0, cuda=inst.cuda or 0.0, verified=True, geolocation="", disk_space_gb=0.0,
    )
    scores = None
    if pool.ranking is Ranking.WORK_PER_DPH:
        sweeps: dict[str, Sweep] = {}
        for spec in world.runs.values():
            if world.pool_of_run(spec) == pool_name:
                sweeps.setdefault(spec.sweep.name, spec.sweep)
        weights = tuple((s, 1.0) for _, s in sorted(sweeps.items()))
        scores = work_score([me, *offers], weights, world.rates, world.gpu_dlperf, normalize_gpu_name)
    key = rank_key(pool.ranking, world.observed.memory.hosts, scores)
    ranked = sorted([me, *offers], key=key)
    best = next(o for o in ranked if o is not me)
    for o in ranked:
        if o is me:
            return None, best
        if pool.ranking in _PRICE_BLIND and o.dph_total > inc.new_dph:
            continue
        return o, best
    return None, best
