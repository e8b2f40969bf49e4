"""A bayes search's next batch of configurations: a deterministic function of the sweep and its finished trials.

``next_batch(sweep, made, finished)`` rebuilds an Optuna study from nothing each time (ask-and-tell, no storage):
every made configuration whose seeds are all settled is added as a finished trial (``study.add_trial``), then the
study is asked ``batch`` times under ``TPESampler(seed=...)``. The sampler's seed is derived from the search's
``seed`` and how many configurations were made, so two batches never replay the same random draws; nothing else
(no clock, no process state) enters, so the same (sweep, made, finished) always gives the same batch: a restart
or a second controller computes exactly what the first one did (and the batches made are recorded under
observed/ anyway: ``reconciler.observed.suggestions``).

Batches: nothing is suggested while a made configuration is still unfinished, and never past ``run_cap``
configurations in total. The first batch (trials ``0 .. batch-1``) is the spec's, known up front
(``reconciler.core.search.configurations``); TPE starts modelling after it (``n_startup_trials`` = the batch).

``finished`` holds, for each made configuration in order, its objective (the mean over its seeds of their
archived metric), None while not all its seeds are settled, and NaN for one settled without any finite metric
(told to the study as a failed trial). Pure apart from Optuna, which is imported lazily (the CLI's start-up time).

``search_bounds`` is the one home of what a bayes search may still start, (run_cap - configurations made) x seeds
runs at the dearest expected price of one run: ``rigsync review`` and ``rigsync plan`` both show it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from reconciler.core.actions import SweepEstimate
from reconciler.core.model import RunSpec, Scalar, SearchMethod, Sweep
from reconciler.core.search import Config, direction, distributions, value

_MAX_ASKS_PER_SLOT = 8  # a repeated configuration is asked again, this many times per wanted one at most


def is_bayes(sweep: Sweep) -> bool:
    """The sweep searches in batches that follow the archive (its later configurations are not known up front)."""
    return sweep.search is not None and sweep.search.method is SearchMethod.BAYES


def batch_seed(seed: int, made: int) -> int:
    """The sampler's seed for the batch after ``made`` configurations: distinct per batch, stable across processes."""
    digest = hashlib.sha256(f"rigsync-bayes:{seed}:{made}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def room_left(sweep: Sweep, made: int) -> int:
    """How many more configurations the search may still make (``run_cap`` minus those made; 0 without a search)."""
    return max(0, sweep.search.run_cap - made) if sweep.search is not None else 0


def wants_batch(sweep: Sweep, finished: Sequence[float | None]) -> bool:
    """A bayes sweep asks for its next batch once every made configuration is finished and run_cap leaves room."""
    return is_bayes(sweep) and room_left(sweep, len(finished)) > 0 and all(f is not None for f in finished)


def _fits(dist: Any, raw: Scalar) -> bool:
    """``raw`` lies in ``dist`` (a categorical's choices, a range's bounds): a made configuration told to the study."""
    try:
        return bool(dist._contains(dist.to_internal_repr(raw)))
    except (ValueError, TypeError):
        return False


def next_batch(sweep: Sweep, made: Sequence[Config], finished: Sequence[float | None]) -> list[Config]:
    """The next ``batch`` configurations of a bayes sweep (fewer near ``run_cap``), or [] while any made one is
    unfinished; ``finished[i]`` is ``made[i]``'s objective (None: unsettled; NaN: settled with no metric)."""
    if len(made) != len(finished):
        raise ValueError(f"{len(made)} configurations made but {len(finished)} objectives given")
    search = sweep.search
    if search is None or not wants_batch(sweep, finished):
        return []
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dists = distributions(search)
    # TPE's random start is the first batch (search.sampler); each later batch gets a seed of its own, so its
    # random draws (TPE's candidates) are not the first batch's again
    sampler = optuna.samplers.TPESampler(seed=batch_seed(search.seed, len(made)), n_startup_trials=search.batch)
    study = optuna.create_study(sampler=sampler, direction=direction(search))
    for config, objective in zip(made, finished, strict=True):
        params = dict(config)
        if set(params) != set(dists) or not all(_fits(dists[k], v) for k, v in params.items()):
            continue  # made under another search space (desired/ changed): it still counts against run_cap
        failed = objective is None or not math.isfinite(objective)
        study.add_trial(
            optuna.trial.create_trial(
                params=params,
                distributions=dists,
                value=None if failed else objective,
                state=optuna.trial.TrialState.FAIL if failed else optuna.trial.TrialState.COMPLETE,
            )
        )
    want = min(search.batch, room_left(sweep, len(made)))
    seen = set(made)
    out: list[Config] = []
    for _ in range(want * _MAX_ASKS_PER_SLOT):
        if len(out) == want:
            break
        asked = study.ask(dists).params
        config = tuple((p.name, value(p, asked[p.name])) for p in search.parameters)
        if config not in seen:  # a repeat would be the same runs again (content ids): ask for another
            seen.add(config)
            out.append(config)
    return out


def configurations_made(sweep: Sweep, runs: Iterable[RunSpec]) -> list[Config]:
    """The configurations of ``sweep`` among ``runs`` (its trials), in trial order."""
    by_trial: dict[int, Config] = {}
    for r in runs:
        if r.sweep.name == sweep.name and r.trial is not None:
            by_trial.setdefault(r.trial, r.params)
    return [by_trial[t] for t in sorted(by_trial)]


@dataclass(frozen=True)
class SearchBound:
    """What a bayes search may still start beyond the runs already known: its runs, and their price at most."""

    sweep: str
    runs: int  # (run_cap - configurations made) x seeds
    usd_high: float | None  # runs x the dearest expected price of one of its runs (None: no price known)

    def to_json(self) -> dict[str, Any]:
        return {"sweep": self.sweep, "runs": self.runs, "usd_high": self.usd_high}


def search_bounds(
    sweeps: Iterable[Sweep], runs: Sequence[RunSpec], estimates: Iterable[SweepEstimate]
) -> list[SearchBound]:
    """Per bayes sweep, the runs its search may still start and what they may cost at most: the one home of the
    bound the review and the plan show. The price of one run is its sweep's estimate (the dearest figure over the
    runs it prices); a sweep with nothing left to price has no price known."""
    per_run: dict[str, float] = {}
    for e in estimates:
        n = e.pending_runs + e.running_runs
        if e.usd_high is not None and n > 0:
            per_run[e.sweep] = e.usd_high / n
    out: list[SearchBound] = []
    for sweep in sweeps:
        if not is_bayes(sweep):
            continue
        left = room_left(sweep, len(configurations_made(sweep, runs))) * len(sweep.seeds)
        price = per_run.get(sweep.name)
        out.append(SearchBound(sweep.name, left, None if price is None else round(left * price, 4)))
    return out
