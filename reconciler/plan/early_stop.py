"""Early termination: which live runs the sweep's ``early_terminate`` (ASHA, Hyperband) stops at a rung. Pure.

Rungs are at ``min_iter`` × ``eta``^k in the sweep's ``progress`` units (``EarlyTerminate.levels``). What a run
scored when it first reached each rung is remembered (``FleetMemory.rungs``, kept by ``remember`` from the probes'
last metrics lines, finite numbers only), so a finished or stopped run stays a peer at its rungs. A run is judged
at the highest rung it has reached: it is stopped when at least ``eta`` runs (itself included) have a value there
and its value is not in the top ceil(n / ``eta``) of them (ties stay). Hyperband splits the sweep's runs into
brackets s = 0..s_max by their trial number (a grid sweep: its cell's order in the sweep), mod the bracket count;
bracket s is ASHA from its own minimum resource, ``min_iter`` × ``eta``^s (the levels from the s-th on).

The kill itself is ``attempts.settle_live``'s, archived ``stopped_early`` (settled, no retry spent).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from reconciler.core.model import EarlyTerminateType, MetricGoal, RungValue, RunSpec
from reconciler.plan.world import World


@dataclass(frozen=True)
class EarlyStop:
    """A run to stop at a rung, and why (the kill's reason)."""

    run_id: str
    reason: str


def early_stops(world: World) -> Mapping[str, EarlyStop]:
    """Run id -> its early stop, for every run of a sweep with ``early_terminate`` below its rung's cut-off now.
    Runs without a value at any rung, or whose sweep has no ``progress`` or no objective, are never stopped."""
    records = rung_records(world.observed.memory.rungs)
    if not records:
        return {}
    brackets = run_brackets(world.runs)
    peers: dict[tuple[str, int, float], list[float]] = {}  # (sweep, bracket, level) -> the values there
    for run_id, values in records.items():
        spec = world.runs.get(run_id)
        if spec is None or run_id not in brackets:
            continue
        for level, value in values.items():
            peers.setdefault((spec.sweep.name, brackets[run_id], level), []).append(value)
    stops: dict[str, EarlyStop] = {}
    for run_id, spec in world.runs.items():
        mine = records.get(run_id)
        if not mine or run_id not in brackets:
            continue
        stop = _judge(spec, brackets[run_id], mine, peers)
        if stop is not None:
            stops[run_id] = stop
    return stops


def rung_records(rungs: tuple[RungValue, ...]) -> dict[str, dict[float, float]]:
    """Run id -> {rung level: its value there}, the first record per (run, level) winning."""
    out: dict[str, dict[float, float]] = {}
    for r in rungs:
        out.setdefault(r.run_id, {}).setdefault(r.level, r.value)
    return out


def run_brackets(runs: Mapping[str, RunSpec]) -> dict[str, int]:
    """Run id -> its Hyperband bracket (0 for ASHA), for the runs of sweeps with ``early_terminate``: its trial
    number, or for a grid cell its cell's order in the sweep (seeds of a cell share it), mod the bracket count."""
    cells: dict[str, dict[str, int]] = {}  # sweep -> cell -> its order
    out: dict[str, int] = {}
    for run_id, spec in runs.items():
        et = spec.sweep.early_terminate
        if et is None:
            continue
        total = spec.sweep.progress.total if spec.sweep.progress is not None else None
        n = et.brackets(total)
        order = cells.setdefault(spec.sweep.name, {})
        number = spec.trial if spec.trial is not None else order.setdefault(spec.cell, len(order))
        out[run_id] = number % n if et.type is EarlyTerminateType.HYPERBAND else 0
    return out


def _judge(
    spec: RunSpec,
    bracket: int,
    mine: Mapping[float, float],
    peers: Mapping[tuple[str, int, float], list[float]],
) -> EarlyStop | None:
    """The run's stop at the highest rung of its bracket it has reached, or None."""
    sweep = spec.sweep
    et, objective = sweep.early_terminate, sweep.objective
    if et is None or sweep.progress is None or objective is None:
        return None
    levels = et.levels(sweep.progress.total)[bracket:]
    reached = [(n, level) for n, level in enumerate(levels, 1) if level in mine]
    if not reached:
        return None
    rung, level = reached[-1]
    there = peers.get((sweep.name, bracket, level), [])
    if len(there) < et.eta:
        return None
    key, goal = objective
    best_first = sorted(there, reverse=goal is MetricGoal.MAX)
    keep = math.ceil(len(there) / et.eta)
    cutoff = best_first[keep - 1]
    value = mine[level]
    behind = value < cutoff if goal is MetricGoal.MAX else value > cutoff
    if not behind:
        return None
    where = f"rung {rung}" if et.type is EarlyTerminateType.ASHA else f"rung {rung} of bracket {bracket}"
    sign = "<" if goal is MetricGoal.MAX else ">"
    return EarlyStop(
        spec.id,
        f"early stop at {where} ({sweep.progress.key} {level:g}): {key} {value:g} {sign} cut-off {cutoff:g} "
        f"(top 1/{et.eta:g} of {len(there)})",
    )
