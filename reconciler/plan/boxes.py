"""Boxes: what state each owned box is in, which must be destroyed and why, and which GPUs are free.

``classify_boxes`` applies the limits that do not depend on the work (budget halt, provider status, ttl,
boot timeout, unreachable grace, failed bootstrap); ``enforce_max_instances`` trims the fleet to its cap;
``prepare_boxes`` replaces drifted boxes, bootstraps new ones and finds the free GPUs of ready ones;
``retire_idle`` destroys idle and surplus boxes after placement; ``box_noops`` says why the rest are kept.
Never ``stop``: a stopped box keeps billing storage, so every exit is a destroy.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, replace

from reconciler.core import contract
from reconciler.core.actions import Bootstrap, Destroy, Drain, ReasonCode
from reconciler.core.identity import slot_spec_hash
from reconciler.core.ledger import PREEMPTION_CODES
from reconciler.core.model import Drift, DriftClass, GpuState, InFlight, InstanceStatus
from reconciler.core.runphase import may_still_hold
from reconciler.plan.attempts import SeenAttempts, unseen_in_flight
from reconciler.plan.bookkeeping import contract_ending
from reconciler.plan.common import Decisions, box_floor, cap, count_cap, fmt_duration, usd_h
from reconciler.plan.forecast import Forecast
from reconciler.plan.money import Purse
from reconciler.plan.world import OwnedBox, World

DEAD_STATUSES = frozenset({InstanceStatus.STOPPED, InstanceStatus.EXITED, InstanceStatus.OFFLINE})
BOOTING_STATUSES = frozenset({InstanceStatus.CREATED, InstanceStatus.LOADING})


class BoxState(enum.StrEnum):
    READY = "ready"  # running, reachable, bootstrapped, built for the current spec
    BOOTING = "booting"  # created or loading, within boot_timeout
    BOOTSTRAPPING = "bootstrapping"  # reachable, the bootstrap script has not finished
    UNREACHABLE = "unreachable"  # running but not answering, within unreachable_grace
    UNUSABLE = "unusable"  # answering with a probe that cannot be used (or distrusted), within unreachable_grace
    DRIFTED = "drifted"  # built for another spec: replaced once its work is done
    UNKNOWN = "unknown"  # a provider status rigsync does not act on
    DESTROYED = "destroyed"  # this plan destroys it
    HARVESTING = "harvesting"  # would be destroyed, but its finished attempts come home first (this plan records them)


@dataclass(frozen=True)
class BoxTable:
    """The owned boxes' states as the phases have decided them so far."""

    states: Mapping[int, BoxState]
    destroyed: Mapping[int, str]  # box id -> the reason it is destroyed
    waiting: Mapping[int, tuple[InFlight, ...]]  # in flight on a box that cannot show them now
    occupied: Mapping[int, frozenset[int]]  # GPU indexes held by live or waiting attempts
    considered: frozenset[int]  # an action or a no-op already speaks for these boxes
    free: Mapping[int, tuple[GpuState, ...]]  # ready boxes: GPUs no run holds and no memory is used on
    # destroyed because the provider took them (``ledger.PREEMPTION_CODES``: outbid, or reclaimed at the contract's
    # end): their attempts are preempted, not lost
    preempted: frozenset[int] = frozenset()

    def alive(self) -> list[int]:
        return [i for i in self.states if i not in self.destroyed]

    def has_work(self, seen: SeenAttempts, box_id: int) -> bool:
        return bool(seen.live.get(box_id) or seen.zombies.get(box_id) or self.waiting.get(box_id))


# Destroys that do not wait for a harvest: money already spent (a cap binds before the next decision) and an
# untrusted box (never contacted again; it shows no attempts anyway).
NO_HARVEST_WAIT = frozenset({ReasonCode.BUDGET_EXHAUSTED, ReasonCode.OVER_BUDGET_HALT, ReasonCode.HOST_KEY_CHANGED})
# Destroys whose harvest is this plan's: a drained box's finished attempts are recorded (harvested) by this same plan,
# before the destroy (``APPLY_ORDER``; apply skips the destroy when such a record failed).
HARVEST_IN_PLAN = frozenset({ReasonCode.DRAINED})


def harvest_pending(seen: SeenAttempts) -> dict[int, tuple[str, ...]]:
    """Per reachable box, its finished attempts not yet archived: recording one harvests it (``apply``), so the
    box must not be destroyed before that record is in the archive."""
    out: dict[int, list[str]] = {}
    for box_id, rd in seen.finished:
        out.setdefault(box_id, []).append(f"run/{rd.run_id}.{rd.attempt}")
    return {k: tuple(v) for k, v in out.items()}


