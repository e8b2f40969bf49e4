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

from collections.abc import Mapping, Sequence
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
    """Pending runs onto free GPUs (the tail first, then first fit in launch order), then queued behind busy slots;
    the runs nothing took are left to renting, in launch order."""
    if budget.stop:
        return Placement(queue.pending, {}, table, 0.0), Decisions()
    placer = _Placer(world, table, budget, fc)
    rest = placer.place_tail(queue.pending)
    unplaced = placer.first_fit(rest)
    slots = _busy_slots(world, queue, table, fc, placer.placed)
    unplaced = placer.queue_ahead(unplaced, slots)
    placer.explain_refusals()
    return placer.placement(unplaced, table, slots), placer.out


class _Placer:
    """One placement being built, step by step: the GPUs still free on each open box, the launches and queue entries
    made so far and what they cost, and what was refused (by the budget, by a box's contract) for the no-ops."""

    def __init__(self, world: World, table: BoxTable, budget: Purse, fc: Forecast) -> None:
        self.world = world
        self.fc = fc
        self.budget = budget
        self.margin = world.desired.fleet.contract_margin_s
        self.accepted = world.observed.memory.accepted_increases
        self.code = world.desired.code_commit  # shipped before a box's first launch when it lacks it
        self.spending = Spending(budget)
        self.out = Decisions()
        self.free: dict[int, list[GpuState]] = {i: list(g) for i, g in table.free.items()}
        self.open_by_pool = _open_by_pool(world, table)  # a run goes only to boxes of its sweep's pool
        self.free_left = sum(len(self.free[b.id]) for boxes in self.open_by_pool.values() for b in boxes)
        self.launches: dict[int, int] = {}  # box id -> launches and queue entries placed on it
        self.considered = set(table.considered)
        self.placed: list[tuple[OwnedBox, tuple[int, ...], PendingRun]] = []  # launches: busy slots from now on
        self.refused: list[tuple[PendingRun, float]] = []  # (run, its cost) the budget's headroom refused
        self.short: dict[int, list[tuple[str, float]]] = {}  # box id -> (run id, its predicted seconds) refused
        # First fit in box order. A box's free GPUs only shrink, so a box that cannot take a request now never
        # will this plan: each request shape keeps its own cursor into the open boxes (linear, not quadratic).
        self.cursor: dict[tuple[str, int, int], int] = {}
        self.hours_on: dict[tuple[str, str], float] = {}  # (sweep, GPU model) -> expected hours of one run
        self.seconds_on: dict[tuple[str, str, int], float] = {}  # (run id, GPU model, machine) -> ``run_s``

    def run_s(self, run: PendingRun, box: OwnedBox) -> float:
        """``Forecast.run_s`` of ``run`` on ``box``'s GPUs, figured once per run and GPU model (and machine): the
        contract check asks it for every slot a run might queue behind."""
        key = (run.spec.id, box.inst.gpu_name, box.inst.machine_id)
        secs = self.seconds_on.get(key)
        if secs is None:
            secs = self.seconds_on[key] = self.fc.run_s(run.spec, box.inst.gpu_name, box.inst.machine_id)
        return secs

    def fits_contract(self, run: PendingRun, box: OwnedBox, ahead_s: float = 0.0) -> bool:
        """Whether ``run``, started on ``box`` in ``ahead_s``, ends ``contract_margin`` before its contract does."""
        need = ahead_s + self.run_s(run, box)
        if contract.room_for(box.inst, self.world.now, need, self.margin, self.accepted):
            return True
        self.short.setdefault(box.id, []).append((run.spec.id, need))
        return False

    def cost_of(self, spec: RunSpec, box: OwnedBox, gpus: int) -> float:
        """What one run on ``gpus`` of ``box`` is expected to cost: its share of the box to its expected runtime."""
        share = box.inst.dph_total * gpus / max(1, box.inst.num_gpus)
        key = (spec.sweep.name, box.inst.gpu_name)
        hours = self.hours_on.get(key)
        if hours is None:  # one figure per sweep and GPU model: thousands of launches share a few
            gpu = self.world.gpu_dlperf.get(normalize_gpu_name(box.inst.gpu_name))
            hours = self.hours_on[key] = runtime_of(self.budget.runtimes, spec).on(gpu)
        return share * hours

    def affordable(self, run: PendingRun, cost: float) -> bool:
        """Whether the budget's headroom takes ``cost``; a refusal is kept for the no-op."""
        if self.spending.fits(cost):
            return True
        self.refused.append((run, cost))
        return False

    def _book(self, box: OwnedBox, cost: float) -> None:
        """A launch or queue entry on ``box``: its cost committed, the code shipped before the box's first one."""
        self.spending.commit(cost)
        if not self.launches.get(box.id):
            self._ship_code(box)
        self.launches[box.id] = self.launches.get(box.id, 0) + 1
        self.considered.add(box.id)

    def _ship_code(self, box: OwnedBox) -> None:
        code = self.code
        if code and box.probe is not None and code not in box.probe.code_commits:
            self.out.act(
                ShipCode(
                    reason=f"commit {code} is not on this box yet",
                    code=ReasonCode.CODE_MISSING,
                    instance_id=box.id,
                    commit=code,
                )
            )

    def _launch(
        self, run: PendingRun, box: OwnedBox, mask: tuple[int, ...], rc: ReasonCode, reason: str, queued: bool
    ) -> Launch:
        return Launch(
            reason=reason,
            code=rc,
            instance_id=box.id,
            run_id=run.spec.id,
            attempt=run.next_attempt,
            gpu_mask=mask,
            command=run.spec.command,
            code_commit=self.code,
            sweep=run.spec.sweep.name,
            queued=queued,
        )

    def launch(
        self, run: PendingRun, box: OwnedBox, mask: tuple[int, ...], cost: float, rc: ReasonCode, why: str
    ) -> None:
        """Launch ``run`` on ``mask`` of ``box`` now: its cost committed, its GPUs taken, the code shipped first."""
        self._book(box, cost)
        taken = set(mask)
        self.free[box.id] = [gpu for gpu in self.free[box.id] if gpu.index not in taken]
        self.free_left -= len(mask)
        self.placed.append((box, mask, run))
        reason = f"pending (attempt {run.used + 1} of {allowed_attempts(run.spec)} allowed) on {gpus_text(mask)}{why}"
        self.out.act(self._launch(run, box, mask, rc, reason, queued=False))

    def place_tail(self, pending: Sequence[PendingRun]) -> Sequence[PendingRun]:
        """Each pool's tail launched, longest work to the fastest GPU (``_tail``); the pending runs it did not take
        (one the budget refused there is not tried again this plan)."""
        tail = self._tail(pending)
        for run, box, mask, why in tail:
            cost = self.cost_of(run.spec, box, len(mask))
            if self.affordable(run, cost):
                self.launch(run, box, mask, cost, ReasonCode.TAIL_TO_FASTEST, f": {why}")
        in_tail = {run.spec.id for run, _, _, _ in tail}
        return [r for r in pending if r.spec.id not in in_tail] if in_tail else pending

    def _tail(self, pending: Sequence[PendingRun]) -> list[tuple[PendingRun, OwnedBox, tuple[int, ...], str]]:
        """The tail of each pool: when all its pending runs are one-GPU runs that fit in its free GPUs, and those GPUs
        differ in predicted speed, (run, box, mask, why) pairing the longest predicted work with the fastest GPU."""
        by_pool: dict[str, list[PendingRun]] = {}
        for run in pending:
            by_pool.setdefault(self.world.pool_of_run(run.spec), []).append(run)
        out: list[tuple[PendingRun, OwnedBox, tuple[int, ...], str]] = []
        for pool in sorted(by_pool):
            runs = by_pool[pool]
            gpus = [(box, gpu) for box in self.open_by_pool.get(pool, ()) for gpu in self.free.get(box.id, ())]
            if not gpus or len(runs) > len(gpus) or any(r.gpus != 1 for r in runs):
                continue
            speeds = {self.run_s(r, box) for r in runs for box, _ in gpus}
            if len(speeds) < 2:
                continue  # every GPU is as fast: first fit is as good
            order = {r.spec.id: n for n, r in enumerate(runs)}
            longest = sorted(runs, key=lambda r: (-self.fc.run_s(r.spec, ""), order[r.spec.id]))
            left = list(gpus)
            for run in longest:
                fits = [
                    (self.run_s(run, box), n)
                    for n, (box, gpu) in enumerate(left)
                    if _enough_ram(gpu.memory_total_mib, run.gpu_ram_mib) and self.fits_contract(run, box)
                ]
                if not fits:
                    continue
                secs, n = min(fits)
                box, gpu = left.pop(n)
                why = f"the tail: longest work first to the fastest free GPU (predicted {fmt_duration(secs)})"
                out.append((run, box, (gpu.index,), why))
        return out

    def first_fit(self, pending: Sequence[PendingRun]) -> list[PendingRun]:
        """Each run, in launch order, onto the first open box of its pool with free GPUs for it and contract room;
        the runs no box took, in launch order."""
        unplaced: list[PendingRun] = []
        for n, run in enumerate(pending):
            if self.free_left <= 0:
                unplaced.extend(pending[n:])  # every GPU is taken: the rest wait, in order
                break
            found = self._first_box(run)
            if found is None:
                unplaced.append(run)
                continue
            box, chosen = found
            cost = self.cost_of(run.spec, box, len(chosen))
            if self.affordable(run, cost):  # else the GPUs stay free: a cheaper run may still fit
                self.launch(run, box, tuple(gpu.index for gpu in chosen), cost, ReasonCode.PENDING_RUN, "")
        return unplaced

    def _first_box(self, run: PendingRun) -> tuple[OwnedBox, list[GpuState]] | None:
        """The first open box from the shape's cursor on with free GPUs for ``run`` and whose contract leaves room for
        it, with the GPUs it would take (a box too short for this run may take a shorter one: the cursor stays)."""
        g, ram = run.gpus, run.gpu_ram_mib
        pool = self.world.pool_of_run(run.spec)
        boxes = self.open_by_pool.get(pool, [])
        i = self.cursor.get((pool, g, ram), 0)
        chosen: list[GpuState] = []
        while i < len(boxes):
            chosen = _fit(self.free[boxes[i].id], g, ram)
            if len(chosen) >= g:
                break
            i += 1
        self.cursor[(pool, g, ram)] = i
        while i < len(boxes) and (len(chosen) < g or not self.fits_contract(run, boxes[i])):
            i += 1
            if i < len(boxes):
                chosen = _fit(self.free[boxes[i].id], g, ram)
        return (boxes[i], chosen) if i < len(boxes) else None

    def queue_ahead(self, unplaced: list[PendingRun], slots: Sequence[_BusySlot]) -> list[PendingRun]:
        """The runs no free GPU took, queued behind busy slots of their pool and GPU count (``_slot_for``), in launch
        order; those no slot takes are returned, in launch order."""
        ahead = self.world.desired.fleet.queue_ahead_s
        if not (slots and ahead > 0 and unplaced):
            return unplaced
        by_shape: dict[tuple[str, int], list[_BusySlot]] = {}
        for busy in slots:
            by_shape.setdefault((busy.box.pool, len(busy.mask)), []).append(busy)
        done: set[tuple[str, int, int]] = set()  # shapes no slot takes any more this plan
        left: list[PendingRun] = []
        for run in unplaced:
            shape = (self.world.pool_of_run(run.spec), run.gpus, run.gpu_ram_mib)
            slot = None if shape in done else self._slot_for(run, by_shape.get(shape[:2], ()), ahead)
            if slot is None:
                done.add(shape)
                left.append(run)
                continue
            cost = self.cost_of(run.spec, slot.box, len(slot.mask))
            if self.affordable(run, cost):
                self.queue_behind(run, slot, cost, ahead)
            else:
                left.append(run)
        return left

    def _slot_for(self, run: PendingRun, slots: Sequence[_BusySlot], ahead: float) -> _BusySlot | None:
        """The slot predicted to free first of those that take ``run``: its queue not full, predicted free within
        ``queue_ahead`` (or nothing queued on it yet), enough memory, and contract room after the wait."""
        takers = [
            sl for sl in slots
            if sl.queued < MAX_QUEUED_PER_SLOT and (sl.free_s <= ahead or sl.queued == 0)
            and _holds(sl, run.gpu_ram_mib) and self.fits_contract(run, sl.box, sl.free_s)
        ]
        return min(takers, key=lambda sl: (sl.free_s, sl.box.id, sl.mask), default=None)

    def queue_behind(self, run: PendingRun, slot: _BusySlot, cost: float, ahead: float) -> None:
        """Queue ``run`` behind ``slot``'s work: its cost committed, the slot busy for one more run."""
        box = slot.box
        self._book(box, cost)
        start = slot.free_s
        slot.free_s += self.run_s(run, box)
        slot.queued += 1
        reason = (
            f"queued behind {slot.current} on {gpus_text(slot.mask)} (entry {slot.queued}): predicted "
            f"to start in {fmt_duration(start)} (queue_ahead {fmt_duration(ahead)})"
        )
        self.out.act(self._launch(run, box, slot.mask, ReasonCode.QUEUED_AHEAD, reason, queued=True))

    def explain_refusals(self) -> None:
        """One no-op per box whose contract refused runs, and one for the runs the budget refused."""
        for box_id, refusals in sorted(self.short.items()):
            inst = self.world.boxes[box_id].inst
            ends_in = contract.time_left(inst, self.world.now, self.accepted) or 0.0
            run_id, need = refusals[0]
            others = {r for r, _ in refusals} - {run_id}
            more = f" and {len(others)} more" if others else ""
            self.out.noop(
                self.world.boxes[box_id].subject,
                ReasonCode.CONTRACT_ENDS_BEFORE_RUN,
                f"not launched or queued here: its contract ends in {fmt_duration(ends_in)}, run/{run_id}{more} "
                f"needs ~{fmt_duration(need)} + contract_margin {fmt_duration(self.margin)}",
            )
        if self.refused:
            first_cost = self.refused[0][1]
            self.out.noop(
                f"fleet/{self.world.desired.fleet.name}",
                ReasonCode.BUDGET_REFUSED,
                f"budget: {len(self.refused)} run(s) not launched on free GPUs: the next would cost ~{usd(first_cost)} "
                f"(its share of the box to its expected runtime), {usd(max(0.0, self.spending.left()))} is left "
                f"before {self.budget.tightest}",
            )

    def placement(self, unplaced: Sequence[PendingRun], table: BoxTable, slots: Sequence[_BusySlot]) -> Placement:
        free = {i: tuple(g) for i, g in self.free.items()}
        new_table = replace(table, free=free, considered=frozenset(self.considered))
        slot_free = tuple(sorted((sl.box.id, sl.mask, sl.free_s) for sl in slots))
        return Placement(tuple(unplaced), self.launches, new_table, self.spending.committed, slot_free)


