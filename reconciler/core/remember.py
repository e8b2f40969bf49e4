"""remember(): what one cycle hands to the next, decided in one pure place.

The state kept between cycles (``FleetMemory``: the box clocks, the attempts in flight, the spend with each box's
last bill, the host ledger, the process's clocks) is made new by one function only, ``remember(memory, learned)``,
a pure function of what was learned (no I/O, no clock: the time a thing was learned is part of it), so every change
to it is tested without a provider, a box or a repository. What can be learned is a small closed set:

- ``Observation``: the world was observed (first seen, unreachable since, bootstrap since, the GPU-quiet and
  heartbeat clocks, the rung values, the billed spend). It runs before ``plan()``, which reads these clocks.
- ``Applied``: a plan was applied (the attempts in flight, the bills closed in the archive, the host ledger, the
  checkpoints pulled, the actions that failed). The loop learns it once per cycle, after apply.
- ``StoreSyncs``: the result store's last checkpoint sync of running attempts this process has not pulled itself.
- ``Restored``: what a start-up reads back from the observed files and the launch journal.

``world_after_apply`` is the snapshot as the next cycle will start from it (the one written under observed/).

The money an archive line carries is accounted here too, beside the spend it comes from: what an attempt cost
(``attempt_cost``, at most what its box was billed: ``capped_to_bill``) and a closed box's overhead line
(``overhead_record``). Apply gathers the facts and writes the lines; the sums are these.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from reconciler.core.actions import AnswerPriceIncrease, ApplyResult, Bootstrap, Kill, Launch, Requeue, ShipCode
from reconciler.core.bounds import bounded_text, finite
from reconciler.core.identity import slot_pool
from reconciler.core.ledger import RENT_WINDOW_S, note_cycle
from reconciler.core.model import (
    AttemptRecord,
    BoxMemory,
    BoxProbe,
    BoxSpend,
    CheckpointPull,
    Desired,
    DistrustedBox,
    FailedAction,
    Fleet,
    FleetMemory,
    GpuQuiet,
    HeartbeatClock,
    HostLedger,
    InFlight,
    Instance,
    InstanceStatus,
    Observed,
    OverheadRecord,
    PriceIncrease,
    RentMade,
    RungValue,
    Spend,
    owned_by,
)
from reconciler.core.runphase import launched_by_box
from reconciler.core.throughput import progress_value

_FLOAT_SLACK_USD = 1e-9


@dataclass(frozen=True)
class Observation:
    """What one observation learned (``observe``): ``mine`` are the owned boxes listed (the lab's own machines
    included), ``billed_boxes`` those the provider bills, ``billed`` what it billed each so far (None: it could not
    say), ``probes`` the boxes' answers, per box (or the fleet's) the bootstrap hash its pool asks for, and
    ``unlisted`` the held boxes the list did not show (probed all the same: those ``still_held`` stay held)."""

    desired: Desired
    mine: tuple[Instance, ...]
    billed_boxes: tuple[Instance, ...]
    probes: tuple[BoxProbe, ...]
    billed: Mapping[int, float] | None
    at: float  # when it was observed (the controller's clock)
    bootstrap_hash: str | Mapping[int, str] = ""
    unlisted: tuple[Instance, ...] = ()


@dataclass(frozen=True)
class Applied:
    """A plan applied to the world ``observed`` showed: its outcomes (``result``), known at ``at``; ``fleet`` gives
    the ledger's windows."""

    observed: Observed
    result: ApplyResult
    fleet: Fleet
    at: float


@dataclass(frozen=True)
class StoreSyncs:
    """The result store's last complete checkpoint sync of running attempts of ours this process has not pulled yet
    (after a restart the store says what was pulled before)."""

    pulls: tuple[CheckpointPull, ...]


@dataclass(frozen=True)
class Restored:
    """What a start-up reads back: the parts of the memory the observed files keep (``observed.memory``), and the
    launches the launch journal kept that a crash left out of them (``journal``), less the attempts the archive has
    (``archived``)."""

    boxes: tuple[BoxMemory, ...] = ()
    in_flight: tuple[InFlight, ...] = ()
    spend: Spend = field(default_factory=Spend)
    spend_at: float | None = None
    hosts: HostLedger = field(default_factory=HostLedger)
    rungs: tuple[RungValue, ...] = ()
    accepted_increases: tuple[PriceIncrease, ...] = ()
    journal: tuple[InFlight, ...] = ()
    archived: frozenset[tuple[str, int]] = frozenset()