class _Destroyer:
    """Collects destroys for one phase; a box is destroyed once, for the first reason found.

    Nothing is destroyed before its finished runs are harvested: a box showing finished attempts that are not yet
    archived (``harvest_pending``) is not destroyed in this plan, which records them (the record harvests them);
    it waits, saying why (``harvest_pending``), and the next plan destroys it. A box that does not answer shows
    no attempts, so nothing holds it: what it had is archived as lost. Spent money does not wait
    (``NO_HARVEST_WAIT``): the record still runs before the destroy in the same apply (``APPLY_ORDER``), so the
    harvest is tried first, but a box past a spent cap goes in this plan whatever it brings home.
    """

    def __init__(self, world: World, seen: SeenAttempts, table: BoxTable | None = None) -> None:
        self.world = world
        self.out = Decisions()
        self.states: dict[int, BoxState] = dict(table.states) if table else {}
        self.destroyed: dict[int, str] = dict(table.destroyed) if table else {}
        self.preempted: set[int] = set(table.preempted) if table else set()
        self.considered: set[int] = set(table.considered) if table else set()
        self.pending = harvest_pending(seen)

    def destroy(self, box: OwnedBox, code: ReasonCode, reason: str) -> None:
        if box.id in self.destroyed:
            return
        if box.own_box:  # the one guard: a machine rigsync does not rent is never destroyed, for any reason
            self.considered.add(box.id)
            self.out.noop(
                box.subject,
                ReasonCode.OWN_BOX_KEPT,
                f"own box (pool {box.pool}, provider ssh): never destroyed; would have been ({code.value}): {reason}; "
                "not used until that is fixed",
            )
            return
        waiting = self.pending.get(box.id)
        if waiting and code not in NO_HARVEST_WAIT and code not in HARVEST_IN_PLAN:
            if self.states.get(box.id) is not BoxState.HARVESTING:
                self.states[box.id] = BoxState.HARVESTING
                self.considered.add(box.id)
                self.out.noop(
                    box.subject,
                    ReasonCode.HARVEST_PENDING,
                    f"destroy ({code.value}) waits until its finished attempt(s) {', '.join(waiting)} are "
                    f"harvested and archived: {reason}",
                )
            return
        self.destroyed[box.id] = reason
        if code in PREEMPTION_CODES:
            self.preempted.add(box.id)
        self.states[box.id] = BoxState.DESTROYED
        self.considered.add(box.id)
        self.out.act(Destroy(reason=reason, code=code, instance_id=box.id, dph=box.inst.dph_total))

    def noop(self, box: OwnedBox, code: ReasonCode, reason: str) -> None:
        self.considered.add(box.id)
        self.out.noop(box.subject, code, reason)

    def destroy_drifted(self, box: OwnedBox, code: ReasonCode, reason: str, cls: DriftClass, detail: str = "") -> None:
        """``destroy``, and the drift that says why (``detail``, else the reason)."""
        self.destroy(box, code, reason)
        self.out.drift.append(Drift(cls, box.subject, detail or reason, f"destroy {box.subject}"))


def unreachable_since(box: OwnedBox, now: float) -> float:
    """Since when a box has not answered, as the cross-cycle memory says (now when it says nothing)."""
    if box.memory is not None and box.memory.unreachable_since is not None:
        return box.memory.unreachable_since
    return now


def unusable_since(box: OwnedBox, now: float) -> float:
    """Since when a box's answers have been unusable: distrusted since, else unreachable since (an unusable probe
    is not reachable), else now."""
    if box.distrusted_since is not None:
        return box.distrusted_since
    return unreachable_since(box, now)


def classify_boxes(world: World, seen: SeenAttempts, budget: Purse) -> tuple[BoxTable, Decisions]:
    """Destroys that do not depend on the work, and every other box's state."""
    d = _Destroyer(world, seen)
    for box in world.boxes.values():
        _classify(d, box, budget)
    waiting, occupied = _held_unseen(world, seen, d.destroyed)
    table = BoxTable(
        states=d.states,
        destroyed=d.destroyed,
        waiting=waiting,
        occupied=occupied,
        considered=frozenset(d.considered),
        free={},
        preempted=frozenset(d.preempted),
    )
    return table, d.out


