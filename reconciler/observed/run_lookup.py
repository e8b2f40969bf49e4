"""Which box each attempt of a run ran on, and which run a person means: what ``rigsync logs`` and ``ssh`` ask.

Nothing here is decided anew: the facts are the ones the cycle already wrote. ``runs.yaml`` gives each run's phase
(``runphase.run_phase``), how many attempts it had and the box of its newest one (the live attempt's box while
it runs: ``runphase.live_attempts``), plus the attempts in flight with their boxes; ``fleet.yaml`` says which
attempt runs on which GPU of which box; the run archive gives the box of every finished attempt. ``AttemptIndex``
puts them together, and ``resolve`` turns what a person typed (a run id or a unique prefix of it, like git,
optionally ``.ATTEMPT``) into one attempt, or a ``UserError`` that says precisely why not.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reconciler.core.model import AttemptRecord, RunPhase
from reconciler.errors import UserError
from reconciler.observed.codec import FLEET, RUNS, expect_mapping, load_yaml
from reconciler.observed.memory import fleet_memory_from_files
from reconciler.observed.observed_tree import read_observed

# RUN.ATTEMPT, as typed and as a run directory is named (``model.run_dir_name``); sweep names hold no '.'
_RUN_DOT_ATTEMPT = re.compile(r"^(?P<run>.+)\.(?P<attempt>\d+)$")
_SHOWN = 5  # candidates named in an ambiguity error


@dataclass(frozen=True)
class AttemptPlace:
    """One attempt of a run: the box it ran on (None: not known) and its archive record once it finished."""

    run_id: str
    attempt: int
    instance_id: int | None
    record: AttemptRecord | None = None

    @property
    def name(self) -> str:
        return f"{self.run_id}.{self.attempt}"

    @property
    def finished(self) -> bool:
        return self.record is not None


@dataclass(frozen=True)
class RunPlaces:
    """A run, its phase as last observed (None: not in runs.yaml) and its attempts by number."""

    run_id: str
    phase: str | None = None
    attempts: Mapping[int, AttemptPlace] = field(default_factory=dict)

    def latest(self) -> AttemptPlace | None:
        return self.attempts[max(self.attempts)] if self.attempts else None


class AttemptIndex:
    """Every run rigsync knows of (desired, observed, archived), with the box of each of its attempts."""

    def __init__(self, runs: Mapping[str, RunPlaces]) -> None:
        self.runs = dict(runs)

    # ------------------------------------------------------------------------------------------ building

    @staticmethod
    def build(
        runs_doc: Mapping[str, Any],
        fleet_doc: Mapping[str, Any],
        history: Iterable[AttemptRecord],
        in_flight: Iterable[tuple[str, int, int]] = (),
        desired_ids: Iterable[str] = (),
    ) -> AttemptIndex:
        """From ``runs.yaml`` and ``fleet.yaml`` as parsed mappings, the archive's records, the attempts in flight
        as ``(run_id, attempt, instance_id)`` and the run ids desired/ expands to."""
        places: dict[str, dict[int, AttemptPlace]] = {}
        phases: dict[str, str] = {}

        def put(p: AttemptPlace, *, replace: bool = False) -> None:
            have = places.setdefault(p.run_id, {})
            if replace or p.attempt not in have or have[p.attempt].instance_id is None:
                have[p.attempt] = p

        for rid in desired_ids:
            places.setdefault(rid, {})
        for sweep_runs in (runs_doc.get("sweeps") or {}).values():
            for rid, entry in (sweep_runs or {}).items():
                if not isinstance(entry, Mapping):
                    continue
                rid = str(rid)
                places.setdefault(rid, {})
                if entry.get("phase") is not None:
                    phases[rid] = str(entry["phase"])
                n = _int(entry.get("attempts"))
                if n is not None and n > 0:
                    put(AttemptPlace(rid, n, _int(entry.get("instance"))))
                    for k in range(1, n):
                        put(AttemptPlace(rid, k, None))
        for box in fleet_doc.get("boxes") or []:
            if not isinstance(box, Mapping) or _int(box.get("id")) is None:
                continue
            for gpu in box.get("gpus") or []:
                m = _RUN_DOT_ATTEMPT.match(str(gpu.get("run") or "")) if isinstance(gpu, Mapping) else None
                if m:
                    put(AttemptPlace(m["run"], int(m["attempt"]), _int(box.get("id"))), replace=True)
        for rid, attempt, instance_id in in_flight:
            put(AttemptPlace(rid, attempt, instance_id), replace=True)
        for rec in history:  # the archive is the last word on a finished attempt
            put(AttemptPlace(rec.run_id, rec.attempt, rec.instance_id or None, rec), replace=True)
        return AttemptIndex(
            {rid: RunPlaces(rid, phases.get(rid), dict(sorted(atts.items()))) for rid, atts in places.items()}
        )

    # ------------------------------------------------------------------------------------------- asking

    def resolve_run(self, text: str) -> RunPlaces:
        """The run ``text`` names: its id, or a prefix of exactly one id or of its digest (``tdmpc-9165``, ``9165``)."""
        text = text.strip()
        if not text:
            raise UserError("no run given")
        if text in self.runs:
            return self.runs[text]
        hits = sorted(rid for rid in self.runs if rid.startswith(text) or _digest(rid).startswith(text))
        if len(hits) == 1:
            return self.runs[hits[0]]
        if hits:
            shown = ", ".join(hits[:_SHOWN]) + (f" and {len(hits) - _SHOWN} more" if len(hits) > _SHOWN else "")
            raise UserError(f"run prefix {text!r} is ambiguous: it matches {shown}; give more characters")
        raise UserError(f"unknown run {text!r}{self._hint(text)}")

    def resolve(self, text: str) -> AttemptPlace:
        """The attempt ``RUN[.ATTEMPT]`` names (the run's latest when no attempt is given)."""
        text = text.strip()
        attempt: int | None = None
        m = _RUN_DOT_ATTEMPT.match(text)
        if m and text not in self.runs:
            text, attempt = m["run"], int(m["attempt"])
        run = self.resolve_run(text)
        latest = run.latest()
        if latest is None:
            phase = run.phase or RunPhase.PENDING.value
            raise UserError(f"run {run.run_id} has not been launched yet ({phase})")
        if attempt is None:
            return latest
        if attempt not in run.attempts:
            have = f"1..{latest.attempt}" if latest.attempt > 1 else "1"
            raise UserError(f"run {run.run_id} has no attempt {attempt} (its attempts: {have})")
        return run.attempts[attempt]

    def _hint(self, text: str) -> str:
        ids = sorted(self.runs)
        if not ids:
            return ": rigsync knows no runs here (is --repo the fleet repository?)"
        close = difflib.get_close_matches(text, ids, n=1, cutoff=0.6)
        if not close:
            by_digest = {_digest(r): r for r in ids}
            close = [by_digest[d] for d in difflib.get_close_matches(text, list(by_digest), n=1, cutoff=0.6)]
        if close:
            return f"; did you mean {close[0]}?"
        return " (`rigsync runs` lists the run ids)"


def read_attempt_index(
    checkout: Path, history: Iterable[AttemptRecord], desired_ids: Iterable[str] = ()
) -> AttemptIndex:
    """The index from the observed files in the working tree at ``checkout`` (as the last cycle wrote them)."""
    files = read_observed(checkout)
    runs_doc = expect_mapping(load_yaml(files[RUNS], RUNS), RUNS) if RUNS in files else {}
    fleet_doc = expect_mapping(load_yaml(files[FLEET], FLEET), FLEET) if FLEET in files else {}
    in_flight = fleet_memory_from_files({RUNS: files[RUNS]} if RUNS in files else {}).in_flight
    return AttemptIndex.build(
        runs_doc, fleet_doc, history, ((f.run_id, f.attempt, f.instance_id) for f in in_flight), desired_ids
    )


def _digest(run_id: str) -> str:
    """The content hash part of a run id (``tdmpc-9165e5518277`` → ``9165e5518277``)."""
    return run_id.rsplit("-", 1)[-1]


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
