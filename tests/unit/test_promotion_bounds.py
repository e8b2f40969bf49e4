"""Promotion reads only metrics that are finite and within ``bounds.MAX_METRIC_ABS`` (issue 20): a box that reports
Infinity or 1e308 for its run promotes nothing, and an honest metric beside it still counts."""

from __future__ import annotations

import math

import pytest
from fakes import flat_run_spec
from hypothesis import given
from hypothesis import strategies as st

from reconciler.core.bounds import MAX_METRIC_ABS
from reconciler.core.model import AttemptOutcome, AttemptRecord, MetricGoal, RunSpec
from reconciler.core.promotion import best_by_cell, succeeded_metrics, wanted_ids


def _runs(goal: MetricGoal) -> list[RunSpec]:
    common = {"gpus": 1, "retries": 0, "metric_key": "reward", "metric_goal": goal}
    base = flat_run_spec(id="base", sweep="s", cell="c", params=(("lr", 1),), seed=0, command="x", **common)
    more = flat_run_spec(
        id="more",
        sweep="s",
        cell="c",
        params=(("lr", 1),),
        seed=1,
        command="x",
        promotion_threshold=100.0 if goal is MetricGoal.MAX else -100.0,
        **common,
    )
    return [base, more]


def _history(*metrics: float | None) -> tuple[AttemptRecord, ...]:
    return tuple(
        AttemptRecord(run_id="base", attempt=i + 1, sweep="s", phase=AttemptOutcome.SUCCEEDED, best_metric=m)
        for i, m in enumerate(metrics)
    )


@pytest.mark.parametrize("goal", [MetricGoal.MAX, MetricGoal.MIN])
@pytest.mark.parametrize("forged", [math.inf, -math.inf, math.nan, 1e308, -1e308, MAX_METRIC_ABS * 2])
def test_a_forged_archived_metric_promotes_nothing(goal: MetricGoal, forged: float) -> None:
    runs = _runs(goal)
    assert wanted_ids(runs, succeeded_metrics(_history(forged))) == {"base"}
    assert best_by_cell({r.id: r for r in runs}, succeeded_metrics(_history(forged))) == {}


def test_an_honest_metric_beside_a_forged_one_still_counts() -> None:
    runs = _runs(MetricGoal.MAX)
    assert wanted_ids(runs, succeeded_metrics(_history(math.inf, 150.0))) == {"base", "more"}
    assert wanted_ids(runs, succeeded_metrics(_history(math.inf, 50.0))) == {"base"}


@given(st.lists(st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)), max_size=8))
def test_the_best_is_always_finite_and_in_range(metrics: list[float | None]) -> None:
    runs = _runs(MetricGoal.MAX)
    best = best_by_cell({r.id: r for r in runs}, succeeded_metrics(_history(*metrics)))
    assert all(math.isfinite(v) and abs(v) <= MAX_METRIC_ABS for v in best.values())
