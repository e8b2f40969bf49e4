"""Phase 0: the inputs indexed once (runs by id, archive by attempt, owned boxes with their probe), and the budget.

Foreign instances are set aside here, so no later phase can act on one: they are reported and never touched.
"""

from __future__ import annotations

from collections.abc import Mapping
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
    OnExceed,
    Ownership,
    RunSpec,
    owned_by,
)
from reconciler.plan.common import Decisions, cap, usd


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


@dataclass(frozen=True)
class BudgetPosition:
    over: bool  # a daily or total cap is reached
    halt: bool  # ... and on_exceed is halt: destroy everything
    text: str  # which caps, with the figures


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
    fleet = desired.fleet.name
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
    )
    return world, out


def budget_position(desired: Desired, observed: Observed) -> BudgetPosition:
    b = desired.budget
    spend = observed.spend
    reasons: list[str] = []
    daily, total = cap(b.daily_usd), cap(b.total_usd)
    if b.daily_usd is not None and not spend.today_usd < daily:
        reasons.append(f"spent today {usd(spend.today_usd)} >= daily_usd {usd(daily)}")
    if b.total_usd is not None and not spend.total_usd < total:
        reasons.append(f"spent in total {usd(spend.total_usd)} >= total_usd {usd(total)}")
    over = bool(reasons)
    return BudgetPosition(over=over, halt=over and b.on_exceed is OnExceed.HALT, text="; ".join(reasons))
