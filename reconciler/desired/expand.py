"""Sweep expansion: a validated ``Sweep`` becomes the concrete ``RunSpec`` values the planner schedules.

It exists apart from the YAML loader because identity lives here: a run's id is content-addressed
(sweep name, its params, its seed, the command *template*) so editing a grid keeps the ids of the cells that
did not change, and a restarted reconciler recognises runs already on boxes. Commands are rendered here too,
because the pure planner must not render templates. A sweep with ``search:`` expands the same way, from the
configurations ``reconciler.core.search`` suggests instead of the grid's cells (``expand_configurations``, which later
bayes batches go through as well): the same configuration is the same cell and the same runs.

Rendering is Jinja2's ``SandboxedEnvironment`` with ``StrictUndefined`` and a ``finalize`` hook that
shell-quotes every substituted value (``shlex.quote``), so ``1; rm -rf ~`` stays one argument. Box-side
variables (``run_dir``, ``python`` ...) are references to environment variables the launch wrapper exports;
they are already quoted for the shell and are passed through as ``ShellRaw``. Templates are restricted to
plain ``{{ name }}`` substitutions: no statements, filters or expressions, which keeps commands reviewable
and makes rendering unable to loop or hang.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import shlex
from collections.abc import Iterable, Sequence
from functools import lru_cache

from jinja2 import StrictUndefined, TemplateSyntaxError, nodes
from jinja2.sandbox import SandboxedEnvironment

from reconciler.core import search
from reconciler.core.model import MetricGoal, PromotionRule, RunSpec, Scalar, Sweep
from reconciler.errors import TemplateProblem


class ShellRaw(str):
    """A value already written for the shell (a quoted variable reference); never quoted again."""

    __slots__ = ()


# Variables the launch wrapper exports on the box; rendered as quoted references, not values.
BOX_VARIABLES: dict[str, str] = {
    "run_dir": '"$RIGSYNC_RUN_DIR"',
    "code_dir": '"$RIGSYNC_CODE_DIR"',
    "python": '"$RIGSYNC_PYTHON"',
    "attempt": '"$RIGSYNC_ATTEMPT"',
    "gpus": '"$CUDA_VISIBLE_DEVICES"',
}
# ``metrics_file`` is box-side too, but also carries the sweep's configured file name.
RUN_VARIABLES: frozenset[str] = frozenset({*BOX_VARIABLES, "metrics_file", "seed", "run_id", "sweep"})


def scalar_text(value: Scalar) -> str:
    """How a parameter value is written on a command line (YAML spelling for booleans)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _finalize(value: object) -> str:
    if isinstance(value, ShellRaw):
        return str(value)
    if isinstance(value, bool | int | float | str):
        return shlex.quote(scalar_text(value))
    # Only names from the run context reach here (see _check_nodes), so this is a programming error.
    raise TypeError(f"unexpected template value of type {type(value).__name__}")


_ENV = SandboxedEnvironment(
    undefined=StrictUndefined, finalize=_finalize, autoescape=False, keep_trailing_newline=False
)


def _describe(node: nodes.Node) -> str:
    if isinstance(node, nodes.Filter):
        return f"filter '{node.name}'"
    if isinstance(node, nodes.Stmt):
        return f"statement '{type(node).__name__.lower()}'"
    return f"expression '{type(node).__name__}'"


def _check_nodes(tree: nodes.Template) -> list[str]:
    """Return the variable names used; raise TemplateProblem on anything but ``{{ name }}``."""
    names: list[str] = []
    for stmt in tree.body:
        if not isinstance(stmt, nodes.Output):
            raise TemplateProblem(
                f"only {{{{ name }}}} substitutions are allowed in commands, found {_describe(stmt)}",
                stmt.lineno,
            )
        for child in stmt.nodes:
            if isinstance(child, nodes.TemplateData):
                continue
            if isinstance(child, nodes.Name) and child.ctx == "load":
                names.append(child.name)
                continue
            raise TemplateProblem(
                f"only {{{{ name }}}} substitutions are allowed in commands, found {_describe(child)}",
                child.lineno,
            )
    return names


