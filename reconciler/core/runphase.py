"""The phase of a run, stated once: the planner, the observed files, ``status``, ``diff`` and the demo all ask here.

A run's phase is derived from two facts only: its finished attempts (the archive, plus whatever the current
cycle settles) and whether an attempt of it is live. "Live" means an attempt that is not archived and either
runs on a reachable box (no exit code, wrapper alive) where this fleet launched it, or was launched on a box that
cannot be checked right now (in flight, the box unreachable or still booting): a run on an unreachable box is
*running*, not pending.

Which attempts a box shows are this fleet's is answered once, by ``launched_by_box``: a run directory counts only
where this fleet launched that attempt (in flight on that box) and the archive does not hold it yet. The planner,
the memory's clocks (heartbeats, GPU quiet, rungs), the store's checkpoint syncs and the run phase all ask it.

An attempt given to a box's queue (``InFlight.queued``) is in flight from the moment it is queued: it counts for
every cap and against duplicates like a running one, and its run is *queued* until its run directory appears on
the box (the box started it). Reported in the box's queue, or on a box that cannot be checked, it is waiting;
on a box that answers and shows it neither queued nor started (and left no run directory out of its answer), its
launch never happened (the planner requeues).
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from reconciler.core.model import (
    AttemptOutcome,
    AttemptRecord,
    BoxProbe,
    InFlight,
    Observed,
    RunDirState,
    RunPhase,
    RunSpec,
)
from reconciler.core.promotion import succeeded_metrics, wanted_ids


def is_live(rd: RunDirState) -> bool:
    """The attempt runs on the box that reported it: no exit code, and its wrapper is alive (it holds its GPUs)."""
    return rd.exit_code is None and rd.pid_alive


def is_unfinished(rd: RunDirState) -> bool:
    """The attempt's directory has no exit code yet: it runs, or its wrapper died without writing one (a crash the
    planner settles as lost). Until it is archived it is still the run's current attempt."""
    return rd.exit_code is None


def is_queued(f: InFlight, probe: BoxProbe | None) -> bool:
    """The in-flight attempt waits in its box's queue, not started: it was queued, its box shows no run directory of
    it, and the box lists it in its queue (or cannot be checked now, so it may well still wait there)."""
    if not f.queued:
        return False
    if probe is None or not probe.reachable:
        return True
    key = (f.run_id, f.attempt)
    if any((r.run_id, r.attempt) == key for r in probe.runs):
        return False
    return any((q.run_id, q.attempt) == key for q in probe.queued)


def may_still_hold(f: InFlight, probe: BoxProbe | None) -> bool:
    """Its box's answer does not settle that an in-flight attempt it shows no run directory of is not there: the box
    cannot be checked now, lists it in its queue, or left run directories out of its answer (``runs_omitted``).
    Otherwise the launch never happened."""
    return probe is None or not probe.reachable or is_queued(f, probe) or probe.runs_omitted > 0


def allowed_attempts(spec: RunSpec) -> int:
    """How many attempts a run may use: the first plus ``retries`` (a negative retries counts as 0)."""
    return 1 + max(0, spec.sweep.retries)


@dataclass(frozen=True)
class LiveAttempt:
    """An attempt that is not archived and is (or may still be) running on ``instance_id``."""

    run_id: str
    attempt: int
    instance_id: int
    queued: bool = False  # waiting in its box's queue, not started (``is_queued``)


class RunTally(NamedTuple):
    """What is known of one run's attempts: the inputs of ``run_phase`` (a tuple: one per run per plan)."""

    succeeded: bool = False
    used: int = 0  # failed or lost attempts: each counts against retries
    live: bool = False
    queued: bool = False  # its live attempt waits in its box's queue (``live`` is then True too)
    stopped: bool = False  # an attempt was stopped early by the sweep's early termination: settled, no retry spent
    preempted: int = 0  # attempts the provider took (``AttemptOutcome.PREEMPTED``): no retry, ``max_preemptions``

    def with_outcome(self, outcome: AttemptOutcome) -> RunTally:
        if outcome is AttemptOutcome.SUCCEEDED:
            return self._replace(succeeded=True)
        if outcome is AttemptOutcome.PREEMPTED:
            return self._replace(preempted=self.preempted + 1)
        if not outcome.uses_a_retry:  # stopped early
            return self._replace(stopped=True)
        return self._replace(used=self.used + 1)


