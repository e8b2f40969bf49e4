"""The bayes search's next batch (core/suggest.py) and its record under observed/ (observed/suggestions.py)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.core.actions import Plan, SweepEstimate
from reconciler.core.model import (
    DEFAULT_POOL,
    AttemptOutcome,
    AttemptRecord,
    Budget,
    Desired,
    Distribution,
    Fleet,
    MetricGoal,
    Observed,
    Pool,
    RunSpec,
    Search,
    SearchMethod,
    SearchParam,
    Sweep,
)
from reconciler.core.search import Config
from reconciler.core.suggest import next_batch, search_bounds, wants_batch
from reconciler.desired.expand import expand
from reconciler.errors import ObservedInvalid
from reconciler.observed.codec import SUGGESTIONS
from reconciler.observed.suggestions import (
    Recorded,
    advance,
    merge_recorded,
    parse_suggestions,
    render_suggestions,
    suggested_runs,
)
from reconciler.observed.summary import describe_change
from reconciler.plan.render import plan_text, search_line
from reconciler.plan.review import Side, compute_review, markdown
from reconciler.plan.review import text as review_text

ROOT = Path(__file__).parents[2]

PARAMS = (
    SearchParam("lr", Distribution.LOG_UNIFORM, min=1e-4, max=1e-1),
    SearchParam("width", Distribution.INT_UNIFORM, min=16, max=256),
    SearchParam("act", Distribution.CATEGORICAL, values=("relu", "tanh", "gelu")),
    SearchParam("dropout", Distribution.UNIFORM, min=0.0, max=0.5),
)


def bayes(*, run_cap: int = 8, batch: int = 2, seed: int = 0, goal: MetricGoal = MetricGoal.MAX) -> Sweep:
    search = Search(
        method=SearchMethod.BAYES,
        metric_key="score",
        metric_goal=goal,
        parameters=PARAMS,
        run_cap=run_cap,
        batch=batch,
        seed=seed,
    )
    return Sweep(
        name="tune",
        command="python train.py --lr {{ lr }} --width {{ width }} --act {{ act }} --dropout {{ dropout }}",
        seeds=(1,),
        metric_key="score",
        metric_goal=goal,
        search=search,
    )


def objective(config: Config) -> float:
    p = dict(config)
    return -((math.log10(float(p["lr"])) + 2.5) ** 2) - abs(int(p["width"]) - 128) / 64 + (p["act"] == "gelu")


def run_search(sweep: Sweep) -> list[Config]:
    """Batches until run_cap, each one finished before the next is asked (as the archive would have them)."""
    made: list[Config] = []
    while True:
        batch = next_batch(sweep, made, [objective(c) for c in made])
        if not batch:
            return made
        made += batch


def test_batches_stop_at_run_cap_and_stay_in_the_space() -> None:
    made = run_search(bayes(run_cap=7, batch=3))
    assert len(made) == 7
    assert len(set(made)) == 7
    for config in made:
        p = dict(config)
        assert [k for k, _ in config] == ["lr", "width", "act", "dropout"]
        assert 1e-4 <= float(p["lr"]) <= 1e-1
        assert isinstance(p["width"], int) and 16 <= p["width"] <= 256
        assert p["act"] in ("relu", "tanh", "gelu")
        assert 0.0 <= float(p["dropout"]) <= 0.5


def test_nothing_while_a_made_configuration_is_unfinished() -> None:
    sweep = bayes()
    first = next_batch(sweep, [], [])
    assert len(first) == 2
    assert next_batch(sweep, first, [objective(first[0]), None]) == []
    assert not wants_batch(sweep, [1.0, None])
    assert len(next_batch(sweep, first, [objective(first[0]), objective(first[1])])) == 2


def test_a_settled_configuration_without_a_metric_is_a_failed_trial() -> None:
    sweep = bayes()
    first = next_batch(sweep, [], [])
    assert len(next_batch(sweep, first, [math.nan, math.nan])) == 2


def test_a_search_that_is_not_bayes_suggests_nothing() -> None:
    sweep = bayes()
    assert sweep.search is not None
    grid = replace(sweep, search=replace(sweep.search, method=SearchMethod.RANDOM))
    assert next_batch(grid, [], []) == []
    assert next_batch(replace(sweep, search=None), [], []) == []


def test_the_objective_steers_later_batches() -> None:
    """The finished trials are told to the study: other objectives, other suggestions."""
    sweep = bayes(run_cap=12, batch=4)
    made = next_batch(sweep, [], [])
    good = next_batch(sweep, made, [objective(c) for c in made])
    bad = next_batch(sweep, made, [-objective(c) for c in made])
    assert good != bad


def test_made_and_finished_must_line_up() -> None:
    with pytest.raises(ValueError):
        next_batch(bayes(), [(("lr", 0.01),)], [])


configs_so_far = st.integers(min_value=0, max_value=3)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(min_value=0, max_value=2**31),
    batches=st.integers(min_value=0, max_value=3),
    batch=st.integers(min_value=1, max_value=3),
    goal=st.sampled_from(list(MetricGoal)),
    noise=st.floats(min_value=-1.0, max_value=1.0),
)
def test_same_archive_same_batch_and_nothing_new_without_results(
    seed: int, batches: int, batch: int, goal: MetricGoal, noise: float
) -> None:
    """The same (sweep, made, finished) always gives the same batch; with it made and nothing new finished the
    search waits (batches)."""
    sweep = bayes(run_cap=batch * 4, batch=batch, seed=seed, goal=goal)
    made: list[Config] = []
    for _ in range(batches):
        made += next_batch(sweep, made, [objective(c) + noise for c in made])
    finished: list[float | None] = [objective(c) + noise for c in made]
    once = next_batch(sweep, made, finished)
    assert once == next_batch(sweep, list(made), list(finished))
    assert len(once) == min(batch, sweep.search.run_cap - len(made)) if sweep.search else False
    waiting = next_batch(sweep, made + once, [*finished, *(None for _ in once)])
    assert waiting == []


# ------------------------------------------------------------------------------------------------ the record


def desired_of(sweep: Sweep) -> Desired:
    fleet = Fleet(name="lab", max_instances=2, pools=(Pool(name=DEFAULT_POOL, max_instances=2),))
    return Desired(fleet=fleet, budget=Budget(), sweeps=(sweep,), runs=expand((sweep,)), commit="d" * 7)


def settle(runs: Iterable[RunSpec], *, phase: AttemptOutcome = AttemptOutcome.SUCCEEDED) -> list[AttemptRecord]:
    """Each run's one attempt, archived with the objective as its best metric (failed ones without one)."""
    return [
        AttemptRecord(
            run_id=r.id,
            attempt=1,
            sweep=r.sweep.name,
            phase=phase,
            params=r.params,
            seed=r.seed,
            best_metric=objective(r.params) if phase is not AttemptOutcome.FAILED else None,
        )
        for r in runs
    ]


