"""A ``search:`` block's configurations: what grid, random and bayes suggest, as plain parameter tuples.

Pure apart from Optuna, and a deterministic function of the block alone (its method, parameters, run_cap, batch
and seed): the same sweep file always gives the same configurations in the same order, so the runs they become
keep their content ids across restarts and controllers. Grid is the product of the parameters' ``values`` in
file order; random is ``run_cap`` draws of Optuna's ``RandomSampler(seed)`` through ask-and-tell; bayes's first
batch is ``batch`` draws of TPE's random start (``TPESampler(seed)`` before it has finished trials). Later bayes
batches depend on the archive and are the bayes planner's; they reuse ``distributions`` and ``sampler`` here.

Values are made stable as text: integers stay int, floats are rounded to 6 significant digits, q-variants to a
multiple of ``q`` inside [min, max] (an int when ``q`` is a whole number). Optuna is imported lazily: the CLI's
start-up time is tested, and only sweeps with a ``search:`` need it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from decimal import Decimal
from functools import lru_cache
from typing import TYPE_CHECKING

from reconciler.core.model import Distribution, MetricGoal, Scalar, Search, SearchMethod, SearchParam

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution
    from optuna.samplers import BaseSampler
    from optuna.study import StudyDirection

Config = tuple[tuple[str, Scalar], ...]  # one configuration: (parameter, value) in the block's parameter order

SIGNIFICANT_DIGITS = 6
LOGARITHMIC = frozenset({Distribution.LOG_UNIFORM, Distribution.Q_LOG_UNIFORM})
QUANTIZED = frozenset({Distribution.Q_UNIFORM, Distribution.Q_LOG_UNIFORM})


def _optuna_quiet() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


def distributions(search: Search) -> dict[str, BaseDistribution]:
    """Each parameter's Optuna distribution, in the block's order: the one home of the mapping.

    A q-variant is its continuous distribution (uniform or log); ``value`` rounds the draw to a multiple of q,
    which keeps a rounded value inside the distribution for ``tell`` and ``create_trial``.
    """
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    out: dict[str, BaseDistribution] = {}
    for p in search.parameters:
        if p.distribution is Distribution.CATEGORICAL:
            out[p.name] = CategoricalDistribution(p.values)
            continue
        assert p.min is not None and p.max is not None  # the loader refuses a range without both
        if p.distribution is Distribution.INT_UNIFORM:
            out[p.name] = IntDistribution(math.ceil(p.min), math.floor(p.max))
        else:
            out[p.name] = FloatDistribution(p.min, p.max, log=p.distribution in LOGARITHMIC)
    return out


def sampler(search: Search) -> BaseSampler:
    """The Optuna sampler of a random or bayes search, seeded by ``search.seed``.

    TPE starts with ``batch`` random trials (its first batch, known up front), then models the finished ones.
    """
    from optuna.samplers import RandomSampler, TPESampler

    if search.method is SearchMethod.BAYES:
        return TPESampler(seed=search.seed, n_startup_trials=search.batch)
    return RandomSampler(seed=search.seed)


def stable_float(x: float) -> float:
    """``x`` rounded to 6 significant digits, so its text (and the run id over it) does not wobble."""
    return float(f"{x:.{SIGNIFICANT_DIGITS}g}")


def _multiple(k: int, q: float) -> float:
    """``k * q`` as stable text: rounded to the decimals ``q`` is written with (six significant digits would merge
    neighbouring multiples past 1e6 quanta, and push a bound's multiple outside the range)."""
    exponent = Decimal(repr(float(q))).as_tuple().exponent
    decimals = -exponent if isinstance(exponent, int) and exponent < 0 else 0
    return round(k * q, decimals)


def quantum_bounds(param: SearchParam) -> tuple[int, int]:
    """The least and most k with k*q (as a stable float) inside [min, max]; k_lo > k_hi: no multiple of q is
    (the loader refuses such a parameter)."""
    assert param.q is not None and param.min is not None and param.max is not None
    q, lo, hi = param.q, param.min, param.max
    k_lo, k_hi = math.ceil(lo / q), math.floor(hi / q)
    if _multiple(k_lo, q) < lo:
        k_lo += 1
    if _multiple(k_hi, q) > hi:
        k_hi -= 1
    return k_lo, k_hi


def value(param: SearchParam, raw: object) -> Scalar:
    """A sampler's draw as the configuration's value: int, categorical as given, or a stable float inside the
    range (a bound itself when rounding would leave it)."""
    if param.distribution is Distribution.CATEGORICAL:
        assert isinstance(raw, bool | int | float | str)
        return raw
    assert isinstance(raw, int | float)
    if param.distribution is Distribution.INT_UNIFORM:
        return int(raw)
    assert param.min is not None and param.max is not None
    if param.distribution in QUANTIZED:
        assert param.q is not None
        k_lo, k_hi = quantum_bounds(param)
        k = min(max(round(float(raw) / param.q), k_lo), k_hi)
        return int(k * int(param.q)) if float(param.q).is_integer() else _multiple(k, param.q)
    return min(max(stable_float(float(raw)), param.min), param.max)


def grid_configurations(search: Search) -> list[Config]:
    """Every combination of the parameters' ``values`` (file order: first parameter slowest), at most run_cap."""
    names = [p.name for p in search.parameters]
    product = itertools.product(*(p.values for p in search.parameters))
    return [tuple(zip(names, combo, strict=True)) for combo in itertools.islice(product, search.run_cap)]


def direction(search: Search) -> StudyDirection:
    """The study's direction for the search's metric goal."""
    from optuna.study import StudyDirection

    return StudyDirection.MAXIMIZE if search.metric_goal is MetricGoal.MAX else StudyDirection.MINIMIZE


def space_size(search: Search) -> int | None:
    """How many distinct configurations the parameters have, or None when one is continuous (uniform, log)."""
    sizes: list[int] = []
    for p in search.parameters:
        if p.distribution is Distribution.CATEGORICAL:
            sizes.append(len(p.values))
        elif p.distribution is Distribution.INT_UNIFORM:
            assert p.min is not None and p.max is not None
            sizes.append(max(0, math.floor(p.max) - math.ceil(p.min) + 1))
        elif p.distribution in QUANTIZED:
            k_lo, k_hi = quantum_bounds(p)
            sizes.append(max(0, k_hi - k_lo + 1))
        else:
            return None
    return math.prod(sizes)


MAX_DRAWS_PER_SUGGESTION = 50  # a sampler repeating itself gets this many tries per new configuration


def ask(search: Search, count: int, seen: Sequence[Config] = ()) -> list[Config]:
    """``count`` new suggestions of the search's sampler with no finished trials (ask-and-tell's ask): each distinct
    from the others and from ``seen`` (the same configuration would be the same runs); fewer when the sampler
    keeps repeating itself (a small discrete space)."""
    import optuna

    _optuna_quiet()
    space = distributions(search)
    study = optuna.create_study(sampler=sampler(search), direction=direction(search))
    known = set(seen)
    out: list[Config] = []
    for _ in range(count * MAX_DRAWS_PER_SUGGESTION):
        if len(out) == count:
            break
        trial = study.ask(space)
        config = tuple((p.name, value(p, trial.params[p.name])) for p in search.parameters)
        if config not in known:
            known.add(config)
            out.append(config)
    return out


def known_count(search: Search) -> int:
    """How many configurations are known up front (without computing them)."""
    if search.method is SearchMethod.GRID:
        return min(search.run_cap, math.prod(len(p.values) for p in search.parameters))
    cap = min(search.batch, search.run_cap) if search.method is SearchMethod.BAYES else search.run_cap
    size = space_size(search)
    return cap if size is None else min(cap, size)


def configurations(search: Search) -> list[Config]:
    """The configurations known up front, in suggestion order (trial 0, 1, ...): grid's and random's all of
    them, bayes's first batch. Remembered per block: every load of desired/ asks for them again."""
    return list(_known(repr(search), search))  # repr: 1, 1.0 and True are equal (and hash alike) but differ here


@lru_cache(maxsize=64)
def _known(_text: str, search: Search) -> tuple[Config, ...]:
    if search.method is SearchMethod.GRID:
        return tuple(grid_configurations(search))
    return tuple(ask(search, known_count(search)))
