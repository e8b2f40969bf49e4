"""Phase 0: the inputs indexed once (runs by id, archive by attempt, owned boxes with their probe), and the budget.

Foreign instances are set aside here, so no later phase can act on one: they are reported and never touched.

The sweeps' progress rates are learned here once (``reconciler.core.throughput``): ``World.learned`` from the archive
alone (what observed/throughput.yaml commits, and what the stall rule compares a live attempt against), and
``World.rates`` with the live attempts' progress so far counted too (what forecasts and the ranking use). A pool
ranked ``work_per_dph`` orders its offers by ``throughput.work_score`` with each of its sweeps weighed by its
pending runs (desired runs routed to the pool with no succeeded attempt in the archive).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from reconciler.core.actions import ReasonCode
from reconciler.core.identity import pool_spec_hash, slot_pool
from reconciler.core.model import (
    AttemptOutcome,
    AttemptRecord,
    BoxMemory,
    BoxProbe,
    Controller,
    Desired,
    Drift,
    DriftClass,
    Instance,
    Observed,
    Offer,
    Ownership,
    Pool,
    Ranking,
    RunSpec,
    Sweep,
    owned_by,
)
from reconciler.core.offers import as_interruptible, normalize_gpu_name, offer_skipped, passing_offers, rank_key
from reconciler.core.remember import answered, still_held
from reconciler.core.runphase import OurAttempt, launched_by_box
from reconciler.core.throughput import (
    Exploration,
    Rates,
    Sample,
    archive_samples,
    exploration,
    learn,
    progress_value,
    work_score,
)
from reconciler.plan.common import Decisions


@dataclass(frozen=True)
class OwnedBox:
    """A box carrying this fleet's label, with what its probe and the cross-cycle memory say."""

    id: int
    inst: Instance
    own: Ownership
    probe: BoxProbe | None
    memory: BoxMemory | None
    pool: str = ""  # the fleet pool it was rented for (its label's suffix; the first pool without one)
    own_box: bool = False  # one of the lab's own machines (a provider ssh pool): never destroyed, never counted
    # since when the controller has distrusted this box although it answers (``FleetMemory.distrusted``): its probe
    # is then planned as unusable, and its unreachable_grace counts from here
    distrusted_since: float | None = None
    # held by this fleet, missing from the provider's list this cycle but answering its probe (``remember.still_held``):
    # planned as a listed box would be
    unlisted: bool = False

    @property
    def rented(self) -> bool:
        return not self.own_box

    @property
    def reachable(self) -> bool:
        return self.probe is not None and self.probe.reachable

    @property
    def subject(self) -> str:
        return f"instance/{self.inst.id}"


PLANNING_ALONE = Controller()  # no controller's settings: the default cycle, no secrets allowed, no store


@dataclass(frozen=True)
class World:
    desired: Desired
    observed: Observed
    controller: Controller  # the settings of the controller that plans (its cycle, secrets, store)
    now: float
    runs: Mapping[str, RunSpec]  # desired order; the first of a duplicated id wins
    run_index: Mapping[str, int]
    archived: Mapping[tuple[str, int], AttemptRecord]
    history: Mapping[str, tuple[AttemptRecord, ...]]
    boxes: Mapping[int, OwnedBox]  # owned by this fleet, by id (ascending)
    listed_ids: frozenset[int]  # every instance the provider lists, ours or not
    current_spec: str  # the first pool's spec hash
    offers: tuple[Offer, ...]  # the offers some pool may rent, best first (the first pool's ranking)
    pools: Mapping[str, Pool]  # by name, in fleet order
    pool_specs: Mapping[str, str]  # pool name -> the spec hash its boxes are built for
    pool_offers: Mapping[str, tuple[Offer, ...]]  # pool name -> the offers it may rent, best first by its ranking

    def bootstrap_of(self, box: OwnedBox) -> str:
        """The bootstrap hash a box's pool asks for ("" when none, or when its pool is gone from the fleet)."""
        pool = self.pools.get(box.pool)
        return pool.bootstrap_hash if pool is not None else ""

    def spec_of(self, box: OwnedBox) -> str:
        """The spec hash a box's pool builds boxes for ("" when its pool is gone from the fleet: it has drifted)."""
        return self.pool_specs.get(box.pool, "")

    def pool_of_run(self, spec: RunSpec) -> str:
        """The pool a run goes to: its sweep's ``pool``, or the first."""
        return spec.sweep.pool or next(iter(self.pools))

    def exploration(
        self, offer: Offer, pool: str, sweeps: Sequence[Sweep], renting: Sequence[Offer] = ()
    ) -> Exploration:
        """``throughput.exploration`` of renting ``offer`` in ``pool`` now for ``sweeps``: the fleet's rented boxes
        held and the offers this plan rents before it (``renting``), its ``exploration_share``, the pool's offers as
        the options and the plan's rates (see its contract)."""
        held = [(b.inst.gpu_name, b.inst.machine_id) for b in self.boxes.values() if b.rented]
        held += [(o.gpu_name, o.machine_id) for o in renting]
        return exploration(
            offer, sweeps, self.rates, held, self.desired.fleet.exploration_share, self.pool_offers.get(pool, ()),
            self.gpu_dlperf, normalize_gpu_name,
        )

    gpu_dlperf: Mapping[str, float]  # normalised GPU name -> median DLPerf of one such GPU on the market
    learned: Rates  # the sweeps' progress rates from the archive alone (observed/throughput.yaml)
    rates: Rates  # the same with the live attempts' progress so far (forecasts, ranking)
    # per owned box that answers, what it shows of the attempts this fleet launched there (``launched_by_box``)
    ours: Mapping[int, tuple[OurAttempt, ...]]
    # why this cycle's list is not believed (``list_doubt``): the plan then acts on nothing. None: believed
    doubted: str | None = None