def _classify(d: _Destroyer, box: OwnedBox, budget: Purse) -> None:
    """The limits a box meets in this order; the first that speaks for it decides it (destroyed, or its state)."""
    if (
        _host_key_changed(d, box)
        or _budget_spent(d, box, budget)
        or _provider_ended(d, box)
        or _past_ttl(d, box)
        or _booting(d, box)
        or _not_running(d, box)
        or _unusable(d, box)
        or _unreachable(d, box)
    ):
        return
    _answering(d, box)


def _host_key_changed(d: _Destroyer, box: OwnedBox) -> bool:
    """First, whatever else holds: a box answering with another host key is not trusted (it may not be our box at
    all). Destroyed at once through the provider, never reused, never sent a command; the attempts launched on it
    are requeued by settle_in_flight (it shows none: it is not probed)."""
    if box.probe is None or not box.probe.host_key_changed:
        return False
    why = box.probe.error or "host key changed"
    reason = f"SSH host key changed since it was pinned: untrusted, destroyed and never reused ({why})"
    d.destroy_drifted(box, ReasonCode.HOST_KEY_CHANGED, reason, DriftClass.HOST_KEY_CHANGED)
    d.out.warnings.append(f"host key changed on {box.subject}: {why}; the box is destroyed, never reused")
    return True


def _budget_spent(d: _Destroyer, box: OwnedBox, budget: Purse) -> bool:
    """A spent budget, or a cap past with ``on_exceed: halt``, ends every box."""
    if budget.exhausted:
        d.destroy(box, ReasonCode.BUDGET_EXHAUSTED, f"budget exhausted: {budget.describe()}")
        return True
    if budget.halt:
        d.destroy(box, ReasonCode.OVER_BUDGET_HALT, f"on_exceed halt: {budget.verdict()}")
        return True
    return False


def _provider_ended(d: _Destroyer, box: OwnedBox) -> bool:
    """A box the provider lists as stopped, exited or offline cannot run work: its contract ended (preempted),
    stopped (outbid?), or dead."""
    inst, now = box.inst, d.world.now
    accepted = d.world.observed.memory.accepted_increases
    if inst.status in DEAD_STATUSES and box.rented and contract.ended(inst, now, accepted):
        end = contract.box_end(inst, accepted) or now
        reason = (
            f"contract ended {fmt_duration(now - end)} ago: the host took the box back (listed "
            f"{inst.status.value}); its attempts are preempted, resumed elsewhere"
        )
        d.destroy(box, ReasonCode.CONTRACT_ENDED, reason)
        return True
    if inst.status is InstanceStatus.STOPPED:
        reason = "stopped (outbid?): stopped boxes still bill storage; destroying, never stopping"
        said = "provider reports the box stopped"
        d.destroy_drifted(box, ReasonCode.PROVIDER_STOPPED, reason, DriftClass.OUTBID, said)
        return True
    if inst.status in DEAD_STATUSES:
        reason = f"provider reports the box {inst.status.value}; it cannot run work"
        d.destroy(box, ReasonCode.PROVIDER_DEAD, reason)
        return True
    return False


def _past_ttl(d: _Destroyer, box: OwnedBox) -> bool:
    """A rented box up longer than the fleet's ttl (the lab's machine has no rental age)."""
    ttl_s = d.world.desired.fleet.ttl_s
    age = d.world.now - box.inst.start_date
    if box.rented and ttl_s is not None and age > cap(ttl_s):
        d.destroy(box, ReasonCode.PAST_TTL, f"past its ttl: up {fmt_duration(age)} > ttl {fmt_duration(cap(ttl_s))}")
        return True
    return False


def _booting(d: _Destroyer, box: OwnedBox) -> bool:
    """A rented box still created or loading: booting within boot_timeout, destroyed past it (the lab's machine does
    not boot: its status is not acted on)."""
    inst = box.inst
    if inst.status not in BOOTING_STATUSES or box.own_box:
        return False
    timeout_s = d.world.desired.fleet.boot_timeout_s
    age = d.world.now - inst.start_date
    if age > timeout_s:
        reason = f"still {inst.status.value} after {fmt_duration(age)} > boot_timeout {fmt_duration(timeout_s)}"
        d.destroy_drifted(box, ReasonCode.BOOT_TIMEOUT, reason, DriftClass.BOOT_TIMEOUT)
    else:
        d.states[box.id] = BoxState.BOOTING
    return True


