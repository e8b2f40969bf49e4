"""Sweep expansion: content-addressed ids, shell-safe rendering, promotion candidates and ordering."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from profiles import examples

from reconciler.core.model import MetricGoal, PromotionRule, Scalar, Sweep
from reconciler.desired.expand import (
    cell_id,
    count_runs,
    expand,
    expand_sweep,
    promotion_thresholds,
    render_command,
    run_id,
    template_variables,
)
from reconciler.errors import TemplateProblem

COMMAND = "{{ python }} train.py --task {{ task }} --lr {{ lr }} --seed {{ seed }} --out {{ run_dir }}/m.jsonl"


def sweep(**changes: object) -> Sweep:
    base = Sweep(
        name="tdmpc",
        command=COMMAND,
        grid=(("task", ("walker-walk", "cheetah-run")), ("lr", (3e-4, 1e-3))),
        seeds=(1, 2, 3),
    )
    return replace(base, **changes)  # type: ignore[arg-type]


names = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True).filter(
    lambda n: (
        n not in {"seed", "run_id", "sweep", "python", "run_dir", "code_dir", "metrics_file", "attempt", "gpus"}
        and n not in {"in", "is", "and", "or", "not", "if", "else", "true", "false", "none"}
    )
)
scalars: st.SearchStrategy[Scalar] = st.one_of(
    st.text(max_size=20),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
)


@st.composite
def sweeps(draw: st.DrawFn) -> Sweep:
    keys = draw(st.lists(names, min_size=0, max_size=3, unique=True))
    grid = tuple(
        (k, tuple(draw(st.lists(scalars, min_size=1, max_size=3, unique_by=lambda v: (type(v), v))))) for k in keys
    )
    seeds = tuple(draw(st.lists(st.integers(0, 1000), min_size=1, max_size=3, unique=True)))
    command = "run " + " ".join(f"--{k} {{{{ {k} }}}}" for k in keys) + " --seed {{ seed }}"
    return Sweep(name="s", command=command, grid=grid, seeds=seeds)


@settings(max_examples=examples(60), deadline=None)
@given(sweeps())
def test_ids_stable_and_unique(s: Sweep) -> None:
    first = expand_sweep(s)
    again = expand_sweep(s)
    assert [r.id for r in first] == [r.id for r in again]
    assert [r.command for r in first] == [r.command for r in again]
    assert len({r.id for r in first}) == len(first) == count_runs(s)
    for r in first:
        assert re.fullmatch(r"s-[0-9a-f]{12}", r.id)
        assert re.fullmatch(r"s-[0-9a-f]{8}", r.cell)


@settings(max_examples=examples(60), deadline=None)
@given(sweeps(), scalars)
def test_adding_a_grid_value_keeps_old_ids(s: Sweep, extra: Scalar) -> None:
    if not s.grid:
        return
    key, values = s.grid[0]
    if any(type(v) is type(extra) and v == extra for v in values):
        return
    grown = replace(s, grid=((key, (*values, extra)), *s.grid[1:]))
    old = {r.id: r for r in expand_sweep(s)}
    new = {r.id: r for r in expand_sweep(grown)}
    assert set(old) <= set(new)
    for rid, spec in old.items():
        assert new[rid].params == spec.params and new[rid].seed == spec.seed and new[rid].cell == spec.cell


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.text(max_size=30), min_size=1, max_size=4))
def test_each_value_is_exactly_one_argument(values: list[str]) -> None:
    keys = [f"p{i}" for i in range(len(values))]
    template = "run " + " ".join(f"{{{{ {k} }}}}" for k in keys) + " {{ seed }} {{ run_dir }}/out"
    command = render_command(
        template, sweep="s", params=list(zip(keys, values, strict=True)), seed=7, run_id="s-0", metrics_file="m"
    )
    words = shlex.split(command)
    assert words == ["run", *values, "7", "$RIGSYNC_RUN_DIR/out"]


def test_hostile_value_stays_one_argument() -> None:
    command = render_command(
        "echo {{ x }}",
        sweep="s",
        params=[("x", "1; rm -rf ~ $(id) `id` 'q' \"dq\"")],
        seed=1,
        run_id="r",
        metrics_file="m",
    )
    assert shlex.split(command) == ["echo", "1; rm -rf ~ $(id) `id` 'q' \"dq\""]


def test_box_variables_are_references_not_quoted_again() -> None:
    command = render_command(
        "{{ python }} {{ code_dir }}/t.py {{ run_dir }} {{ metrics_file }} {{ attempt }} {{ gpus }} {{ run_id }} "
        "{{ sweep }}",
        sweep="s",
        params=[],
        seed=1,
        run_id="s-abc",
        metrics_file="sub/metrics.jsonl",
    )
    assert command == (
        '"$RIGSYNC_PYTHON" "$RIGSYNC_CODE_DIR"/t.py "$RIGSYNC_RUN_DIR" "$RIGSYNC_RUN_DIR"/sub/metrics.jsonl '
        '"$RIGSYNC_ATTEMPT" "$CUDA_VISIBLE_DEVICES" s-abc s'
    )


def test_scalar_spelling() -> None:
    command = render_command(
        "x {{ a }} {{ b }} {{ c }} {{ d }}",
        sweep="s",
        params=[("a", True), ("b", 0.0003), ("c", 12), ("d", "")],
        seed=1,
        run_id="r",
        metrics_file="m",
    )
    assert command == "x true 0.0003 12 ''"


def test_id_depends_on_sweep_params_seed_and_template_only() -> None:
    base = run_id("s", [("a", 1), ("b", "x")], 1, "t {{ a }}")
    assert run_id("s", [("b", "x"), ("a", 1)], 1, "t {{ a }}") == base  # param order does not matter
    assert run_id("s2", [("a", 1), ("b", "x")], 1, "t {{ a }}") != base
    assert run_id("s", [("a", 2), ("b", "x")], 1, "t {{ a }}") != base
    assert run_id("s", [("a", 1), ("b", "x")], 2, "t {{ a }}") != base
    assert run_id("s", [("a", 1), ("b", "x")], 1, "t  {{ a }}") != base
    assert run_id("s", [("a", 1)], 1, "t") != run_id("s", [("a", "1")], 1, "t")  # 1 and "1" are different cells
    assert cell_id("s", [("a", 1), ("b", "x")]) == cell_id("s", [("b", "x"), ("a", 1)])


def test_golden_ids() -> None:
    """Ids are a persistence format (runs on boxes are found by them): pinned to sha256 of the canonical JSON
    {"command":"t {{ a }}","params":[["a",1]],"seed":1,"sweep":"s"} (and {"params":...,"sweep":"s"} for cells)."""
    assert run_id("tdmpc", [("task", "walker-walk"), ("lr", 0.0003)], 1, COMMAND) == run_id(
        "tdmpc", [("lr", 0.0003), ("task", "walker-walk")], 1, COMMAND
    )
    assert run_id("s", [("a", 1)], 1, "t {{ a }}") == "s-3d72df4120e0"
    assert cell_id("s", [("a", 1)]) == "s-072e6fca"


def test_promotion_thresholds_goal_max() -> None:
    rules = (PromotionRule(600, 5), PromotionRule(500, 2), PromotionRule(380, 1))
    assert promotion_thresholds(rules, MetricGoal.MAX) == [380, 500, 600, 600, 600]


def test_promotion_thresholds_goal_min() -> None:
    rules = (PromotionRule(0.1, 3), PromotionRule(0.5, 1))
    assert promotion_thresholds(rules, MetricGoal.MIN) == [0.5, 0.1, 0.1]


def test_promotion_candidates_expanded() -> None:
    s = sweep(promotion=(PromotionRule(600, 5), PromotionRule(500, 2), PromotionRule(380, 1)), metric_key="r")
    runs = expand_sweep(s)
    assert len(runs) == 4 * (3 + 5) == count_runs(s)
    first_cell = [r for r in runs if r.cell == runs[0].cell]
    assert [(r.seed, r.promotion_threshold) for r in first_cell] == [
        (1, None),
        (2, None),
        (3, None),
        (4, 380),
        (5, 500),
        (6, 600),
        (7, 600),
        (8, 600),
    ]
    # A promotion seed has the id it would have as a base seed: adding seed 4 to `seeds` keeps its identity.
    grown = expand_sweep(replace(s, seeds=(1, 2, 3, 4), promotion=()))
    assert first_cell[3].id in {r.id for r in grown}


def test_runs_order() -> None:
    low = sweep(name="low", priority=0, order=0, grid=(("task", ("a", "b")),), command="x {{ task }}", seeds=(2, 1))
    high = sweep(name="high", priority=5, order=1, grid=(("task", ("a",)),), command="x {{ task }}", seeds=(1,))
    tie = sweep(name="tie", priority=0, order=2, grid=(), command="x", seeds=(1,))
    runs = expand([low, high, tie])
    assert [(r.sweep.name, r.params, r.seed) for r in runs] == [
        ("high", (("task", "a"),), 1),
        ("low", (("task", "a"),), 2),
        ("low", (("task", "a"),), 1),
        ("low", (("task", "b"),), 2),
        ("low", (("task", "b"),), 1),
        ("tie", (), 1),
    ]


def test_runspec_carries_its_sweep() -> None:
    s = sweep(
        gpus_per_run=2,
        min_gpu_ram_mib=8192,
        max_runtime_s=60.0,
        retries=0,
        metrics_file="r.jsonl",
        metric_key="loss",
        metric_goal=MetricGoal.MIN,
        priority=3,
        order=4,
    )
    r = expand_sweep(s)[0]
    assert r.sweep is s
    w = r.sweep
    assert (w.gpus_per_run, w.min_gpu_ram_mib, w.max_runtime_s, w.retries) == (2, 8192, 60.0, 0)
    assert (w.metrics_file, w.metric_key, w.metric_goal, w.priority, w.order) == (
        "r.jsonl",
        "loss",
        MetricGoal.MIN,
        3,
        4,
    )


@pytest.mark.parametrize(
    "template",
    [
        "{% for i in range(10) %}x{% endfor %}",
        "{{ a | upper }}",
        "{{ a.__class__ }}",
        "{{ 9**9**9 }}",
        "{{ 'x' * 1000000 }}",
        "{{ a",
        "{% set x = 1 %}",
    ],
)
def test_templates_beyond_plain_names_are_refused(template: str) -> None:
    with pytest.raises(TemplateProblem):
        template_variables(template)


def test_template_variables_in_order() -> None:
    assert template_variables("{{ b }} {{ a }} {{ b }} {# note #}") == ["b", "a"]


@settings(max_examples=examples(40), deadline=None)
@given(
    st.lists(st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=20), max_size=3)
)
def test_a_real_shell_sees_each_value_as_one_argument(values: list[str]) -> None:
    """Beyond shlex: /bin/sh itself runs the rendered command; argv must come back exactly."""
    keys = [f"p{i}" for i in range(len(values))]
    template = "{{ python }} -c 'import sys, json; print(json.dumps(sys.argv[1:]))' " + " ".join(
        f"{{{{ {k} }}}}" for k in keys
    )
    command = render_command(
        template, sweep="s", params=list(zip(keys, values, strict=True)), seed=1, run_id="r", metrics_file="m"
    )
    env = {"RIGSYNC_PYTHON": sys.executable, "PATH": "/usr/bin:/bin", "PYTHONIOENCODING": "utf-8"}
    out = subprocess.run(["/bin/sh", "-c", command], env=env, capture_output=True, check=True)
    assert json.loads(out.stdout) == values