UNTOUCHED = RunTally()  # no attempt yet


def preemptions_exhausted(spec: RunSpec | None, tally: RunTally) -> bool:
    """The run has lost more attempts to preemption than its sweep's ``max_preemptions`` allows (a run no longer
    desired, ``spec`` None, none): it is blocked, so a run on boxes that keep being outbid cannot bounce forever."""
    return tally.preempted > (max(0, spec.sweep.max_preemptions) if spec is not None else 0)


def run_phase(spec: RunSpec | None, tally: RunTally) -> RunPhase:
    """The one rule: succeeded beats stopped early, which beats live (a run stopped early is settled: never launched
    again, no retry spent), live beats blocked, and a run is blocked once its retries are used or once more of its
    attempts were preempted than ``max_preemptions`` allows (``preemptions_exhausted``). A live attempt that waits in
    its box's queue makes the run queued rather than running.

    A run no longer in the desired state (``spec`` None) is never launched again, so one failure blocks it.
    """
    if tally.succeeded:
        return _SUCCEEDED
    if tally.stopped:
        return _STOPPED
    if tally.live:
        return _QUEUED if tally.queued else _RUNNING
    allowed = allowed_attempts(spec) if spec is not None else 1
    if tally.used >= allowed or (tally.preempted and preemptions_exhausted(spec, tally)):
        return _BLOCKED
    return _RETRYING if tally.used or tally.preempted else _PENDING


# Module constants: an enum member looked up on its class costs a descriptor call in the planner's hot loop.
_SUCCEEDED, _RUNNING, _BLOCKED = RunPhase.SUCCEEDED, RunPhase.RUNNING, RunPhase.BLOCKED
_RETRYING, _PENDING, _QUEUED = RunPhase.RETRYING, RunPhase.PENDING, RunPhase.QUEUED
_STOPPED = RunPhase.STOPPED_EARLY


@dataclass(frozen=True)
class OurAttempt:
    """A run directory a reachable box shows of an attempt this fleet launched on that box (``launch``, in flight
    there) and the archive does not hold yet."""

    instance_id: int
    run_dir: RunDirState
    launch: InFlight

    @property
    def live(self) -> bool:
        """Its process runs on the box (``is_live``): it holds its GPUs."""
        return is_live(self.run_dir)


def launched_by_box(
    probes: Iterable[BoxProbe], in_flight: Iterable[InFlight], archived: Container[tuple[str, int]] = frozenset()
) -> dict[int, tuple[OurAttempt, ...]]:
    """Box id → the attempts this fleet launched there that the box shows (its ``live`` ones: the live attempts this
    fleet launched, by box): the one join of what boxes report with what this fleet launched. A run directory counts
    only on a reachable box, when that attempt is in flight on that very box and not in ``archived``; any other a box
    shows is foreign, whatever it claims (a run id or attempt number of ours elsewhere included). Only boxes with one
    are keys."""
    flights = {(f.run_id, f.attempt): f for f in in_flight}
    out: dict[int, tuple[OurAttempt, ...]] = {}
    for probe in probes:
        if not probe.reachable or not probe.runs:
            continue
        ours = []
        for rd in probe.runs:
            key = (rd.run_id, rd.attempt)
            launch = flights.get(key)
            if launch is not None and launch.instance_id == probe.instance_id and key not in archived:
                ours.append(OurAttempt(probe.instance_id, rd, launch))
        if ours:
            out[probe.instance_id] = tuple(ours)
    return out