def index_world(
    desired: Desired, observed: Observed, controller: Controller, now: float
) -> tuple[World, Decisions]:
    """The inputs indexed once (see ``World``); ``controller`` is the one that plans (``PLANNING_ALONE`` for a
    price or a review made away from any controller)."""
    out = Decisions()
    ids = [r.id for r in desired.runs]
    runs: dict[str, RunSpec] = dict(zip(ids, desired.runs, strict=True))
    run_index: dict[str, int] = dict(zip(ids, range(len(ids)), strict=True))
    if len(runs) < len(ids):  # a duplicated id: the first one is used
        runs, run_index = {}, {}
        for i, r in enumerate(desired.runs):
            if r.id not in runs:
                runs[r.id] = r
                run_index[r.id] = i
            else:
                out.warnings.append(f"run id {r.id} appears twice in desired; the first is used")
    history: dict[str, list[AttemptRecord]] = {}
    archived: dict[tuple[str, int], AttemptRecord] = {}
    for h in observed.history:
        history.setdefault(h.run_id, []).append(h)
        archived[h.key] = h
    probes = {p.instance_id: observed.memory.vetted(p) for p in observed.probes}  # (observe vets them already)
    distrusted = {d.instance_id: d.since for d in observed.memory.distrusted}
    memory = {m.instance_id: m for m in observed.memory.boxes}
    f = desired.fleet
    fleet = f.name
    boxes: dict[int, OwnedBox] = {}
    for inst in sorted(observed.instances, key=lambda i: i.id):
        own = owned_by(fleet, inst.label)
        if own is None:
            subject = f"instance/{inst.id}"
            other = Ownership.parse(inst.label)
            why = "no rigsync label" if other is None else f"owned by fleet {other.fleet!r}"
            out.noop(subject, ReasonCode.FOREIGN, f"foreign instance ({why}): reported, never touched")
            detail = f"label {inst.label!r}, {inst.gpu_name} x{inst.num_gpus}"
            out.drift.append(Drift(DriftClass.FOREIGN, subject, detail, "none"))
            continue
        if inst.id not in boxes:
            pool = slot_pool(f, own.slot)
            of = f.pool(pool)
            mine = of is not None and of.own and inst.id < 0  # only the ids own_boxes() makes: never a rented box
            boxes[inst.id] = OwnedBox(
                inst.id, inst, own, probes.get(inst.id), memory.get(inst.id), pool, mine, distrusted.get(inst.id)
            )
    _hold_unlisted(desired, observed, boxes, out)
    doubted = list_doubt(boxes.values())
    if doubted is not None:
        out.noop(f"fleet/{fleet}", ReasonCode.LIST_IMPLAUSIBLE, doubted)
        out.warnings.append(f"observation failed: {doubted}")
    pools = {p.name: p for p in f.pools}
    dlperf = gpu_dlperf(observed.offers)
    archive = archive_samples(observed.history, normalize_gpu_name)
    learned = learn(archive)
    probed = (b.probe for b in boxes.values() if b.probe is not None)
    ours = launched_by_box(probed, observed.memory.in_flight, archived)
    rates = learn([*archive, *_live_samples(runs, boxes, ours, now)])
    weights = _pool_weights(desired, runs, observed.history)
    pool_offers = _rentable_offers(desired, observed, now, out, rates, dlperf, weights)
    first = next(iter(pools))
    union = {o.id: o for offers in pool_offers.values() for o in offers}
    ranked: list[Offer] = []
    if len(pools) > 1:  # the first pool's ranking over every pool's offers (work_per_dph: each offer's best score)
        scores: dict[int, float] = {}
        if pools[first].ranking is Ranking.WORK_PER_DPH:
            for name, offers in pool_offers.items():
                for oid, v in work_score(offers, weights.get(name, ()), rates, dlperf, normalize_gpu_name).items():
                    scores[oid] = max(v, scores.get(oid, 0.0))
        ranked = sorted(union.values(), key=rank_key(pools[first].ranking, observed.memory.hosts, scores))
    world = World(
        desired=desired,
        observed=observed,
        controller=controller,
        now=now,
        runs=runs,
        run_index=run_index,
        archived=archived,
        history={k: tuple(v) for k, v in history.items()},
        boxes=boxes,
        listed_ids=frozenset(i.id for i in observed.instances),
        current_spec=pool_spec_hash(pools[first]),
        offers=tuple(ranked) if len(pools) > 1 else pool_offers[first],
        pools=pools,
        pool_specs={name: pool_spec_hash(p) for name, p in pools.items()},
        pool_offers=pool_offers,
        gpu_dlperf=dlperf,
        learned=learned,
        rates=rates,
        ours=ours,
        doubted=doubted,
    )
    return world, out