def _not_running(d: _Destroyer, box: OwnedBox) -> bool:
    """A provider status rigsync does not act on: left alone."""
    if box.inst.status is InstanceStatus.RUNNING:
        return False
    d.states[box.id] = BoxState.UNKNOWN
    return True


@dataclass(frozen=True)
class _Silence:
    """How a box that gives nothing to act on is waited for, and said to be: its state while within the grace,
    its drift class, the destroy's code past it, the word for it, and what the reasons add."""

    state: BoxState
    cls: DriftClass
    code: ReasonCode
    word: str  # "unreachable", "unusable"
    detail: str  # appended to the destroy's reason
    waiting: str  # the drift's detail while within the grace


def _wait_out_grace(d: _Destroyer, box: OwnedBox, down: float, silence: _Silence) -> None:
    """A box silent (or unusable) for ``down`` seconds is waited for until unreachable_grace (its attempts wait),
    then destroyed (they are requeued)."""
    grace = d.world.desired.fleet.unreachable_grace_s
    if down > grace:
        reason = f"{silence.word} for {fmt_duration(down)} > unreachable_grace {fmt_duration(grace)}{silence.detail}"
        d.destroy_drifted(box, silence.code, reason, silence.cls)
    else:
        d.states[box.id] = silence.state
        d.out.drift.append(Drift(silence.cls, box.subject, silence.waiting, "none"))


def _unusable(d: _Destroyer, box: OwnedBox) -> bool:
    """It answered, but with nothing to act on: like an unreachable box (its attempts wait, then are requeued when
    it is destroyed after the grace), with its own class and codes."""
    if box.probe is None or box.probe.unusable is None:
        return False
    what = box.probe.unusable
    down = d.world.now - unusable_since(box, d.world.now)
    silence = _Silence(
        BoxState.UNUSABLE, DriftClass.UNUSABLE, ReasonCode.PROBE_UNUSABLE, "unusable", f": {what}", f"unusable: {what}"
    )
    _wait_out_grace(d, box, down, silence)
    return True


def _unreachable(d: _Destroyer, box: OwnedBox) -> bool:
    """A running box that does not answer: waited for within the grace, destroyed past it."""
    if box.reachable:
        return False
    down = d.world.now - unreachable_since(box, d.world.now)
    err = f" ({box.probe.error})" if box.probe is not None and box.probe.error else ""
    waiting = f"unreachable for {fmt_duration(down)}{err}"
    silence = _Silence(
        BoxState.UNREACHABLE, DriftClass.UNREACHABLE, ReasonCode.UNREACHABLE_PAST_GRACE, "unreachable", err, waiting
    )
    _wait_out_grace(d, box, down, silence)
    return True


def _answering(d: _Destroyer, box: OwnedBox) -> None:
    """A box that answers usably: destroyed when its pool's bootstrap failed on it or is not done past
    bootstrap_timeout; else drifted (built for another spec), bootstrapping, or ready."""
    probe = box.probe
    assert probe is not None
    world, now = d.world, d.world.now
    bh = world.bootstrap_of(box)
    if bh and bh in probe.bootstrap_failed and bh not in probe.bootstrap_hashes:
        d.destroy(box, ReasonCode.BOOTSTRAP_FAILED, f"bootstrap {bh} failed on this box")
    elif slot_spec_hash(box.own.slot) != world.spec_of(box):
        d.states[box.id] = BoxState.DRIFTED
    elif bh and bh not in probe.bootstrap_hashes:
        missing = box.memory.bootstrap_since if box.memory is not None else None
        timeout_s = world.desired.fleet.bootstrap_timeout_s
        if missing is not None and now - missing > timeout_s:
            reason = (
                f"bootstrap {bh} not done {fmt_duration(now - missing)} after it was first missing > "
                f"bootstrap_timeout {fmt_duration(timeout_s)}"
            )
            d.destroy(box, ReasonCode.BOOTSTRAP_TIMEOUT, reason)
        else:
            d.states[box.id] = BoxState.BOOTSTRAPPING
    else:
        d.states[box.id] = BoxState.READY


