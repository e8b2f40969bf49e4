"""Seeing a search: the one home of "the objective of a configuration" and of what the views show of a sweep's search.

A configuration is a cell: the run's parameters without its seed (grid cells and a ``search:`` block's suggestions
alike; the archive records both the same way). Its **objective** is the mean, over its seeds, of each seed's
metric (``promotion.run_metric``, the one home a bayes search's sampler uses too): the best ``best_metric`` (by the
sweep's goal) of its run's *succeeded* attempts, else their ``final_metric`` (a run that never reported a best).
Only finite numbers in range count (``bounds.finite``):
a forged NaN or 1e308 is no objective. ``std`` is the population standard deviation over those seeds (0 for one).

Also here, pure and read from committed facts only: the runs stopped early and their rung (``stopped_early``
archive records; the rung is in the planner's reason, ``rung 9 ...``, else the record's last ``progress``), the
curves of a configuration summarised as a band (mean, min and max across its seeds at common steps), and, per
searched parameter, the points of the objective against it (a log axis for ``log_uniform``). The dashboard and
STATUS.md both call ``configurations``, so they can never disagree on a ranking.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reconciler.core.bounds import finite
from reconciler.core.model import AttemptOutcome, AttemptRecord, Distribution, MetricGoal, Sweep
from reconciler.core.promotion import run_metric

Params = tuple[tuple[str, Any], ...]
TOP_CONFIGURATIONS = 10  # the rows a "Top configurations" table shows per sweep
BAND_STEPS = 100  # the steps a band is sampled at (the union of its curves' steps, thinned evenly)
LOG_DISTRIBUTIONS = (Distribution.LOG_UNIFORM, Distribution.Q_LOG_UNIFORM)


def cell_of(params: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> Params:
    """A configuration's key: its parameters, sorted by name (a record's, a run spec's or a file's mapping)."""
    items = params.items() if isinstance(params, Mapping) else params
    return tuple(sorted((str(k), v) for k, v in items))


def mean_std(values: Sequence[float]) -> tuple[float, float] | None:
    """The mean and population standard deviation of ``values`` (None for none)."""
    if not values:
        return None
    mean = math.fsum(values) / len(values)
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))


_RUNG = re.compile(r"\brung\s*[=:]?\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)")
_AT = re.compile(r"\brung [^(]*\((\w+) ([-+]?[0-9.]+(?:[eE][-+]?[0-9]+)?)\)")  # "rung 1 (step 1500)"


def rung_of(rec: AttemptRecord) -> float | None:
    """The rung a stopped-early attempt was stopped at: the number after ``rung`` in its reason, else its last
    ``progress`` (None when neither says)."""
    m = _RUNG.search(rec.reason or "")
    if m is not None and (r := finite(float(m.group(1)))) is not None:
        return r
    return finite(rec.progress)


def rung_at(rec: AttemptRecord) -> str:
    """Where the rung is in the sweep's progress units, as the planner's reason says it (``step 1500``; else "")."""
    m = _AT.search(rec.reason or "")
    return f"{m.group(1)} {m.group(2)}" if m is not None else ""


@dataclass(frozen=True)
class StoppedRun:
    run_id: str
    attempt: int
    seed: int
    rung: float | None
    metric: float | None  # its best metric when stopped
    reason: str
    at: str = ""  # the rung in progress units (``step 1500``), when the reason says


@dataclass(frozen=True)
class Configuration:
    """One configuration of a sweep: its objective (mean ± std over the seeds that succeeded with a metric)."""

    params: Params
    mean: float | None
    std: float | None
    seeds: int  # seeds with a metric (what the mean is over)
    runs: int  # its runs (one per seed) in the archive
    stopped: tuple[StoppedRun, ...] = ()

    @property
    def objective(self) -> float | None:
        return self.mean


def configurations(records: Iterable[AttemptRecord], sweep: str, goal: MetricGoal | str) -> tuple[Configuration, ...]:
    """The configurations of ``sweep`` in the archive's ``records``, best objective first by ``goal``; those with no
    objective yet last (in parameter order)."""
    runs: dict[Params, dict[str, list[AttemptRecord]]] = {}
    for rec in records:
        if rec.sweep == sweep:
            runs.setdefault(cell_of(rec.params), {}).setdefault(rec.run_id, []).append(rec)
    out = []
    for params, by_run in runs.items():
        metrics = [m for recs in by_run.values() if (m := run_metric(recs, goal)) is not None]
        stats = mean_std(metrics)
        stopped = tuple(sorted(
            (StoppedRun(r.run_id, r.attempt, r.seed, rung_of(r), finite(r.best_metric), r.reason, rung_at(r))
             for recs in by_run.values() for r in recs if r.phase is AttemptOutcome.STOPPED_EARLY),
            key=lambda s: (s.run_id, s.attempt)))
        out.append(Configuration(params, stats[0] if stats else None, stats[1] if stats else None, len(metrics),
                                 len(by_run), stopped))
    sign = -1.0 if goal == MetricGoal.MAX else 1.0
    out.sort(key=lambda c: (c.mean is None, sign * (c.mean or 0.0), repr(c.params)))
    return tuple(out)


def stopped_runs(configs: Iterable[Configuration]) -> list[tuple[Params, StoppedRun]]:
    """Every run stopped early, with its configuration, by rung then run id."""
    rows = [(c.params, s) for c in configs for s in c.stopped]
    rows.sort(key=lambda row: (row[1].rung is None, row[1].rung or 0.0, row[1].run_id, row[1].attempt))
    return rows


def shows_search(sweep: Sweep | None, configs: Sequence[Configuration]) -> bool:
    """A sweep gets the search views when it has a ``search:`` block, or several configurations."""
    return (sweep is not None and sweep.search is not None) or len(configs) > 1


@dataclass(frozen=True)
class Band:
    """A configuration's curves summarised at common steps: the mean, the lowest and the highest across its seeds
    (at a step, only the curves that reach it count: ``counts``)."""

    steps: tuple[float, ...]
    mean: tuple[float, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]
    counts: tuple[int, ...]
    curves: int


def _at(points: Sequence[tuple[float, float]], x: float) -> float | None:
    """``points`` (sorted by x) linearly interpolated at ``x``; None outside their range."""
    if not points or x < points[0][0] or x > points[-1][0]:
        return None
    lo, hi = 0, len(points) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if points[mid][0] <= x:
            lo = mid
        else:
            hi = mid
    (x0, y0), (x1, y1) = points[lo], points[hi]
    if x1 == x0:
        return y1
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def band(curves: Sequence[Sequence[tuple[float, float]]], max_steps: int = BAND_STEPS) -> Band | None:
    """The band of ``curves`` (each a list of finite ``(step, value)``): at the union of their steps (thinned evenly
    to ``max_steps``, the last kept), the mean, min and max of the curves that reach the step. None without points."""
    ordered = [sorted(c) for c in curves if c]
    steps = sorted({x for c in ordered for x, _ in c})
    if not steps:
        return None
    if len(steps) > max_steps:
        stride = (len(steps) - 1) / (max_steps - 1)
        steps = [steps[round(i * stride)] for i in range(max_steps)]
    xs, mean, low, high, counts = [], [], [], [], []
    for x in steps:
        ys = [y for c in ordered if (y := _at(c, x)) is not None]
        if not ys:
            continue
        xs.append(x)
        mean.append(math.fsum(ys) / len(ys))
        low.append(min(ys))
        high.append(max(ys))
        counts.append(len(ys))
    return Band(tuple(xs), tuple(mean), tuple(low), tuple(high), tuple(counts), len(ordered))


@dataclass(frozen=True)
class ParamPlot:
    """The objective of each configuration against one parameter: ``points`` (x, objective) for numbers, or the
    category's index in ``categories`` (strings, booleans); ``stopped`` the runs stopped early, (x, their metric at
    the stop), drawn apart (no objective: they never finished)."""

    name: str
    log: bool
    points: tuple[tuple[float, float], ...]
    categories: tuple[str, ...] = ()
    stopped: tuple[tuple[float, float], ...] = ()


def searched_parameters(sweep: Sweep | None, configs: Sequence[Configuration]) -> list[tuple[str, bool]]:
    """The parameters to plot against, with whether their axis is logarithmic: the ``search:`` block's (in its
    order), else those whose value varies across the configurations."""
    if sweep is not None and sweep.search is not None:
        return [(p.name, p.distribution in LOG_DISTRIBUTIONS) for p in sweep.search.parameters]
    values: dict[str, set[str]] = {}
    for c in configs:
        for k, v in c.params:
            values.setdefault(k, set()).add(repr(v))
    return [(k, False) for k in sorted(values) if len(values[k]) > 1]


def param_plots(sweep: Sweep | None, configs: Sequence[Configuration]) -> list[ParamPlot]:
    """One scatter per searched parameter: each configuration's objective against that parameter's value, and each
    run stopped early's metric at its stop (a log axis drops values <= 0, which a log_uniform range cannot hold)."""
    plots = []
    for name, log in searched_parameters(sweep, configs):
        pairs = [(v, c.mean) for c in configs if c.mean is not None and (v := dict(c.params).get(name)) is not None]
        stops = [(v, r.metric) for c in configs for r in c.stopped
                 if r.metric is not None and (v := dict(c.params).get(name)) is not None]
        numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v, _ in [*pairs, *stops])
        if numeric:
            def xs(rows: list[tuple[Any, float]], log: bool = log) -> tuple[tuple[float, float], ...]:
                return tuple((float(v), m) for v, m in rows
                             if finite(float(v)) is not None and (not log or float(v) > 0))
            plots.append(ParamPlot(name, log, xs(pairs), (), xs(stops)))
        else:
            cats = tuple(sorted({str(v) for v, _ in [*pairs, *stops]}))
            index = {c: i for i, c in enumerate(cats)}
            plots.append(ParamPlot(name, False, tuple((float(index[str(v)]), m) for v, m in pairs), cats,
                                   tuple((float(index[str(v)]), m) for v, m in stops)))
    return plots


