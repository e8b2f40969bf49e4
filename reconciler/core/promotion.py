"""Which runs are wanted, given what has finished: the promotion rule, stated once.

Promotion seeds are expanded ahead of time (the planner cannot render templates); one becomes wanted when its
cell's best metric over *succeeded base-seed* attempts reaches its threshold; a metric counts only when it is a
finite number within ``bounds.MAX_METRIC_ABS`` (a box's forged Infinity or 1e308 never promotes). Only base seeds
count, so a promoted seed's own result can never promote further: promotion is bounded by construction. The
planner, the observed files, the status view and the demo all ask this module, so they can never disagree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from reconciler.core.bounds import finite
from reconciler.core.model import AttemptOutcome, AttemptRecord, MetricGoal, RunSpec


def better(goal: MetricGoal | str, new: float, cur: float | None) -> bool:
    """``new`` beats ``cur`` (None: nothing yet) by the sweep's goal (the enum, or its value as a file says it)."""
    return cur is None or (new > cur if goal == MetricGoal.MAX else new < cur)


def best_by_cell(runs: Mapping[str, RunSpec], metrics: Mapping[str, Iterable[float | None]]) -> dict[str, float]:
    """The best metric per cell over its base seeds; ``metrics`` maps run id → succeeded attempts' best metrics."""
    best: dict[str, float] = {}
    for run_id in sorted(metrics):
        spec = runs.get(run_id)
        if spec is None or spec.promotion_threshold is not None:
            continue
        for raw in metrics[run_id]:
            m = finite(raw)  # a box's NaN, Infinity or 1e308 promotes nothing (bounds.MAX_METRIC_ABS)
            if m is None:
                continue
            if better(spec.sweep.metric_goal, m, best.get(spec.cell)):
                best[spec.cell] = m
    return best


def promotion_met(spec: RunSpec, best: Mapping[str, float]) -> bool:
    """True for base seeds, and for promotion seeds whose cell reached the threshold."""
    threshold = spec.promotion_threshold
    if threshold is None:
        return True
    b = best.get(spec.cell)
    if b is None:
        return False
    return b >= threshold if spec.sweep.metric_goal is MetricGoal.MAX else b <= threshold


def wanted_among(runs: Mapping[str, RunSpec], metrics: Mapping[str, Iterable[float | None]]) -> list[str]:
    """The ids of ``runs`` that are wanted (``promotion_met``), in their order."""
    best = best_by_cell(runs, metrics)
    return [run_id for run_id, spec in runs.items() if promotion_met(spec, best)]


def wanted_ids(runs: Iterable[RunSpec], metrics: Mapping[str, Iterable[float | None]]) -> set[str]:
    by_id: dict[str, RunSpec] = {}
    for spec in runs:
        by_id.setdefault(spec.id, spec)
    return set(wanted_among(by_id, metrics))


def run_metric(
    records: Iterable[AttemptRecord], goal: MetricGoal | str,
    counted: frozenset[AttemptOutcome] = frozenset({AttemptOutcome.SUCCEEDED}),
) -> float | None:
    """One run's (one seed's) metric from its archived attempts: the best ``best_metric`` by ``goal`` of those whose
    phase is ``counted`` (succeeded ones by default: the views' leaderboard; a bayes search also tells its sampler
    what runs stopped early reached), else their best ``final_metric``; None when none reported a finite one."""
    best: float | None = None
    final: float | None = None
    for rec in records:
        if rec.phase not in counted:
            continue
        if (b := finite(rec.best_metric)) is not None and better(goal, b, best):
            best = b
        if (f := finite(rec.final_metric)) is not None and better(goal, f, final):
            final = f
    return best if best is not None else final


def succeeded_metrics(history: Iterable[AttemptRecord]) -> dict[str, list[float | None]]:
    """Run id → the best metric of each of its succeeded attempts: what ``best_by_cell`` reads."""
    out: dict[str, list[float | None]] = {}
    for rec in history:
        if rec.phase is AttemptOutcome.SUCCEEDED:
            out.setdefault(rec.run_id, []).append(rec.best_metric)
    return out
