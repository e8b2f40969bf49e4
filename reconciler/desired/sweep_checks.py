"""What the sweep schema cannot say: templates that name unknown variables, paths that leave their folder, a grid
too large, env values that would leak, runs no pool can hold, durations that contradict the fleet's.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Container, Mapping
from pathlib import PurePosixPath
from typing import Any

from reconciler.core import jobenv
from reconciler.core.model import DEFAULT_POOL, Distribution, SearchMethod, SearchParam, Sweep
from reconciler.core.offers import most_gpu_ram_gib
from reconciler.core.search import LOGARITHMIC, QUANTIZED, quantum_bounds, space_size
from reconciler.desired.desired_tree import FLEET_FILE, safe_relative
from reconciler.desired.expand import RUN_VARIABLES, parameter_name_problem, template_variables
from reconciler.desired.fields import (
    build_search,
    duration_or,
    field_default,
    format_duration,
    grid_size,
    param_distribution,
    parse_duration,
)
from reconciler.desired.load_error import LoadError
from reconciler.desired.strict_yaml import VALUE_CONTROL_RE, Doc, character_name
from reconciler.errors import TemplateProblem

MAX_RUNS_PER_SWEEP = 10_000


def sweep_checks(doc: Doc, fleet_data: Mapping[str, Any] | None, repo_paths: Container[str] | None) -> list[LoadError]:
    data = doc.data
    errors: list[LoadError] = []
    grid: Mapping[str, Any] = data.get("grid", {})
    searched: Mapping[str, Any] = data.get("search", {}).get("parameters", {})
    # where each parameter is written, and what it is called there
    parameters: list[tuple[tuple[str, ...], str, str]] = [(("grid", key), "grid", key) for key in grid]
    parameters += [(("search", "parameters", key), "search", key) for key in searched]
    for where, kind, key in parameters:
        if key in RUN_VARIABLES:
            errors.append(
                doc.error(where, f"{kind} parameter '{key}' clashes with the run variable of that name", at_key=True)
            )
        elif (reserved := parameter_name_problem(key)) is not None:
            errors.append(
                doc.error(where, f"{kind} parameter '{key}' cannot be used in a command: {reserved}", at_key=True)
            )
    if not data["command"].strip():
        errors.append(doc.error(("command",), "command is blank: it would run nothing"))
    for key, values in grid.items():
        for i, value in enumerate(values):
            found = VALUE_CONTROL_RE.search(value) if isinstance(value, str) else None
            if found is not None:
                char = found.group()
                errors.append(
                    doc.error(
                        ("grid", key, i),
                        f"control characters (NUL, escape, ...) are not allowed in values: this one has "
                        f"U+{ord(char):04X} {character_name(char)}",
                    )
                )
    errors += _env_checks(doc)
    try:
        used = template_variables(data["command"])
    except TemplateProblem as exc:
        errors.append(doc.error(("command",), str(exc)))
        used = []
    known = set(grid) | set(searched) | RUN_VARIABLES
    for name in used:
        if name not in known:
            hint = difflib.get_close_matches(name, sorted(known), n=1)
            kind = "search" if searched else "grid"
            message = f"template variable '{name}' is neither a {kind} parameter nor a run variable"
            message += (
                f"; did you mean '{hint[0]}'?" if hint else f" (run variables: {', '.join(sorted(RUN_VARIABLES))})"
            )
            errors.append(doc.error(("command",), message))
    for where, kind, key in parameters:
        if key not in used:
            errors.append(
                doc.error(
                    where,
                    f"{kind} parameter '{key}' is not used in the command, so its cells would run the same command",
                    at_key=True,
                )
            )
    errors += _search_checks(doc) + _early_terminate_checks(doc)
    longest = duration_or(data, "max_runtime", field_default(Sweep, "max_runtime"))
    if longest <= 0:
        errors.append(doc.error(("max_runtime",), "max_runtime must be longer than 0s: every run would be killed"))
    if "stall_timeout" in data and parse_duration(data["stall_timeout"]) <= 0:
        errors.append(
            doc.error(("stall_timeout",), "stall_timeout must be longer than 0s: every run would be killed as stalled")
        )
    # max_runtime is only a cap (runs may end long before it), so it may exceed ttl; a run *expected* to outlast
    # ttl, though, can never finish: its box is destroyed ttl after it is rented, every attempt.
    ttl = parse_duration(fleet_data["ttl"]) if fleet_data is not None and "ttl" in fleet_data else 0.0
    if "expected_runtime" in data and fleet_data is not None and 0 < ttl <= parse_duration(data["expected_runtime"]):
        errors.append(
            doc.error(
                ("expected_runtime",),
                f"expected_runtime {data['expected_runtime']} is not shorter than the fleet's ttl {fleet_data['ttl']} "
                f"({FLEET_FILE}): every box is destroyed ttl after it is rented, so such a run could never finish; "
                "raise ttl",
            )
        )
    if "expected_runtime" in data:
        expected = parse_duration(data["expected_runtime"])
        if expected <= 0:
            errors.append(doc.error(("expected_runtime",), "expected_runtime must be longer than 0s"))
        elif expected > longest:
            errors.append(
                doc.error(
                    ("expected_runtime",),
                    f"expected_runtime {data['expected_runtime']} is longer than max_runtime "
                    f"{data.get('max_runtime', format_duration(longest))}: a run that long is killed",
                )
            )
    for i, path in enumerate(data.get("code", ())):
        if path == ".":
            continue  # the whole repository, as the schema documents
        if not safe_relative(path):
            errors.append(
                doc.error(("code", i), f"code path {path!r} must be relative to the repository root, without '..'")
            )
        elif repo_paths is not None and path not in repo_paths:
            errors.append(
                doc.error(("code", i), f"code path {path!r} is not in the repository: there is no such file or folder")
            )
    metrics = data.get("metrics", {})
    if ".." in PurePosixPath(metrics.get("file", "x")).parts:
        errors.append(doc.error(("metrics", "file"), "metrics file must stay inside the run directory (no '..')"))
    for i, pattern in enumerate(data.get("artifacts", ())):
        if pattern.startswith("/") or ".." in PurePosixPath(pattern).parts:
            errors.append(doc.error(("artifacts", i), "artifacts must stay inside the run directory (no '/', no '..')"))
    checkpoint = data.get("checkpoint")
    if checkpoint:
        if ".." in PurePosixPath(checkpoint["path"]).parts:
            errors.append(doc.error(("checkpoint", "path"), "checkpoint path must stay inside the run directory"))
        if parse_duration(checkpoint["every"]) <= 0:
            errors.append(doc.error(("checkpoint", "every"), "checkpoint every must be longer than 0s"))
    promotion = data.get("promotion", [])
    if promotion and "key" not in metrics:
        errors.append(doc.error(("promotion",), "promotion rules need metrics.key (which metric to compare)"))
    seen: dict[float, int] = {}
    for i, rule in enumerate(promotion):
        t = float(rule["threshold"])
        if t in seen:
            errors.append(
                doc.error(("promotion", i, "threshold"), f"threshold {rule['threshold']} repeats rule {seen[t]}")
            )
        seen.setdefault(t, i)
    if "search" in data:
        cells = data["search"].get("run_cap") or grid_size(data["search"])
    else:
        cells = math.prod(len(v) for v in grid.values())
    total = cells * (len(data["seeds"]) + max((int(r["add_seeds"]) for r in promotion), default=0))
    if total > MAX_RUNS_PER_SWEEP:
        errors.append(
            doc.error(
                ("search",) if "search" in data else ("grid",) if grid else ("seeds",),
                f"sweep expands to {total} runs (with promotion seeds); the limit is {MAX_RUNS_PER_SWEEP}",
            )
        )
    gpus = int(data.get("resources", {}).get("gpus", field_default(Sweep, "resources.gpus")))
    pool_data: Mapping[str, Any] | None = fleet_data
    if fleet_data is not None and fleet_data.get("pools"):
        pools = fleet_data["pools"]
        wanted = data.get("pool", pools[0]["name"])
        pool_data = next((p for p in pools if p["name"] == wanted), None)
        if pool_data is None:
            names = ", ".join(p["name"] for p in pools)
            errors.append(doc.error(("pool",), f"no pool {wanted!r} in {FLEET_FILE} (its pools: {names})"))
        elif "offers" not in pool_data:
            pool_data = fleet_data
    elif fleet_data is not None and data.get("pool", DEFAULT_POOL) != DEFAULT_POOL:
        errors.append(
            doc.error(
                ("pool",),
                f"no pool {data['pool']!r} in {FLEET_FILE}: it defines no pools:, so its one pool is {DEFAULT_POOL!r}",
            )
        )
    if pool_data is not None:
        need_ram = data.get("resources", {}).get("min_gpu_ram_gib")
        named = pool_data.get("offers", {}).get("gpu_names", ())
        most_ram = most_gpu_ram_gib(named)
        if need_ram is not None and most_ram is not None and need_ram > most_ram:
            errors.append(
                doc.error(
                    ("resources", "min_gpu_ram_gib"),
                    f"a run needs {need_ram} GiB of GPU memory but no GPU model the fleet accepts has that much "
                    f"(offers.gpu_names in {FLEET_FILE}: {', '.join(named)}; the most is {most_ram:g} GiB); it "
                    "could never be scheduled",
                )
            )
        gpus_max = pool_data.get("offers", {}).get("gpus_max")
        if gpus_max is not None and gpus > gpus_max:
            errors.append(
                doc.error(
                    ("resources", "gpus"),
                    f"a run needs {gpus} GPUs but the fleet rents boxes with at most {gpus_max} (offers.gpus_max "
                    f"in {FLEET_FILE}); it could never be scheduled",
                )
            )
    return errors


def _env_checks(doc: Doc) -> list[LoadError]:
    """A sweep's ``env`` beyond the schema (``reconciler.core.jobenv`` holds the rules). No message quotes a value."""
    env: Mapping[str, Any] = doc.data.get("env", {})
    errors: list[LoadError] = []
    for name, value in env.items():
        if (why := jobenv.name_problem(name)) is not None:
            errors.append(doc.error(("env", name), f"env variable {name} {why}", at_key=True))
            continue
        text = str(value)
        found = VALUE_CONTROL_RE.search(text)
        if found is not None:
            char = found.group()
            errors.append(
                doc.error(
                    ("env", name),
                    f"control characters (NUL, escape, ...) are not allowed in env values: this one has "
                    f"U+{ord(char):04X} {character_name(char)}",
                )
            )
        elif (why := jobenv.value_problem(name, text)) is not None:
            errors.append(doc.error(("env", name), why))
    refs = jobenv.references(tuple((str(k), str(v)) for k, v in env.items()))
    expanded = jobenv.expands_reference(doc.data["command"], refs)
    if expanded is not None:
        errors.append(
            doc.error(
                ("command",),
                f"the command expands ${expanded} itself, which puts the value into the job's command line (seen "
                f"by every user of the box in `ps`); read {expanded} from the environment in the program instead",
            )
        )
    return errors