@dataclass(frozen=True)
class SearchView:
    """What a page shows of one sweep's search: its configurations ranked by objective, the runs stopped early, and
    the objective against each searched parameter."""

    name: str
    method: str  # the search's method, or "grid" (a grid of several cells)
    metric_key: str | None
    goal: str
    configs: tuple[Configuration, ...]
    stopped: tuple[tuple[Params, StoppedRun], ...]
    plots: tuple[ParamPlot, ...]

    @property
    def top(self) -> tuple[Configuration, ...]:
        return self.configs[:TOP_CONFIGURATIONS]


def search_views(records: Sequence[AttemptRecord], sweeps: Iterable[tuple[str, str, Sweep | None]]
                 ) -> tuple[SearchView, ...]:
    """The search view of each of ``sweeps`` (name, goal, its desired sweep when known) that ``shows_search``."""
    by_sweep: dict[str, list[AttemptRecord]] = {}
    for rec in records:  # once, not once per sweep: a large archive is read by every cycle's STATUS.md
        by_sweep.setdefault(rec.sweep, []).append(rec)
    out = []
    for name, goal, sweep in sweeps:
        if sweep is not None and sweep.search is not None:
            goal = sweep.search.metric_goal.value
        configs = configurations(by_sweep.get(name, ()), name, goal)
        if not shows_search(sweep, configs):
            continue
        method = sweep.search.method.value if sweep is not None and sweep.search is not None else "grid"
        key = sweep.search.metric_key if sweep is not None and sweep.search is not None else (
            sweep.metric_key if sweep is not None else None)
        out.append(SearchView(name, method, key, goal, configs, tuple(stopped_runs(configs)),
                              tuple(param_plots(sweep, configs))))
    return tuple(out)