# A list that drops more than this share of the rented boxes held (at least ``LIST_DOUBT_MIN_HELD`` of them) while
# they still answer is not believed: an observation failure, not a fleet that left.
LIST_DOUBT_SHARE = 0.5
LIST_DOUBT_MIN_HELD = 2


def list_doubt(boxes: Iterable[OwnedBox]) -> str | None:
    """Why the provider's list is not believed this cycle, or None: it dropped most of the rented boxes held
    (``LIST_DOUBT_SHARE`` of at least ``LIST_DOUBT_MIN_HELD``) while those still answer their probes."""
    held = [b for b in boxes if b.rented]
    dropped = [b for b in held if b.unlisted and answered(b.probe)]
    if len(held) < LIST_DOUBT_MIN_HELD or len(dropped) <= LIST_DOUBT_SHARE * len(held):
        return None
    ids = ", ".join(b.subject for b in dropped)
    return (
        f"the provider's list dropped {len(dropped)} of the {len(held)} boxes held ({ids}) while they answer: the "
        "list is not believed; nothing is rented, launched, requeued or destroyed this cycle"
    )


def _hold_unlisted(
    desired: Desired, observed: Observed, boxes: dict[int, OwnedBox], out: Decisions
) -> None:
    """The held boxes the list dropped that still answer (``remember.still_held``) join ``boxes`` as unlisted, said
    so: not vanished, their attempts stay, they are not replaced."""
    f = desired.fleet
    memory = {m.instance_id: m for m in observed.memory.boxes}
    probes = {p.instance_id: observed.memory.vetted(p) for p in observed.probes}  # a distrusted box is not held
    for inst in still_held(observed.unlisted, probes.values()):
        own = owned_by(f.name, inst.label)
        if own is None or inst.id in boxes:
            continue
        pool = slot_pool(f, own.slot)
        box = OwnedBox(inst.id, inst, own, probes.get(inst.id), memory.get(inst.id), pool, unlisted=True)
        boxes[inst.id] = box
        out.noop(
            box.subject, ReasonCode.BOX_UNLISTED,
            "missing from the provider's list but answered its probe with this fleet's key: unlisted, not "
            "vanished; kept with its attempts, not replaced",
        )
    for k in sorted(boxes):  # ascending ids, as the list gives them
        boxes[k] = boxes.pop(k)