def cycle(desired: Desired, recorded: Recorded, history: list[AttemptRecord]) -> tuple[Recorded, Desired]:
    """What the loop does before plan(): record the next batch when due, then the desired runs with it."""
    recorded = advance(desired, recorded, history)
    return recorded, suggested_runs(desired, recorded)


def test_the_loop_records_batches_until_run_cap_and_a_restart_reads_the_same_runs() -> None:
    sweep = replace(bayes(run_cap=6, batch=2), seeds=(1, 2))
    desired = desired_of(sweep)
    assert len(desired.runs) == 4  # the first batch (2 configurations x 2 seeds), known up front
    recorded: Recorded = {}
    history: list[AttemptRecord] = []
    recorded, full = cycle(desired, recorded, history)
    assert [s.batch for s in recorded["tune"]] == [0, 0] and full.runs == desired.runs  # nothing finished yet
    history += settle(full.runs[:3])
    recorded, full = cycle(desired, recorded, history)
    assert len(recorded["tune"]) == 2  # one seed of trial 1 still runs
    for _ in range(2):
        history += settle(r for r in full.runs if r.id not in {h.run_id for h in history})
        recorded, full = cycle(desired, recorded, history)
    again, _ = cycle(desired, recorded, history)
    assert again == recorded  # the same archive: nothing new is suggested
    assert [(s.trial, s.batch) for s in recorded["tune"]] == [(0, 0), (1, 0), (2, 1), (3, 1), (4, 2), (5, 2)]
    assert len(full.runs) == 12 and len({r.id for r in full.runs}) == 12
    assert sorted(r.trial or 0 for r in full.runs) == [t for t in range(6) for _ in (1, 2)]
    history += settle(r for r in full.runs if r.id not in {h.run_id for h in history})
    capped, _ = cycle(desired, recorded, history)
    assert capped == recorded  # run_cap reached

    text = render_suggestions(recorded)
    assert text is not None
    schema = json.loads((ROOT / "schemas" / "observed-suggestions.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(yaml.safe_load(text))
    restarted = parse_suggestions(text)
    assert restarted == {"tune": tuple(replace(s, params=tuple(sorted(s.params))) for s in recorded["tune"])}
    # a restart (or a second controller) with another archive order still runs exactly what is recorded
    _, after_restart = cycle(desired, restarted, list(reversed(history)))
    assert [r.id for r in after_restart.runs] == [r.id for r in full.runs]
    assert [r.params for r in after_restart.runs] == [r.params for r in full.runs]


def test_failed_seeds_out_of_retries_settle_a_configuration() -> None:
    sweep = replace(bayes(run_cap=4, batch=2), retries=0)
    desired = desired_of(sweep)
    recorded, _ = cycle(desired, {}, settle(desired.runs, phase=AttemptOutcome.FAILED))
    assert len(recorded["tune"]) == 4
    stopped, _ = cycle(desired, {}, settle(desired.runs, phase=AttemptOutcome.STOPPED_EARLY))
    assert len(stopped["tune"]) == 4


def test_a_grid_fleet_writes_no_suggestions_file() -> None:
    assert render_suggestions({}) is None
    assert parse_suggestions(None) == {}


@pytest.mark.parametrize(
    "text",
    [
        "format_version: 2\nsweeps: []\n",
        "format_version: 1\nsweeps: {}\n",
        "format_version: 1\nsweeps:\n- sweep: t\n  configurations:\n  - {trial: 1, batch: 0, params: {a: 1}}\n",
        "format_version: 1\nsweeps:\n- sweep: t\n  configurations:\n  - {trial: 0, batch: -1, params: {a: 1}}\n",
        "format_version: 1\nsweeps:\n- sweep: t\n  configurations:\n  - {trial: 0, batch: 0, params: {a: [1]}}\n",
        "format_version: 1\nsweeps:\n- {sweep: t}\n- {sweep: t}\n",
        "sweeps: [\n",
    ],
)
def test_a_malformed_record_is_refused_naming_the_file(text: str) -> None:
    with pytest.raises(ObservedInvalid, match=r"observed/suggestions\.yaml"):
        parse_suggestions(text)


def test_the_bound_of_what_the_search_may_still_start() -> None:
    sweep = replace(bayes(run_cap=10, batch=2), seeds=(1, 2, 3))
    desired = desired_of(sweep)
    e = SweepEstimate(
        sweep="tune", pending_runs=6, running_runs=0, gpu_hours=1.0, runtime_h=0.2, runtime_source="archive",
        runtime_samples=3, usd_low=0.3, usd_high=0.6, eta_h=None, fleet_gpus=1, budget_left_low=None,
        budget_left_high=None,
    )
    (bound,) = search_bounds(desired.sweeps, desired.runs, [e])
    assert (bound.runs, bound.usd_high) == (8 * 3, round(24 * 0.1, 4))
    assert search_line(bound.sweep, bound.runs, bound.usd_high) == (
        "search tune: the search may still start 24 run(s), at most $2.40"
    )
    (unpriced,) = search_bounds(desired.sweeps, desired.runs, [])
    assert unpriced.usd_high is None
    assert search_bounds([replace(sweep, search=None)], desired.runs, [e]) == []


def test_a_commit_message_names_the_batch_suggested() -> None:
    sweep = bayes(run_cap=6, batch=2)
    desired = desired_of(sweep)
    first, _ = cycle(desired, {}, [])
    later, _ = cycle(desired, first, settle(desired.runs))
    old, new = render_suggestions(first), render_suggestions(later)
    assert old is not None and new is not None
    message = describe_change({SUGGESTIONS: old}, {SUGGESTIONS: new})
    assert message == "tune: suggested 2 configurations (batch 1)"
    assert describe_change({SUGGESTIONS: new}, {SUGGESTIONS: new}) is None


def test_review_and_plan_show_what_the_search_may_still_start() -> None:
    head = desired_of(replace(bayes(run_cap=6, batch=2), seeds=(1, 2)))
    base = replace(head, sweeps=(), runs=())
    doc = compute_review(Side("main", "a" * 40, base), Side("HEAD", "b" * 40, head), Observed(),
                         [(0.10, 1, "RTX 3060")], 1_796_000_000.0)
    jsonschema.Draft202012Validator(json.loads((ROOT / "schemas" / "review.schema.json").read_text())).validate(doc)
    e = doc["estimate"]
    assert e["runs"] == 4  # the first batch: 2 configurations x 2 seeds, 1 GPU-h each (max_runtime) at $0.10
    line = "search tune: the search may still start 8 run(s), at most $0.8000"
    assert e["search"] == [{"sweep": "tune", "runs": 8, "usd_high": pytest.approx(0.8)}]
    assert line in review_text(doc).splitlines()
    assert line in markdown(doc)
    (bound,) = search_bounds(head.sweeps, head.runs, [SweepEstimate.from_json(s) for s in e["sweeps"]])
    assert "  " + line in plan_text(Plan(actions=()), searches=[bound]).splitlines()


def test_a_controller_that_stood_by_takes_over_the_longer_record() -> None:
    desired = desired_of(bayes(run_cap=6, batch=2))
    first, _ = cycle(desired, {}, [])
    later, _ = cycle(desired, first, settle(desired.runs))
    assert merge_recorded(first, later) == later
    assert merge_recorded(later, first) == later
    assert merge_recorded({}, later) == later and merge_recorded(later, {}) == later


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(min_value=0, max_value=2**31),
    seeds=st.integers(min_value=1, max_value=3),
    cut=st.integers(min_value=0, max_value=3),
)
def test_a_restart_from_the_recorded_file_gives_the_same_runs(seed: int, seeds: int, cut: int) -> None:
    """Stopped after ``cut`` cycles and restarted from observed/suggestions.yaml alone (no memory), the search goes on
    to exactly the runs an uninterrupted controller reaches."""
    sweep = replace(bayes(run_cap=6, batch=2, seed=seed), seeds=tuple(range(1, seeds + 1)))
    desired = desired_of(sweep)

    def run(recorded: Recorded, history: list[AttemptRecord], cycles: int) -> tuple[Recorded, Desired]:
        full = desired
        for _ in range(cycles):
            recorded, full = cycle(desired, recorded, history)
            history += settle(r for r in full.runs if r.id not in {h.run_id for h in history})
        return recorded, full

    straight, straight_runs = run({}, [], 5)
    history: list[AttemptRecord] = []
    part, _ = run({}, history, cut)
    text = render_suggestions(part)
    restarted, restarted_runs = run(parse_suggestions(text), history, 5 - cut)
    assert [r.id for r in restarted_runs.runs] == [r.id for r in straight_runs.runs]
    assert render_suggestions(restarted) == render_suggestions(straight)
