"""``observed/suggestions.yaml``: every configuration a bayes search has made, in order, so none ever changes.

Per sweep, the configurations made, each with its trial number and the batch it came in (batch 0 is the spec's
first batch, known up front; later ones are ``reconciler.core.suggest.next_batch`` of the archive's finished trials).
The loop asks ``advance`` before every plan: a bayes sweep whose recorded configurations are all finished (every
seed settled in the run archive) and below ``run_cap`` gets its next batch recorded, and ``suggested_runs`` turns
the recorded batches after the first into runs through the spec's expansion (``expand.expand_configurations``).
The file is read back when a controller starts (``read_suggestions``) and, by ``rigsync run``, at every cycle
(``merge_recorded``): a restart, or a second controller, runs what is recorded and never suggests again what was
already suggested. It is written and committed with the cycle that
made the batch. Format described by ``schemas/observed-suggestions.schema.json``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from reconciler.core.model import AttemptOutcome, AttemptRecord, Desired, RunSpec, Scalar, Sweep
from reconciler.core.promotion import run_metric
from reconciler.core.runphase import UNTOUCHED, run_phase, tally_runs
from reconciler.core.search import Config
from reconciler.core.suggest import configurations_made, is_bayes, next_batch, wants_batch
from reconciler.desired.expand import expand_configurations
from reconciler.errors import ObservedInvalid
from reconciler.observed.codec import FORMAT_VERSION, SUGGESTIONS, dump_yaml, expect_mapping, load_yaml

HEADER = (
    "rigsync search suggestions: per bayes sweep, the configurations made, in order, with their trial number and "
    "batch (0: the first batch, known up front); recorded once, never changed"
)


@dataclass(frozen=True)
class Suggestion:
    trial: int
    batch: int
    params: Config


Recorded = Mapping[str, tuple[Suggestion, ...]]  # sweep name → its configurations made, in trial order


# ------------------------------------------------------------------------------------------------ the file


def suggestions_document(recorded: Recorded) -> dict[str, Any]:
    """The file's content as a mapping (``dump_yaml`` writes it): sweeps by name, configurations by trial."""
    sweeps = []
    for name, made in sorted(recorded.items()):
        if made:
            sweeps.append(
                {
                    "sweep": name,
                    "configurations": [
                        {"trial": s.trial, "batch": s.batch, "params": dict(s.params)} for s in made
                    ],
                }
            )
    return {"format_version": FORMAT_VERSION, "sweeps": sweeps}


def render_suggestions(recorded: Recorded) -> str | None:
    """The file's text, or None when no bayes search has made anything (the file is then not written)."""
    if not any(recorded.values()):
        return None
    return dump_yaml(suggestions_document(recorded), HEADER)


def _scalar(value: Any, where: str) -> Scalar:
    if isinstance(value, bool | int | str) or (isinstance(value, float) and math.isfinite(value)):
        return value
    raise ObservedInvalid(f"{where}: expected a number, string or boolean, got {value!r}")


