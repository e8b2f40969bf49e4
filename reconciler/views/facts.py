"""One view model of a fleet built from its committed files: what STATUS.md and the dashboard both show.

Inputs are facts rigsync committed: the rendered observed/*.yaml texts, the archive's attempt and overhead lines
(the ops tax, ``opstax``), and desired/ (for each sweep's metric goal and its promotion thresholds). Nothing reads
a clock: a box's age (and a held box's bill) is measured to the snapshot's own time (``status.yaml``'s
``last_change_at``), so the same files give the same view, byte for byte.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from reconciler.core.bounds import finite
from reconciler.core.contract import seconds_left
from reconciler.core.jobenv import held_back
from reconciler.core.model import AttemptRecord, Desired, MetricGoal, OverheadRecord, RunPhase
from reconciler.core.promotion import best_by_cell, better, promotion_met, succeeded_metrics
from reconciler.errors import ObservedInvalid
from reconciler.observed.codec import BUDGET, FLEET, RUNS, STATUS, load_mapping_quietly, parse_iso
from reconciler.views.opstax import OpsTax, ops_tax
from reconciler.views.search_results import SearchView, search_views

RECENT_FAILURES = 5  # the failed attempts a view lists (newest first)
LISTED = 20  # blocked runs and promotions a page lists per sweep before saying how many more
PHASES = tuple(p.value for p in RunPhase)


@dataclass(frozen=True)
class BoxView:
    id: int
    gpu: str
    dph: float
    status: str
    reachable: bool | None
    age_s: float | None  # from its start to the snapshot's time
    runs_now: tuple[str, ...]  # run.attempt on its GPUs
    runs_seen: int  # runs whose latest attempt ran here (runs.yaml)
    queued: tuple[str, ...] = ()  # run.attempt given to its queue, not started yet (runs.yaml in_flight)
    ends_in_s: float | None = None  # from the snapshot's time to its contract's end (fleet.yaml ends_at); None: no end


@dataclass(frozen=True)
class CellView:
    params: tuple[tuple[str, Any], ...]
    best: float | None
    seeds: int
    succeeded: int


@dataclass(frozen=True)
class SweepView:
    name: str
    counts: Mapping[str, int]
    metric_key: str | None
    goal: str
    cells: tuple[CellView, ...]  # best first (by the sweep's goal); cells without a metric last
    blocked: tuple[tuple[str, str], ...]  # (run id, why) of runs with no retries left

    @property
    def best_cell(self) -> CellView | None:
        return self.cells[0] if self.cells and self.cells[0].best is not None else None


@dataclass(frozen=True)
class CapView:
    name: str
    used: float
    cap: float | None
    unit: str  # "$" or "$/h"


@dataclass(frozen=True)
class PromotionView:
    sweep: str
    params: tuple[tuple[str, Any], ...]
    threshold: float
    goal: str
    best: float | None
    met: bool
    seeds: int


@dataclass(frozen=True)
class FailureView:
    run_id: str
    attempt: int
    sweep: str
    instance_id: int
    ended_at: float | None
    exit_code: int | None
    reason: str
    stderr_tail: str


@dataclass(frozen=True)
class FleetView:
    fleet: str
    snapshot_at: float | None
    desired_commit: str | None
    boxes: tuple[BoxView, ...]
    fleet_dph: float
    sweeps: tuple[SweepView, ...]
    caps: tuple[CapView, ...]
    credit_usd: float | None
    failures: tuple[FailureView, ...]
    promotions: tuple[PromotionView, ...]
    warnings: tuple[str, ...]  # budget lines and held-back sweeps, as the last plan said them
    errors: tuple[str, ...] = field(default=())  # desired and apply errors of the last cycle
    ops_tax: OpsTax = field(default_factory=OpsTax)  # the bill's money that bought no succeeded work (opstax)
    searches: tuple[SearchView, ...] = ()  # per sweep with a search (or several cells): its configurations (search)


@functools.lru_cache(maxsize=8)
def _document(text: str | None) -> dict[str, Any]:
    """An observed document parsed once per distinct text: a still fleet re-renders its page without parsing
    runs.yaml again every cycle (tens of thousands of runs take seconds). Never mutated by the view."""
    return load_mapping_quietly(text)


document = _document  # the same memo, public: the dashboard's timeline reads fleet.yaml and runs.yaml through it


def mapping(v: Any) -> dict[str, Any]:
    """``v`` when it is a mapping, else empty (a view shows what it can of a damaged file)."""
    return v if isinstance(v, dict) else {}


def _num(v: Any) -> float | None:
    return finite(v)  # a number of the committed files is shown (and ranks cells) only when finite and in range


def time_of(v: Any) -> float | None:
    """A UTC stamp of observed/ as POSIX seconds; None when missing or unreadable (a view shows what it can)."""
    try:
        return parse_iso(v, "time")
    except ObservedInvalid:
        return None


def _params_key(params: Any) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((str(k), v) for k, v in (params or {}).items())) if isinstance(params, dict) else ()


def build_view(
    files: Mapping[str, str | None], history: Iterable[AttemptRecord], desired: Desired | None,
    overheads: Iterable[OverheadRecord] = (),
) -> FleetView:
    """The view of the fleet from its observed documents (path -> text), archived attempts, the archive's overhead
    lines (one per ended box) and desired state."""
    from reconciler.views.timeline import live_boxes  # it reads this module's helpers

    fleet_doc = _document(files.get(FLEET))
    runs_doc = _document(files.get(RUNS))
    budget_doc = _document(files.get(BUDGET))
    status_doc = _document(files.get(STATUS))
    records = list(history)
    ended = list(overheads)
    snapshot = time_of(status_doc.get("last_change_at"))
    boxes = _box_views(fleet_doc, runs_doc, snapshot)
    sweeps = _sweep_views(runs_doc, records, desired)
    fleet_dph = _num(fleet_doc.get("dph")) or 0.0
    by_name = {s.name: s for s in desired.sweeps} if desired else {}
    return FleetView(
        fleet=str(fleet_doc.get("fleet") or (desired.fleet.name if desired else "")),
        snapshot_at=snapshot,
        desired_commit=status_doc.get("desired_commit_applied"),
        boxes=tuple(sorted(boxes, key=lambda b: b.id)),
        fleet_dph=fleet_dph,
        sweeps=tuple(sweeps),
        caps=_cap_views(budget_doc, fleet_dph, boxes),
        credit_usd=_num(mapping(budget_doc.get("spend")).get("credit_usd")),
        failures=_failure_views(records),
        promotions=_promotion_views(desired, records) if desired is not None else (),
        warnings=_warnings(status_doc),
        errors=_errors(status_doc),
        ops_tax=ops_tax(records, ended, live_boxes(ended, fleet_doc, runs_doc, snapshot)),
        searches=search_views(records, [(s.name, s.goal, by_name.get(s.name)) for s in sweeps]),
    )


def _runs_seen_on(sweeps_doc: Mapping[str, Any]) -> dict[int, int]:
    """Box id -> the runs whose latest attempt ran there (runs.yaml's sweeps)."""
    runs_on: dict[int, int] = {}
    for runs in sweeps_doc.values():
        for r in mapping(runs).values():
            if isinstance(r, dict) and isinstance(r.get("instance"), int):
                runs_on[r["instance"]] = runs_on.get(r["instance"], 0) + 1
    return runs_on


def _queued_on(runs_doc: Mapping[str, Any], fleet_doc: Mapping[str, Any]) -> dict[int, list[str]]:
    """Box id -> run.attempt given to its queue and not started yet (runs.yaml's ``in_flight``)."""
    from reconciler.views.timeline import in_flight  # it reads this module's helpers

    queued_on: dict[int, list[str]] = {}
    for f in in_flight(runs_doc, fleet_doc):
        if f.queued:
            queued_on.setdefault(f.instance_id, []).append(f"{f.run_id}.{f.attempt}")
    return queued_on


def _box_views(fleet_doc: Mapping[str, Any], runs_doc: Mapping[str, Any], snapshot: float | None) -> list[BoxView]:
    """fleet.yaml's boxes, in its order, with what runs.yaml says ran and waits on each."""
    runs_on = _runs_seen_on(mapping(runs_doc.get("sweeps")))
    queued_on = _queued_on(runs_doc, fleet_doc)
    boxes = []
    for b in fleet_doc.get("boxes") or []:
        if not isinstance(b, dict):
            continue
        started = time_of(b.get("started_at")) or time_of(b.get("first_seen_at"))
        gpus = [g for g in b.get("gpus") or [] if isinstance(g, dict)]
        boxes.append(
            BoxView(
                id=int(b.get("id") or 0),
                gpu=f"{b.get('num_gpus') or 0}x {b.get('gpu_name') or '?'}",
                dph=_num(b.get("dph")) or 0.0,
                status=str(b.get("status") or ""),
                reachable=b.get("reachable") if isinstance(b.get("reachable"), bool) else None,
                age_s=max(0.0, snapshot - started) if snapshot is not None and started is not None else None,
                runs_now=tuple(sorted(str(g["run"]) for g in gpus if g.get("run"))),
                runs_seen=runs_on.get(int(b.get("id") or 0), 0),
                queued=tuple(sorted(queued_on.get(int(b.get("id") or 0), []))),
                ends_in_s=None if snapshot is None else seconds_left(time_of(b.get("ends_at")), snapshot),
            )
        )
    return boxes


def _sweep_views(runs_doc: Mapping[str, Any], records: list[AttemptRecord], desired: Desired | None) -> list[SweepView]:
    """One view per sweep runs.yaml lists, by name: its counts, its cells best first, its blocked runs."""
    goals = {s.name: s.metric_goal.value for s in desired.sweeps} if desired else {}
    keys = {s.name: s.metric_key for s in desired.sweeps} if desired else {}
    last_reason: dict[str, str] = {}
    for rec in sorted(records, key=lambda r: (r.run_id, r.attempt)):
        last_reason[rec.run_id] = rec.reason
    sweeps_doc = mapping(runs_doc.get("sweeps"))
    sweeps = []
    for name in sorted(sweeps_doc):
        goal = goals.get(name, MetricGoal.MAX.value)
        cells, blocked = _cells(mapping(sweeps_doc.get(name)), goal, last_reason)
        counts_doc = mapping(mapping(runs_doc.get("counts")).get(name))
        counts = {p: int(counts_doc.get(p) or 0) for p in (*PHASES, "total")}
        sweeps.append(
            SweepView(name=str(name), counts=counts, metric_key=keys.get(name), goal=goal, cells=cells, blocked=blocked)
        )
    return sweeps


def _cells(
    runs: Mapping[str, Any], goal: str, last_reason: Mapping[str, str]
) -> tuple[tuple[CellView, ...], tuple[tuple[str, str], ...]]:
    """A sweep's cells (its runs grouped by params), best first by ``goal`` and those without a metric last, and its
    blocked runs with why (their last attempt's reason)."""
    cells: dict[tuple[tuple[str, Any], ...], dict[str, Any]] = {}
    blocked = []
    for run_id in sorted(runs):
        r = runs[run_id]
        if not isinstance(r, dict):
            continue
        if r.get("phase") == RunPhase.BLOCKED.value:
            blocked.append((str(run_id), last_reason.get(str(run_id), "no retries left")))
        c = cells.setdefault(_params_key(r.get("params")), {"best": None, "seeds": 0, "succeeded": 0})
        c["seeds"] += 1
        if r.get("phase") == RunPhase.SUCCEEDED.value:
            c["succeeded"] += 1
        m = _num(r.get("best_metric"))
        if m is not None and better(goal, m, c["best"]):
            c["best"] = m
    sign = -1.0 if goal == MetricGoal.MAX.value else 1.0
    ordered = sorted(cells.items(), key=lambda kv: (kv[1]["best"] is None, sign * (kv[1]["best"] or 0.0), repr(kv[0])))
    return tuple(CellView(k, v["best"], v["seeds"], v["succeeded"]) for k, v in ordered), tuple(blocked)


def _cap_views(budget_doc: Mapping[str, Any], fleet_dph: float, boxes: list[BoxView]) -> tuple[CapView, ...]:
    """Each cap beside what is used of it: today's and the total spend, the fleet's $/h, the dearest box's."""
    caps_doc = mapping(budget_doc.get("caps"))
    spend = mapping(budget_doc.get("spend"))
    max_box = max((b.dph for b in boxes), default=0.0)
    return (
        CapView("spent today", _num(spend.get("today_usd")) or 0.0, _num(caps_doc.get("daily_usd")), "$"),
        CapView("spent in total", _num(spend.get("total_usd")) or 0.0, _num(caps_doc.get("total_usd")), "$"),
        CapView("fleet $/h", fleet_dph, _num(caps_doc.get("max_fleet_dph")), "$/h"),
        CapView("dearest box $/h", max_box, _num(caps_doc.get("max_instance_dph")), "$/h"),
    )


def _failure_views(records: list[AttemptRecord]) -> tuple[FailureView, ...]:
    """The newest ``RECENT_FAILURES`` attempts that used a retry."""
    # a run the search stopped early did not fail (its rung is on the search's view), nor did a preempted one
    failed = [r for r in records if r.phase.uses_a_retry]
    failed.sort(key=lambda r: (-(r.ended_at or 0.0), r.run_id, r.attempt))
    return tuple(
        FailureView(
            run_id=r.run_id, attempt=r.attempt, sweep=r.sweep, instance_id=r.instance_id, ended_at=r.ended_at,
            exit_code=r.exit_code, reason=r.reason, stderr_tail=r.stderr_tail or "",
        )
        for r in failed[:RECENT_FAILURES]
    )


def _promotion_views(desired: Desired, records: list[AttemptRecord]) -> tuple[PromotionView, ...]:
    """One view per cell and promotion threshold of desired's runs, with its seeds and whether the cell met it."""
    by_id = {r.id: r for r in desired.runs}
    best = best_by_cell(by_id, succeeded_metrics(records))
    seen: dict[tuple[str, float], list[Any]] = {}
    for spec in desired.runs:
        if spec.promotion_threshold is None:
            continue
        key = (spec.cell, spec.promotion_threshold)
        if key in seen:
            seen[key][0] += 1
            continue
        seen[key] = [1, spec]
    order = sorted(seen.items(), key=lambda kv: (kv[1][1].sweep.name, repr(sorted(kv[1][1].params)), kv[0][1]))
    return tuple(
        PromotionView(
            sweep=spec.sweep.name, params=tuple(sorted(spec.params)), threshold=threshold,
            goal=spec.sweep.metric_goal.value, best=best.get(cell), met=promotion_met(spec, best), seeds=n,
        )
        for (cell, threshold), (n, spec) in order
    )


def _warnings(status_doc: Mapping[str, Any]) -> tuple[str, ...]:
    """The last plan's budget lines and held-back sweeps."""
    last_plan = mapping(status_doc.get("last_plan"))
    plan_warnings = [str(w) for w in last_plan.get("warnings") or []]
    warnings = [w for w in plan_warnings if w.startswith("budget:")]
    warnings += [f"held back: {w}" for w in held_back(plan_warnings)]
    return tuple(warnings)


def _errors(status_doc: Mapping[str, Any]) -> tuple[str, ...]:
    """The last cycle's desired and apply errors."""
    return tuple(str(e) for e in (status_doc.get("desired_errors") or []) + (status_doc.get("apply_errors") or []))