Learned = Observation | Applied | StoreSyncs | Restored

NO_MEMORY = FleetMemory()  # what a controller knows before it has read or seen anything


def remember(memory: FleetMemory, learned: Learned) -> FleetMemory:
    """The memory after learning ``learned``: the one function that makes a new ``FleetMemory``."""
    match learned:
        case Observation():
            return _observed(memory, learned)
        case Applied():
            return _applied(memory, learned)
        case StoreSyncs():
            known = {p.key for p in memory.checkpoint_pulls}
            fresh = (p for p in learned.pulls if p.key not in known)  # this process's own pull is the newer
            return replace(memory, checkpoint_pulls=tuple(sorted((*memory.checkpoint_pulls, *fresh))))
        case Restored():
            return replace(
                memory,
                boxes=learned.boxes,
                in_flight=merge_in_flight(learned.in_flight, learned.journal, learned.archived),
                spend=learned.spend,
                spend_at=learned.spend_at,
                hosts=learned.hosts,
                rungs=learned.rungs,
                accepted_increases=learned.accepted_increases,
            )


def answered(probe: BoxProbe | None) -> bool:
    """The box answered its probe this cycle, with this fleet's identity on it (its pinned host key)."""
    return probe is not None and probe.reachable and not probe.host_key_changed


def still_held(unlisted: Iterable[Instance], probes: Iterable[BoxProbe]) -> tuple[Instance, ...]:
    """The held boxes the provider's list does not show that this fleet still holds: those that answered their probe
    this cycle with this fleet's identity (``answered``: the pinned host key). A box missing from the list that is
    silent, or answers with another key (its address may be another rental's now), has vanished, as before: a
    silent box that is listed is the one unreachable_grace waits for."""
    by_id = {p.instance_id: p for p in probes}
    return tuple(sorted((i for i in unlisted if answered(by_id.get(i.id))), key=lambda i: i.id))


def _observed(memory: FleetMemory, seen: Observation) -> FleetMemory:
    """The memory brought up to one observation: the box clocks, the billed spend, the GPU-quiet and heartbeat
    clocks, the rung values, the boxes held and the rents seen; distrust and accepted increases of boxes no longer
    held go. A held box the list dropped that still answers (``still_held``) is kept as if listed: its clocks run,
    its bill stays open."""
    desired, probes, now = seen.desired, list(seen.probes), seen.at
    kept = still_held(seen.unlisted, probes)
    mine = [*seen.mine, *kept]
    pools = {i.id: slot_pool(desired.fleet, o.slot) for i in mine if (o := owned_by(desired.fleet.name, i.label))}
    open_bills = frozenset(b.instance_id for b in memory.spend.boxes)
    boxes = update_box_memory(
        memory.boxes, mine, probes, now, seen.bootstrap_hash, pools=pools, open_bills=open_bills
    )
    billed = dict(seen.billed) if seen.billed is not None else None
    billing = [*seen.billed_boxes, *kept]
    spend = accrue_billed(memory.spend, memory.spend_at, billing, billed, memory.in_flight, now)
    listed = {i.id for i in mine}
    return replace(
        memory,
        boxes=boxes,
        spend=spend,
        spend_at=now,
        gpu_quiet=track_gpu_quiet(memory.gpu_quiet, desired, memory.in_flight, probes, now),
        heartbeats=track_heartbeats(memory.heartbeats, memory.in_flight, probes, now),
        distrusted=tuple(d for d in memory.distrusted if d.instance_id in listed),
        rungs=track_rungs(memory.rungs, desired, memory.in_flight, probes),
        accepted_increases=tuple(p for p in memory.accepted_increases if p.instance_id in listed),
        held=tuple(i for i in sorted(mine, key=lambda i: i.id) if i.id > 0),  # the lab's own machines are not held
        rents=seen_rents(memory.rents, {i.id for i in (*seen.billed_boxes, *kept)}, now),
    )