def template_variables(template: str) -> list[str]:
    """The variables a command template uses, in order of first use. Raises ``TemplateProblem``."""
    try:
        tree = _ENV.parse(template)
    except TemplateSyntaxError as exc:
        raise TemplateProblem(f"template syntax error: {exc.message}", exc.lineno) from None
    seen: dict[str, None] = {}
    for name in _check_nodes(tree):
        seen.setdefault(name, None)
    return list(seen)


@lru_cache(maxsize=1024)
def parameter_name_problem(name: str) -> str | None:
    """Why a grid parameter called ``name`` cannot be substituted, or None when ``{{ name }}`` renders its value.

    Decided by trying it, so every name Jinja2 reads as something else is caught, whatever it is: ``self`` is
    the template itself, ``true``/``none`` are constants, ``not`` is an operator.
    """
    try:
        if template_variables(f"{{{{ {name} }}}}") != [name]:
            return "Jinja2 does not read it as a variable"
        if _ENV.from_string(f"{{{{ {name} }}}}").render({name: 0}) == "0":
            return None
    except TemplateProblem:
        return "Jinja2 reads it as a keyword or constant, not a variable"
    except Exception:  # whatever Jinja2 does with the name instead, it is not substitution
        pass
    return "Jinja2 binds it to an object of its own (the template itself for 'self'), not the parameter's value"


