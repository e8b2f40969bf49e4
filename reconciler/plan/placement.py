"""Placement: pending runs onto free GPU slots of ready boxes, in launch order, first fit.

A GPU is free only when no run holds it and its memory used is at most ``FREE_GPU_MEMORY_MIB``; a multi-GPU
run gets one ``CUDA_VISIBLE_DEVICES`` mask of that many free GPUs with enough memory each. The pinned code
commit is shipped before the first launch on a box that lacks it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from reconciler.actions import Launch, ReasonCode, ShipCode
from reconciler.model import GpuState
from reconciler.offers import normalize_gpu_name
from reconciler.plan.attempts import PendingRun, RunQueue
from reconciler.plan.boxes import BoxState, BoxTable
from reconciler.plan.common import Decisions, gpus_text, usd
from reconciler.plan.forecast import Forecast
from reconciler.plan.money import Purse, Spending, runtime_of
from reconciler.plan.world import OwnedBox, World
from reconciler.runphase import allowed_attempts


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
    for n, run in enumerate(queue.pending):
        if free_left <= 0:
            unplaced.extend(queue.pending[n:])  # every GPU is taken: the rest wait, in order
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
        if i >= len(open_boxes):
            unplaced.append(run)
            continue
        box = open_boxes[i]
        share = box.inst.dph_total * len(chosen) / max(1, box.inst.num_gpus)
        key = (spec.sweep.name, box.inst.gpu_name)
        hours = hours_on.get(key)
        if hours is None:  # one figure per sweep and GPU model: thousands of launches share a few
            gpu = world.gpu_dlperf.get(normalize_gpu_name(box.inst.gpu_name))
            hours = hours_on[key] = runtime_of(runtimes, spec).on(gpu)
        cost = share * hours
        if not spending.fits(cost):
            refused.append((run, cost))  # the GPUs stay free: a cheaper run may still fit
            continue
        spending.commit(cost)
        mask = tuple(gpu.index for gpu in chosen)
        taken = set(mask)
        free[box.id] = [gpu for gpu in free[box.id] if gpu.index not in taken]
        free_left -= len(mask)
        if not launches.get(box.id) and code and box.probe is not None and code not in box.probe.code_commits:
            out.act(
                ShipCode(
                    reason=f"commit {code} is not on this box yet",
                    code=ReasonCode.CODE_MISSING,
                    instance_id=box.id,
                    commit=code,
                )
            )
        launches[box.id] = launches.get(box.id, 0) + 1
        considered.add(box.id)
        out.act(
            Launch(
                reason=f"pending (attempt {run.used + 1} of {allowed_attempts(spec)} allowed) on {gpus_text(mask)}",
                code=ReasonCode.PENDING_RUN,
                instance_id=box.id,
                run_id=spec.id,
                attempt=run.next_attempt,
                gpu_mask=mask,
                command=spec.command,
                code_commit=code,
                sweep=spec.sweep.name,
            )
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
    return Placement(tuple(unplaced), launches, new_table, spending.committed), out


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
