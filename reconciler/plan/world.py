"""Phase 0: the inputs indexed once (runs by id, archive by attempt, owned boxes with their probe), and the budget.

Foreign instances are set aside here, so no later phase can act on one: they are reported and never touched.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from reconciler.actions import ReasonCode
from reconciler.identity import pool_spec_hash, slot_pool
from reconciler.model import (
    AttemptRecord,
    BoxMemory,
    BoxProbe,
    Desired,
    Drift,
    DriftClass,
    Instance,
    Observed,
    Offer,
    Ownership,
    Pool,
    RunSpec,
    owned_by,
)
from reconciler.offers import as_interruptible, normalize_gpu_name, offer_skipped, passing_offers, rank_key
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

    @property
    def rented(self) -> bool:
        return not self.own_box

    @property
    def reachable(self) -> bool:
        return self.probe is not None and self.probe.reachable

    @property
    def subject(self) -> str:
        return f"instance/{self.inst.id}"


@dataclass(frozen=True)
class World:
    desired: Desired
    observed: Observed
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

    gpu_dlperf: Mapping[str, float]  # normalised GPU name -> median DLPerf of one such GPU on the market


def index_world(desired: Desired, observed: Observed, now: float) -> tuple[World, Decisions]:
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
    distrusted = {iid: since for iid, since, _ in observed.memory.distrusted}
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
    pools = {p.name: p for p in f.pools}
    pool_offers = _rentable_offers(desired, observed, now, out)
    first = next(iter(pools))
    union = {o.id: o for offers in pool_offers.values() for o in offers}
    ranked = sorted(union.values(), key=rank_key(pools[first].ranking, observed.memory.hosts))
    world = World(
        desired=desired,
        observed=observed,
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
        gpu_dlperf=gpu_dlperf(observed.offers),
    )
    return world, out


def _rentable_offers(desired: Desired, observed: Observed, now: float, out: Decisions) -> dict[str, tuple[Offer, ...]]:
    """Per pool, the offers that pass its filters and the host ledger's rules, best first by its ranking and the
    host penalty. An offer the ledger keeps back is said once, whichever pools it passes."""
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
        per_pool[pool.name] = tuple(sorted(kept, key=rank_key(pool.ranking, observed.memory.hosts)))
    return per_pool


def gpu_dlperf(offers: Iterable[Offer]) -> dict[str, float]:
    """Normalised GPU name -> median DLPerf of one such GPU, from the offers on the market."""
    per_gpu: dict[str, list[float]] = {}
    for o in offers:
        if o.num_gpus > 0 and math.isfinite(o.dlperf) and o.dlperf > 0:
            per_gpu.setdefault(normalize_gpu_name(o.gpu_name), []).append(o.dlperf / o.num_gpus)
    return {name: statistics.median(v) for name, v in per_gpu.items()}