def _held_unseen(
    world: World, seen: SeenAttempts, destroyed: Mapping[int, str]
) -> tuple[dict[int, tuple[InFlight, ...]], dict[int, frozenset[int]]]:
    """In-flight attempts a box cannot show (unreachable, still booting) are work we must not discard: per box not
    destroyed, those it may still hold; and per box every GPU held, by those or by the attempts seen on it."""
    waiting: dict[int, list[InFlight]] = {}
    occupied = {i: set(g) for i, g in seen.occupied.items()}
    for fl in unseen_in_flight(world, seen):
        b = world.boxes.get(fl.instance_id)
        if b is not None and b.id not in destroyed and may_still_hold(fl, b.probe):
            waiting.setdefault(b.id, []).append(fl)
            occupied.setdefault(b.id, set()).update(fl.gpu_mask)
    return {k: tuple(v) for k, v in waiting.items()}, {k: frozenset(v) for k, v in occupied.items()}


def enforce_max_instances(world: World, seen: SeenAttempts, table: BoxTable) -> tuple[BoxTable, Decisions]:
    """Destroy boxes past each pool's max, then past the fleet's (idle ones first, then the dearest)."""
    d = _Destroyer(world, seen, table)
    groups: list[tuple[str, int, str]] = []  # (pool name or "" for the fleet, limit, what the limit is called)
    if world.desired.fleet.named_pools:
        groups += [(p.name, count_cap(p.max_instances), f"pool {p.name} max_instances") for p in world.pools.values()]
    groups.append(("", count_cap(world.desired.fleet.max_instances), "max_instances"))
    for pool, limit, called in groups:
        alive = [
            world.boxes[i]
            for i in table.alive()
            if i not in d.destroyed and world.boxes[i].rented and (not pool or world.boxes[i].pool == pool)
        ]
        extra = len(alive) - limit
        if extra <= 0:
            continue
        order = sorted(alive, key=lambda b: (table.has_work(seen, b.id), -b.inst.dph_total, b.id))
        for b in order[:extra]:
            what = "busy" if table.has_work(seen, b.id) else "idle"
            d.destroy(
                b,
                ReasonCode.OVER_MAX_INSTANCES,
                f"{len(alive)} owned boxes > {called} {limit}; this one is {what} at {usd_h(b.inst.dph_total)}",
            )
    if not d.out.actions and not d.out.noops:
        return table, d.out
    return replace(table, states=d.states, destroyed=d.destroyed, considered=frozenset(d.considered)), d.out


def prepare_boxes(world: World, seen: SeenAttempts, table: BoxTable, budget: Purse) -> tuple[BoxTable, Decisions]:
    """Replace drifted boxes once idle, bootstrap new ones, and list the free GPUs of ready ones."""
    d = _Destroyer(world, seen, table)
    free: dict[int, tuple[GpuState, ...]] = {}
    for box in world.boxes.values():
        state = table.states.get(box.id)
        if box.id in d.destroyed or state is None:
            continue
        if state is BoxState.DRIFTED:
            if table.has_work(seen, box.id):
                n = len(seen.live.get(box.id, ())) + len(table.waiting.get(box.id, ()))
                d.noop(
                    box,
                    ReasonCode.DRIFTED_BUSY,
                    f"spec drifted (slot {box.own.slot}, now {world.spec_of(box) or 'no pool ' + box.pool}); "
                    f"waiting for {n} attempt(s) to finish",
                )
            else:
                d.destroy(
                    box,
                    ReasonCode.SPEC_DRIFTED,
                    f"spec drifted: box built for {slot_spec_hash(box.own.slot)}, "
                    + (
                        f"fleet spec is now {world.spec_of(box)}"
                        if world.spec_of(box)
                        else f"its pool {box.pool!r} is no longer in the fleet"
                    ),
                )
        elif state is BoxState.BOOTSTRAPPING and box.probe is not None:
            bh = world.bootstrap_of(box)
            if bh in box.probe.bootstrap_running:
                d.noop(box, ReasonCode.BOOTSTRAP_RUNNING, f"bootstrap {bh} running")
            elif not budget.stop:
                d.considered.add(box.id)
                d.out.act(
                    Bootstrap(
                        reason=f"bootstrap {bh} not done on this box",
                        code=ReasonCode.BOOTSTRAP_MISSING,
                        instance_id=box.id,
                        script_hash=bh,
                    )
                )
        elif state is BoxState.READY and box.probe is not None:
            free[box.id] = free_gpus(box, table.occupied.get(box.id, frozenset()))
    new = replace(table, states=d.states, destroyed=d.destroyed, considered=frozenset(d.considered), free=free)
    return new, d.out


