"""A ``search:`` sweep's configurations and their runs: deterministic, content-addressed, grid sweeps unchanged."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from reconciler.core import search
from reconciler.core.model import (
    Distribution,
    EarlyTerminate,
    EarlyTerminateType,
    MetricGoal,
    PromotionRule,
    Scalar,
    Search,
    SearchMethod,
    SearchParam,
    Sweep,
)
from reconciler.core.promotion import wanted_ids
from reconciler.desired import fields, load_desired, read_desired_files
from reconciler.desired.expand import cell_id, count_runs, expand_configurations, expand_sweep, run_id

COMMAND = "{{ python }} train.py --task {{ task }} --lr {{ lr }} --seed {{ seed }} --out {{ run_dir }}/m.jsonl"
GRID_SWEEP = Sweep(
    name="tdmpc",
    command=COMMAND,
    grid=(("task", ("walker-walk", "cheetah-run")), ("lr", (3e-4, 1e-3))),
    seeds=(1, 2, 3),
    promotion=(PromotionRule(0.5, 2),),
    env=(("MUJOCO_GL", "egl"),),
)
# (id, cell, seed, promotion threshold) of GRID_SWEEP, computed by expand.py at 031c3a8 (before search existed).
GRID_IDS_BEFORE = [
    ("tdmpc-12f288824139", "tdmpc-0e798406", 1, None),
    ("tdmpc-303a338ce4e6", "tdmpc-0e798406", 2, None),
    ("tdmpc-6c06e51ead2d", "tdmpc-0e798406", 3, None),
    ("tdmpc-f74e10440b11", "tdmpc-0e798406", 4, 0.5),
    ("tdmpc-94e86b478d0b", "tdmpc-0e798406", 5, 0.5),
    ("tdmpc-64dedbfa0ee6", "tdmpc-24678b61", 1, None),
    ("tdmpc-bd489d793c2b", "tdmpc-24678b61", 2, None),
    ("tdmpc-ae91ce9df0c6", "tdmpc-24678b61", 3, None),
    ("tdmpc-dde849240048", "tdmpc-24678b61", 4, 0.5),
    ("tdmpc-51565d14f992", "tdmpc-24678b61", 5, 0.5),
    ("tdmpc-61f65c9fde25", "tdmpc-14803182", 1, None),
    ("tdmpc-a1ddbb710f59", "tdmpc-14803182", 2, None),
    ("tdmpc-00b4d80c9732", "tdmpc-14803182", 3, None),
    ("tdmpc-c8fd282cddca", "tdmpc-14803182", 4, 0.5),
    ("tdmpc-8832dc576d90", "tdmpc-14803182", 5, 0.5),
    ("tdmpc-d2e83a3c6202", "tdmpc-2c1bae0d", 1, None),
    ("tdmpc-7ec41bcbe39e", "tdmpc-2c1bae0d", 2, None),
    ("tdmpc-69cafbd8275b", "tdmpc-2c1bae0d", 3, None),
    ("tdmpc-5391f2595b17", "tdmpc-2c1bae0d", 4, 0.5),
    ("tdmpc-ca4d74d36613", "tdmpc-2c1bae0d", 5, 0.5),
]

PARAMS = (
    SearchParam("lr", Distribution.LOG_UNIFORM, min=1e-5, max=1e-1),
    SearchParam("layers", Distribution.INT_UNIFORM, min=1, max=8),
    SearchParam("task", Distribution.CATEGORICAL, values=("walker-walk", "cheetah-run")),
    SearchParam("batch", Distribution.Q_UNIFORM, min=16, max=256, q=16),
    SearchParam("dropout", Distribution.Q_UNIFORM, min=0.05, max=0.5, q=0.1),
    SearchParam("wd", Distribution.Q_LOG_UNIFORM, min=1e-4, max=1.0, q=1e-4),
    SearchParam("tau", Distribution.UNIFORM, min=0.001, max=0.1),
)
SEARCH_COMMAND = "train.py " + " ".join(f"--{p.name} {{{{ {p.name} }}}}" for p in PARAMS) + " --seed {{ seed }}"

SMALL_COMMAND = "train.py --lr {{ lr }} --layers {{ layers }} --seed {{ seed }}"


def a_search(method: SearchMethod = SearchMethod.RANDOM, **changes: object) -> Search:
    base = Search(method=method, metric_key="reward", metric_goal=MetricGoal.MAX, parameters=PARAMS, run_cap=6)
    return replace(base, **changes)  # type: ignore[arg-type]


def search_sweep(s: Search, **changes: object) -> Sweep:
    base = Sweep(name="tune", command=SEARCH_COMMAND, seeds=(1, 2), search=s)
    return replace(base, **changes)  # type: ignore[arg-type]


def test_a_grid_sweep_keeps_the_run_ids_it_had_before_search() -> None:
    specs = expand_sweep(GRID_SWEEP)
    assert [(s.id, s.cell, s.seed, s.promotion_threshold) for s in specs] == GRID_IDS_BEFORE
    assert all(s.trial is None for s in specs)
    assert count_runs(GRID_SWEEP) == len(specs)


def test_expand_configurations_numbers_trials_from_first_trial_and_runs_every_seed() -> None:
    sweep = search_sweep(a_search(), command=SMALL_COMMAND)
    configs = [(("lr", 0.01), ("layers", 2)), (("lr", 0.02), ("layers", 3))]
    specs = expand_configurations(sweep, configs, 7)
    assert [(s.trial, s.seed) for s in specs] == [(7, 1), (7, 2), (8, 1), (8, 2)]
    assert specs[0].id == run_id("tune", configs[0], 1, SMALL_COMMAND)
    assert specs[2].command == "train.py --lr 0.02 --layers 3 --seed 1"
    assert {s.cell for s in specs[:2]} == {cell_id("tune", configs[0])}
    assert specs[0].params == configs[0]


def test_the_same_configuration_is_the_same_cell_whatever_its_trial() -> None:
    sweep = search_sweep(a_search(), command=SMALL_COMMAND)
    config = (("layers", 2), ("lr", 0.01))
    first = expand_configurations(sweep, [config], 0)
    later = expand_configurations(sweep, [tuple(reversed(config))], 12)
    assert [s.id for s in first] == [s.id for s in later]
    assert first[0].cell == later[0].cell


def test_a_random_sweep_expands_to_run_cap_configurations_times_seeds() -> None:
    sweep = search_sweep(a_search(run_cap=5))
    specs = expand_sweep(sweep)
    assert len(specs) == 10 == count_runs(sweep)
    assert [s.trial for s in specs] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert len({s.cell for s in specs}) == 5
    assert "--task walker-walk" in specs[0].command or "--task cheetah-run" in specs[0].command


def test_promotion_seeds_are_added_to_search_cells() -> None:
    sweep = search_sweep(a_search(run_cap=2), promotion=(PromotionRule(0.9, 1),))
    specs = expand_sweep(sweep)
    assert [(s.seed, s.promotion_threshold) for s in specs[:3]] == [(1, None), (2, None), (3, 0.9)]
    assert count_runs(sweep) == len(specs) == 6


def test_grid_search_is_the_product_of_values_in_file_order_up_to_run_cap() -> None:
    params = (
        SearchParam("a", Distribution.CATEGORICAL, values=(1, 2, 3)),
        SearchParam("b", Distribution.CATEGORICAL, values=("x", "y")),
    )
    s = a_search(SearchMethod.GRID, parameters=params, run_cap=4)
    assert search.configurations(s) == [
        (("a", 1), ("b", "x")),
        (("a", 1), ("b", "y")),
        (("a", 2), ("b", "x")),
        (("a", 2), ("b", "y")),
    ]
    assert search.known_count(replace(s, run_cap=100)) == 6


def test_bayes_knows_its_first_batch_up_front_and_it_is_tpes_random_start() -> None:
    bayes = a_search(SearchMethod.BAYES, batch=3, seed=5)
    first = search.configurations(bayes)
    assert len(first) == 3 == search.known_count(bayes)
    assert first == search.configurations(a_search(seed=5))[:3]
    assert search.known_count(replace(bayes, run_cap=2)) == 2


def test_the_seed_changes_the_suggestions() -> None:
    assert search.configurations(a_search(seed=1)) != search.configurations(a_search(seed=2))


def test_distributions_map_every_kind() -> None:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    d = search.distributions(a_search())
    assert list(d) == [p.name for p in PARAMS]
    assert d["lr"] == FloatDistribution(1e-5, 1e-1, log=True)
    assert d["layers"] == IntDistribution(1, 8)
    assert d["task"] == CategoricalDistribution(("walker-walk", "cheetah-run"))
    assert d["dropout"] == FloatDistribution(0.05, 0.5)


def _check_value(param: SearchParam, v: object) -> None:
    if param.distribution is Distribution.CATEGORICAL:
        assert v in param.values
        return
    assert isinstance(v, int | float) and not isinstance(v, bool)
    assert param.min is not None and param.max is not None
    assert param.min <= v <= param.max
    if param.distribution is Distribution.INT_UNIFORM:
        assert isinstance(v, int)
    if param.q is not None:
        k = v / param.q
        assert math.isclose(k, round(k), rel_tol=1e-6, abs_tol=1e-6)
        assert isinstance(v, int) == float(param.q).is_integer()
    if isinstance(v, float) and v not in (param.min, param.max):
        if param.q is not None:  # stable text: the decimals q is written with
            assert float(f"{v:.{max(0, -Decimal(repr(param.q)).as_tuple().exponent)}f}") == v  # type: ignore[operator]
        else:  # stable text: 6 significant digits (or a bound as written)
            assert float(f"{v:.6g}") == v


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), method=st.sampled_from([SearchMethod.RANDOM, SearchMethod.BAYES]))
def test_suggestions_are_a_deterministic_function_of_the_block_and_stay_in_their_space(
    seed: int, method: SearchMethod
) -> None:
    s = a_search(method, seed=seed, run_cap=4, batch=4)
    configs = search.configurations(s)
    assert configs == search.ask(s, 4)  # asked afresh (configurations remembers its answer)
    assert len(configs) == 4
    for config in configs:
        assert [k for k, _ in config] == [p.name for p in PARAMS]
        for param, (_, v) in zip(PARAMS, config, strict=True):
            _check_value(param, v)
    specs = expand_sweep(search_sweep(s))
    assert [x.id for x in specs] == [x.id for x in expand_sweep(search_sweep(s))]


@settings(max_examples=40, deadline=None)
@example(raw=5000.0, lo=0.828125, width=1000.0, q=0.001)  # six significant digits pushed k*q past max
@given(
    raw=st.floats(-1e6, 1e6),
    lo=st.floats(-100, 100),
    width=st.floats(0.01, 1000),
    q=st.sampled_from([0.001, 0.1, 0.25, 1.0, 16.0]),
)
def test_a_quantized_value_is_a_multiple_of_q_inside_the_range(raw: float, lo: float, width: float, q: float) -> None:
    param = SearchParam("x", Distribution.Q_UNIFORM, min=lo, max=lo + width, q=q)
    k_lo, k_hi = search.quantum_bounds(param)
    if k_lo > k_hi:
        return  # no multiple of q in the range: the loader refuses such a parameter
    _check_value(param, search.value(param, raw))


def test_many_random_draws_cover_every_category() -> None:
    configs = search.configurations(a_search(run_cap=40, seed=3))
    assert {dict(c)["task"] for c in configs} == {"walker-walk", "cheetah-run"}


# ------------------------------------------------------------------------------ loaded from desired/, listed, priced

REPO = Path(__file__).resolve().parents[2]
RIGSYNC = Path(sys.executable).parent / "rigsync"
TUNE = """name: tune
command: >-
  {{ python }} experiments/train.py --task {{ task }} --lr {{ lr }} --seed {{ seed }}
  --out {{ run_dir }}/metrics.jsonl