def _index(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ObservedInvalid(f"{where}: expected a whole number >= 0, got {value!r}")
    return value


def parse_suggestions(text: str | None, path: str = SUGGESTIONS) -> dict[str, tuple[Suggestion, ...]]:
    """The recorded configurations in ``text`` (None or empty: nothing recorded). ``ObservedInvalid`` names the
    entry that does not fit the format."""
    if not text:
        return {}
    doc = expect_mapping(load_yaml(text, path), path)
    if doc.get("format_version") != FORMAT_VERSION:
        raise ObservedInvalid(f"{path}: format_version {doc.get('format_version')!r} is not {FORMAT_VERSION}")
    entries = doc.get("sweeps")
    entries = [] if entries is None else entries
    if not isinstance(entries, list):
        raise ObservedInvalid(f"{path}: sweeps: expected a list")
    out: dict[str, tuple[Suggestion, ...]] = {}
    for i, raw in enumerate(entries):
        entry = expect_mapping(raw, f"{path}: sweeps[{i}]")
        name = entry.get("sweep")
        if not isinstance(name, str) or not name or name in out:
            raise ObservedInvalid(f"{path}: sweeps[{i}].sweep: expected a sweep name given once, got {name!r}")
        configs = entry.get("configurations")
        configs = [] if configs is None else configs
        if not isinstance(configs, list):
            raise ObservedInvalid(f"{path}: sweeps[{i}].configurations: expected a list")
        made: list[Suggestion] = []
        for j, c in enumerate(configs):
            where = f"{path}: {name} configuration {j}"
            one = expect_mapping(c, where)
            trial = _index(one.get("trial"), f"{where}: trial")
            if trial != j:
                raise ObservedInvalid(f"{where}: trial {trial} out of order (expected {j})")
            params = expect_mapping(one.get("params"), f"{where}: params")
            made.append(
                Suggestion(
                    trial=trial,
                    batch=_index(one.get("batch"), f"{where}: batch"),
                    params=tuple((str(k), _scalar(v, f"{where}: params.{k}")) for k, v in params.items()),
                )
            )
        out[name] = tuple(made)
    return out


def read_suggestions(checkout: Path) -> dict[str, tuple[Suggestion, ...]]:
    """What the checkout's observed/suggestions.yaml records (nothing when it is missing)."""
    p = Path(checkout) / SUGGESTIONS
    return parse_suggestions(p.read_text(encoding="utf-8") if p.is_file() else None)


def merge_recorded(held: Recorded, committed: Recorded) -> dict[str, tuple[Suggestion, ...]]:
    """Per sweep, the longer record of the two (the committed one on a tie): a controller that stood by while another
    made batches takes them over, and one ahead of its last commit keeps what it has made."""
    out = dict(held)
    for name, made in committed.items():
        if len(made) >= len(out.get(name, ())):
            out[name] = made
    return out


# ------------------------------------------------------------------------------------------------ the loop's step


def _in_search_order(sweep: Sweep, params: Config) -> Config:
    """``params`` in the order of the sweep's search parameters (the file keeps its keys sorted)."""
    order = [p.name for p in sweep.search.parameters] if sweep.search is not None else []
    rank = {name: i for i, name in enumerate(order)}
    return tuple(sorted(params, key=lambda kv: (rank.get(kv[0], len(rank)), kv[0])))


TOLD = frozenset({AttemptOutcome.SUCCEEDED, AttemptOutcome.STOPPED_EARLY})  # attempts whose metric the sampler hears


def objectives(sweep: Sweep, made: Sequence[Config], history: Iterable[AttemptRecord]) -> list[float | None]:
    """Per made configuration: the mean of its base seeds' best archived metrics (the archive's ``best_metric``, of
    the sweep's metrics key) once every seed is settled (succeeded, stopped early, or out of retries), NaN when
    settled without a finite metric, None while any seed is not."""
    specs = expand_configurations(sweep, list(made), 0)
    ids = {s.id for s in specs}
    records = [r for r in history if r.run_id in ids]
    tallies = tally_runs(records)
    goal = sweep.search.metric_goal if sweep.search is not None else sweep.metric_goal
    by_run: dict[str, list[AttemptRecord]] = {}
    for r in records:
        by_run.setdefault(r.run_id, []).append(r)
    best = {run_id: m for run_id, recs in by_run.items() if (m := run_metric(recs, goal, TOLD)) is not None}
    out: list[float | None] = []
    for trial in range(len(made)):
        seeds = [s for s in specs if s.trial == trial and s.promotion_threshold is None]  # base seeds only
        settled = all(run_phase(s, tallies.get(s.id, UNTOUCHED)).finished for s in seeds)
        metrics = [best[s.id] for s in seeds if s.id in best]
        out.append(None if not settled else (sum(metrics) / len(metrics) if metrics else math.nan))
    return out


def advance(
    desired: Desired, recorded: Recorded, history: Sequence[AttemptRecord]
) -> dict[str, tuple[Suggestion, ...]]:
    """``recorded`` with each bayes sweep's first batch recorded and, where every configuration made is finished and
    run_cap leaves room, its next batch appended (the same inputs always give the same record)."""
    out = dict(recorded)
    for sweep in desired.sweeps:
        if not is_bayes(sweep):
            continue
        made = [replace(s, params=_in_search_order(sweep, s.params)) for s in out.get(sweep.name, ())]
        if not made:
            made = [Suggestion(t, 0, c) for t, c in enumerate(configurations_made(sweep, desired.runs))]
        configs = [s.params for s in made]
        finished = objectives(sweep, configs, history)
        if wants_batch(sweep, finished):
            batch = 1 + max((s.batch for s in made), default=-1)
            made += [Suggestion(len(made) + i, batch, c) for i, c in enumerate(next_batch(sweep, configs, finished))]
        if made:
            out[sweep.name] = tuple(made)
    return out


def suggested_runs(desired: Desired, recorded: Recorded) -> Desired:
    """``desired`` with the runs of every recorded configuration after the spec's first batch (the first batch is
    already among its runs); a sweep no longer a bayes search in desired/ adds nothing."""
    known = {r.id for r in desired.runs}
    extra: list[RunSpec] = []
    for sweep in desired.sweeps:
        if not is_bayes(sweep):
            continue
        first = len(configurations_made(sweep, desired.runs))
        later = [s for s in recorded.get(sweep.name, ()) if s.trial >= first]
        for s in later:
            for spec in expand_configurations(sweep, [_in_search_order(sweep, s.params)], s.trial):
                if spec.id not in known:
                    known.add(spec.id)
                    extra.append(spec)
    return replace(desired, runs=(*desired.runs, *extra)) if extra else desired