def free_gpus(box: OwnedBox, used: frozenset[int]) -> tuple[GpuState, ...]:
    """A ready box's free GPUs: those its probe shows unheld and without memory in use, among the GPUs the provider
    lists for the instance (an index below its ``num_gpus``), each index once. A box's claims never add a GPU."""
    if box.probe is None:
        return ()
    listed = range(box.inst.num_gpus)
    by_index: dict[int, GpuState] = {}
    busy = set(used)
    for g in box.probe.gpus:
        if g.index in listed:
            by_index.setdefault(g.index, g)
            if g.memory_in_use:  # an index claimed twice is busy if either claim says so
                busy.add(g.index)
    return tuple(g for i, g in sorted(by_index.items()) if i not in busy)


def retire_idle(
    world: World,
    seen: SeenAttempts,
    table: BoxTable,
    launches: Mapping[int, int],
    waiting: Mapping[str, int],
    live_work: bool,
    budget: Purse,
    *,
    fc: Forecast,
) -> tuple[BoxTable, Decisions]:
    """Destroy idle boxes, down to min_instances: past idle_timeout, or at once when no run waits for a GPU.

    ``waiting`` is, per pool, how many pending runs placement could not put on a free GPU. When none waits for a
    box's pool an idle box can only bill: it is surplus even while other boxes still run work (a retry later rents
    again, which costs a boot; an idle box costs its $/h for idle_timeout, usually more).

    The tail: a busy box that no pending run will use beyond what it holds (none of its pool waits and this plan
    gives it nothing more), whose work is predicted to end before the next decision (``work_left_s`` within
    ``Controller.cycle_s``: later, the next plan knows more), is marked draining once (``Drain``, ``DRAIN_TAIL``), so
    it ends itself the moment its queue runs dry instead of idling until a cycle sees it; above the floor only. A
    draining box with nothing live, nothing queued and no launch in this plan is destroyed at once (``DRAINED``):
    its finished attempts are recorded by this same plan, before the destroy. A box with attempts in its queue and
    nothing running is not idle: they start there (``PREDICTED_NEED``).
    """
    d = _Destroyer(world, seen, table)
    work = _AfterPlacement(seen, table, launches, waiting, live_work, budget, fc)
    candidates: list[_Retiring] = []
    tail: list[OwnedBox] = []
    for box in world.boxes.values():
        if box.id in d.destroyed:
            continue
        if table.has_work(seen, box.id) or launches.get(box.id):
            if _joins_tail(d, work, box):
                tail.append(box)
            continue
        retiring = _idle_box(d, work, box)
        if retiring is not None:
            candidates.append(retiring)
    spare = _Spare(world, table, d.destroyed)
    _retire_above_floors(d, spare, candidates)
    spare.count_out_draining(world, table, d.destroyed)  # they leave the fleet on their own
    _drain_tail(d, spare, tail, budget)
    return replace(table, states=d.states, destroyed=d.destroyed, considered=frozenset(d.considered)), d.out


@dataclass(frozen=True)
class _AfterPlacement:
    """What retiring idle boxes reads about the work once placement is done."""

    seen: SeenAttempts
    table: BoxTable
    launches: Mapping[int, int]  # box id -> launches (and queue entries) this plan places on it
    waiting: Mapping[str, int]  # pool -> pending runs placement could not put on a free GPU
    live_work: bool  # some attempt is live anywhere in the fleet
    budget: Purse
    fc: Forecast


_Retiring = tuple[OwnedBox, ReasonCode, str]  # an idle box that may go (the floors decide), with why


def _joins_tail(d: _Destroyer, work: _AfterPlacement, box: OwnedBox) -> bool:
    """A box with work or a launch in this plan is kept. One with attempts in its queue and nothing running is
    between two runs (``PREDICTED_NEED``); one that no pending run will use beyond what it holds and whose work
    ends before the next decision is the tail's (True): it may be marked draining."""
    probe = box.probe
    live = bool(work.seen.live.get(box.id))
    launched = bool(work.launches.get(box.id))
    queued = len(probe.queued) if probe is not None else 0
    if queued and not live and not launched:
        # between two runs: its next attempt waits in its queue, the box starts it as the slot frees
        d.noop(box, ReasonCode.PREDICTED_NEED, f"{queued} queued attempt(s) start on it as its slots free: kept")
        return False
    world = d.world
    return (
        work.table.states.get(box.id) is BoxState.READY
        and probe is not None
        and box.rented
        and live
        and not probe.draining
        and not launched
        and not work.waiting.get(box.pool, 0)
        and work_left_s(world, work.fc, work.seen, box) <= world.controller.cycle_s
    )


