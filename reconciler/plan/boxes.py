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
from reconciler.plan.common import Decisions, cap, count_cap, fmt_duration, usd_h
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


def unusable_since(box: OwnedBox, now: float) -> float:
    """Since when a box's answers have been unusable: distrusted since, else unreachable since (an unusable probe
    is not reachable), else now."""
    if box.distrusted_since is not None:
        return box.distrusted_since
    if box.memory is not None and box.memory.unreachable_since is not None:
        return box.memory.unreachable_since
    return now


def classify_boxes(world: World, seen: SeenAttempts, budget: Purse) -> tuple[BoxTable, Decisions]:
    """Destroys that do not depend on the work, and every other box's state."""
    f = world.desired.fleet
    now = world.now
    d = _Destroyer(world, seen)
    for box in world.boxes.values():
        inst, subj = box.inst, box.subject
        if box.probe is not None and box.probe.host_key_changed:
            # First, whatever else holds: a box answering with another host key is not trusted (it may not be our
            # box at all). Destroyed at once through the provider, never reused, never sent a command; the attempts
            # launched on it are requeued by settle_in_flight (it shows none: it is not probed).
            why = box.probe.error or "host key changed"
            reason = f"SSH host key changed since it was pinned: untrusted, destroyed and never reused ({why})"
            d.destroy(box, ReasonCode.HOST_KEY_CHANGED, reason)
            d.out.drift.append(Drift(DriftClass.HOST_KEY_CHANGED, subj, reason, f"destroy {subj}"))
            d.out.warnings.append(f"host key changed on {subj}: {why}; the box is destroyed, never reused")
            continue
        if budget.exhausted:
            d.destroy(box, ReasonCode.BUDGET_EXHAUSTED, f"budget exhausted: {budget.describe()}")
            continue
        if budget.halt:
            d.destroy(box, ReasonCode.OVER_BUDGET_HALT, f"on_exceed halt: {budget.verdict()}")
            continue
        accepted = world.observed.memory.accepted_increases
        if inst.status in DEAD_STATUSES and box.rented and contract.ended(inst, now, accepted):
            end = contract.box_end(inst, accepted) or now
            reason = (
                f"contract ended {fmt_duration(now - end)} ago: the host took the box back (listed "
                f"{inst.status.value}); its attempts are preempted, resumed elsewhere"
            )
            d.destroy(box, ReasonCode.CONTRACT_ENDED, reason)
            continue
        if inst.status is InstanceStatus.STOPPED:
            d.destroy(
                box,
                ReasonCode.PROVIDER_STOPPED,
                "stopped (outbid?): stopped boxes still bill storage; destroying, never stopping",
            )
            d.out.drift.append(Drift(DriftClass.OUTBID, subj, "provider reports the box stopped", f"destroy {subj}"))
            continue
        if inst.status in DEAD_STATUSES:
            d.destroy(
                box, ReasonCode.PROVIDER_DEAD, f"provider reports the box {inst.status.value}; it cannot run work"
            )
            continue
        age = now - inst.start_date
        if box.own_box:
            pass  # the lab's machine: no rental age, no boot (ttl and boot_timeout are about rented boxes)
        elif f.ttl_s is not None and age > cap(f.ttl_s):
            d.destroy(
                box, ReasonCode.PAST_TTL, f"past its ttl: up {fmt_duration(age)} > ttl {fmt_duration(cap(f.ttl_s))}"
            )
            continue
        if inst.status in BOOTING_STATUSES and not box.own_box:
            if age > f.boot_timeout_s:
                reason = (
                    f"still {inst.status.value} after {fmt_duration(age)} > "
                    f"boot_timeout {fmt_duration(f.boot_timeout_s)}"
                )
                d.destroy(box, ReasonCode.BOOT_TIMEOUT, reason)
                d.out.drift.append(Drift(DriftClass.BOOT_TIMEOUT, subj, reason, f"destroy {subj}"))
            else:
                d.states[box.id] = BoxState.BOOTING
            continue
        if inst.status is not InstanceStatus.RUNNING:
            d.states[box.id] = BoxState.UNKNOWN
            continue
        if box.probe is not None and box.probe.unusable is not None:
            # It answered, but with nothing to act on: like an unreachable box (its attempts wait, then are
            # requeued when it is destroyed after the grace), with its own class and codes.
            since = unusable_since(box, now)
            down = now - since
            what = box.probe.unusable
            if down > f.unreachable_grace_s:
                reason = (
                    f"unusable for {fmt_duration(down)} > unreachable_grace "
                    f"{fmt_duration(f.unreachable_grace_s)}: {what}"
                )
                d.destroy(box, ReasonCode.PROBE_UNUSABLE, reason)
                d.out.drift.append(Drift(DriftClass.UNUSABLE, subj, reason, f"destroy {subj}"))
            else:
                d.states[box.id] = BoxState.UNUSABLE
                d.out.drift.append(Drift(DriftClass.UNUSABLE, subj, f"unusable: {what}", "none"))
            continue
        if not box.reachable:
            since = now
            if box.memory is not None and box.memory.unreachable_since is not None:
                since = box.memory.unreachable_since
            down = now - since
            err = f" ({box.probe.error})" if box.probe is not None and box.probe.error else ""
            if down > f.unreachable_grace_s:
                reason = (
                    f"unreachable for {fmt_duration(down)} > unreachable_grace "
                    f"{fmt_duration(f.unreachable_grace_s)}{err}"
                )
                d.destroy(box, ReasonCode.UNREACHABLE_PAST_GRACE, reason)
                d.out.drift.append(Drift(DriftClass.UNREACHABLE, subj, reason, f"destroy {subj}"))
            else:
                d.states[box.id] = BoxState.UNREACHABLE
                d.out.drift.append(
                    Drift(DriftClass.UNREACHABLE, subj, f"unreachable for {fmt_duration(down)}{err}", "none")
                )
            continue
        probe = box.probe
        assert probe is not None
        bh = world.bootstrap_of(box)
        if bh and bh in probe.bootstrap_failed and bh not in probe.bootstrap_hashes:
            d.destroy(box, ReasonCode.BOOTSTRAP_FAILED, f"bootstrap {bh} failed on this box")
            continue
        if slot_spec_hash(box.own.slot) != world.spec_of(box):
            d.states[box.id] = BoxState.DRIFTED
        elif bh and bh not in probe.bootstrap_hashes:
            missing = box.memory.bootstrap_since if box.memory is not None else None
            if missing is not None and now - missing > f.bootstrap_timeout_s:
                reason = (
                    f"bootstrap {bh} not done {fmt_duration(now - missing)} after it was first missing > "
                    f"bootstrap_timeout {fmt_duration(f.bootstrap_timeout_s)}"
                )
                d.destroy(box, ReasonCode.BOOTSTRAP_TIMEOUT, reason)
                continue
            d.states[box.id] = BoxState.BOOTSTRAPPING
        else:
            d.states[box.id] = BoxState.READY
    # In-flight attempts the box cannot show (unreachable, still booting) are work we must not discard.
    waiting: dict[int, list[InFlight]] = {}
    occupied = {i: set(g) for i, g in seen.occupied.items()}
    for fl in unseen_in_flight(world, seen):
        b = world.boxes.get(fl.instance_id)
        if b is not None and b.id not in d.destroyed and may_still_hold(fl, b.probe):
            waiting.setdefault(b.id, []).append(fl)
            occupied.setdefault(b.id, set()).update(fl.gpu_mask)
    table = BoxTable(
        states=d.states,
        destroyed=d.destroyed,
        waiting={k: tuple(v) for k, v in waiting.items()},
        occupied={k: frozenset(v) for k, v in occupied.items()},
        considered=frozenset(d.considered),
        free={},
        preempted=frozenset(d.preempted),
    )
    return table, d.out


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
    f = world.desired.fleet
    now = world.now
    d = _Destroyer(world, seen, table)
    candidates: list[tuple[OwnedBox, ReasonCode, str]] = []
    timeout = fmt_duration(f.idle_timeout_s)
    tail: list[OwnedBox] = []
    for box in world.boxes.values():
        if box.id in d.destroyed:
            continue
        probe = box.probe
        draining = probe is not None and probe.draining
        queued = len(probe.queued) if probe is not None else 0
        busy = table.has_work(seen, box.id)
        if draining and box.rented and not busy and not queued and not launches.get(box.id):
            d.destroy(box, ReasonCode.DRAINED, "draining: its queue is dry and its attempts are recorded")
            continue
        if busy or launches.get(box.id):
            if queued and not seen.live.get(box.id) and not launches.get(box.id):
                # between two runs: its next attempt waits in its queue, the box starts it as the slot frees
                d.noop(
                    box, ReasonCode.PREDICTED_NEED, f"{queued} queued attempt(s) start on it as its slots free: kept"
                )
                continue
            ready = table.states.get(box.id) is BoxState.READY and probe is not None
            if (
                ready
                and box.rented
                and bool(seen.live.get(box.id))
                and not draining
                and not launches.get(box.id)
                and not waiting.get(box.pool, 0)
                and work_left_s(world, fc, seen, box) <= world.controller.cycle_s
            ):
                tail.append(box)
            continue
        if box.own_box:
            if table.states.get(box.id) is BoxState.READY:
                d.noop(box, ReasonCode.OWN_BOX_KEPT, f"own box (pool {box.pool}, provider ssh): idle, kept")
            continue
        if contract_ending(world, box):  # nothing left to do on it: let go, not left for its host to take back
            left = contract.time_left(box.inst, now, world.observed.memory.accepted_increases) or 0.0
            d.destroy(
                box,
                ReasonCode.CONTRACT_ENDING,
                f"idle, and its contract ends in {fmt_duration(left)} (contract_margin "
                f"{fmt_duration(f.contract_margin_s)}): let go before the host takes it back",
            )
            continue
        waiting_runs = waiting.get(box.pool, 0)
        idle_for: float | None = None
        if table.states.get(box.id) is BoxState.READY and box.probe is not None:
            idle_for = now - (box.probe.last_activity_at or box.inst.start_date)
        if budget.binds:  # drain: no new work can start, so an idle box could only burn the budget
            d.destroy(box, ReasonCode.BUDGET_IDLE, f"on_exceed drain: {budget.verdict()}; idle box destroyed")
            continue
        if idle_for is not None and idle_for > f.idle_timeout_s:
            candidates.append(
                (box, ReasonCode.IDLE_TIMEOUT, f"idle for {fmt_duration(idle_for)} > idle_timeout {timeout}")
            )
        elif not waiting_runs and f.named_pools:  # runs of other pools may wait: they never go to this box
            candidates.append((box, ReasonCode.SURPLUS, f"surplus: no pending run of pool {box.pool} waits for a GPU"))
        elif not waiting_runs and not live_work:
            candidates.append((box, ReasonCode.SURPLUS, "surplus: no pending or running work in the fleet"))
        elif not waiting_runs:
            candidates.append((box, ReasonCode.SURPLUS, "surplus: no pending run waits for a GPU"))
        elif idle_for is not None:
            d.noop(box, ReasonCode.IDLE_KEPT, f"idle for {fmt_duration(idle_for)} (idle_timeout {timeout}); kept")
    keep_at_least = min(count_cap(f.min_instances), count_cap(f.max_instances))
    spare = sum(1 for i in table.alive() if world.boxes[i].rented and i not in d.destroyed) - keep_at_least
    # with named pools each also keeps its own min_instances (a box of a pool gone from the fleet keeps nothing)
    pool_floor = {p.name: min(count_cap(p.min_instances), count_cap(p.max_instances)) for p in world.pools.values()}
    pool_spare = {name: -floor for name, floor in pool_floor.items()}
    for i in table.alive():
        if world.boxes[i].rented and world.boxes[i].pool in pool_spare and i not in d.destroyed:
            pool_spare[world.boxes[i].pool] += 1
    for box, code, reason in sorted(candidates, key=lambda t: (-t[0].inst.dph_total, t[0].id)):
        left_in_pool = pool_spare.get(box.pool, 1) if f.named_pools else 1
        if spare > 0 and left_in_pool > 0:
            d.destroy(box, code, reason)
            spare -= 1
            if box.pool in pool_spare:
                pool_spare[box.pool] -= 1
        elif spare > 0:
            floor = pool_floor[box.pool]
            d.noop(box, ReasonCode.MIN_INSTANCES_KEPT, f"{reason}; kept to hold pool {box.pool} min_instances {floor}")
        else:
            d.noop(box, ReasonCode.MIN_INSTANCES_KEPT, f"{reason}; kept to hold min_instances {keep_at_least}")
    # boxes already draining leave the fleet on their own: the floor counts without them
    for i in table.alive():
        b = world.boxes[i]
        if i not in d.destroyed and b.rented and b.probe is not None and b.probe.draining:
            spare -= 1
            if b.pool in pool_spare:
                pool_spare[b.pool] -= 1
    for box in tail:
        if spare <= 0 or (f.named_pools and pool_spare.get(box.pool, 1) <= 0) or budget.binds:
            continue
        spare -= 1
        if box.pool in pool_spare:
            pool_spare[box.pool] -= 1
        d.considered.add(box.id)
        d.out.act(
            Drain(
                reason=f"no pending run of pool {box.pool} will use it beyond what it holds: it ends when its "
                "queue is dry",
                code=ReasonCode.DRAIN_TAIL,
                instance_id=box.id,
            )
        )
    return replace(table, states=d.states, destroyed=d.destroyed, considered=frozenset(d.considered)), d.out


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
            since = box.memory.unreachable_since if box.memory and box.memory.unreachable_since else now
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