def _live_samples(
    runs: Mapping[str, RunSpec], boxes: Mapping[int, OwnedBox], ours: Mapping[int, tuple[OurAttempt, ...]], now: float
) -> list[Sample]:
    """The live attempts' progress so far as samples: the live attempts this fleet launched (not resumed) on its
    boxes that answer, of a sweep with a progress key."""
    out: list[Sample] = []
    for box_id, attempts in ours.items():
        box = boxes[box_id]
        if box.probe is None or box.probe.unusable:
            continue
        for a in attempts:
            rd = a.run_dir
            spec = runs.get(rd.run_id)
            if spec is None or not a.live or rd.started_at is None or a.launch.resumed_from is not None:
                continue
            done = progress_value(spec.sweep, rd.last_metrics)
            if done is not None:
                gpu = normalize_gpu_name(box.inst.gpu_name)
                out.append(Sample(spec.sweep.name, gpu, box.inst.machine_id, done, now - rd.started_at))
    return out


def _pool_weights(
    desired: Desired, runs: Mapping[str, RunSpec], history: Iterable[AttemptRecord]
) -> dict[str, tuple[tuple[Sweep, float], ...]]:
    """Per pool, each of its sweeps with its pending runs (desired runs with no succeeded attempt), for the
    ``work_per_dph`` ranking; a sweep with none pending weighs 0 (``work_score`` then weighs every sweep 1)."""
    done = {h.run_id for h in history if h.phase is AttemptOutcome.SUCCEEDED}
    first = desired.fleet.pools[0].name
    counts: dict[str, dict[str, list[float]]] = {}
    sweeps: dict[str, Sweep] = {}
    for spec in runs.values():
        pool = spec.sweep.pool or first
        sweeps.setdefault(spec.sweep.name, spec.sweep)
        entry = counts.setdefault(pool, {}).setdefault(spec.sweep.name, [0.0])
        if spec.id not in done:
            entry[0] += 1
    return {
        pool: tuple((sweeps[name], w[0]) for name, w in sorted(per.items())) for pool, per in counts.items()
    }


def _rentable_offers(
    desired: Desired,
    observed: Observed,
    now: float,
    out: Decisions,
    rates: Rates,
    dlperf: Mapping[str, float],
    weights: Mapping[str, tuple[tuple[Sweep, float], ...]],
) -> dict[str, tuple[Offer, ...]]:
    """Per pool, the offers that pass its filters and the host ledger's rules, best first by its ranking and the
    host penalty (``work_per_dph``: by ``throughput.work_score`` with the pool's sweeps weighed by their pending
    runs). An offer the ledger keeps back is said once, whichever pools it passes."""
    f = desired.fleet
    said: set[int] = set()
    per_pool: dict[str, tuple[Offer, ...]] = {}
    for pool in f.pools:
        kept: list[Offer] = []
        market: list[Offer] = list(observed.offers)
        if pool.max_bid_dph is not None:  # interruptible allowed: an offer that takes a bid is priced as one
            market = [as_interruptible(o, pool.max_bid_dph) or o for o in market]
        for o in passing_offers(market, pool.filters, pool.disk_gb):
            skipped = offer_skipped(o, f, observed.memory.hosts, now)
            if skipped is None:
                kept.append(o)
            elif o.id not in said:
                said.add(o.id)
                code = ReasonCode.GHOST_OFFER if skipped[0] == "ghost" else ReasonCode.HOST_AVOIDED
                out.noop(f"offer/{o.id}", code, f"not rented: {skipped[1]}")
        scores = None
        if pool.ranking is Ranking.WORK_PER_DPH:
            scores = work_score(kept, weights.get(pool.name, ()), rates, dlperf, normalize_gpu_name)
        per_pool[pool.name] = tuple(sorted(kept, key=rank_key(pool.ranking, observed.memory.hosts, scores)))
    return per_pool


def gpu_dlperf(offers: Iterable[Offer]) -> dict[str, float]:
    """Normalised GPU name -> median DLPerf of one such GPU, from the offers on the market."""
    per_gpu: dict[str, list[float]] = {}
    for o in offers:
        if o.num_gpus > 0 and math.isfinite(o.dlperf) and o.dlperf > 0:
            per_gpu.setdefault(normalize_gpu_name(o.gpu_name), []).append(o.dlperf / o.num_gpus)
    return {name: statistics.median(v) for name, v in per_gpu.items()}
