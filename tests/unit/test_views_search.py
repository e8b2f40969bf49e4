"""Seeing a search (``views.search_results``): the objective of a configuration (mean ± std over seeds), the runs
stopped early and their rung, the band of a configuration's curves, the objective against each parameter, and the
same ranking in STATUS.md and on the dashboard."""

from __future__ import annotations

import math
import re
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from reconciler.core.curves import curve_path, render_curve
from reconciler.core.model import (
    AttemptOutcome,
    AttemptRecord,
    Distribution,
    MetricGoal,
    OverheadRecord,
    Search,
    SearchMethod,
    SearchParam,
    Sweep,
)
from reconciler.observed.archive_lines import entry_to_json
from reconciler.views.search_results import (
    band,
    configurations,
    mean_std,
    param_plots,
    run_metric,
    rung_at,
    rung_of,
    search_views,
    stopped_runs,
)
from reconciler.views.svg import BandSeries, Series, band_chart, line_chart

ROOT = Path(__file__).resolve().parents[2]
OK, STOP, FAIL = AttemptOutcome.SUCCEEDED, AttemptOutcome.STOPPED_EARLY, AttemptOutcome.FAILED


def rec(run_id: str, lr: float, seed: int, phase: AttemptOutcome = OK, best: float | None = None,
        final: float | None = None, attempt: int = 1, sweep: str = "tune", reason: str = "",
        progress: float | None = None, opt: str = "adam") -> AttemptRecord:
    return AttemptRecord(run_id=run_id, attempt=attempt, sweep=sweep, phase=phase, params=(("lr", lr), ("opt", opt)),
                         seed=seed, best_metric=best, final_metric=final, reason=reason, progress=progress)


SEARCH = Search(method=SearchMethod.RANDOM, metric_key="episode_reward", metric_goal=MetricGoal.MAX,
                parameters=(SearchParam("lr", Distribution.LOG_UNIFORM, min=1e-5, max=1e-1),
                            SearchParam("opt", Distribution.CATEGORICAL, values=("adam", "sgd"))), run_cap=8)
SWEEP = Sweep(name="tune", command="python train.py", seeds=(1, 2), metric_key="episode_reward", search=SEARCH)

HISTORY = [
    rec("a1", 1e-3, 1, best=700.0), rec("a2", 1e-3, 2, best=600.0),  # 650 ± 50
    rec("b1", 1e-2, 1, best=400.0), rec("b2", 1e-2, 2, phase=FAIL, best=900.0),  # a failure's metric never counts
    rec("b2", 1e-2, 2, attempt=2, best=420.0),  # 410 ± 10
    rec("c1", 1e-5, 1, phase=STOP, best=50.0, reason="early_stopped: rung 3 episode_reward 50 < cut-off 210"),
    rec("c2", 1e-5, 2, phase=STOP, best=80.0, reason="stopped by the search", progress=9.0),
    rec("d1", 1e-4, 1, best=None, final=300.0, opt="sgd"),  # no best: its final metric
    rec("e1", 3e-4, 1, best=float("nan")),  # a forged NaN is no objective
    rec("x1", 1e-3, 1, best=9999.0, sweep="other"),
]


def test_the_objective_is_the_mean_and_std_over_succeeded_seeds_best_first() -> None:
    configs = configurations(HISTORY, "tune", MetricGoal.MAX)
    got = [(dict(c.params)["lr"], c.mean, c.std, c.seeds, c.runs) for c in configs]
    assert got == [(1e-3, 650.0, 50.0, 2, 2), (1e-2, 410.0, 10.0, 2, 2), (1e-4, 300.0, 0.0, 1, 1),
                   (3e-4, None, None, 0, 1), (1e-5, None, None, 0, 2)]
    low_first = configurations(HISTORY, "tune", MetricGoal.MIN)
    assert [c.mean for c in low_first][:3] == [300.0, 410.0, 650.0]


