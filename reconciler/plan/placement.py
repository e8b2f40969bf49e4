"""Placement: pending runs onto free GPU slots of ready boxes, in launch order, first fit; then the box-side queue.

A GPU is free only when no run holds it and its memory used is at most ``FREE_GPU_MEMORY_MIB``; a multi-GPU
run gets one ``CUDA_VISIBLE_DEVICES`` mask of that many free GPUs with enough memory each. The pinned code
commit is shipped before the first launch on a box that lacks it.

The tail: when a pool's pending runs all fit in its free GPUs and those GPUs differ in predicted speed, the runs
with the longest predicted work go to the fastest GPUs (``TAIL_TO_FASTEST``), so the sweep ends sooner.

The queue: a GPU slot between two runs is money spent on nothing, so once the free GPUs are filled, each busy slot
of a ready box (not draining) is given its next attempts ahead of time (``Launch.queued``, ``QUEUED_AHEAD``): the
box starts them the moment the slot frees, with no controller cycle in between. A slot is the GPU mask of its
running attempt; a run queues only behind a slot of exactly its GPU count. Entries go to the slot predicted to free
first, as long as their predicted start (``Forecast``: the current attempt's remaining time plus the runs already
queued on the slot, the box's and this plan's) is within ``queue_ahead``; a slot takes at least one entry whatever
its wait (``queue_ahead`` > 0) and at most ``MAX_QUEUED_PER_SLOT``. A queued entry is priced into the headroom as a
launch is. Each slot's predicted free time after this plan (``Placement.slot_free_s``) tells renting what waiting
for a held GPU would cost.

Contracts end (``reconciler.core.contract``): a run is launched, queued or given to the tail on a box only when its
predicted time there (its ``Forecast.run_s``, after the slot's work ahead of it for a queued entry) plus the fleet's
``contract_margin`` ends before the box's contract does; it goes to another box, or to a rent
(``CONTRACT_ENDS_BEFORE_RUN``, one no-op per box naming the figures).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from reconciler.core import contract
from reconciler.core.actions import Launch, ReasonCode, ShipCode
from reconciler.core.model import GpuState, RunSpec
from reconciler.core.offers import normalize_gpu_name
from reconciler.core.runphase import allowed_attempts
from reconciler.plan.attempts import PendingRun, RunQueue
from reconciler.plan.boxes import BoxState, BoxTable
from reconciler.plan.common import Decisions, fmt_duration, gpus_text, usd
from reconciler.plan.forecast import Forecast
from reconciler.plan.money import Purse, Spending, runtime_of
from reconciler.plan.world import OwnedBox, World

MAX_QUEUED_PER_SLOT = 8  # entries one slot's queue may hold: the box's queue is bounded (what a stale plan leaves)


@dataclass
class _BusySlot:
    """A busy GPU slot of a ready box: what runs on it now, and the work queued behind it."""

    box: OwnedBox
    mask: tuple[int, ...]
    free_s: float  # seconds until it is predicted free of all its work (its current attempt and its queue)
    queued: int  # entries in its queue (the box's and this plan's)
    current: str  # what it runs now ("run/<id>.<attempt>"), for the reason


@dataclass(frozen=True)
class Placement:
    unplaced: tuple[PendingRun, ...]  # no free GPU took them: renting may, in launch order
    launches: Mapping[int, int]  # box id -> launches placed on it
    table: BoxTable  # free GPUs left, boxes with launches considered
    spent: float  # what the launches placed are expected to cost (they count against the budget's headroom)
    # Per busy GPU slot of a ready box after this plan's launches and queue entries: (box id, its GPU mask, seconds
    # until the slot is predicted free of all its work, ``Forecast``'s figures). Renting reads it: a run waits for
    # a held GPU that frees before a new box would be ready instead of renting one (``WAIT_FOR_BUSY_GPU``).
    slot_free_s: tuple[tuple[int, tuple[int, ...], float], ...] = ()


def place(
    world: World, queue: RunQueue, table: BoxTable, budget: Purse, *, fc: Forecast
) -> tuple[Placement, Decisions]:
    out = Decisions()
    if budget.stop:
        return Placement(queue.pending, {}, table, 0.0), out
    margin = world.desired.fleet.contract_margin_s
    accepted = world.observed.memory.accepted_increases
    spending = Spending(budget)
    runtimes = budget.runtimes
    refused: list[tuple[PendingRun, float]] = []
    hours_on: dict[tuple[str, str], float] = {}
    free: dict[int, list[GpuState]] = {i: list(g) for i, g in table.free.items()}
    # a run goes only to boxes of its sweep's pool
    open_by_pool: dict[str, list[OwnedBox]] = {}
    for i in _open_boxes(world, table):
        open_by_pool.setdefault(world.boxes[i].pool, []).append(world.boxes[i])
    launches: dict[int, int] = {}
    considered = set(table.considered)
    unplaced: list[PendingRun] = []
    # First fit in box order. A box's free GPUs only shrink, so a box that cannot take a request now never
    # will this plan: each request shape keeps its own cursor into the open boxes (linear, not quadratic).
    cursor: dict[tuple[str, int, int], int] = {}
    code = world.desired.code_commit
    free_left = sum(len(free[b.id]) for boxes in open_by_pool.values() for b in boxes)
    placed: list[tuple[OwnedBox, tuple[int, ...], PendingRun]] = []  # this plan's launches: busy slots from now on
    short: dict[int, list[tuple[str, float]]] = {}  # box id -> (run id, its predicted seconds) its contract refused

    def room(run: PendingRun, box: OwnedBox, ahead_s: float = 0.0) -> bool:
        """Whether ``run``, started on ``box`` in ``ahead_s``, ends ``contract_margin`` before its contract does."""
        need = ahead_s + fc.run_s(run.spec, box.inst.gpu_name, box.inst.machine_id)
        if contract.room_for(box.inst, world.now, need, margin, accepted):
            return True
        short.setdefault(box.id, []).append((run.spec.id, need))
        return False

    def cost_of(spec: RunSpec, box: OwnedBox, gpus: int) -> float:
        share = box.inst.dph_total * gpus / max(1, box.inst.num_gpus)
        key = (spec.sweep.name, box.inst.gpu_name)
        hours = hours_on.get(key)
        if hours is None:  # one figure per sweep and GPU model: thousands of launches share a few
            gpu = world.gpu_dlperf.get(normalize_gpu_name(box.inst.gpu_name))
            hours = hours_on[key] = runtime_of(runtimes, spec).on(gpu)
        return share * hours

    def ship_code(box: OwnedBox) -> None:
        if not launches.get(box.id) and code and box.probe is not None and code not in box.probe.code_commits:
            out.act(
                ShipCode(
                    reason=f"commit {code} is not on this box yet",
                    code=ReasonCode.CODE_MISSING,
                    instance_id=box.id,
                    commit=code,
                )
            )

    def launch(run: PendingRun, box: OwnedBox, mask: tuple[int, ...], cost: float, rc: ReasonCode, why: str) -> None:
        """Launch ``run`` on ``mask`` of ``box`` now: its cost committed, its GPUs taken, the code shipped first."""
        nonlocal free_left
        spending.commit(cost)
        taken = set(mask)
        free[box.id] = [gpu for gpu in free[box.id] if gpu.index not in taken]
        free_left -= len(mask)
        placed.append((box, mask, run))
        ship_code(box)
        launches[box.id] = launches.get(box.id, 0) + 1
        considered.add(box.id)
        out.act(
            Launch(
                reason=f"pending (attempt {run.used + 1} of {allowed_attempts(run.spec)} allowed) on "
                f"{gpus_text(mask)}{why}",
                code=rc,
                instance_id=box.id,
                run_id=run.spec.id,
                attempt=run.next_attempt,
                gpu_mask=mask,
                command=run.spec.command,
                code_commit=code,
                sweep=run.spec.sweep.name,
            )
        )

    tail = _tail(world, queue.pending, open_by_pool, free, fc, room)
    for run, box, mask, why in tail:
        cost = cost_of(run.spec, box, len(mask))
        if not spending.fits(cost):
            refused.append((run, cost))
            continue
        launch(run, box, mask, cost, ReasonCode.TAIL_TO_FASTEST, f": {why}")
    in_tail = {run.spec.id for run, _, _, _ in tail}
    pending = [r for r in queue.pending if r.spec.id not in in_tail] if in_tail else queue.pending
    for n, run in enumerate(pending):
        if free_left <= 0:
            unplaced.extend(pending[n:])  # every GPU is taken: the rest wait, in order
            break
        spec = run.spec
        g, ram = run.gpus, run.gpu_ram_mib
        pool = world.pool_of_run(spec)
        open_boxes = open_by_pool.get(pool, [])
        i = cursor.get((pool, g, ram), 0)
        if i >= len(open_boxes):
            unplaced.append(run)
            continue
        chosen: list[GpuState] = []
        while i < len(open_boxes):
            chosen = _fit(free[open_boxes[i].id], g, ram)
            if len(chosen) >= g:
                break
            i += 1
        cursor[(pool, g, ram)] = i
        # the first box from the cursor on that fits and whose contract leaves room for the run (a box too short for
        # this run may take a shorter one: the cursor stays)
        while i < len(open_boxes) and (len(chosen) < g or not room(run, open_boxes[i])):
            i += 1
            if i < len(open_boxes):
                chosen = _fit(free[open_boxes[i].id], g, ram)
        if i >= len(open_boxes):
            unplaced.append(run)
            continue
        box = open_boxes[i]
        cost = cost_of(spec, box, len(chosen))
        if not spending.fits(cost):
            refused.append((run, cost))  # the GPUs stay free: a cheaper run may still fit
            continue
        launch(run, box, tuple(gpu.index for gpu in chosen), cost, ReasonCode.PENDING_RUN, "")
    slots = _busy_slots(world, queue, table, fc, placed)
    ahead = world.desired.fleet.queue_ahead_s
    if slots and ahead > 0 and unplaced:
        by_shape: dict[tuple[str, int], list[_BusySlot]] = {}
        for slot in slots:
            by_shape.setdefault((slot.box.pool, len(slot.mask)), []).append(slot)
        done: set[tuple[str, int, int]] = set()  # shapes no slot takes any more this plan
        left: list[PendingRun] = []
        for run in unplaced:
            shape = (world.pool_of_run(run.spec), run.gpus, run.gpu_ram_mib)
            if shape in done:
                left.append(run)
                continue
            open_slots = [
                sl for sl in by_shape.get(shape[:2], ())
                if sl.queued < MAX_QUEUED_PER_SLOT and (sl.free_s <= ahead or sl.queued == 0)
                and _holds(sl, run.gpu_ram_mib) and room(run, sl.box, sl.free_s)
            ]
            if not open_slots:
                done.add(shape)
                left.append(run)
                continue
            slot = min(open_slots, key=lambda sl: (sl.free_s, sl.box.id, sl.mask))
            box = slot.box
            cost = cost_of(run.spec, box, len(slot.mask))
            if not spending.fits(cost):
                refused.append((run, cost))
                left.append(run)
                continue
            spending.commit(cost)
            ship_code(box)
            launches[box.id] = launches.get(box.id, 0) + 1
            considered.add(box.id)
            start = slot.free_s
            slot.free_s += fc.run_s(run.spec, box.inst.gpu_name, box.inst.machine_id)
            slot.queued += 1
            out.act(
                Launch(
                    reason=f"queued behind {slot.current} on {gpus_text(slot.mask)} (entry {slot.queued}): predicted "
                    f"to start in {fmt_duration(start)} (queue_ahead {fmt_duration(ahead)})",
                    code=ReasonCode.QUEUED_AHEAD,
                    instance_id=box.id,
                    run_id=run.spec.id,
                    attempt=run.next_attempt,
                    gpu_mask=slot.mask,
                    command=run.spec.command,
                    code_commit=code,
                    sweep=run.spec.sweep.name,
                    queued=True,
                )
            )
        unplaced = left
    for box_id, refusals in sorted(short.items()):
        inst = world.boxes[box_id].inst
        ends_in = contract.time_left(inst, world.now, accepted) or 0.0
        run_id, need = refusals[0]
        others = {r for r, _ in refusals} - {run_id}
        more = f" and {len(others)} more" if others else ""
        out.noop(
            world.boxes[box_id].subject,
            ReasonCode.CONTRACT_ENDS_BEFORE_RUN,
            f"not launched or queued here: its contract ends in {fmt_duration(ends_in)}, run/{run_id}{more} "
            f"needs ~{fmt_duration(need)} + contract_margin {fmt_duration(margin)}",
        )
    if refused:
        first_cost = refused[0][1]
        out.noop(
            f"fleet/{world.desired.fleet.name}",
            ReasonCode.BUDGET_REFUSED,
            f"budget: {len(refused)} run(s) not launched on free GPUs: the next would cost ~{usd(first_cost)} "
            f"(its share of the box to its expected runtime), {usd(max(0.0, spending.left()))} is left before "
            f"{budget.tightest}",
        )
    new_table = replace(table, free={i: tuple(g) for i, g in free.items()}, considered=frozenset(considered))
    slot_free = tuple(sorted((sl.box.id, sl.mask, sl.free_s) for sl in slots))
    return Placement(tuple(unplaced), launches, new_table, spending.committed, slot_free), out


def _holds(slot: _BusySlot, ram_mib: int) -> bool:
    """Every GPU of the slot has ``ram_mib`` of memory (as the box reports its GPUs)."""
    if not ram_mib or slot.box.probe is None:
        return True
    total = {g.index: g.memory_total_mib for g in slot.box.probe.gpus}
    return all(total.get(i, 0) >= ram_mib for i in slot.mask)


def _busy_slots(
    world: World,
    queue: RunQueue,
    table: BoxTable,
    fc: Forecast,
    placed: Sequence[tuple[OwnedBox, tuple[int, ...], PendingRun]],
) -> list[_BusySlot]:
    """The busy GPU slots of ready boxes that may be given queue entries: not destroyed, not draining. Each is the
    mask of an attempt kept running (``RunQueue.running``) or launched by this plan (``placed``), or of attempts
    waiting in the box's queue on GPUs whose attempt just ended; its free time counts the current attempt's
    remaining time and every entry queued on it."""
    slots: dict[tuple[int, tuple[int, ...]], _BusySlot] = {}

    def usable(box_id: int) -> OwnedBox | None:
        box = world.boxes.get(box_id)
        if box is None or box.probe is None or box.probe.draining or box_id in table.destroyed:
            return None
        return box if table.states.get(box_id) is BoxState.READY else None

    for run_id, (box_id, rd) in sorted(queue.running.items()):
        box = usable(box_id)
        spec = world.runs.get(run_id)
        if box is None or spec is None or not rd.gpu_mask:
            continue
        mask = tuple(rd.gpu_mask)
        slots[(box_id, mask)] = _BusySlot(box, mask, fc.remaining_s(spec, rd, box), 0, f"run/{run_id}.{rd.attempt}")
    for box, mask, run in placed:
        if usable(box.id) is not None and (box.id, mask) not in slots:
            whole = fc.run_s(run.spec, box.inst.gpu_name, box.inst.machine_id)
            label = f"run/{run.spec.id}.{run.next_attempt} (launched now)"
            slots[(box.id, mask)] = _BusySlot(box, mask, whole, 0, label)
    counted: set[tuple[int, str, int]] = set()
    for fl in sorted(queue.queued, key=lambda f: (f.instance_id, f.run_id, f.attempt)):
        box = usable(fl.instance_id)
        spec = world.runs.get(fl.run_id)
        if box is None or spec is None or not fl.gpu_mask:
            continue
        mask = tuple(fl.gpu_mask)
        slot = slots.get((box.id, mask))
        if slot is None:
            slot = slots[(box.id, mask)] = _BusySlot(box, mask, 0.0, 0, f"run/{fl.run_id}.{fl.attempt} (queued)")
        slot.free_s += fc.run_s(spec, box.inst.gpu_name, box.inst.machine_id)
        slot.queued += 1
        counted.add((box.id, fl.run_id, fl.attempt))
    for (box_id, mask), slot in slots.items():  # what else the box reports queued on the slot (a stale plan's)
        assert slot.box.probe is not None
        for q in slot.box.probe.queued:
            other = world.runs.get(q.run_id)
            if tuple(q.gpu_mask) != mask or (box_id, q.run_id, q.attempt) in counted or other is None:
                continue
            slot.free_s += fc.run_s(other, slot.box.inst.gpu_name, slot.box.inst.machine_id)
            slot.queued += 1
    return sorted(slots.values(), key=lambda sl: (sl.box.id, sl.mask))


def _tail(
    world: World,
    pending: Sequence[PendingRun],
    open_by_pool: Mapping[str, Sequence[OwnedBox]],
    free: Mapping[int, Sequence[GpuState]],
    fc: Forecast,
    room: Callable[[PendingRun, OwnedBox], bool],
) -> list[tuple[PendingRun, OwnedBox, tuple[int, ...], str]]:
    """The tail of each pool: when all its pending runs are one-GPU runs that fit in its free GPUs, and those GPUs
    differ in predicted speed, (run, box, mask, why) pairing the longest predicted work with the fastest GPU."""
    by_pool: dict[str, list[PendingRun]] = {}
    for run in pending:
        by_pool.setdefault(world.pool_of_run(run.spec), []).append(run)
    out: list[tuple[PendingRun, OwnedBox, tuple[int, ...], str]] = []
    for pool in sorted(by_pool):
        runs = by_pool[pool]
        gpus = [(box, gpu) for box in open_by_pool.get(pool, ()) for gpu in free.get(box.id, ())]
        if not gpus or len(runs) > len(gpus) or any(r.gpus != 1 for r in runs):
            continue
        speeds = {fc.run_s(r.spec, box.inst.gpu_name, box.inst.machine_id) for r in runs for box, _ in gpus}
        if len(speeds) < 2:
            continue  # every GPU is as fast: first fit is as good
        order = {r.spec.id: n for n, r in enumerate(runs)}
        longest = sorted(runs, key=lambda r: (-fc.run_s(r.spec, ""), order[r.spec.id]))
        left = list(gpus)
        for run in longest:
            fits = [
                (fc.run_s(run.spec, box.inst.gpu_name, box.inst.machine_id), n)
                for n, (box, gpu) in enumerate(left)
                if (not run.gpu_ram_mib or gpu.memory_total_mib >= run.gpu_ram_mib) and room(run, box)
            ]
            if not fits:
                continue
            secs, n = min(fits)
            box, gpu = left.pop(n)
            why = f"the tail: longest work first to the fastest free GPU (predicted {fmt_duration(secs)})"
            out.append((run, box, (gpu.index,), why))
    return out


def _fit(box_free: Sequence[GpuState], gpus: int, ram_mib: int) -> list[GpuState]:
    """The first ``gpus`` of a box's free GPUs with ``ram_mib`` each (fewer: the box cannot take the run)."""
    return [gpu for gpu in box_free if gpu.memory_total_mib >= ram_mib][:gpus] if ram_mib else list(box_free[:gpus])


def _open_boxes(world: World, table: BoxTable) -> list[int]:
    return [
        i for i in world.boxes
        if table.states.get(i) is BoxState.READY and i not in table.destroyed and table.free.get(i)
    ]


def without_free_gpus(world: World, table: BoxTable, runs: Sequence[PendingRun]) -> tuple[PendingRun, ...]:
    """Those of ``runs`` no ready box of their pool has free GPUs for now: held back from launching this plan, they
    may still need a box rented (one that boots while they wait), but not when a free slot will take them next
    cycle."""
    boxes = _open_boxes(world, table)
    return tuple(
        r for r in runs
        if not any(
            world.boxes[i].pool == world.pool_of_run(r.spec)
            and len(_fit(table.free[i], r.gpus, r.gpu_ram_mib)) >= r.gpus
            for i in boxes
        )
    )