def _idle_box(d: _Destroyer, work: _AfterPlacement, box: OwnedBox) -> _Retiring | None:
    """A box with no work and no launch in this plan: destroyed at once when its draining is done, its contract
    ends within the margin, or a binding budget lets nothing new start; else it may retire (``_why_retire``)."""
    probe = box.probe
    if probe is not None and probe.draining and box.rented and not probe.queued:
        d.destroy(box, ReasonCode.DRAINED, "draining: its queue is dry and its attempts are recorded")
        return None
    if box.own_box:
        if work.table.states.get(box.id) is BoxState.READY:
            d.noop(box, ReasonCode.OWN_BOX_KEPT, f"own box (pool {box.pool}, provider ssh): idle, kept")
        return None
    world = d.world
    if contract_ending(world, box):  # nothing left to do on it: let go, not left for its host to take back
        left = contract.time_left(box.inst, world.now, world.observed.memory.accepted_increases) or 0.0
        d.destroy(
            box,
            ReasonCode.CONTRACT_ENDING,
            f"idle, and its contract ends in {fmt_duration(left)} (contract_margin "
            f"{fmt_duration(world.desired.fleet.contract_margin_s)}): let go before the host takes it back",
        )
        return None
    if work.budget.binds:  # drain: no new work can start, so an idle box could only burn the budget
        d.destroy(box, ReasonCode.BUDGET_IDLE, f"on_exceed drain: {work.budget.verdict()}; idle box destroyed")
        return None
    return _why_retire(d, work, box)


def _why_retire(d: _Destroyer, work: _AfterPlacement, box: OwnedBox) -> _Retiring | None:
    """Why an idle rented box may go: idle past idle_timeout, or surplus when no pending run of its pool waits for
    a GPU; else kept, saying for how long it has been idle."""
    f = d.world.desired.fleet
    timeout = fmt_duration(f.idle_timeout_s)
    waiting_runs = work.waiting.get(box.pool, 0)
    idle_for: float | None = None
    if work.table.states.get(box.id) is BoxState.READY and box.probe is not None:
        idle_for = d.world.now - (box.probe.last_activity_at or box.inst.start_date)
    if idle_for is not None and idle_for > f.idle_timeout_s:
        return box, ReasonCode.IDLE_TIMEOUT, f"idle for {fmt_duration(idle_for)} > idle_timeout {timeout}"
    if not waiting_runs and f.named_pools:  # runs of other pools may wait: they never go to this box
        return box, ReasonCode.SURPLUS, f"surplus: no pending run of pool {box.pool} waits for a GPU"
    if not waiting_runs and not work.live_work:
        return box, ReasonCode.SURPLUS, "surplus: no pending or running work in the fleet"
    if not waiting_runs:
        return box, ReasonCode.SURPLUS, "surplus: no pending run waits for a GPU"
    if idle_for is not None:
        d.noop(box, ReasonCode.IDLE_KEPT, f"idle for {fmt_duration(idle_for)} (idle_timeout {timeout}); kept")
    return None


class _Spare:
    """How many rented boxes may still go above the floors: the fleet's min_instances and, with named pools, each
    pool's own (a box of a pool gone from the fleet keeps nothing)."""

    def __init__(self, world: World, table: BoxTable, destroyed: Mapping[int, str]) -> None:
        self.named_pools = world.desired.fleet.named_pools
        self.fleet_floor = box_floor(world.desired.fleet)
        rented = [world.boxes[i] for i in table.alive() if world.boxes[i].rented and i not in destroyed]
        self.fleet = len(rented) - self.fleet_floor
        self.pool_floor = {p.name: box_floor(p) for p in world.pools.values()}
        self.pool = {name: -floor for name, floor in self.pool_floor.items()}
        for box in rented:
            if box.pool in self.pool:
                self.pool[box.pool] += 1

    def allows(self, box: OwnedBox) -> bool:
        """Whether ``box`` may go without taking the fleet (or, with named pools, its pool) below its floor."""
        return self.fleet > 0 and (not self.named_pools or self.pool.get(box.pool, 1) > 0)

    def take(self, box: OwnedBox) -> None:
        self.fleet -= 1
        if box.pool in self.pool:
            self.pool[box.pool] -= 1

    def count_out_draining(self, world: World, table: BoxTable, destroyed: Mapping[int, str]) -> None:
        """Boxes already draining leave the fleet on their own: the floors count without them."""
        for i in table.alive():
            b = world.boxes[i]
            if i not in destroyed and b.rented and b.probe is not None and b.probe.draining:
                self.take(b)


