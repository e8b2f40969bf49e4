"""The early-stop rule (``plan.early_stop``) over generated rung values (hypothesis): at any rung the best run is
never stopped, fewer than eta runs there stop nothing, at most n - ceil(n/eta) of the runs judged there are stopped,
a run stopped is strictly behind the cut-off, and the goal's direction is respected (min mirrors max)."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.core.model import Controller, FleetMemory, Observed, RungValue
from reconciler.plan.early_stop import early_stops
from reconciler.plan.world import index_world

try:
    from .plan_case_io import build_desired
except ImportError:  # run as a top-level module
    from plan_case_io import build_desired  # type: ignore[no-redef]

DEPTH = 3  # rungs a generated run may have reached: min_iter 100 x eta^k, all below the total (10000)


def levels(eta: float) -> list[float]:
    return [100.0 * eta**k for k in range(DEPTH)]


def _stops(values: dict[str, list[float]], eta: float, goal: str) -> dict[str, str]:
    et: dict[str, Any] = {"type": "asha", "min_iter": 100, "eta": eta}
    desired = build_desired({"runs": [
        {"id": rid, "metric_key": "m", "metric_goal": goal, "progress": {"key": "step", "total": 10000},
         "early_terminate": et} for rid in values
    ]})
    rungs = tuple(RungValue(rid, levels(eta)[i], v) for rid, vs in values.items() for i, v in enumerate(vs))
    world, _ = index_world(desired, Observed(memory=FleetMemory(rungs=rungs)), Controller(), 1e6)
    return {k: s.reason for k, s in early_stops(world).items()}


values_st = st.dictionaries(
    st.sampled_from([f"r{i}" for i in range(8)]),
    st.lists(st.integers(-50, 50).map(float), min_size=1, max_size=DEPTH),
    min_size=1,
)


@settings(max_examples=200, deadline=None)
@given(values_st, st.sampled_from([2.0, 3.0, 4.0]), st.sampled_from(["max", "min"]))
def test_the_early_stop_rule(values: dict[str, list[float]], eta: float, goal: str) -> None:
    stops = _stops(values, eta, goal)
    sign = 1.0 if goal == "max" else -1.0
    for k, level in enumerate(levels(eta)):
        there = {rid: vs[k] for rid, vs in values.items() if len(vs) > k}
        judged = [rid for rid, vs in values.items() if len(vs) == k + 1]  # judged at their highest rung
        stopped = [rid for rid in judged if rid in stops]
        if len(there) < eta:
            assert not stopped
            continue
        ranked = sorted(there.values(), key=lambda v: -sign * v)
        cutoff = ranked[math.ceil(len(there) / eta) - 1]
        assert len(stopped) <= len(there) - math.ceil(len(there) / eta)
        for rid in judged:
            behind = sign * there[rid] < sign * cutoff
            assert (rid in stops) is behind, (rid, there, cutoff, stops)
        for rid in stopped:
            assert f"rung {k + 1} (step {level:g})" in stops[rid]
            assert f"cut-off {cutoff:g}" in stops[rid]


def test_a_mirror_goal_stops_the_mirror_runs() -> None:
    values = {"a": [1.0], "b": [2.0], "c": [3.0], "d": [4.0]}
    assert sorted(_stops(values, 2.0, "max")) == ["a", "b"]
    assert sorted(_stops(values, 2.0, "min")) == ["c", "d"]
    assert _stops(values, 2.0, "max")["a"] == "early stop at rung 1 (step 100): m 1 < cut-off 3 (top 1/2 of 4)"
    assert _stops(values, 2.0, "min")["d"] == "early stop at rung 1 (step 100): m 4 > cut-off 2 (top 1/2 of 4)"