def test_a_run_s_metric_is_its_best_succeeded_attempt_by_goal() -> None:
    recs = [rec("r", 1e-3, 1, best=5.0), rec("r", 1e-3, 1, attempt=2, best=7.0),
            rec("r", 1e-3, 1, attempt=3, phase=FAIL, best=100.0)]
    assert run_metric(recs, MetricGoal.MAX) == 7.0 and run_metric(recs, "min") == 5.0
    assert run_metric([rec("r", 1e-3, 1, phase=STOP, best=5.0)], MetricGoal.MAX) is None


@given(st.lists(st.floats(min_value=-1e6, max_value=1e6), min_size=1, max_size=12))
def test_mean_std_agree_with_the_definition(values: list[float]) -> None:
    stats = mean_std(values)
    assert stats is not None
    mean, std = stats
    assert min(values) - 1e-6 <= mean <= max(values) + 1e-6
    assert std >= 0 and math.isclose(std ** 2, sum((v - mean) ** 2 for v in values) / len(values),
                                     rel_tol=1e-6, abs_tol=1e-3)


def test_runs_stopped_early_with_their_rung_from_the_reason_else_their_progress() -> None:
    configs = configurations(HISTORY, "tune", MetricGoal.MAX)
    rows = stopped_runs(configs)
    assert [(r.run_id, r.rung, r.metric) for _, r in rows] == [("c1", 3.0, 50.0), ("c2", 9.0, 80.0)]
    assert rung_of(rec("z", 1, 1, reason="no number here")) is None
    real = rec("z", 1, 1, reason="early stop at rung 1 (step 1500): episode_reward 200.1 < cut-off 436 (top 1/2 of 4)")
    assert rung_of(real) == 1.0 and rung_at(real) == "step 1500" and rung_at(HISTORY[0]) == ""
    assert rung_of(rec("z", 1, 1, reason="rung=2.5e3: below")) == 2500.0


def test_a_band_is_the_mean_min_and_max_of_the_curves_that_reach_each_step() -> None:
    b = band([[(0.0, 0.0), (10.0, 10.0)], [(0.0, 2.0), (5.0, 4.0)]])
    assert b is not None and b.curves == 2
    assert b.steps == (0.0, 5.0, 10.0)
    assert b.mean == (1.0, 4.5, 10.0) and b.low == (0.0, 4.0, 10.0) and b.high == (2.0, 5.0, 10.0)
    assert b.counts == (2, 2, 1)  # the shorter (stopped) curve ends at step 5
    assert band([]) is None and band([[]]) is None
    long = band([[(float(i), float(i)) for i in range(1000)]], max_steps=50)
    assert long is not None and len(long.steps) == 50 and long.steps[0] == 0.0 and long.steps[-1] == 999.0


def test_objective_against_each_searched_parameter_log_axis_for_log_uniform() -> None:
    configs = configurations(HISTORY, "tune", MetricGoal.MAX)
    plots = {p.name: p for p in param_plots(SWEEP, configs)}
    assert list(plots) == ["lr", "opt"]
    assert plots["lr"].log and sorted(plots["lr"].points) == [(1e-4, 300.0), (1e-3, 650.0), (1e-2, 410.0)]
    assert sorted(plots["lr"].stopped) == [(1e-5, 50.0), (1e-5, 80.0)] and plots["opt"].stopped == ((0.0, 50.0),
                                                                                                    (0.0, 80.0))
    assert not plots["opt"].log and plots["opt"].categories == ("adam", "sgd")
    assert sorted(plots["opt"].points) == [(0.0, 410.0), (0.0, 650.0), (1.0, 300.0)]
    # without a search block: the parameters that vary across the configurations, linear axes
    plain = {p.name: p for p in param_plots(None, configs)}
    assert list(plain) == ["lr", "opt"] and not plain["lr"].log