def seen_rents(rents: Iterable[RentMade], seen: Container[int], now: float) -> tuple[RentMade, ...]:
    """The last hour's rents, each marked seen once its box is listed or answers (``seen``)."""
    return tuple(
        replace(r, seen=r.seen or r.instance_id in seen) for r in sorted(rents) if now - r.at < RENT_WINDOW_S
    )


def made_rents(rents: tuple[RentMade, ...], fleet: Fleet, result: ApplyResult, now: float) -> tuple[RentMade, ...]:
    """``rents`` with the rents an apply made (``ApplyResult.rented_as``), each with its pool (its label's)."""
    made = [
        RentMade(iid, now, slot_pool(fleet, o.slot) if (o := owned_by(fleet.name, rent.label)) else "")
        for iid, rent in sorted(result.rented_as.items())
    ]
    return tuple(sorted((*rents, *made)))


def _applied(memory: FleetMemory, applied: Applied) -> FleetMemory:
    """The memory after a plan was applied to the world ``applied.observed`` showed, starting from ``memory`` (the
    memory the cycle planned from: ``observed.memory``).

    What it takes of the plan comes through the outcomes of its actions (each outcome names its action): a launch
    that happened, a bill closed, a rent that failed; an action that was skipped (lease lost, shutting down) left
    nothing to remember, and the next cycle plans it again."""
    observed, result, now = applied.observed, applied.result, applied.at
    in_flight = next_in_flight(memory.in_flight, observed, result, now)
    done = [(o.action, o.ok, o.detail) for o in result.outcomes if not o.skipped]
    pulled = (CheckpointPull(r, a, at) for (r, a), at in result.checkpoint_pulls.items())
    failed, distrusted = note_failures(memory.distrusted, result, now, memory.failed_actions)
    return replace(
        memory,
        in_flight=in_flight,
        spend=close_bills(memory.spend, (o.instance_id for o in result.overheads)),
        hosts=note_cycle(memory.hosts, applied.fleet, observed, done, result.archived, now),
        checkpoint_pulls=note_checkpoint_pulls(memory.checkpoint_pulls, pulled, in_flight),
        failed_actions=failed,
        distrusted=distrusted,
        accepted_increases=note_accepted(memory.accepted_increases, observed.price_increases, result),
        held=tuple(i for i in memory.held if i.id not in set(result.destroyed)),
        rents=made_rents(memory.rents, applied.fleet, result, now),
    )


def merge_in_flight(
    in_flight: tuple[InFlight, ...], journal: Iterable[InFlight], archived: Container[tuple[str, int]]
) -> tuple[InFlight, ...]:
    """``in_flight`` plus the journal's attempts it lacks that the archive does not know either."""
    known = {(f.run_id, f.attempt) for f in in_flight}
    extra = {
        (f.run_id, f.attempt): f
        for f in journal
        if (f.run_id, f.attempt) not in known and (f.run_id, f.attempt) not in archived
    }
    if not extra:
        return in_flight
    return tuple(sorted((*in_flight, *extra.values()), key=lambda f: (f.run_id, f.attempt)))


def note_accepted(
    accepted: tuple[PriceIncrease, ...], pending: Iterable[PriceIncrease], applied: ApplyResult
) -> tuple[PriceIncrease, ...]:
    """The accepted increases after apply: each one the provider took an accept of (an outcome ``accepted``; not
    one that was gone) joins, as it was listed (its new rate, when it applies, the extended end). Kept by id until
    its box leaves the instance list (an ``Observation``)."""
    listed = {p.id: p for p in pending}
    out = {p.id: p for p in accepted}
    for o in applied.outcomes:
        a = o.action
        if isinstance(a, AnswerPriceIncrease) and a.accept and o.ok and not o.skipped and o.detail == "accepted":
            inc = listed.get(a.pending_id)
            out[a.pending_id] = inc if inc is not None else PriceIncrease(
                a.pending_id, a.instance_id, a.old_dph, a.new_dph, a.applies_at
            )
    return tuple(out[k] for k in sorted(out))