def _retire_above_floors(d: _Destroyer, spare: _Spare, candidates: list[_Retiring]) -> None:
    """The dearest idle boxes first, destroyed while the floors allow; the rest kept, saying which floor holds them."""
    for box, code, reason in sorted(candidates, key=lambda t: (-t[0].inst.dph_total, t[0].id)):
        if spare.allows(box):
            d.destroy(box, code, reason)
            spare.take(box)
        elif spare.fleet > 0:
            floor = spare.pool_floor[box.pool]
            d.noop(box, ReasonCode.MIN_INSTANCES_KEPT, f"{reason}; kept to hold pool {box.pool} min_instances {floor}")
        else:
            d.noop(box, ReasonCode.MIN_INSTANCES_KEPT, f"{reason}; kept to hold min_instances {spare.fleet_floor}")


def _drain_tail(d: _Destroyer, spare: _Spare, tail: list[OwnedBox], budget: Purse) -> None:
    """The tail's boxes marked draining while the floors allow (none while the budget binds)."""
    for box in tail:
        if not spare.allows(box) or budget.binds:
            continue
        spare.take(box)
        d.considered.add(box.id)
        d.out.act(
            Drain(
                reason=f"no pending run of pool {box.pool} will use it beyond what it holds: it ends when its "
                "queue is dry",
                code=ReasonCode.DRAIN_TAIL,
                instance_id=box.id,
            )
        )


def work_left_s(world: World, fc: Forecast, seen: SeenAttempts, box: OwnedBox) -> float:
    """Predicted seconds until ``box`` has no work left: per GPU slot, its live attempt's remaining time plus the
    run time of each attempt queued behind it (``Forecast``), the latest slot's. 0 when it holds nothing."""
    per_mask: dict[tuple[int, ...], float] = {}
    for rd in seen.live.get(box.id, ()):
        spec = world.runs.get(rd.run_id)
        left = fc.remaining_s(spec, rd, box) if spec is not None else 0.0
        per_mask[rd.gpu_mask] = max(per_mask.get(rd.gpu_mask, 0.0), left)
    if box.probe is not None:
        for q in box.probe.queued:
            spec = world.runs.get(q.run_id)
            if spec is not None:
                run = fc.run_s(spec, box.inst.gpu_name, box.inst.machine_id)
                per_mask[q.gpu_mask] = per_mask.get(q.gpu_mask, 0.0) + run
    return max(per_mask.values(), default=0.0)


def box_noops(world: World, seen: SeenAttempts, table: BoxTable) -> Decisions:
    """Why every box no action or no-op has spoken for yet is left as it is."""
    f = world.desired.fleet
    now = world.now
    out = Decisions()
    for box in world.boxes.values():
        if box.id in table.considered or box.id in table.destroyed:
            continue
        inst = box.inst
        state = table.states.get(box.id)
        if state is BoxState.BOOTING:
            code = ReasonCode.BOOTING
            reason = (
                f"{inst.status.value} for {fmt_duration(now - inst.start_date)} "
                f"(boot_timeout {fmt_duration(f.boot_timeout_s)})"
            )
        elif state is BoxState.UNREACHABLE:
            since = unreachable_since(box, now)
            code = ReasonCode.UNREACHABLE_WAITING
            reason = (
                f"unreachable for {fmt_duration(now - since)} (grace {fmt_duration(f.unreachable_grace_s)}); waiting"
            )
        elif state is BoxState.UNUSABLE:
            code = ReasonCode.UNUSABLE_WAITING
            what = box.probe.unusable if box.probe is not None else ""
            reason = (
                f"unusable for {fmt_duration(now - unusable_since(box, now))} "
                f"(grace {fmt_duration(f.unreachable_grace_s)}): {what}; waiting"
            )
        elif state is BoxState.UNKNOWN:
            code = ReasonCode.STATUS_UNKNOWN
            reason = f"provider status {inst.status.value}; left alone this cycle"
        else:
            busy = len(table.occupied.get(box.id, ()))
            free = table.free.get(box.id, ())
            # Only a box with live attempts gets here: an idle one was retired or kept by retire_idle.
            code = ReasonCode.BUSY
            reason = f"busy: {busy} of {inst.num_gpus} GPU(s) in use, {len(free)} free"
        out.noop(box.subject, code, reason)
    return out