def _search_checks(doc: Doc) -> list[LoadError]:
    """A ``search:`` block beyond the schema: each parameter's values or range, and what its method needs."""
    data = doc.data
    search: Mapping[str, Any] | None = data.get("search")
    if search is None:
        return []
    errors: list[LoadError] = []
    method = SearchMethod(search["method"])
    if data.get("grid"):
        errors.append(
            doc.error(
                ("grid",),
                "grid: and search: are both given: write the grid as a search with method grid "
                "(parameters with values), or drop search:",
                at_key=True,
            )
        )
    if "run_cap" not in search and method is not SearchMethod.GRID:
        errors.append(
            doc.error(("search", "method"), f"a {method} search needs run_cap: it bounds the configurations it runs")
        )
    if "batch" in search and method is not SearchMethod.BAYES:
        errors.append(
            doc.error(
                ("search", "batch"),
                f"batch is for method bayes; a {method} search knows every configuration up front",
                at_key=True,
            )
        )
    for name, spec in search["parameters"].items():
        errors += _param_checks(doc, ("search", "parameters", name), name, spec, method)
    metrics = data.get("metrics", {})
    goal = metrics.get("goal", field_default(Sweep, "metrics.goal"))
    objective = search["metric"]
    if "key" in metrics and (metrics["key"], goal) != (objective["key"], objective["goal"]):
        errors.append(
            doc.error(
                ("search", "metric"),
                f"the search's metric ({objective['key']}, {objective['goal']}) differs from the sweep's metrics "
                f"({metrics['key']}, {goal}): a sweep has one objective (promotion and the archive read metrics); "
                "make them the same, or drop metrics.key",
            )
        )
    if errors or method is SearchMethod.GRID or "run_cap" not in search:
        return errors
    size = space_size(build_search(search))
    if size is not None and search["run_cap"] > size:
        errors.append(
            doc.error(
                ("search", "run_cap"),
                f"run_cap {search['run_cap']} is more than the {size} distinct configurations the parameters have; "
                f"lower it, or use method grid",
            )
        )
    return errors