def note_failures(
    distrusted: tuple[DistrustedBox, ...],
    applied: ApplyResult,
    now: float,
    before: tuple[FailedAction, ...] = (),
) -> tuple[tuple[FailedAction, ...], tuple[DistrustedBox, ...]]:
    """The actions that failed in this apply, (kind, target, error), so the next plan does not send them the same
    way again; and the boxes distrusted from now on: one whose kill (or requeue, which kills) failed cannot be made
    to end an attempt, so it is not asked again: it waits out unreachable_grace like a box with an unusable probe,
    then goes, its attempts requeued. Work of one kind (ship code, bootstrap, launch) that fails on a box that
    answered, as work of that kind failed there in the cycle ``before`` (one failure may be a passing fault),
    distrusts the box too: no such failure comes a third time. A box that did not answer is left to the
    unreachable rule."""
    failed = tuple(
        sorted({FailedAction(o.action.kind.value, o.action.target, bounded_text(o.detail)) for o in applied.failures})
    )
    failed_before = {(f.kind, _box_of(f.target)) for f in before if not f.error.startswith(_NOT_THE_BOX)}
    known = {d.instance_id: d for d in distrusted}
    for o in applied.failures:
        act = o.action
        if not isinstance(act, Kill | Requeue | ShipCode | Bootstrap | Launch) or act.instance_id in known:
            continue
        # a requeue from a box that answered kills there first: its failure is a failed kill too
        if isinstance(act, Kill | Requeue) or (
            (act.kind.value, str(act.instance_id)) in failed_before and not o.detail.startswith(_NOT_THE_BOX)
        ):
            why = bounded_text(f"{act.kind.value} {act.target} failed: {o.detail}")
            known[act.instance_id] = DistrustedBox(act.instance_id, now, why)
    return failed, tuple(sorted(known.values()))


# failures that say nothing against the box: it did not answer (the unreachable rule decides), a launch fenced by its
# own lock, the controller's own launch journal
_NOT_THE_BOX = ("HostUnreachable", "HostKeyMismatch", "LaunchLockHeld", "LaunchJournalError")


def _box_of(target: str) -> str:
    """The instance id an action's target names (``instance/7``, ``run/r.2@7``)."""
    return target.rpartition("@")[2] if "@" in target else target.removeprefix("instance/")


def note_checkpoint_pulls(
    previous: Iterable[CheckpointPull], pulled: Iterable[CheckpointPull], in_flight: Iterable[InFlight]
) -> tuple[CheckpointPull, ...]:
    """When each attempt still in flight last had its checkpoint pulled: the ``pulled`` over the earlier ones."""
    last = {p.key: p for p in previous}
    last.update((p.key, p) for p in pulled)
    flying = {(f.run_id, f.attempt) for f in in_flight}
    return tuple(sorted(p for key, p in last.items() if key in flying))


def attempt_cost(dph: float, num_gpus: int, gpu_mask: tuple[int, ...], started: float | None, ended: float) -> float:
    """An attempt's share of its box's billed rate over its run time: the GPUs it held out of the box's (the rest
    of the box's bill goes to the box's overhead line when the box ends)."""
    share = min(1.0, len(gpu_mask) / num_gpus) if num_gpus and gpu_mask else 1.0
    return round(dph * share * max(0.0, ended - started) / 3600.0 if started else 0.0, 6)


class RunningAttempt(Protocol):
    """An attempt in flight as the running cost reads it (``InFlight``, or one read back from runs.yaml)."""

    @property
    def instance_id(self) -> int: ...
    @property
    def gpu_mask(self) -> tuple[int, ...]: ...
    @property
    def launched_at(self) -> float | None: ...
    @property
    def queued(self) -> bool: ...


def running_cost(box_id: int, dph: float, num_gpus: int, attempts: Iterable[RunningAttempt], now: float) -> float:
    """What the attempts running on box ``box_id`` have cost up to ``now``: each its share from its launch
    (``attempt_cost``). One still queued for its slot, or launched after ``now`` (clocks differ), costs nothing yet."""
    return sum(
        (
            attempt_cost(dph, num_gpus, a.gpu_mask, a.launched_at, now)
            for a in attempts
            if a.instance_id == box_id and not a.queued and a.launched_at is not None and a.launched_at <= now
        ),
        0.0,
    )