def _enough_ram(total_mib: int, ram_mib: int) -> bool:
    """A GPU of ``total_mib`` takes a run asking ``ram_mib`` on each (0: any GPU)."""
    return not ram_mib or total_mib >= ram_mib


def _holds(slot: _BusySlot, ram_mib: int) -> bool:
    """Every GPU of the slot has ``ram_mib`` of memory (as the box reports its GPUs)."""
    if not ram_mib or slot.box.probe is None:
        return True
    total = {g.index: g.memory_total_mib for g in slot.box.probe.gpus}
    return all(_enough_ram(total.get(i, 0), ram_mib) for i in slot.mask)


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


def _fit(box_free: Sequence[GpuState], gpus: int, ram_mib: int) -> list[GpuState]:
    """The first ``gpus`` of a box's free GPUs with ``ram_mib`` each (fewer: the box cannot take the run)."""
    return [gpu for gpu in box_free if gpu.memory_total_mib >= ram_mib][:gpus] if ram_mib else list(box_free[:gpus])


def _open_boxes(world: World, table: BoxTable) -> list[int]:
    return [
        i for i in world.boxes
        if table.states.get(i) is BoxState.READY and i not in table.destroyed and table.free.get(i)
    ]


def _open_by_pool(world: World, table: BoxTable) -> dict[str, list[OwnedBox]]:
    """The open boxes (``_open_boxes``) of each pool, in box order."""
    out: dict[str, list[OwnedBox]] = {}
    for i in _open_boxes(world, table):
        out.setdefault(world.boxes[i].pool, []).append(world.boxes[i])
    return out


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