def _param_checks(
    doc: Doc, where: tuple[str, ...], name: str, spec: Mapping[str, Any], method: SearchMethod
) -> list[LoadError]:
    distribution = param_distribution(spec)
    ranged = [k for k in ("min", "max", "q") if k in spec]
    if distribution is Distribution.CATEGORICAL:
        if "values" not in spec:
            return [doc.error(where, f"parameter '{name}' is categorical but has no values", at_key=True)]
        if ranged:
            return [
                doc.error(
                    (*where, ranged[0]), f"parameter '{name}' has values, so it takes no {ranged[0]}", at_key=True
                )
            ]
        return []
    if method is SearchMethod.GRID:
        return [
            doc.error(
                where,
                f"parameter '{name}' is a range ({distribution}) but a grid search enumerates "
                "values only: give it values, or use method random or bayes",
                at_key=True,
            )
        ]
    if "values" in spec:
        return [
            doc.error(
                (*where, "values"), f"parameter '{name}' is {distribution}: a range (min, max), not values", at_key=True
            )
        ]
    missing = [k for k in ("min", "max") if k not in spec]
    if missing:
        return [doc.error(where, f"parameter '{name}' ({distribution}) needs {' and '.join(missing)}", at_key=True)]
    low, high = spec["min"], spec["max"]
    if low > high:
        return [doc.error((*where, "min"), f"parameter '{name}': min {low} is above max {high}")]
    if low == high:
        return [
            doc.error(
                (*where, "min"),
                f"parameter '{name}': the range is empty (min equals max {high}); a constant belongs in the command",
            )
        ]
    if distribution in LOGARITHMIC and low <= 0:
        return [
            doc.error(
                (*where, "min"),
                f"parameter '{name}' is {distribution}, so min must be above 0 (the log of {low} is not defined)",
            )
        ]
    if distribution is Distribution.INT_UNIFORM and math.ceil(low) > math.floor(high):
        return [doc.error((*where, "min"), f"parameter '{name}': no integer lies in [{low}, {high}]")]
    if distribution in QUANTIZED:
        if "q" not in spec:
            return [doc.error(where, f"parameter '{name}' is {distribution} and needs q (the quantum)", at_key=True)]
        param = SearchParam(name, distribution, min=float(low), max=float(high), q=float(spec["q"]))
        k_lo, k_hi = quantum_bounds(param)
        if k_lo > k_hi:
            return [
                doc.error((*where, "q"), f"parameter '{name}': no multiple of q {spec['q']} lies in [{low}, {high}]")
            ]
    elif "q" in spec:
        return [
            doc.error(
                (*where, "q"),
                f"parameter '{name}' is {distribution}: q is for q_uniform and q_log_uniform",
                at_key=True,
            )
        ]
    return []


def _early_terminate_checks(doc: Doc) -> list[LoadError]:
    """``early_terminate:`` beyond the schema: it is measured in the sweep's progress units, its rungs in order."""
    block: Mapping[str, Any] | None = doc.data.get("early_terminate")
    if block is None:
        return []
    errors: list[LoadError] = []
    if "progress" not in doc.data:
        errors.append(
            doc.error(
                ("early_terminate",),
                "early_terminate needs the sweep's progress: {key, total} (its rungs are measured in progress units)",
                at_key=True,
            )
        )
    if "max_iter" in block and block["max_iter"] < block["min_iter"]:
        errors.append(
            doc.error(
                ("early_terminate", "max_iter"),
                f"max_iter {block['max_iter']} is below min_iter {block['min_iter']}: there would be no rung",
            )
        )
    return errors