seeds: [1, 2]
code: [experiments]
expected_runtime: 10m
progress: {key: step, total: 20000}
metrics: {key: episode_reward, goal: max}
search:
  method: random
  metric: {key: episode_reward, goal: max}
  run_cap: 3
  seed: 11
  parameters:
    lr: {distribution: log_uniform, min: 1.0e-4, max: 1.0e-2}
    task: {values: [walker-walk, cheetah-run]}
early_terminate: {type: asha, min_iter: 2000, eta: 3}
"""


def _desired_with(extra: dict[str, str]) -> dict[str, bytes]:
    files = read_desired_files(REPO)
    files.update({k: v.encode() for k, v in extra.items()})
    return files


def test_a_search_sweep_loads_into_the_model_and_expands() -> None:
    desired = load_desired(_desired_with({"desired/sweeps/tune.yaml": TUNE}))
    [tune] = [s for s in desired.sweeps if s.name == "tune"]
    assert tune.search == Search(
        method=SearchMethod.RANDOM,
        metric_key="episode_reward",
        metric_goal=MetricGoal.MAX,
        parameters=(
            SearchParam("lr", Distribution.LOG_UNIFORM, min=1e-4, max=1e-2),
            SearchParam("task", Distribution.CATEGORICAL, values=("walker-walk", "cheetah-run")),
        ),
        run_cap=3,
        seed=11,
    )
    assert tune.early_terminate == EarlyTerminate(EarlyTerminateType.ASHA, min_iter=2000.0, eta=3.0)
    runs = [r for r in desired.runs if r.sweep.name == "tune"]
    assert [r.trial for r in runs] == [0, 0, 1, 1, 2, 2]
    assert runs == expand_configurations(tune, search.configurations(tune.search), 0)


def test_a_grid_search_without_run_cap_runs_every_combination_and_ranges_are_inferred() -> None:
    text = (
        TUNE.replace("method: random", "method: grid")
        .replace("  run_cap: 3\n", "")
        .replace("lr: {distribution: log_uniform, min: 1.0e-4, max: 1.0e-2}", "lr: {values: [0.001, 0.01, 0.1]}")
    )
    desired = load_desired(_desired_with({"desired/sweeps/tune.yaml": text}))
    [tune] = [s for s in desired.sweeps if s.name == "tune"]
    assert tune.search is not None and tune.search.run_cap == 6
    assert len([r for r in desired.runs if r.sweep.name == "tune"]) == 12
    inferred = TUNE.replace("{distribution: log_uniform, min: 1.0e-4, max: 1.0e-2}", "{min: 1, max: 4}")
    [tune] = [s for s in load_desired(_desired_with({"desired/sweeps/tune.yaml": inferred})).sweeps if s.name == "tune"]
    assert tune.search is not None and tune.search.parameters[0].distribution is Distribution.INT_UNIFORM


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def _rigsync(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(RIGSYNC), *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert proc.returncode == 0, proc.stderr
    return proc


def test_rigsync_runs_lists_a_search_sweeps_runs_and_review_prices_them(tmp_path: Path) -> None:
    repo = tmp_path / "fleet"
    for d in ("desired", "experiments"):
        shutil.copytree(REPO / d, repo / d, ignore=shutil.ignore_patterns("__pycache__"))
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "base")
    _git(repo, "checkout", "-q", "-b", "tune")
    (repo / "desired" / "sweeps" / "tune.yaml").write_text(TUNE)
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "a random search")
    listed = [r for r in json.loads(_rigsync("runs", "--json", cwd=repo).stdout) if r["sweep"] == "tune"]
    [tune] = [s for s in load_desired(read_desired_files(repo)).sweeps if s.name == "tune"]
    expected = expand_sweep(tune)
    assert [r["id"] for r in listed] == [s.id for s in expected]
    assert [tuple(r["params"].items()) for r in listed] == [s.params for s in expected]
    assert len(listed) == 6 and len({s.cell for s in expected}) == 3
    doc = json.loads(_rigsync("review", "--base", "main", "--head", "tune", "--json", cwd=repo).stdout)
    assert doc["totals"]["added"] == 6
    [priced] = [s for s in doc["estimate"]["sweeps"] if s["sweep"] == "tune"]
    assert priced["pending_runs"] == 6 and priced["usd_high"] > 0
    assert priced["gpu_hours"] == 6 * 10 / 60  # each of the 6 runs at the sweep's expected_runtime


def test_random_never_suggests_a_configuration_twice_so_no_run_id_repeats() -> None:
    small = (
        SearchParam("a", Distribution.CATEGORICAL, values=(1, 2, 3)),
        SearchParam("b", Distribution.INT_UNIFORM, min=0, max=1),
    )
    s = a_search(parameters=small, run_cap=6)
    assert search.space_size(s) == 6
    configs = search.configurations(s)
    assert len(configs) == 6 == len(set(configs)) == search.known_count(s)
    assert search.space_size(a_search()) is None  # a continuous parameter: no bound
    fresh = search.ask(s, 2, seen=configs[:4])
    assert set(fresh) == set(configs[4:])


def test_a_search_without_metrics_key_gives_the_sweep_its_objective() -> None:
    text = TUNE.replace("metrics: {key: episode_reward, goal: max}\n", "").replace("goal: max}", "goal: min}")
    [tune] = [s for s in load_desired(_desired_with({"desired/sweeps/tune.yaml": text})).sweeps if s.name == "tune"]
    assert (tune.metric_key, tune.metric_goal) == ("episode_reward", MetricGoal.MIN)


def test_another_process_with_another_hash_seed_suggests_the_same_runs() -> None:
    """A restarted or second controller computes the same configurations, so the same run ids."""
    sweep = search_sweep(a_search(SearchMethod.BAYES, run_cap=9, batch=5, seed=42))
    code = (
        "import json, sys; sys.path.insert(0, 'tests/unit'); import test_search_expand as t;"
        "from reconciler.desired.expand import expand_sweep; from reconciler.core.model import SearchMethod;"
        "s = t.search_sweep(t.a_search(SearchMethod.BAYES, run_cap=9, batch=5, seed=42));"
        "print(json.dumps([r.id for r in expand_sweep(s)]))"
    )
    env = {"PYTHONHASHSEED": "12345", "PYTHONDONTWRITEBYTECODE": "1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [r.id for r in expand_sweep(sweep)]


def test_promotion_rules_promote_search_cells_by_their_base_seeds() -> None:
    sweep = search_sweep(a_search(run_cap=3), promotion=(PromotionRule(0.9, 1),))
    specs = expand_sweep(sweep)
    base = [s for s in specs if s.promotion_threshold is None]
    good, poor = base[0], base[2]  # trial 0's seed 1, trial 1's seed 1
    assert good.trial == 0 and poor.trial == 1
    wanted = wanted_ids(specs, {good.id: [0.95], poor.id: [0.5]})
    promoted = {s.trial for s in specs if s.promotion_threshold is not None and s.id in wanted}
    assert promoted == {0}
    assert {s.id for s in base} <= wanted


@st.composite
def _param_yaml(draw: st.DrawFn) -> dict[str, object]:
    kind = draw(st.sampled_from(["values", "uniform", "log_uniform", "int_uniform", "q_uniform", "q_log_uniform"]))
    if kind == "values":
        return {
            "values": draw(
                st.lists(st.integers(-5, 5) | st.sampled_from(["a", "b"]), min_size=1, max_size=4, unique=True)
            )
        }
    low = draw(st.floats(0.001, 10, allow_nan=False))
    high = low + draw(st.floats(0.5, 100))
    spec: dict[str, object] = {"distribution": kind, "min": low, "max": high}
    if kind == "int_uniform":
        spec.update(min=int(low), max=int(high) + 1)
    if kind.startswith("q_"):
        spec["q"] = draw(st.sampled_from([0.01, 0.25, 1, 2]))
        spec["max"] = high + 2 * float(spec["q"])  # type: ignore[arg-type]
    return spec


@settings(max_examples=20, deadline=None)
@given(
    params=st.lists(_param_yaml(), min_size=1, max_size=3),
    method=st.sampled_from(["random", "bayes"]),
    seed=st.integers(0, 1000),
)
def test_any_valid_search_block_loads_and_expands_to_distinct_runs_in_its_space(
    params: list[dict[str, object]], method: str, seed: int
) -> None:
    names = [f"p{i}" for i in range(len(params))]
    block = {
        "method": method,
        "metric": {"key": "r", "goal": "max"},
        "run_cap": 3,
        "seed": seed,
        "parameters": dict(zip(names, params, strict=True)),
    }
    doc = {
        "name": "tune",
        "command": "train.py " + " ".join(f"{{{{ {n} }}}}" for n in names) + " {{ seed }}",
        "seeds": [1, 2],
        "search": block,
    }
    size = search.space_size(fields.build_search(block))
    if size is not None and size < 3:
        return  # refused at load (run_cap above the space): a loader case holds that error
    desired = load_desired(_desired_with({"desired/sweeps/tune.yaml": json.dumps(doc)}))
    [tune] = [s for s in desired.sweeps if s.name == "tune"]
    runs = [r for r in desired.runs if r.sweep.name == "tune"]
    assert tune.search is not None
    assert len(runs) == 2 * search.known_count(tune.search) == 2 * len({r.cell for r in runs})
    assert len({r.id for r in runs}) == len(runs)
    for r in runs:
        for param, (_, v) in zip(tune.search.parameters, r.params, strict=True):
            _check_value(param, v)


def test_values_equal_in_python_but_written_differently_are_other_configurations() -> None:
    def grid(*values: Scalar) -> Search:
        return a_search(SearchMethod.GRID, parameters=(SearchParam("a", Distribution.CATEGORICAL, values=values),))

    assert search.configurations(grid(1)) == [(("a", 1),)]
    [[(_, one)]] = search.configurations(grid(1.0))
    assert isinstance(one, float)
    [[(_, true)]] = search.configurations(grid(True))
    assert true is True