_BILLING_FULL = (InstanceStatus.CREATED, InstanceStatus.LOADING, InstanceStatus.RUNNING)


def capped_to_bill(
    rec: AttemptRecord, box: BoxSpend | None, listed: Instance | None, prior: Iterable[AttemptRecord], now: float
) -> AttemptRecord:
    """An attempt never costs more than its box was billed, less what the box's earlier attempts (``prior``) cost.

    A lost attempt's end is known only when it is noticed, by which time a vanished box may have billed storage
    only for a while: without the cap, its run would be charged money the box never billed (and the box's
    overhead line would go negative).
    """
    if box is None:
        return rec
    bill = box.usd
    if listed is not None and listed.status in _BILLING_FULL:  # still billing its price since the bill was read
        bill += listed.dph_total * max(0.0, now - box.at) / 3600.0
    spent = sum(r.cost_usd for r in prior if r.instance_id == rec.instance_id)
    cap = round(max(0.0, bill - spent), 6)
    return replace(rec, cost_usd=cap) if rec.cost_usd > cap else rec


def overhead_record(
    box: BoxSpend, records: Iterable[AttemptRecord], memory: BoxMemory | None = None
) -> OverheadRecord:
    """A closed box's overhead line: its bill minus the costs of the attempts archived on it (``records``), with
    when it first answered and was first ready (``memory``, the box's, kept while its bill was open)."""
    ran = [r for r in records if r.instance_id == box.instance_id]
    attempts_usd = round(sum(r.cost_usd for r in ran), 6)
    billed = round(box.usd, 6)
    return OverheadRecord(
        instance_id=box.instance_id,
        billed_usd=billed,
        attempts_usd=attempts_usd,
        attempts=len(ran),
        cost_usd=round(billed - attempts_usd, 6),
        machine_id=box.machine_id,
        gpu_name=box.gpu_name,
        num_gpus=box.num_gpus,
        dph=box.dph,
        started_at=box.started_at,
        ended_at=box.gone_at,
        reachable_at=memory.reachable_at if memory is not None else None,
        ready_at=memory.ready_at if memory is not None else None,
        pool=memory.pool if memory is not None else "",
        estimated=box.estimated,
        reason=f"box ended: billed ${billed:.6f}, {len(ran)} attempt(s) ${attempts_usd:.6f}, the rest was boot, "
        f"bootstrap and idle time{box.estimate_note}",
    )


def close_bills(spend: Spend, closed: Iterable[int]) -> Spend:
    """The spend without the boxes whose bills are in the archive's overhead lines now (their money stays in the
    totals)."""
    gone = set(closed)
    if not gone:
        return spend
    return replace(spend, boxes=tuple(b for b in spend.boxes if b.instance_id not in gone))


def world_after_apply(
    observed: Observed,
    memory: FleetMemory,
    applied: ApplyResult | None,
    history: tuple[AttemptRecord, ...],
    now: float,
) -> Observed:
    """The snapshot as the next cycle will start from it: with this cycle's memory and archive, and its boxes as
    this cycle's apply left them (rented ones listed, destroyed ones gone), so that a rent or a destroy is recorded
    in the cycle that made it, not when the provider's list shows it a cycle later."""
    instances = observed.instances
    if applied is not None:
        gone = set(applied.destroyed)
        instances = tuple(i for i in instances if i.id not in gone)
        listed = {i.id for i in instances}
        instances += tuple(
            Instance(
                id=new_id,
                label=rent.label,
                status=InstanceStatus.CREATED,
                gpu_name=rent.gpu_name,
                num_gpus=rent.num_gpus,
                gpu_ram_mib=0,
                dph_total=rent.dph,
                start_date=now,
                image=rent.image,
            )
            for new_id, rent in sorted(applied.rented_as.items())
            if new_id not in listed
        )
    return replace(
        observed,
        instances=instances,
        history=history,
        memory=memory,
    )