def _canonical(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def _param_pairs(params: Iterable[tuple[str, Scalar]]) -> list[list[object]]:
    return [[k, v] for k, v in sorted(params, key=lambda kv: kv[0])]


def run_id(
    sweep: str, params: Iterable[tuple[str, Scalar]], seed: int, template: str, env: Sequence[tuple[str, str]] = ()
) -> str:
    """``<sweep>-<12 hex>`` over (sweep, sorted params, seed, command template, and the env as written if any).

    The env is what the job runs with, like its command: changing a literal (``MUJOCO_GL: egl``) is another
    experiment, so another id. A reference counts by its text ``${NAME}`` only, never the value it resolves to:
    rotating a secret changes no id. A sweep without env hashes exactly as before env existed.
    """
    identity: dict[str, object] = {"sweep": sweep, "params": _param_pairs(params), "seed": seed, "command": template}
    if env:
        identity["env"] = sorted([k, v] for k, v in env)
    digest = hashlib.sha256(_canonical(identity)).hexdigest()
    return f"{sweep}-{digest[:12]}"


def cell_id(sweep: str, params: Iterable[tuple[str, Scalar]]) -> str:
    """``<sweep>-<8 hex>`` over (sweep, sorted params): shared by every seed of one grid cell."""
    digest = hashlib.sha256(_canonical({"sweep": sweep, "params": _param_pairs(params)})).hexdigest()
    return f"{sweep}-{digest[:8]}"


class CommandTemplate:
    """A checked, compiled command template; compile once per sweep, render once per run."""

    def __init__(self, template: str) -> None:
        self.source = template
        self.variables = template_variables(template)
        self._compiled = _ENV.from_string(template)

    def render(
        self, *, sweep: str, params: Sequence[tuple[str, Scalar]], seed: int, run_id: str, metrics_file: str
    ) -> str:
        context: dict[str, object] = {k: ShellRaw(v) for k, v in BOX_VARIABLES.items()}
        context["metrics_file"] = ShellRaw('"$RIGSYNC_RUN_DIR"/' + shlex.quote(metrics_file))
        context.update(dict(params))
        context.update({"seed": seed, "run_id": run_id, "sweep": sweep})
        return self._compiled.render(context)


def render_command(
    template: str,
    *,
    sweep: str,
    params: Sequence[tuple[str, Scalar]],
    seed: int,
    run_id: str,
    metrics_file: str,
) -> str:
    """Render one command; every substituted value is one shell word."""
    return CommandTemplate(template).render(
        sweep=sweep, params=params, seed=seed, run_id=run_id, metrics_file=metrics_file
    )


def count_runs(sweep: Sweep) -> int:
    """How many RunSpecs the sweep expands to, base seeds and promotion candidates (without expanding)."""
    if sweep.search is not None:
        cells = search.known_count(sweep.search)
    else:
        cells = math.prod(len(values) for _, values in sweep.grid)
    return cells * (len(sweep.seeds) + max((r.add_seeds for r in sweep.promotion), default=0))


def promotion_thresholds(rules: Sequence[PromotionRule], goal: MetricGoal) -> list[float]:
    """Threshold of extra seed k (index k-1): the lowest bar among rules granting at least k seeds."""
    most = max((r.add_seeds for r in rules), default=0)
    out: list[float] = []
    for k in range(1, most + 1):
        eligible = [r.threshold for r in rules if r.add_seeds >= k]
        out.append(min(eligible) if goal is MetricGoal.MAX else max(eligible))
    return out


def _seeds(sweep: Sweep) -> list[tuple[int, float | None]]:
    """A cell's seeds: the base seeds, then each promotion seed with its threshold."""
    thresholds = promotion_thresholds(sweep.promotion, sweep.metric_goal)
    top = max(sweep.seeds)
    seeds: list[tuple[int, float | None]] = [(s, None) for s in sweep.seeds]
    return seeds + [(top + k, t) for k, t in enumerate(thresholds, start=1)]


def expand_configurations(
    sweep: Sweep, configs: Sequence[Sequence[tuple[str, Scalar]]], first_trial: int | None
) -> list[RunSpec]:
    """One RunSpec per (configuration, seed), configurations in order, each with its base then promotion seeds.

    ``first_trial`` numbers a search's configurations (``RunSpec.trial``; the next of bayes's batches starts
    where the last ended); None for a grid sweep's cells. Ids are content-addressed (``run_id``/``cell_id``), so
    the same configuration is the same cell whatever its trial number.
    """
    seeds = _seeds(sweep)
    command = CommandTemplate(sweep.command)
    specs: list[RunSpec] = []
    for i, config in enumerate(configs):
        params = tuple(config)
        cell = cell_id(sweep.name, params)
        trial = None if first_trial is None else first_trial + i
        for seed, threshold in seeds:
            rid = run_id(sweep.name, params, seed, sweep.command, sweep.env)
            specs.append(
                RunSpec(
                    id=rid,
                    sweep=sweep,
                    cell=cell,
                    params=params,
                    seed=seed,
                    command=command.render(
                        sweep=sweep.name,
                        params=params,
                        seed=seed,
                        run_id=rid,
                        metrics_file=sweep.metrics_file,
                    ),
                    promotion_threshold=threshold,
                    trial=trial,
                )
            )
    return specs


def expand_sweep(sweep: Sweep) -> list[RunSpec]:
    """Grid cells in file order (keys, then values), or a search's configurations known up front (trial order);
    each with its base seeds then its promotion seeds."""
    if sweep.search is not None:
        return expand_configurations(sweep, search.configurations(sweep.search), 0)
    keys = [k for k, _ in sweep.grid]
    cells = [tuple(zip(keys, values, strict=True)) for values in itertools.product(*(vals for _, vals in sweep.grid))]
    return expand_configurations(sweep, cells, None)


def expand(sweeps: Sequence[Sweep]) -> tuple[RunSpec, ...]:
    """Every sweep's runs: sweeps by (-priority, file order), then grid order, then seed."""
    ordered = sorted(sweeps, key=lambda s: (-s.priority, s.order))
    return tuple(spec for sweep in ordered for spec in expand_sweep(sweep))
