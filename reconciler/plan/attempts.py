"""Attempts: what the boxes show, what finished, what must be killed or requeued, and which runs wait to launch.

The phases here run in this order (``plan()`` calls them so): ``collect_attempts`` sorts what reachable boxes
show (only what this fleet launched there counts: the rest is foreign, ``report_foreign``); ``record_finished``
archives exited attempts; ``wanted_runs`` applies the promotion rule; ``settle_live`` and ``settle_in_flight``
decide about attempts still alive or unaccounted for (their boxes' fate is already known); ``run_queue`` asks the
one run-phase rule which runs are pending. An attempt waiting in its box's queue is in flight like a running one
(``runphase.is_queued``): kept waiting, or killed (tombstoned on the box) when its run is no longer wanted, a
duplicate, or the budget binds. Runtime limits and staleness run on the controller's clock, from the
launch this fleet made (``launched_at``, ``heartbeat_stale``), never on times a box reports (save a queued
attempt's start, which only its box knows: clamped between its queueing and now).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from reconciler.core import contract
from reconciler.core.actions import Kill, Kind, ReasonCode, Record, Requeue
from reconciler.core.bounds import MAX_REPORTED_CLAIMS, bounded_text
from reconciler.core.model import (
    LAUNCHABLE_PHASES,
    AttemptOutcome,
    Drift,
    DriftClass,
    InFlight,
    RunDirState,
    RunPhase,
    RunSpec,
)
from reconciler.core.offers import normalize_gpu_name
from reconciler.core.promotion import succeeded_metrics, wanted_among
from reconciler.core.runphase import (
    UNTOUCHED,
    RunTally,
    allowed_attempts,
    is_live,
    is_queued,
    is_unfinished,
    may_still_hold,
    preemptions_exhausted,
    run_phase,
    tally_runs,
)
from reconciler.core.throughput import STALL_RATE_FLOOR, predict, progress_value
from reconciler.plan.bookkeeping import contract_ending, contract_pull_due
from reconciler.plan.common import Decisions, fmt_duration, gpus_text
from reconciler.plan.early_stop import EarlyStop
from reconciler.plan.world import OwnedBox, World

AttemptKey = tuple[str, int]


@dataclass(frozen=True)
class SeenAttempts:
    """What the reachable boxes show, sorted by what must happen to it."""

    finished: tuple[tuple[int, RunDirState], ...]  # exited, not archived: to record
    live: Mapping[int, tuple[RunDirState, ...]]  # per box: no exit code, not archived
    zombies: Mapping[int, tuple[RunDirState, ...]]  # per box: archived already, process still alive
    occupied: Mapping[int, frozenset[int]]  # per box: GPU indexes held by alive attempts (of the instance's GPUs)
    visible: frozenset[AttemptKey]  # our attempts that a reachable box shows
    max_attempt: Mapping[str, int]  # highest attempt number known per run (archive, in flight, boxes)
    # run directories no launch of this fleet made on the box that shows them: (box id, what it shows, why)
    foreign: tuple[tuple[int, RunDirState, str], ...] = ()
    flights: Mapping[AttemptKey, InFlight] = field(default_factory=dict)  # the launches in flight, by attempt

    def launch_of(self, rd: RunDirState) -> InFlight | None:
        return self.flights.get((rd.run_id, rd.attempt))


@dataclass(frozen=True)
class Recorded:
    """Attempts this plan archives, and their outcomes per run (they count like archived ones)."""

    outcomes: Mapping[str, tuple[tuple[AttemptOutcome, float | None], ...]]
    keys: frozenset[AttemptKey]


@dataclass(frozen=True)
class LiveVerdicts:
    """What happened to live attempts: the one kept per run, and the attempts settled by kill or requeue."""

    running: Mapping[str, tuple[int, RunDirState]]  # run id -> (box id, the attempt kept running)
    used: Mapping[str, int]  # run id -> attempts this plan ends as failed (max runtime) or lost (requeue)
    settled: frozenset[AttemptKey]
    launched: Mapping[str, float] = field(default_factory=dict)  # run id -> when its kept attempt was launched
    stopped: frozenset[str] = frozenset()  # runs this plan stops early (``early_stop``): settled, no retry spent
    preempted: Mapping[str, int] = field(default_factory=dict)  # run id -> attempts this plan requeues as preempted


@dataclass(frozen=True)
class InFlightVerdicts:
    waiting: frozenset[str]  # runs launched on a box that cannot be checked now: they count as running
    used: Mapping[str, int]  # run id -> attempts requeued here
    # run id -> why its lost attempt may still run: requeued here from a box that is still listed and cannot be
    # checked (being destroyed, or no longer carrying our label)
    unverified: Mapping[str, str]
    queued: tuple[InFlight, ...] = ()  # attempts kept waiting in a reachable box's queue (``is_queued``)
    preempted: Mapping[str, int] = field(default_factory=dict)  # run id -> attempts requeued here as preempted


class PendingRun(NamedTuple):
    """A run to launch (a tuple: thousands are made per plan)."""

    spec: RunSpec
    gpus: int  # GPUs it needs (at least 1)
    gpu_ram_mib: int  # memory it needs on each
    used: int  # attempts failed or lost so far
    next_attempt: int


@dataclass(frozen=True)
class RunQueue:
    pending: tuple[PendingRun, ...]  # launch order: priority, sweep order, desired order
    live_work: bool  # some run is running (or may be, on a box that cannot be checked)
    pending_by_sweep: Mapping[str, int]  # how many of ``pending`` and ``held`` each sweep has (for the price)
    # launchable runs not launched by this plan: an attempt of theirs was lost on a box that is still listed and
    # cannot be checked, so it may still run (``unverified_lost``); renting may still provide for them
    held: tuple[PendingRun, ...] = ()
    # what holds the GPU slots of reachable boxes: run id -> (box id, its attempt kept running), and the attempts
    # kept waiting in boxes' queues (placement queues more behind them)
    running: Mapping[str, tuple[int, RunDirState]] = field(default_factory=dict)
    queued: tuple[InFlight, ...] = ()


def exit_code_unusable(rd: RunDirState) -> bool:
    """The box's report of the attempt's exit code could not be used (``RunDirState.problem`` names it)."""
    return rd.problem is not None and rd.problem.startswith("exit_code")


def is_finished(rd: RunDirState) -> bool:
    """The attempt ended: it has an exit code, or its wrapper is gone having written one that cannot be read (it is
    settled once as failed with the problem, not requeued as lost)."""
    return not is_unfinished(rd) or (exit_code_unusable(rd) and not rd.pid_alive)


def collect_attempts(world: World) -> SeenAttempts:
    """What the reachable boxes show, sorted. A run directory counts only when this fleet launched that attempt on
    that box (it is in flight there) or it is archived; any other is foreign, whatever it claims: it is reported,
    never recorded, killed, requeued or promoted. A foreign attempt that claims to be alive still holds the GPUs it
    claims among those the instance has (a process the box says runs there may well use them: nothing is placed
    beside it), and its attempt number is kept clear of (our launch's run directory must not collide with it)."""
    max_attempt: dict[str, int] = {}
    for h in world.observed.history:
        max_attempt[h.run_id] = max(max_attempt.get(h.run_id, 0), h.attempt)
    flights: dict[AttemptKey, InFlight] = {}
    for f in world.observed.memory.in_flight:
        max_attempt[f.run_id] = max(max_attempt.get(f.run_id, 0), f.attempt)
        flights[(f.run_id, f.attempt)] = f
    finished: list[tuple[int, RunDirState]] = []
    live: dict[int, tuple[RunDirState, ...]] = {}
    zombies: dict[int, tuple[RunDirState, ...]] = {}
    occupied: dict[int, frozenset[int]] = {}
    visible: set[AttemptKey] = set()
    foreign: list[tuple[int, RunDirState, str]] = []
    for box in world.boxes.values():
        if not box.reachable or box.probe is None:
            continue
        box_live: list[RunDirState] = []
        box_zombies: list[RunDirState] = []
        held: set[int] = set()
        gpus = range(box.inst.num_gpus)
        ours = {(a.run_dir.run_id, a.run_dir.attempt) for a in world.ours.get(box.id, ())}
        for rd in sorted(box.probe.runs, key=lambda r: (r.run_id, r.attempt)):
            key = (rd.run_id, rd.attempt)
            max_attempt[rd.run_id] = max(max_attempt.get(rd.run_id, 0), rd.attempt)
            alive = is_live(rd)
            if alive:
                held.update(i for i in rd.gpu_mask if i in gpus)
            if key in world.archived:
                if alive:
                    box_zombies.append(rd)
                continue
            if key not in ours:
                launch = flights.get(key)
                why = (
                    "that no launch of this fleet made"
                    if launch is None
                    else f"of an attempt launched on instance/{launch.instance_id}, not there"
                )
                foreign.append((box.id, rd, why))
                continue
            visible.add(key)
            if is_finished(rd):
                finished.append((box.id, rd))
            else:
                box_live.append(rd)
        live[box.id], zombies[box.id], occupied[box.id] = tuple(box_live), tuple(box_zombies), frozenset(held)
    return SeenAttempts(
        tuple(finished), live, zombies, occupied, frozenset(visible), max_attempt, tuple(foreign), flights
    )


def report_foreign(world: World, seen: SeenAttempts) -> Decisions:
    """Each foreign run directory, and each claim a probe made that was refused (``BoxProbe.rejected``): reported
    as ``foreign_attempt``, never acted on. Per box the first ``MAX_REPORTED_CLAIMS`` are reported one by one and
    the rest counted in one line, so what is reported (and the drift file committed from it) does not grow with
    a box's claims."""
    out = Decisions()
    per_box: dict[int, list[tuple[str, str]]] = {}  # box id -> (subject, detail) in report order
    for box_id, rd, why in seen.foreign:
        if rd.exit_code is not None:
            claim = f"claims exit code {rd.exit_code}"
        elif is_live(rd):
            claim = f"claims to run on {gpus_text(rd.gpu_mask)}" if rd.gpu_mask else "claims to run"
        else:
            claim = "no exit code, no live process"
        detail = bounded_text(f"run directory on instance/{box_id} {why} ({claim})")
        per_box.setdefault(box_id, []).append((f"run/{rd.run_id}.{rd.attempt}@{box_id}", detail))
    for box in world.boxes.values():
        if box.probe is not None:
            claims = per_box.setdefault(box.id, [])
            claims.extend((box.subject, f"probe claim refused: {text}") for text in box.probe.rejected)
    for box_id, claims in sorted(per_box.items()):
        for subj, detail in claims[:MAX_REPORTED_CLAIMS]:
            if subj.startswith("run/"):
                out.noop(subj, ReasonCode.FOREIGN_ATTEMPT, f"foreign attempt: {detail}; reported, never recorded")
            else:
                out.noop(subj, ReasonCode.FOREIGN_ATTEMPT, f"{detail}; reported, never acted on")
            out.drift.append(Drift(DriftClass.FOREIGN_ATTEMPT, subj, detail, "none"))
        more = len(claims) - MAX_REPORTED_CLAIMS
        if more > 0:
            detail = f"{more} more foreign run directories or refused claims on instance/{box_id}"
            out.noop(f"instance/{box_id}", ReasonCode.FOREIGN_ATTEMPT, f"{detail}; reported, never recorded")
            out.drift.append(Drift(DriftClass.FOREIGN_ATTEMPT, f"instance/{box_id}", detail, "none"))
    return out


def unseen_in_flight(world: World, seen: SeenAttempts) -> Iterator[InFlight]:
    """Attempts in flight that the archive does not know and no reachable box shows: launched on a box that cannot
    be checked now, or lost (the box vanished, or the launch never happened)."""
    archived, visible = world.archived, seen.visible
    for fl in world.observed.memory.in_flight:
        key = (fl.run_id, fl.attempt)
        if key not in archived and key not in visible:
            yield fl


def recorded_group(
    fl: InFlight | None, box_id: int, rd: RunDirState | None = None
) -> tuple[int | None, int | None]:
    """The process group a kill on ``box_id`` may signal (``InFlight.group_on``): the one the attempt's launch there
    recorded, or for a queued attempt its box started, the one the box's launch of it reported in ``rd`` (so a kill
    in the first cycle that sees it started signals at once instead of waiting on its wrapper)."""
    return (None, None) if fl is None else fl.group_on(box_id, rd)


def failed_last_cycle(world: World, kind: Kind, target: str) -> str | None:
    """The error of the same action (kind and target) when it failed in the last apply, else None."""
    for failed in world.observed.memory.failed_actions:
        if failed.kind == kind.value and failed.target == target:
            return failed.error
    return None


def record_finished(world: World, seen: SeenAttempts) -> tuple[Recorded, Decisions]:
    """Archive the attempts of ours that ended. One whose results the box reported unusably (``problem``) is
    settled all the same, with the problem as its reason: succeeded only on exit code 0 read as such, and with no
    metric for promotion. A record that failed last cycle is planned again without its harvest (the harvest is
    what fails on a bad box), so the attempt settles instead of failing the same way every cycle."""
    out = Decisions()
    outcomes: dict[str, list[tuple[AttemptOutcome, float | None]]] = {}
    for box_id, rd in seen.finished:
        ok = rd.exit_code == 0 and not exit_code_unusable(rd)
        outcome = AttemptOutcome.SUCCEEDED if ok else AttemptOutcome.FAILED
        if rd.exit_code is None:
            exited = f"ended on instance/{box_id} without an exit code that could be read"
        else:
            exited = f"exited with code {rd.exit_code} on instance/{box_id}"
        if rd.problem is not None:
            code, reason = ReasonCode.RESULTS_UNUSABLE, f"unusable {rd.problem}; {exited}"
        else:
            code, reason = ReasonCode.EXITED, exited
        outcomes.setdefault(rd.run_id, []).append((outcome, rd.best_metric if rd.problem is None else None))
        target = f"run/{rd.run_id}.{rd.attempt}"
        failed = failed_last_cycle(world, Kind.RECORD, target)
        out.act(
            Record(
                reason=reason,
                code=code,
                run_id=rd.run_id,
                attempt=rd.attempt,
                instance_id=box_id,
                phase=outcome.value,
                exit_code=rd.exit_code,
                skip_harvest=None if failed is None else f"harvest failed last cycle: {failed}",
            )
        )
    keys = frozenset((rd.run_id, rd.attempt) for _, rd in seen.finished)
    return Recorded({k: tuple(v) for k, v in outcomes.items()}, keys), out


def wanted_runs(world: World, recorded: Recorded) -> tuple[frozenset[str], Decisions]:
    """Base runs, plus promotion seeds whose cell's best base metric reached their threshold."""
    out = Decisions()
    metrics = succeeded_metrics(world.observed.history)
    for run_id, done in recorded.outcomes.items():
        metrics.setdefault(run_id, []).extend(m for o, m in done if o is AttemptOutcome.SUCCEEDED)
    wanted = frozenset(wanted_among(world.runs, metrics))
    waiting_promo: dict[str, int] = {}
    if len(wanted) < len(world.runs):
        for r in world.runs.values():
            if r.id not in wanted:
                waiting_promo[r.sweep.name] = waiting_promo.get(r.sweep.name, 0) + 1
    for sweep, n in sorted(waiting_promo.items()):
        out.noop(
            f"sweep/{sweep}",
            ReasonCode.PROMOTION_WAITING,
            f"{n} promotion seed(s) wait for their cell's best metric to reach the threshold",
        )
    return wanted, out


def destroyed_box_requeue(box_id: int, gone: str, preempted: frozenset[int]) -> tuple[ReasonCode, str, AttemptOutcome]:
    """How an attempt of a destroyed box is requeued: preempted when the provider took the box (``BoxTable.preempted``,
    an outbid box: no retry spent, it counts against ``max_preemptions``), else lost."""
    if box_id in preempted:
        reason = f"preempted: the provider took its box instance/{box_id} ({gone}); no retry spent"
        return ReasonCode.PREEMPTED, reason, AttemptOutcome.PREEMPTED
    return ReasonCode.BOX_DESTROYED, f"its box instance/{box_id} is destroyed: {gone}", AttemptOutcome.LOST


@dataclass
class _Ending:
    """What a settling phase has decided so far: its decisions, and per run the attempts it ended as failed or lost
    (``used``: a retry each) or requeued as preempted (``took``: no retry spent). Mutable only while its phase builds
    it."""

    world: World
    out: Decisions = field(default_factory=Decisions)
    used: dict[str, int] = field(default_factory=dict)
    took: dict[str, int] = field(default_factory=dict)

    def count(self, run_id: str, phase: AttemptOutcome) -> None:
        """One more attempt of ``run_id`` ended as ``phase``: preempted ones spend no retry."""
        count = self.took if phase is AttemptOutcome.PREEMPTED else self.used
        count[run_id] = count.get(run_id, 0) + 1

    def kill(
        self, key: AttemptKey, box_id: int, group: tuple[int | None, int | None], code: ReasonCode, reason: str,
        phase: AttemptOutcome = AttemptOutcome.FAILED,
    ) -> None:
        """Kill attempt ``key`` on ``box_id`` (its process ``group``, ``recorded_group``), archived as ``phase``."""
        pid, started = group
        self.out.act(Kill(reason=reason, code=code, instance_id=box_id, run_id=key[0], attempt=key[1], pid=pid,
                          pid_started=started, phase=phase))

    def requeue(
        self, key: AttemptKey, box_id: int, group: tuple[int | None, int | None], code: ReasonCode, reason: str,
        phase: AttemptOutcome,
    ) -> None:
        """Requeue attempt ``key`` from ``box_id`` (its process ``group`` there killed first), archived as ``phase``."""
        pid, started = group
        self.out.act(Requeue(reason=reason, code=code, run_id=key[0], attempt=key[1], instance_id=box_id, pid=pid,
                             pid_started=started, phase=phase))


@dataclass
class _LiveEnding(_Ending):
    """``settle_live``'s tally: ``_Ending``, with the attempts it settled, those that go on running per run and the
    runs stopped early."""

    seen: SeenAttempts = field(kw_only=True)
    settled: set[AttemptKey] = field(default_factory=set)
    running: dict[str, list[tuple[int, RunDirState]]] = field(default_factory=dict)
    stopped: set[str] = field(default_factory=set)

    def kill_live(
        self, box_id: int, rd: RunDirState, code: ReasonCode, reason: str, phase: AttemptOutcome = AttemptOutcome.FAILED
    ) -> None:
        self.settled.add((rd.run_id, rd.attempt))
        self.kill((rd.run_id, rd.attempt), box_id, self._group(box_id, rd), code, reason, phase)

    def requeue_live(
        self, box_id: int, rd: RunDirState, code: ReasonCode, reason: str, phase: AttemptOutcome = AttemptOutcome.LOST
    ) -> None:
        self.settled.add((rd.run_id, rd.attempt))
        self.count(rd.run_id, phase)
        self.requeue((rd.run_id, rd.attempt), box_id, self._group(box_id, rd), code, reason, phase)

    def _group(self, box_id: int, rd: RunDirState) -> tuple[int | None, int | None]:
        return recorded_group(self.seen.launch_of(rd), box_id, rd)


def settle_live(
    world: World,
    seen: SeenAttempts,
    destroyed: Mapping[int, str],
    wanted: frozenset[str],
    stops: Mapping[str, EarlyStop] | None = None,
    preempted: frozenset[int] = frozenset(),
) -> tuple[LiveVerdicts, Decisions]:
    """Kill or requeue live attempts that must end; keep one running attempt per run. ``stops`` are the runs the
    sweep's early termination stops (``early_stop.early_stops``): their attempts are killed as stopped early."""
    ending = _LiveEnding(world, seen=seen)
    for box_id in world.boxes:
        gone = destroyed.get(box_id)
        if gone is None:
            _kill_zombies(ending, box_id)
        for rd in seen.live.get(box_id, ()):
            if gone is not None:
                ending.requeue_live(box_id, rd, *destroyed_box_requeue(box_id, gone, preempted))
            elif not _ended_lost(ending, box_id, rd) and not _ended_as_due(ending, box_id, rd, wanted, stops or {}):
                ending.running.setdefault(rd.run_id, []).append((box_id, rd))
    kept, launched_kept = _keep_the_oldest(ending)
    verdicts = LiveVerdicts(
        kept, ending.used, frozenset(ending.settled), launched_kept, frozenset(ending.stopped), ending.took
    )
    return verdicts, ending.out


def _kill_zombies(ending: _LiveEnding, box_id: int) -> None:
    """Kill the attempts on a box (not being destroyed) that are archived already but whose process lives on."""
    for rd in ending.seen.zombies.get(box_id, ()):
        phase = ending.world.archived[(rd.run_id, rd.attempt)].phase.value
        reason = f"attempt already archived as {phase}, but its process is still alive"
        ending.kill_live(box_id, rd, ReasonCode.ARCHIVED_BUT_ALIVE, reason)


def _ended_lost(ending: _LiveEnding, box_id: int, rd: RunDirState) -> bool:
    """Requeue a live attempt that is lost (its wrapper gone without an exit code, or its heartbeat stale); True when
    it was."""
    subj = f"run/{rd.run_id}.{rd.attempt}"
    if not is_live(rd):  # unfinished, and its wrapper is gone
        detail = "wrapper process gone without an exit code"
        ending.requeue_live(box_id, rd, ReasonCode.WRAPPER_GONE, f"lost: {detail}")
        ending.out.drift.append(Drift(DriftClass.JOB_CRASHED, subj, detail, f"requeue {subj}"))
        return True
    stale = heartbeat_stale(ending.world, rd)
    if stale is not None:
        ending.requeue_live(box_id, rd, ReasonCode.HEARTBEAT_STALE, f"lost: {stale}")
        ending.out.drift.append(Drift(DriftClass.JOB_CRASHED, subj, stale, f"requeue {subj}"))
        return True
    return False


def _ended_as_due(
    ending: _LiveEnding, box_id: int, rd: RunDirState, wanted: frozenset[str], stops: Mapping[str, EarlyStop]
) -> bool:
    """End a running attempt whose run is no longer wanted, is stopped early, ran past its max runtime, stalled, or
    whose box's contract ends (moved as preempted); True when it was."""
    world = ending.world
    if rd.run_id not in wanted:
        ending.kill_live(box_id, rd, ReasonCode.NOT_DESIRED, "no longer desired")
        return True
    stop = stops.get(rd.run_id)
    if stop is not None:
        ending.stopped.add(rd.run_id)
        ending.kill_live(box_id, rd, ReasonCode.EARLY_STOPPED, stop.reason, AttemptOutcome.STOPPED_EARLY)
        return True
    spec = world.runs[rd.run_id]
    launched = launched_at(world, ending.seen, rd)
    if world.now - launched > spec.sweep.max_runtime_s:
        ending.count(rd.run_id, AttemptOutcome.FAILED)
        reason = (
            f"exceeded max runtime {fmt_duration(spec.sweep.max_runtime_s)} "
            f"(running for {fmt_duration(world.now - launched)})"
        )
        ending.kill_live(box_id, rd, ReasonCode.MAX_RUNTIME, reason)
        return True
    stalled = stall_of(world, rd, spec, launched)
    if stalled is not None:
        ending.count(rd.run_id, AttemptOutcome.FAILED)
        ending.kill_live(box_id, rd, ReasonCode.STALLED, f"stalled: {stalled}")
        subj = f"run/{rd.run_id}.{rd.attempt}"
        ending.out.drift.append(Drift(DriftClass.STALLED, subj, stalled, f"kill {subj}"))
        return True
    box = world.boxes[box_id]
    if contract_ending(world, box) and not contract_pull_due(world, box, rd):
        # moved before the host takes the box back: requeued as preempted (no retry spent; apply kills it and
        # harvests what it wrote), its checkpoint (pulled inside the margin by bookkeeping, and again by the
        # harvest) is what its next attempt resumes from
        why = _ending_text(world, box, spec)
        ending.requeue_live(box_id, rd, ReasonCode.CONTRACT_ENDING, why, AttemptOutcome.PREEMPTED)
        return True
    return False


def _keep_the_oldest(ending: _LiveEnding) -> tuple[dict[str, tuple[int, RunDirState]], dict[str, float]]:
    """Per run, the attempt kept running (the oldest) and when it was launched; the others are killed as duplicates
    (a duplicate daemon once launched the same seed twice)."""
    world, seen = ending.world, ending.seen
    kept: dict[str, tuple[int, RunDirState]] = {}
    launched_kept: dict[str, float] = {}
    for run_id in sorted(ending.running):
        group = sorted(ending.running[run_id], key=lambda t: (t[1].attempt, t[0]))
        keep_box, keep_rd = group[0]
        for box_id, rd in group[1:]:
            reason = f"duplicate: attempt {keep_rd.attempt} of this run is already running on instance/{keep_box}"
            ending.kill_live(box_id, rd, ReasonCode.DUPLICATE_ATTEMPT, reason)
        kept[run_id] = (keep_box, keep_rd)
        launched_kept[run_id] = launched_at(world, seen, keep_rd)
        _note_running(ending.out, world, keep_box, keep_rd, launched_kept[run_id])
    return kept, launched_kept


def _note_running(out: Decisions, world: World, box_id: int, rd: RunDirState, launched: float) -> None:
    """The no-op of an attempt kept running: how long it has run of its max, on which GPUs, its heartbeat."""
    spec = world.runs[rd.run_id]
    ran = fmt_duration(world.now - launched)
    beat = fmt_duration(rd.heartbeat_age_s) + " ago" if rd.heartbeat_age_s is not None else "not yet"
    out.noop(
        f"run/{rd.run_id}.{rd.attempt}@{box_id}",
        ReasonCode.RUNNING,
        f"running for {ran} of max {fmt_duration(spec.sweep.max_runtime_s)} on {gpus_text(rd.gpu_mask)}; "
        f"heartbeat {beat}",
    )


def _ending_text(world: World, box: OwnedBox, spec: RunSpec) -> str:
    left = contract.time_left(box.inst, world.now, world.observed.memory.accepted_increases) or 0.0
    margin = fmt_duration(world.desired.fleet.contract_margin_s)
    resume = "from its checkpoint" if spec.sweep.checkpoint is not None and world.controller.harvesting else "afresh"
    return (
        f"its box's contract ends in {fmt_duration(left)} (contract_margin {margin}): preempted before the host takes "
        f"it back, resumed elsewhere {resume}; no retry spent"
    )


def launched_at(world: World, seen: SeenAttempts, rd: RunDirState) -> float:
    """When this fleet launched a live attempt of ours, on the controller's clock: the runtime limits count from
    it, never from the ``started_at`` the box reports (a box's clock may be anywhere). An entry that does not know
    (an old runs.yaml without ``launched_at``) counts from its box's start as the provider lists it: the attempt
    cannot be older. An attempt given to a box's queue started when its slot freed, which only the box can say: its
    reported start counts, clamped between the queueing and the first cycle this controller saw it started
    (``InFlight.seen_started_at``): it cannot have started before it was queued or after it was seen running, so a
    box whose clock runs ten days ahead cannot keep its attempt young."""
    fl = seen.launch_of(rd)
    assert fl is not None, "collect_attempts keeps only attempts in flight as ours"
    if fl.launched_at > 0 and fl.queued and rd.started_at is not None:
        seen_by = fl.seen_started_at if fl.seen_started_at is not None else world.now
        return min(world.now, seen_by, max(fl.launched_at, rd.started_at))
    if fl.launched_at > 0:
        return fl.launched_at
    box = world.boxes.get(fl.instance_id)
    return box.inst.start_date if box is not None and box.inst.start_date > 0 else world.now


def heartbeat_stale(world: World, rd: RunDirState) -> str | None:
    """Why a live attempt's heartbeat is stale, or None: the age the box reports (clamped at 0) is past
    ``heartbeat_stale``, or its heartbeat has not moved on the controller's clock for that long
    (``FleetMemory.heartbeats``: a frozen heartbeat, or one from the future, stales so)."""
    limit = world.desired.fleet.heartbeat_stale_s
    hb = rd.heartbeat_age_s
    if hb is None:
        return None
    age = max(0.0, hb)
    if age > limit:
        return f"heartbeat {fmt_duration(age)} old > heartbeat_stale {fmt_duration(limit)}"
    for beat in world.observed.memory.heartbeats:
        if beat.key == (rd.run_id, rd.attempt) and world.now - beat.since > limit:
            return (
                f"heartbeat unchanged for {fmt_duration(world.now - beat.since)} on the controller's clock > "
                f"heartbeat_stale {fmt_duration(limit)}"
            )
    return None


def stall_of(world: World, rd: RunDirState, spec: RunSpec, launched: float) -> str | None:
    """Why a live attempt is stalled (its sweep's ``stall_timeout`` passed with no metric progress, or with its GPUs
    under ``stall_gpu_util`` all along, or its progress crawling), or None. No metrics file yet counts from the
    attempt's launch.

    Crawling: the sweep has a progress key, the attempt (not resumed) has worked longer than ``stall_timeout``
    (since its box started it, at most since its launch), and its progress over that whole time is under
    ``throughput.STALL_RATE_FLOOR`` (10%) of the rate learned from the archive for its box (that machine, that GPU
    model, or the nearest measured model scaled by DLPerf; the live attempts are not counted, so a slow attempt
    cannot lower its own bar)."""
    limit = spec.sweep.stall_timeout_s
    if limit is None:
        return None
    now = world.now
    ran = now - launched
    quiet = min(ran, max(0.0, rd.metrics_age_s)) if rd.metrics_age_s is not None else ran
    if quiet > limit:
        file = spec.sweep.metrics_file
        what = f"{file} unchanged for" if rd.metrics_age_s is not None else f"no {file} in"
        return f"no metric progress: {what} {fmt_duration(quiet)} > stall_timeout {fmt_duration(limit)}"
    worked = min(ran, now - rd.started_at) if rd.started_at is not None else ran  # a queued attempt waited first
    done = progress_value(spec.sweep, rd.last_metrics) if worked > limit else None
    box = None
    if done is not None:
        box = next((b for b in world.boxes.values() if b.probe and any(r is rd for r in b.probe.runs)), None)
    key = (rd.run_id, rd.attempt)
    if done is not None and box is not None and not any(
        f.resumed_from is not None for f in world.observed.memory.in_flight if (f.run_id, f.attempt) == key
    ):
        gpu = normalize_gpu_name(box.inst.gpu_name)
        learned = predict(world.learned, spec.sweep.name, gpu, box.inst.machine_id, world.gpu_dlperf)
        if learned.per_s is not None and done / worked < STALL_RATE_FLOOR * learned.per_s:
            return (
                f"progress {done / worked:.4g}/s over {fmt_duration(worked)} is under {STALL_RATE_FLOOR:.0%} of the "
                f"learned {learned.per_s:.4g}/s ({learned.source.value}: {learned.basis})"
            )
    for clock in world.observed.memory.gpu_quiet:
        if clock.key == key and now - clock.since > limit:
            return (
                f"GPU utilization under {spec.sweep.stall_gpu_util_pct:g}% for {fmt_duration(now - clock.since)} > "
                f"stall_timeout {fmt_duration(limit)} while its process lives"
            )
    return None


@dataclass
class _InFlightEnding(_Ending):
    """``settle_in_flight``'s tally: ``_Ending``, with the runs that count as running (``waiting``), the runs whose
    lost attempt may still run (``unverified``) and the queued attempt kept per run."""

    waiting: set[str] = field(default_factory=set)
    unverified: dict[str, str] = field(default_factory=dict)
    queued_kept: dict[str, InFlight] = field(default_factory=dict)

    def kill_queued(self, fl: InFlight, code: ReasonCode, reason: str) -> None:
        """Kill a queued attempt no box started: not started, no process group yet, kill.sh tombstones the entry;
        archived as never started (``runphase.never_ran``), it spends no retry."""
        self.kill((fl.run_id, fl.attempt), fl.instance_id, (None, None), code, reason)

    def requeue_flight(
        self, fl: InFlight, code: ReasonCode, reason: str, phase: AttemptOutcome = AttemptOutcome.LOST
    ) -> None:
        if not fl.queued:  # a queued attempt no box showed started never ran (``runphase.never_ran``)
            self.count(fl.run_id, phase)
        self.requeue((fl.run_id, fl.attempt), fl.instance_id, recorded_group(fl, fl.instance_id), code, reason, phase)


def settle_in_flight(
    world: World,
    seen: SeenAttempts,
    settled: frozenset[AttemptKey],
    destroyed: Mapping[int, str],
    box_states: Mapping[int, str],
    *,
    wanted: frozenset[str],
    running: Mapping[str, tuple[int, RunDirState]] | None = None,
    over_budget: str | None = None,
    preempted: frozenset[int] = frozenset(),
) -> tuple[InFlightVerdicts, Decisions]:
    """Attempts rigsync launched that no reachable box shows and the archive does not know.

    One that waits in its box's queue (``runphase.is_queued``) is in flight and counts as running, unless its run is
    no longer wanted (``NOT_DESIRED``), another attempt of its run already runs or waits ahead of it
    (``DUPLICATE_ATTEMPT``), or the budget binds (``over_budget``, its verdict): nothing queued may start once the
    headroom is gone (``QUEUE_OVER_BUDGET``). Those are killed, which tombstones the entry on the box (its launch
    lock taken, so the box never starts it)."""
    ending = _InFlightEnding(world)
    for fl in sorted(unseen_in_flight(world, seen), key=lambda x: (x.run_id, x.attempt, x.instance_id)):
        if (fl.run_id, fl.attempt) in settled:
            continue
        box = world.boxes.get(fl.instance_id)
        if box is None:
            _lost_with_its_box(ending, fl)
        elif fl.instance_id in destroyed:
            _requeue_from_destroyed(ending, fl, box, destroyed[fl.instance_id], preempted)
        elif box.reachable and is_queued(fl, box.probe):
            _settle_queued(ending, fl, box, wanted, running or {}, over_budget)
        elif not may_still_hold(fl, box.probe):
            reason = f"launch never happened: no run dir on instance/{fl.instance_id}"
            ending.requeue_flight(fl, ReasonCode.LAUNCH_NEVER_HAPPENED, reason)
        else:
            _wait_for(ending, fl, box, box_states)
    verdicts = InFlightVerdicts(
        frozenset(ending.waiting), ending.used, ending.unverified, tuple(ending.queued_kept.values()), ending.took
    )
    return verdicts, ending.out


def _lost_with_its_box(ending: _InFlightEnding, fl: InFlight) -> None:
    """Requeue an attempt whose box is no longer listed as ours (vanished, or its label gone); one on a box still
    listed may still run, so its run waits (``unverified``)."""
    subj_inst = f"instance/{fl.instance_id}"
    listed = fl.instance_id in ending.world.listed_ids
    why = "no longer carries our label" if listed else "vanished"
    ending.requeue_flight(fl, ReasonCode.BOX_VANISHED, f"box {subj_inst} {why}")
    if listed:
        ending.unverified[fl.run_id] = f"attempt {fl.attempt} was lost on {subj_inst}, still listed but not ours"
    ending.out.drift.append(
        Drift(
            DriftClass.DESTROYED_BY_HAND,
            subj_inst,
            f"owned box running run/{fl.run_id}.{fl.attempt} is no longer listed as ours",
            f"requeue run/{fl.run_id}.{fl.attempt}",
        )
    )


def _requeue_from_destroyed(
    ending: _InFlightEnding, fl: InFlight, box: OwnedBox, gone: str, preempted: frozenset[int]
) -> None:
    """Requeue an attempt of a box this plan destroys (as preempted when the provider took it); when the box cannot
    be checked, the attempt may still run, so its run waits (``unverified``)."""
    code, reason, phase = destroyed_box_requeue(fl.instance_id, gone, preempted)
    ending.requeue_flight(fl, code, reason, phase)
    if not box.reachable:
        how = "preempted" if phase is AttemptOutcome.PREEMPTED else "lost"
        ending.unverified[fl.run_id] = f"attempt {fl.attempt} was {how} on {box.subject}, which cannot be checked"


def _settle_queued(
    ending: _InFlightEnding,
    fl: InFlight,
    box: OwnedBox,
    wanted: frozenset[str],
    running: Mapping[str, tuple[int, RunDirState]],
    over_budget: str | None,
) -> None:
    """Keep an attempt waiting in a reachable box's queue, or kill it (tombstoned): its run no longer wanted, an
    attempt of its run already running or queued ahead, the budget binding, or its box's contract ending."""
    world = ending.world
    ahead = running.get(fl.run_id)
    first = ending.queued_kept.get(fl.run_id)
    if fl.run_id not in wanted:
        ending.kill_queued(fl, ReasonCode.NOT_DESIRED, "no longer desired (queued, not started)")
    elif ahead is not None:
        where = f"attempt {ahead[1].attempt} of this run is already running on instance/{ahead[0]}"
        ending.kill_queued(fl, ReasonCode.DUPLICATE_ATTEMPT, f"duplicate: {where}")
    elif first is not None:
        where = f"attempt {first.attempt} of this run is already queued on instance/{first.instance_id}"
        ending.kill_queued(fl, ReasonCode.DUPLICATE_ATTEMPT, f"duplicate: {where}")
    elif over_budget is not None:
        ending.kill_queued(fl, ReasonCode.QUEUE_OVER_BUDGET, f"queued, not started: {over_budget}")
    elif contract_ending(world, box):
        left = contract.time_left(box.inst, world.now, world.observed.memory.accepted_increases) or 0.0
        ending.kill_queued(
            fl,
            ReasonCode.CONTRACT_ENDING,
            f"queued, not started: its box's contract ends in {fmt_duration(left)} (contract_margin "
            f"{fmt_duration(world.desired.fleet.contract_margin_s)}); it launches elsewhere",
        )
    else:
        ending.queued_kept[fl.run_id] = fl
        ending.waiting.add(fl.run_id)
        ending.out.noop(
            f"run/{fl.run_id}.{fl.attempt}@{fl.instance_id}",
            ReasonCode.QUEUED,
            f"queued on {box.subject} {gpus_text(fl.gpu_mask)}, behind the slot's current attempt",
        )


def _wait_for(ending: _InFlightEnding, fl: InFlight, box: OwnedBox, box_states: Mapping[int, str]) -> None:
    """An attempt its box may still hold (it cannot be checked, or left run directories out of its answer): its run
    counts as running, and the plan waits."""
    ending.waiting.add(fl.run_id)
    if box.probe is not None and box.reachable:
        why = (
            f"not among the run directories {box.subject} listed, and it left {box.probe.runs_omitted} out of its "
            "answer; waiting"
        )
    else:
        why = f"launched on {box.subject} which cannot be checked now ({box_states.get(fl.instance_id, '')}); waiting"
    ending.out.noop(f"run/{fl.run_id}.{fl.attempt}@{fl.instance_id}", ReasonCode.UNCHECKABLE, why)


def unverified_lost(world: World, in_flight: InFlightVerdicts) -> dict[str, str]:
    """Runs whose lost attempt may still be running: its box is still listed and cannot be checked.

    A lost attempt is requeued at once, but its next attempt waits while the box that had it is listed and
    does not answer: a hung box that comes back (or a launch still on its way to it) would run both attempts
    at once. A box that answers is safe (apply kills the attempt, or fences a launch that never came, before
    the requeue counts); a box no longer listed is gone. The run launches again once either is true.
    """
    held = dict(in_flight.unverified)
    for run_id, records in world.history.items():
        if run_id in held:
            continue
        for rec in records:
            if rec.phase not in (AttemptOutcome.LOST, AttemptOutcome.PREEMPTED):
                continue
            box = world.boxes.get(rec.instance_id)
            if box is not None and not box.reachable:
                held[run_id] = f"attempt {rec.attempt} was lost on {box.subject}, still listed and cannot be checked"
                break
    return held


def plan_tallies(world: World, recorded: Recorded, live: Iterable[str]) -> dict[str, RunTally]:
    """Run id -> tally from the archive plus what this plan records, with ``live`` runs marked live."""
    tallies = tally_runs(world.observed.history, live)
    for run_id, done in recorded.outcomes.items():
        for outcome, _metric in done:
            tallies[run_id] = tallies.get(run_id, UNTOUCHED).with_outcome(outcome)
    return tallies


def run_queue(
    world: World,
    seen: SeenAttempts,
    recorded: Recorded,
    wanted: frozenset[str],
    live: LiveVerdicts,
    in_flight: InFlightVerdicts,
    unverified: Mapping[str, str],
) -> tuple[RunQueue, Decisions]:
    """Every wanted run through the one phase rule: launchable ones queue in launch order (or are held while a
    lost attempt of theirs may still run, ``unverified_lost``), blocked ones say so."""
    out = Decisions()
    held: list[PendingRun] = []
    tallies = plan_tallies(world, recorded, (*live.running, *in_flight.waiting))
    for used in (live.used, in_flight.used):
        for run_id, n in used.items():
            t = tallies.get(run_id, UNTOUCHED)
            tallies[run_id] = t._replace(used=t.used + n)
    for took in (live.preempted, in_flight.preempted):
        for run_id, n in took.items():
            t = tallies.get(run_id, UNTOUCHED)
            tallies[run_id] = t._replace(preempted=t.preempted + n)
    for run_id in live.stopped:
        tallies[run_id] = tallies.get(run_id, UNTOUCHED).with_outcome(AttemptOutcome.STOPPED_EARLY)
    # Launch order is priority, then sweep order, then desired order: runs are visited in desired order and
    # dropped into one bucket per (priority, sweep order), so no per-run sort key is built.
    buckets: dict[tuple[int, int], list[PendingRun]] = {}
    fresh: dict[int, RunPhase] = {}  # run_phase of a run with no attempts, per retries (it reads nothing else)
    max_attempt = seen.max_attempt
    new_run = tuple.__new__  # NamedTuple's own __new__ is one more Python call per run
    by_sweep: dict[str, int] = {}
    for run_id, spec in world.runs.items():
        if run_id not in wanted:
            continue
        tally = tallies.get(run_id)
        if tally is None:
            phase = fresh.get(spec.sweep.retries)
            if phase is None:
                phase = fresh[spec.sweep.retries] = run_phase(spec, UNTOUCHED)
            tally = UNTOUCHED
        else:
            phase = run_phase(spec, tally)
        if phase in LAUNCHABLE_PHASES:
            gpus = spec.sweep.gpus_per_run if spec.sweep.gpus_per_run > 1 else 1
            ram = spec.sweep.min_gpu_ram_mib
            run = new_run(PendingRun, (spec, gpus, ram, tally.used, max_attempt.get(run_id, 0) + 1))
            by_sweep[spec.sweep.name] = by_sweep.get(spec.sweep.name, 0) + 1
            doubt = unverified.get(run_id) if unverified else None
            if doubt is not None:
                held.append(run)
                out.noop(f"run/{run_id}", ReasonCode.LOST_ATTEMPT_UNVERIFIED, f"not launched again yet: {doubt}")
                continue
            key = (-spec.sweep.priority, spec.sweep.order)
            bucket = buckets.get(key)
            if bucket is None:
                buckets[key] = [run]
            else:
                bucket.append(run)
        elif phase is RunPhase.BLOCKED and preemptions_exhausted(spec, tally):
            out.noop(
                f"run/{run_id}",
                ReasonCode.PREEMPTIONS_EXHAUSTED,
                f"blocked: preempted {tally.preempted} time(s), more than max_preemptions "
                f"{spec.sweep.max_preemptions}; no more launches",
            )
        elif phase is RunPhase.BLOCKED:
            out.noop(
                f"run/{run_id}",
                ReasonCode.BLOCKED,
                f"blocked: {tally.used} of {allowed_attempts(spec)} allowed attempt(s) failed or lost; "
                "no more launches",
            )
    pending = [run for key in sorted(buckets) for run in buckets[key]]
    live_work = bool(live.running) or bool(in_flight.waiting) or bool(held)
    return RunQueue(tuple(pending), live_work, by_sweep, tuple(held), live.running, in_flight.queued), out