def update_box_memory(
    previous: tuple[BoxMemory, ...],
    instances: list[Instance],
    probes: list[BoxProbe],
    now: float,
    bootstrap_hash: str | Mapping[int, str] = "",
    *,
    pools: Mapping[int, str] | None = None,
    open_bills: frozenset[int] = frozenset(),
) -> tuple[BoxMemory, ...]:
    """Per box: first seen, unreachable since, and since when it answers without its bootstrap done (the clock of
    ``bootstrap_timeout``; the box's own clock cannot say, and its uptime is its host's). ``bootstrap_hash`` is the
    fleet's, or per instance id the one of its pool.

    Also when it first answered (``reachable_at``) and when it was first ready for work (``ready_at``: answering
    with its pool's bootstrap done, or at once when the pool has none), and its pool (``pools``, per instance id):
    the measured boot and bootstrap of the pool (``plan.readiness``). A box gone from the list keeps its memory
    while its bill is still open (``open_bills``), so its overhead line carries these times when the bill closes.
    """
    prev = {m.instance_id: m for m in previous}
    reach = {p.instance_id: p.reachable for p in probes}
    by_id = {p.instance_id: p for p in probes}
    pool_of = pools or {}

    def wanted(iid: int) -> str:
        return bootstrap_hash if isinstance(bootstrap_hash, str) else bootstrap_hash.get(iid, "")

    unbooted = {
        p.instance_id
        for p in probes
        if p.reachable and wanted(p.instance_id) and wanted(p.instance_id) not in p.bootstrap_hashes
    }
    out = []
    for inst in sorted(instances, key=lambda i: i.id):
        old = prev.get(inst.id)
        first = old.first_seen_at if old else now
        if reach.get(inst.id) is False:
            since = old.unreachable_since if old and old.unreachable_since is not None else now
        else:
            since = None
        booting: float | None
        if inst.id in unbooted:
            booting = old.bootstrap_since if old and old.bootstrap_since is not None else now
        elif reach.get(inst.id) is False and old is not None:
            booting = old.bootstrap_since  # not known this cycle: the clock keeps running
        else:
            booting = None
        answered = by_id.get(inst.id) is not None and reach.get(inst.id) is True
        reachable_at = old.reachable_at if old and old.reachable_at is not None else (now if answered else None)
        ready_at = old.ready_at if old and old.ready_at is not None else None
        if ready_at is None and answered and inst.id not in unbooted:
            ready_at = now
        pool = (old.pool if old and old.pool else "") or pool_of.get(inst.id, "")
        out.append(
            BoxMemory(
                inst.id,
                first_seen_at=first,
                unreachable_since=since,
                bootstrap_since=booting,
                reachable_at=reachable_at,
                ready_at=ready_at,
                pool=pool,
            )
        )
    listed = {i.id for i in instances}
    out.extend(m for iid, m in sorted(prev.items()) if iid not in listed and iid in open_bills)
    return tuple(sorted(out, key=lambda m: m.instance_id))


def track_gpu_quiet(
    previous: tuple[GpuQuiet, ...],
    desired: Desired,
    in_flight: Iterable[InFlight],
    probes: list[BoxProbe],
    now: float,
) -> tuple[GpuQuiet, ...]:
    """Since when each live attempt this fleet launched (``launched_by_box``), of a sweep with ``stall_timeout``, has
    kept its GPUs under ``stall_gpu_util``.

    A reading is one probe's ``utilization.gpu``: the most of the attempt's GPUs. An attempt at or above the threshold,
    finished, or on a box that did not answer this cycle is dropped (its clock starts again when it is next quiet).
    """
    since = {q.key: q.since for q in previous}
    util = {p.instance_id: {g.index: g.utilization_pct for g in p.gpus} for p in probes}
    out: list[GpuQuiet] = []
    for box_id, ours in launched_by_box(probes, in_flight).items():
        for rd in (a.run_dir for a in ours if a.live):
            spec = desired.run(rd.run_id)
            if spec is None or spec.sweep.stall_timeout_s is None:
                continue
            seen = [util[box_id][i] for i in rd.gpu_mask if i in util[box_id]]
            if seen and max(seen) < spec.sweep.stall_gpu_util_pct:
                out.append(GpuQuiet(rd.run_id, rd.attempt, since.get((rd.run_id, rd.attempt), now)))
    return tuple(sorted(out))