def test_search_views_pick_sweeps_with_a_search_or_several_cells() -> None:
    one_cell = [rec("s1", 1e-3, 1, best=1.0, sweep="single"), rec("s2", 1e-3, 2, best=3.0, sweep="single")]
    views = search_views([*HISTORY, *one_cell], [("tune", "max", SWEEP), ("single", "max", None),
                                                 ("other", "max", None)])
    assert [v.name for v in views] == ["tune"]
    assert views[0].method == "random" and views[0].metric_key == "episode_reward"
    with_search = search_views(one_cell, [("single", "max", Sweep(name="single", command="x", search=SEARCH))])
    assert [v.name for v in with_search] == ["single"] and with_search[0].configs[0].mean == 2.0


def test_charts_draw_a_band_and_a_log_scatter_with_finite_coordinates_only() -> None:
    svg = band_chart([BandSeries("b", [(0.0, 1.0, 0.0, 2.0), (1.0, float("nan"), 0.0, 1.0), (2.0, 3.0, 2.0, 4.0)])])
    assert svg.count("<polygon") == 1 and svg.count("<polyline") == 1 and "nan" not in svg.lower()
    log = line_chart([Series("s", [(1e-5, 1.0), (1e-1, 2.0), (-1.0, 5.0)], dots=True)], log_x=True)
    xs = [float(x) for x in re.findall(r'<circle cx="([0-9.]+)"', log)]
    assert len(xs) == 2  # x <= 0 has no place on a log axis
    mid = line_chart([Series("s", [(1e-5, 1.0), (1e-3, 1.5), (1e-1, 2.0)], dots=True)], log_x=True)
    a, b, c = (float(x) for x in re.findall(r'<circle cx="([0-9.]+)"', mid))
    assert b - a == pytest.approx(c - b, abs=0.2)  # 1e-3 sits halfway between 1e-5 and 1e-1 on a log axis
    assert ">1e-05<" in mid and ">0.1<" in mid


def _status_rows(text: str) -> list[str]:
    section = text.split("## Top configurations")[1].split("## ")[0]
    return [line for line in section.splitlines() if re.match(r"^\| \d+ \|", line)]


def test_status_md_and_the_dashboard_rank_the_configurations_the_same(tmp_path: Any) -> None:
    from reconciler.views.dashboard import RepoFacts, render_dashboard
    from reconciler.views.status_md import render_status_md

    runs_doc = "sweeps:\n  tune: {}\n"
    files = {"observed/runs.yaml": runs_doc}
    text = render_status_md(files, HISTORY, None)
    rows = _status_rows(text)
    assert rows[0] == r"| 1 | lr\=0\.001 opt\=adam | 650 ± 50 | 2/2 | 0 |"
    assert rows[1] == r"| 2 | lr\=0\.01 opt\=adam | 410 ± 10 | 2/2 | 0 |"
    assert r"| 5 | lr\=1e\-05 opt\=adam | - ± - | 0/2 | 2 |" in rows
    page = render_dashboard(RepoFacts(files, HISTORY, (), (), None))
    search = page.split('<section id="search">')[1].split("</section>")[0]
    means = re.findall(r'<td class="num mean">([^<]*)</td>', search)
    assert means[:3] == ["650", "410", "300"]
    assert re.findall(r'<td class="num rung">([^<]*)</td>', search) == ["3", "9"]


TUNE_YAML = """\
name: tune
command: python experiments/train.py --lr {{ lr }} --opt {{ opt }} --seed {{ seed }}
seeds: [1, 2]
search:
  method: random
  metric: {key: episode_reward, goal: max}
  parameters:
    lr: {distribution: log_uniform, min: 1.0e-5, max: 1.0e-1}
    opt: {values: [adam, sgd]}
  run_cap: 8
"""


