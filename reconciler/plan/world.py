"""Phase 0: the inputs indexed once (runs by id, archive by attempt, owned boxes with their probe), and the budget.

Foreign instances are set aside here, so no later phase can act on one: they are reported and never touched.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from reconciler.actions import ReasonCode
from reconciler.identity import fleet_spec_hash
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
    RunSpec,
    owned_by,
)
from reconciler.offers import normalize_gpu_name, offer_skipped, passing_offers, rank_key
from reconciler.plan.common import Decisions


@dataclass(frozen=True)
class OwnedBox:
    """A box carrying this fleet's label, with what its probe and the cross-cycle memory say."""

    id: int
    inst: Instance
    own: Ownership
    probe: BoxProbe | None
    memory: BoxMemory | None

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
    current_spec: str
    offers: tuple[Offer, ...]  # the offers that pass the fleet's filters, best first by its ranking
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
    probes = {p.instance_id: p for p in observed.probes}
    memory = {m.instance_id: m for m in observed.memory}
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
            boxes[inst.id] = OwnedBox(inst.id, inst, own, probes.get(inst.id), memory.get(inst.id))
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
        current_spec=fleet_spec_hash(desired.fleet),
        offers=_rentable_offers(desired, observed, now, out),
        gpu_dlperf=gpu_dlperf(observed.offers),
    )
    return world, out


def _rentable_offers(desired: Desired, observed: Observed, now: float, out: Decisions) -> tuple[Offer, ...]:
    """The offers that pass the filters and the host ledger's rules, best first by the ranking and host penalty."""
    f = desired.fleet
    kept: list[Offer] = []
    for o in passing_offers(observed.offers, f.filters, f.disk_gb):
        skipped = offer_skipped(o, f, observed.hosts, now)
        if skipped is None:
            kept.append(o)
        else:
            code = ReasonCode.GHOST_OFFER if skipped[0] == "ghost" else ReasonCode.HOST_AVOIDED
            out.noop(f"offer/{o.id}", code, f"not rented: {skipped[1]}")
    return tuple(sorted(kept, key=rank_key(f.ranking, observed.hosts)))


def gpu_dlperf(offers: Iterable[Offer]) -> dict[str, float]:
    """Normalised GPU name -> median DLPerf of one such GPU, from the offers on the market."""
    per_gpu: dict[str, list[float]] = {}
    for o in offers:
        if o.num_gpus > 0 and math.isfinite(o.dlperf) and o.dlperf > 0:
            per_gpu.setdefault(normalize_gpu_name(o.gpu_name), []).append(o.dlperf / o.num_gpus)
    return {name: statistics.median(v) for name, v in per_gpu.items()}