def track_rungs(
    previous: tuple[RungValue, ...], desired: Desired, in_flight: Iterable[InFlight], probes: Iterable[BoxProbe]
) -> tuple[RungValue, ...]:
    """The rung values (``FleetMemory.rungs``) with what the probes show: an attempt of ours (in flight on the box
    that reports it) of a sweep with ``early_terminate`` whose last metrics line has a finite progress value and a
    finite objective gets its metric recorded at each rung it has reached and has no record at yet (one per (run,
    rung): the first stands; a retried run keeps its earlier attempt's). Records of runs no longer desired go; those
    of finished and stopped runs stay (they are peers at their rungs). A box's metrics are untrusted: a value that
    is not a finite number (``bounds.finite``) records nothing."""
    runs = {r.id: r for r in desired.runs if r.sweep.early_terminate is not None}
    kept = [r for r in previous if r.run_id in runs]
    if not runs:
        return tuple(kept)
    have = {(r.run_id, r.level) for r in kept}
    for ours in launched_by_box(probes, in_flight).values():
        for rd in (a.run_dir for a in ours):
            spec = runs.get(rd.run_id)
            if spec is None:
                continue
            sweep, et = spec.sweep, spec.sweep.early_terminate
            objective = sweep.objective
            done = progress_value(sweep, rd.last_metrics)
            if et is None or objective is None or sweep.progress is None or done is None:
                continue
            value = finite(dict(rd.last_metrics).get(objective[0]))
            if value is None:
                continue
            for level in et.levels(sweep.progress.total):
                if level > done:
                    break
                if (rd.run_id, level) not in have:
                    have.add((rd.run_id, level))
                    kept.append(RungValue(rd.run_id, level, value))
    return tuple(sorted(kept, key=lambda r: (r.run_id, r.level)))


def track_heartbeats(
    previous: tuple[HeartbeatClock, ...],
    in_flight: Iterable[InFlight],
    probes: list[BoxProbe],
    now: float,
) -> tuple[HeartbeatClock, ...]:
    """Each attempt in flight's heartbeat on the controller's clock (``HeartbeatClock``).

    ``implied`` is when the heartbeat was written by this clock (``now - heartbeat_age_s``), ``since`` when it last
    moved forward by more than a second. Only attempts this fleet launched, as their box shows them, are tracked
    (so a box's claims cannot grow it); one whose box did not show it this cycle keeps its entry while it is in
    flight. First sight (after a restart too): since is now.
    """
    old = {h.key: h for h in previous}
    flights = tuple(in_flight)
    flying = {(f.run_id, f.attempt) for f in flights}
    out: dict[tuple[str, int], HeartbeatClock] = {}
    for ours in launched_by_box(probes, flights).values():
        for rd in (a.run_dir for a in ours if a.live):
            if rd.heartbeat_age_s is None:
                continue
            implied = now - rd.heartbeat_age_s
            last = old.get((rd.run_id, rd.attempt))
            if last is None or implied > last.implied + 1.0:
                last = HeartbeatClock(rd.run_id, rd.attempt, implied, now)
            out[last.key] = last
    for key, last in old.items():
        if key in flying and key not in out:
            out[key] = last
    return tuple(sorted(out.values()))