def live_attempts(observed: Observed) -> dict[str, LiveAttempt]:
    """Run id → its newest live attempt: alive on a reachable box, or in flight and not yet archived. Only what this
    fleet launched counts (``launched_by_box``): a live attempt a box shows that is not in flight there is foreign,
    not the run's. An attempt waiting in its box's queue is live too (``LiveAttempt.queued``)."""
    archived = {rec.key for rec in observed.history}
    live: dict[str, LiveAttempt] = {}

    def keep(a: LiveAttempt) -> None:
        cur = live.get(a.run_id)
        if cur is None or (a.attempt, a.instance_id) > (cur.attempt, cur.instance_id):
            live[a.run_id] = a

    for box_id, ours in launched_by_box(observed.probes, observed.memory.in_flight, archived).items():
        for a in ours:
            if a.live:
                keep(LiveAttempt(a.run_dir.run_id, a.run_dir.attempt, box_id))
    probes = observed.probes_by_id() if any(f.queued for f in observed.memory.in_flight) else {}
    for f in observed.memory.in_flight:
        if (f.run_id, f.attempt) not in archived:
            queued = f.queued and is_queued(f, probes.get(f.instance_id))
            keep(LiveAttempt(f.run_id, f.attempt, f.instance_id, queued))
    return live


def live_progress(runs: Iterable[RunSpec], observed: Observed) -> dict[tuple[str, int], float]:
    """(run id, attempt) → the fraction of its work a run's newest live attempt has done (its sweep's ``progress``,
    read from the last metrics line the box reported while it runs); runs whose sweep has no ``progress``, or whose
    line says nothing, are left out."""
    live = live_attempts(observed)
    out: dict[tuple[str, int], float] = {}
    for spec in runs:
        attempt = live.get(spec.id)
        if attempt is None or spec.sweep.progress is None:
            continue
        probe = observed.probe(attempt.instance_id)
        key = (spec.id, attempt.attempt)
        state = next((r for r in probe.runs if (r.run_id, r.attempt) == key), None) if probe is not None else None
        done = spec.sweep.progress.fraction(dict(state.last_metrics)) if state is not None and is_live(state) else None
        if done is not None:
            out[key] = done
    return out


def never_ran(rec: AttemptRecord) -> bool:
    """An attempt that ended while it waited in its box's queue, before the box started it (cancelled for the budget,
    no longer desired, a duplicate, fenced, or its box went away): it never ran, so it spends no retry."""
    return rec.queued_at is not None and rec.started_at is None


def tally_runs(
    history: Iterable[AttemptRecord], live: Iterable[str] | Mapping[str, LiveAttempt] = ()
) -> dict[str, RunTally]:
    """Run id → its tally from archived attempts, with ``live`` marking the runs that have a live attempt (given as
    ``live_attempts``' map, a queued one marks its run queued)."""
    out: dict[str, RunTally] = {}
    for rec in history:
        if never_ran(rec):
            out.setdefault(rec.run_id, UNTOUCHED)
            continue
        out[rec.run_id] = out.get(rec.run_id, UNTOUCHED).with_outcome(rec.phase)
    queued = {k for k, a in live.items() if a.queued} if isinstance(live, Mapping) else set()
    for run_id in live:
        t = out.get(run_id, UNTOUCHED)
        out[run_id] = t._replace(live=True, queued=run_id in queued)
    return out


def run_phases(runs: Iterable[RunSpec], observed: Observed) -> dict[str, RunPhase]:
    """Phase of every wanted run (base seeds, and promotion seeds whose cell reached the threshold)."""
    specs = list(runs)
    wanted = wanted_ids(specs, succeeded_metrics(observed.history))
    tallies = tally_runs(observed.history, live_attempts(observed))
    return {s.id: run_phase(s, tallies.get(s.id, UNTOUCHED)) for s in specs if s.id in wanted}


def count_phases(phases: Mapping[str, RunPhase]) -> dict[str, int]:
    """Runs per phase, every phase present (zeros included), in the enum's order."""
    counts = dict.fromkeys((p.value for p in RunPhase), 0)
    for p in phases.values():
        counts[p.value] += 1
    return counts