def search_repo(where: Path, *, desired: bool = False) -> Path:
    """A checkout's observed/ by hand for a searched sweep ``tune``: HISTORY's attempts archived, runs.yaml naming its
    runs, and one committed curve per run that has a metric (the stopped-early runs' curves end at their rung). With
    ``desired``, this repository's desired/ with ``tune`` (TUNE_YAML: a random search, lr log_uniform) as its sweep."""
    repo = where / "search"
    (repo / "observed" / "runs").mkdir(parents=True)
    if desired:
        shutil.copytree(ROOT / "desired", repo / "desired")
        for old in (repo / "desired" / "sweeps").glob("*.yaml"):
            old.unlink()
        (repo / "desired" / "sweeps" / "tune.yaml").write_text(TUNE_YAML)
    runs = {r.run_id: {"params": dict(r.params), "seed": r.seed, "attempts": r.attempt, "best_metric": r.best_metric
                       if r.best_metric is None or math.isfinite(r.best_metric) else None,
                       "phase": "succeeded" if r.phase is OK else "blocked"}
            for r in HISTORY if r.sweep == "tune"}
    (repo / "observed" / "runs.yaml").write_text(yaml.safe_dump({"sweeps": {"tune": runs}}))
    (repo / "observed" / "status.yaml").write_text(yaml.safe_dump({"last_change_at": "2026-11-03T12:00:00Z"}))
    archived = [r if r.best_metric is None or math.isfinite(r.best_metric) else replace(r, best_metric=None)
                for r in HISTORY]  # the archive holds strict JSON: the NaN record as one without a metric
    (repo / "observed" / "runs" / "2026-11.jsonl").write_text("".join(entry_to_json(r) + "\n" for r in archived))
    for r in HISTORY:
        level = r.best_metric if r.best_metric is not None else r.final_metric
        if level is None or not math.isfinite(level) or r.phase is FAIL:
            continue
        last = 3 if r.phase is STOP else 10
        path = repo / curve_path(r.sweep, r.run_id, r.attempt)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render_curve(sweep=r.sweep, run_id=r.run_id, attempt=r.attempt, key="episode_reward",
                                     goal="max", points=[(float(s), level * s / last) for s in range(last + 1)]))
    return repo


def test_a_search_block_in_desired_gives_the_method_and_a_log_axis(tmp_path: Path) -> None:
    from reconciler.views.dashboard import build, read_repo

    repo = search_repo(tmp_path, desired=True)
    facts = read_repo(repo)
    assert facts.desired is not None and facts.desired.sweeps[0].search is not None
    page = build(repo)
    search = page.split('<section id="search">')[1].split("</section>")[0]
    assert "(random; episode_reward, max;" in search
    assert re.findall(r'data-param="([^"]*)" data-log="(yes|no)"', search) == [("lr", "yes"), ("opt", "no")]
    assert "lr (log axis)" in search


def test_the_search_repo_ranks_and_bands_its_configurations(tmp_path: Path) -> None:
    from reconciler.views.dashboard import build

    page = build(search_repo(tmp_path))
    curves = page.split('<section id="curves">')[1].split("</section>")[0]
    figures = re.findall(r'<figure class="cell-chart curve"(.*?)</figure>', curves, re.S)
    assert len(figures) == 4  # four configurations with a curve; one band each, whatever its seeds
    assert all(f.count("<polygon") == 1 and f.count("<polyline") == 1 for f in figures)
    assert "a1, a2" in curves and "mean of 2 seed(s), min to max" in curves


def test_a_stopped_attempt_has_its_own_segment_on_its_box_s_lane() -> None:
    from reconciler.views.svg import timeline_chart
    from reconciler.views.timeline import build_timeline

    t0 = 1_800_000_000.0
    recs = [replace(rec("c1", 1e-5, 1, phase=STOP, best=50.0), instance_id=4, started_at=t0, ended_at=t0 + 60),
            replace(rec("a1", 1e-3, 1, best=700.0), instance_id=4, started_at=t0 + 60, ended_at=t0 + 200)]
    box = OverheadRecord(instance_id=4, billed_usd=0.1, attempts_usd=0.05, cost_usd=0.05, dph=0.2, started_at=t0 - 30,
                         ended_at=t0 + 300)
    tl = build_timeline(recs, [box], {}, {}, t0 + 300)
    assert [s.kind for s in tl.lanes[0].segments if s.kind in ("stopped_early", "succeeded")] == [
        "stopped_early", "succeeded"]
    assert 'class="seg seg-stopped_early"' in timeline_chart(tl)