def accrue_billed(
    spend: Spend,
    spend_at: float | None,
    mine: list[Instance],
    billed: dict[int, float] | None,
    in_flight: Iterable[InFlight],
    now: float,
) -> Spend:
    """The spend at ``now``: per owned box, what the provider billed since its last figure, added to the totals.

    - A box's figure never decreases (a bill below an earlier estimate keeps the estimate, marked estimated).
    - An increase is spread evenly over the time since the box's last figure (its start for a new box), so the
      part after UTC midnight goes to today and the rest only to the total.
    - When the provider cannot say (``billed`` is None, or has no charge for the box), a listed box is estimated
      at its listed $/h since its last figure; a gone box adds nothing more.
    - A box missing from the list is kept (``gone_at``) until apply could archive its overhead line (its bill
      was final at the previous read and no attempt on it is in flight), then dropped: its money stays in the total.
    """
    busy = {f.instance_id for f in in_flight}
    out = spend.rolled(spend_at, now) if spend_at is not None else spend
    listed = {i.id: i for i in mine}
    previous = {b.instance_id: b for b in spend.boxes}
    boxes: list[BoxSpend] = []
    for iid in sorted(set(previous) | set(listed)):
        old, inst = previous.get(iid), listed.get(iid)
        if inst is None and old is not None and old.bill_final(old.at) and iid not in busy:
            continue  # its overhead line was due last cycle; its money is in the total
        since = old.at if old is not None else min(inst.start_date if inst and inst.start_date > 0 else now, now)
        last = old.usd if old is not None else 0.0
        figure = billed.get(iid) if billed is not None else None
        if figure is not None:
            usd = max(last, figure)
            estimated = figure + _FLOAT_SLACK_USD < last
        else:
            rate = inst.dph_total if inst is not None else 0.0
            usd = last + rate * max(0.0, now - since) / 3600.0
            estimated = True
        out = out.plus(usd - last, since, now)
        boxes.append(
            BoxSpend(
                instance_id=iid,
                usd=usd,
                at=now,
                dph=inst.dph_total if inst is not None else (old.dph if old else 0.0),
                estimated=estimated,
                gone_at=None if inst is not None else (old.gone_at if old and old.gone_at is not None else now),
                started_at=inst.start_date if inst is not None else (old.started_at if old else None),
                machine_id=inst.machine_id if inst is not None else (old.machine_id if old else 0),
                gpu_name=inst.gpu_name if inst is not None else (old.gpu_name if old else ""),
                num_gpus=inst.num_gpus if inst is not None else (old.num_gpus if old else 0),
            )
        )
    return Spend(today_usd=out.today_usd, total_usd=out.total_usd, boxes=tuple(boxes))


def next_in_flight(
    previous: tuple[InFlight, ...], observed: Observed, result: ApplyResult, now: float
) -> tuple[InFlight, ...]:
    """In flight after this cycle: what was, plus launches, minus what settled. What a box shows running is never
    added: only a launch of this fleet makes an attempt ours (anything else is foreign).

    A queued attempt's launch (``InFlight.queued``) could not say its process group or its start: the box starts it
    later. The first cycle its box shows its run directory, ``now`` is recorded as when it was seen started, and
    the wrapper's pid and start tick the box reports with it, once: what is recorded is never overwritten by what
    a box says later."""
    by_key: dict[tuple[str, int], InFlight] = {(f.run_id, f.attempt): f for f in previous}
    for f in (*result.in_doubt, *result.launched):
        by_key[(f.run_id, f.attempt)] = f
    archived_keys = {rec.key for rec in observed.history}
    for key in list(by_key):
        if key in result.settled or key in archived_keys:
            del by_key[key]
    for key, (pid, tick) in _queued_starts(by_key.values(), observed).items():
        f = by_key[key]
        if f.seen_started_at is None:
            f = replace(f, seen_started_at=now)
        if f.pid is None and pid is not None and tick is not None:
            f = replace(f, pid=pid, pid_started=tick)
        by_key[key] = f
    return tuple(sorted(by_key.values(), key=lambda f: (f.run_id, f.attempt)))


def _queued_starts(
    in_flight: Iterable[InFlight], observed: Observed
) -> dict[tuple[str, int], tuple[int | None, int | None]]:
    """(run id, attempt) -> the (pid, start tick) its box reports (either None when it cannot be used) for each queued
    attempt whose run directory its box shows and that lacks its seen start or its process group."""
    waiting = {
        (f.run_id, f.attempt): f for f in in_flight if f.queued and (f.pid is None or f.seen_started_at is None)
    }
    if not waiting:
        return {}
    out: dict[tuple[str, int], tuple[int | None, int | None]] = {}
    for box_id, ours in launched_by_box(observed.probes, waiting.values()).items():
        for a in ours:
            out[(a.launch.run_id, a.launch.attempt)] = a.launch.group_on(box_id, a.run_dir)
    return out
