"""The observed/*.yaml documents, rendered from one cycle's facts for humans and agents to diff.

Every cycle renders the same seven files (hosts.yaml: ``reconciler.observed.hosts_file``, throughput.yaml:
``reconciler.observed.throughput_file``) from the same facts. They
must be byte-identical when the world did not change, because rigsync commits only when a file changed: so no
"last cycle at" stamps, no GPU memory or utilisation readings, no running metrics. Facts that do change are kept
(a box's start time, a run's phase). Two values move with the clock and get special care:

* ``status.yaml`` carries ``last_change_at``: the time of the last cycle in which anything else changed. The
  renderer compares with the previous files and keeps the old stamp when nothing else differs.
* ``budget.yaml`` carries billed spend and the account's credit as an anchor (``memory.spend_anchor``): a
  snapshot at ``as_of`` and the rates its figures grow at, kept while every figure stays on its line.

The parts that are the fleet's cross-cycle memory (box memory, attempts in flight, the spend anchor) are
encoded by ``reconciler.observed.memory``, which also reads them back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reconciler.core.actions import Plan
from reconciler.core.bounds import MAX_GPUS, MAX_LIST_ENTRIES, MAX_NOTE_CHARS, bounded_block, bounded_text, finite
from reconciler.core.contract import box_end
from reconciler.core.model import (
    AttemptRecord,
    Desired,
    InstanceStatus,
    MetricGoal,
    Observed,
    RunPhase,
    RunSpec,
    owned_by,
    run_dir_name,
    split_owned,
)
from reconciler.core.promotion import succeeded_metrics, wanted_ids
from reconciler.core.runphase import RunTally, is_live, live_attempts, live_progress, run_phase, tally_runs
from reconciler.observed.codec import (
    BUDGET,
    DRIFT,
    FLEET,
    FORMAT_VERSION,
    HOSTS,
    RUNS,
    STATUS,
    THROUGHPUT,
    dump_yaml,
    iso,
    load_mapping_quietly,
    money,
)
from reconciler.observed.hosts_file import HEADER as HOSTS_HEADER
from reconciler.observed.hosts_file import hosts_document
from reconciler.observed.memory import (
    accepted_increase_entries,
    box_memory_entries,
    in_flight_entries,
    rung_entries,
    spend_anchor,
)
from reconciler.observed.throughput_file import HEADER as THROUGHPUT_HEADER
from reconciler.observed.throughput_file import throughput_document

RUN_PHASES = tuple(p.value for p in RunPhase)


@dataclass(frozen=True)
class ReconcilerStatus:
    """The reconciler's own state, as ``status.yaml`` reports it."""

    desired_commit_applied: str | None = None
    last_valid_desired_commit: str | None = None
    desired_errors: tuple[str, ...] = ()
    apply_errors: tuple[str, ...] = ()
    holder: str | None = None


def _fleet_name(desired: Desired | None, observed: Observed) -> str:
    return desired.fleet.name if desired is not None else observed.fleet_name


# ------------------------------------------------------------------------------------------------ fleet


def _render_fleet(fleet: str, observed: Observed) -> dict[str, Any]:
    owned, foreign = split_owned(observed.instances, fleet)
    probes = observed.probes_by_id()
    on_gpu: dict[tuple[int, int], str] = {}
    for p in observed.probes:
        for r in p.runs:
            if is_live(r):
                for gi in r.gpu_mask:
                    on_gpu[(p.instance_id, gi)] = run_dir_name(r.run_id, r.attempt)
    for f in observed.memory.in_flight:
        for gi in f.gpu_mask:
            on_gpu.setdefault((f.instance_id, gi), run_dir_name(f.run_id, f.attempt))
    boxes = []
    for inst in owned:
        own = owned_by(fleet, inst.label)
        probe = probes.get(inst.id)
        mem = observed.memory_of(inst.id)
        gpus: list[dict[str, Any]] = []
        unlisted = 0
        if probe is not None and probe.reachable:
            # the box's claims never grow the file: GPUs the instance is not listed with are counted, not listed
            listed = inst.num_gpus if inst.num_gpus > 0 else MAX_GPUS
            seen: set[int] = set()
            for g in sorted(probe.gpus, key=lambda g: g.index):
                if not 0 <= g.index < min(listed, MAX_GPUS) or g.index in seen or not 0 <= g.memory_total_mib < 1 << 40:
                    unlisted += 1
                    continue
                seen.add(g.index)
                gpus.append(
                    {
                        "index": g.index,
                        "memory_total_mib": g.memory_total_mib,
                        "busy": g.memory_in_use,
                        "run": _text(on_gpu.get((inst.id, g.index))),
                    }
                )
        boxes.append(
            {
                "id": inst.id,
                "slot": own.slot if own else None,
                "label": inst.label,
                "status": inst.status.value,
                "gpu_name": inst.gpu_name,
                "num_gpus": inst.num_gpus,
                "gpu_ram_mib": inst.gpu_ram_mib,
                "dph": money(inst.dph_total),
                "machine_id": inst.machine_id,
                "image": inst.image,
                "interruptible": inst.is_bid,
                "started_at": iso(inst.start_date),
                # its contract's end (``reconciler.core.contract.box_end``): the views show the time left from it
                **({"ends_at": end} if (end := iso(box_end(inst, observed.memory.accepted_increases))) else {}),
                "reachable": None if probe is None else probe.reachable,
                "first_seen_at": iso(mem.first_seen_at) if mem else None,
                "unreachable_since": iso(mem.unreachable_since) if mem else None,
                # boot ends at its first answer, bootstrap at its first ready one: the box's timeline (when known)
                **({"reachable_at": iso(mem.reachable_at)} if mem and mem.reachable_at is not None else {}),
                **({"ready_at": iso(mem.ready_at)} if mem and mem.ready_at is not None else {}),
                "bootstrapped": _claims(probe.bootstrap_hashes) if probe and probe.reachable else [],
                "code_commits": _claims(probe.code_commits) if probe and probe.reachable else [],
                "gpus": gpus,
                **({"gpus_unlisted": unlisted} if unlisted else {}),
            }
        )
    return {
        "format_version": FORMAT_VERSION,
        "fleet": fleet,
        "held": len(owned),
        "dph": money(sum(i.dph_total for i in owned)),
        "boxes": boxes,
        "foreign": [
            {
                "id": i.id,
                "label": i.label,
                "status": i.status.value,
                "gpu_name": i.gpu_name,
                "num_gpus": i.num_gpus,
                "dph": money(i.dph_total),
            }
            for i in foreign
        ],
        "memory": box_memory_entries(observed.memory.boxes),
        **(
            {"accepted_price_increases": accepted_increase_entries(observed.memory.accepted_increases)}
            if observed.memory.accepted_increases else {}
        ),
    }


def _text(value: str | None) -> str | None:
    """A string a box sent, as observed/ stores it: escaped and bounded (``bounds.bounded_text``)."""
    return None if value is None else bounded_text(value)


def _claims(values: tuple[str, ...]) -> list[str]:
    """A box's claimed list (commits, bootstrap hashes), each escaped and bounded, at most ``MAX_LIST_ENTRIES``."""
    return sorted({bounded_text(v) for v in values})[:MAX_LIST_ENTRIES]


# ------------------------------------------------------------------------------------------------- runs


def _better(a: float | None, b: float | None, goal: MetricGoal) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b) if goal is MetricGoal.MAX else min(a, b)


def _render_runs(desired: Desired | None, observed: Observed) -> dict[str, Any]:
    history: dict[str, list[AttemptRecord]] = {}
    for rec in observed.history:
        history.setdefault(rec.run_id, []).append(rec)
    live = live_attempts(observed)
    tallies = tally_runs(observed.history, live)
    progress = live_progress(desired.runs, observed) if desired is not None else {}

    def entry(run_id: str, spec: RunSpec | None) -> dict[str, Any]:
        recs = sorted(history.get(run_id, []), key=lambda r: r.attempt)
        goal = spec.sweep.metric_goal if spec else MetricGoal.MAX
        best: float | None = None
        for r in recs:
            best = _better(best, finite(r.best_metric), goal)
        now_live = live.get(run_id)
        attempts = max([r.attempt for r in recs] + [now_live.attempt if now_live else 0])
        tally = tallies.get(run_id, RunTally())
        phase = run_phase(spec, tally).value
        instance = now_live.instance_id if now_live else (recs[-1].instance_id if recs else None)
        out: dict[str, Any] = {
            "phase": phase,
            "attempts": attempts,
            "instance": instance or None,
            "best_metric": best,
        }
        if tally.preempted:
            out["preempted"] = tally.preempted
        done = progress.get((run_id, now_live.attempt)) if now_live else None
        done = finite(done) if done is not None else None
        if done is not None:  # in tenths, floored: a running sweep commits a few progress changes, not every cycle
            out["progress"] = math.floor(done * 10) / 10
        if spec is not None:
            out["seed"] = spec.seed
            out["params"] = {k: v for k, v in spec.params}
        elif recs:
            out["seed"] = recs[-1].seed
            out["params"] = {k: v for k, v in recs[-1].params}
        return out

    sweeps: dict[str, dict[str, Any]] = {}
    if desired is not None:
        wanted = wanted_ids(desired.runs, succeeded_metrics(observed.history))
        for sweep in desired.sweeps:
            sweeps[sweep.name] = {}
        for spec in desired.runs:
            if spec.id not in wanted and spec.id not in history and spec.id not in live:
                continue
            sweeps.setdefault(spec.sweep.name, {})[spec.id] = entry(spec.id, spec)
    else:
        sweep_of: dict[str, str] = {}
        for rec in observed.history:
            sweep_of[rec.run_id] = rec.sweep
        for f in observed.memory.in_flight:
            sweep_of.setdefault(f.run_id, f.sweep)
        for run_id in live:
            sweep_of.setdefault(run_id, "")
        for run_id, sweep_name in sorted(sweep_of.items()):
            sweeps.setdefault(sweep_name, {})[run_id] = entry(run_id, None)

    counts: dict[str, dict[str, int]] = {}
    for name, runs in sweeps.items():
        c = dict.fromkeys(RUN_PHASES, 0)
        for r in runs.values():
            c[r["phase"]] += 1
        c["total"] = len(runs)
        counts[name] = c
    return {
        "format_version": FORMAT_VERSION,
        "desired_commit": desired.commit if desired is not None else None,
        "counts": counts,
        "sweeps": sweeps,
        "in_flight": in_flight_entries(observed.memory.in_flight),
        # the rung values early termination compares runs by (only while there are some: other fleets' files stay)
        **({"rungs": rung_entries(observed.memory.rungs)} if observed.memory.rungs else {}),
    }


# ------------------------------------------------------------------------------------ drift, budget, status


def _render_drift(plan: Plan) -> dict[str, Any]:
    entries = sorted(
        (
            {
                "class": d.cls.value,
                "subject": bounded_text(d.subject),
                "detail": bounded_block(d.detail, MAX_NOTE_CHARS),  # it may quote what a box claimed
                "action": d.action,
            }
            for d in plan.drift
        ),
        key=lambda e: (e["subject"], e["class"], e["detail"], e["action"]),
    )
    return {"format_version": FORMAT_VERSION, "drift": entries}


# What bills at the listed $/h (a stopped or offline box bills storage only, a gone one nothing).
_BILLING = frozenset({InstanceStatus.CREATED, InstanceStatus.LOADING, InstanceStatus.RUNNING, InstanceStatus.UNKNOWN})


def _render_budget(
    desired: Desired | None, fleet_dph: float, plan: Plan, observed: Observed, now: float, previous: Mapping[str, Any]
) -> dict[str, Any]:
    caps: dict[str, Any] | None = None
    if desired is not None:
        b = desired.budget
        caps = {
            "max_instance_dph": b.max_instance_dph,
            "max_fleet_dph": b.max_fleet_dph,
            "daily_usd": b.daily_usd,
            "total_usd": b.total_usd,
            "on_exceed": b.on_exceed.value,
        }
    prev_spend = previous.get("spend")
    billing = [i for i in observed.instances if i.status in _BILLING]
    rates = {i.id: i.dph_total for i in billing}
    anchor = spend_anchor(
        prev_spend if isinstance(prev_spend, dict) else None,
        observed.memory.spend,
        {b.instance_id: rates.get(b.instance_id, 0.0) for b in observed.memory.spend.boxes if b.gone_at is None},
        observed.credit_usd,
        sum(rates.values()),
        now,
    )
    return {
        "format_version": FORMAT_VERSION,
        "caps": caps,
        "fleet_dph": money(fleet_dph),
        "planned_fleet_dph": money(plan.fleet_dph_after),
        "spend": anchor,
    }


def _render_status(status: ReconcilerStatus, plan: Plan) -> dict[str, Any]:
    return {
        "format_version": FORMAT_VERSION,
        "holder": status.holder,
        "desired_commit_applied": status.desired_commit_applied,
        "last_valid_desired_commit": status.last_valid_desired_commit,
        "desired_valid": not status.desired_errors,
        "desired_errors": list(status.desired_errors),
        "apply_errors": [bounded_block(e, MAX_NOTE_CHARS) for e in status.apply_errors],  # may carry a box's stderr
        "suspended": plan.suspended,
        "last_plan": {
            "counts": plan.counts(changes_only=True),
            "warnings": [bounded_block(w, MAX_NOTE_CHARS) for w in plan.warnings],
            "price": [e.to_json() for e in plan.estimates],
        },
    }


HEADERS = {
    FLEET: "rigsync observed fleet: owned boxes, their GPUs and what runs on each, $/h; foreign instances",
    RUNS: "rigsync observed runs: per sweep, per run id: phase, attempts, instance, best metric",
    DRIFT: "rigsync observed drift: how the world differs from desired, and what the plan does about it",
    BUDGET: "rigsync observed budget: caps, fleet $/h, billed spend and credit at as_of (they move at fleet_dph and "
    "account_dph after it)",
    STATUS: "rigsync reconciler status: desired commit applied, errors, last change",
    HOSTS: HOSTS_HEADER,
    THROUGHPUT: THROUGHPUT_HEADER,
}


def render_observed(
    *,
    desired: Desired | None,
    observed: Observed,
    plan: Plan,
    status: ReconcilerStatus,
    now: float,
    previous: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The observed/*.yaml files for this cycle, keyed by repository path.

    ``observed`` is the state after apply (its ``memory``, ``in_flight``, ``history`` and ``spend`` are what
    the next cycle should start from). ``previous`` holds the files as last committed (missing ones may be
    left out); with it, an unchanged world renders byte-identical files.
    """
    previous = previous or {}
    fleet_doc = _render_fleet(_fleet_name(desired, observed), observed)
    prev_budget = load_mapping_quietly(previous.get(BUDGET))
    out = {
        FLEET: dump_yaml(fleet_doc, HEADERS[FLEET]),
        RUNS: dump_yaml(_render_runs(desired, observed), HEADERS[RUNS]),
        DRIFT: dump_yaml(_render_drift(plan), HEADERS[DRIFT]),
        BUDGET: dump_yaml(
            _render_budget(desired, fleet_doc["dph"], plan, observed, now, prev_budget), HEADERS[BUDGET]
        ),
        HOSTS: dump_yaml(
            hosts_document(observed.memory.hosts, desired.fleet if desired else None, observed.history), HEADERS[HOSTS]
        ),
        THROUGHPUT: dump_yaml(throughput_document(observed.history), HEADERS[THROUGHPUT]),
    }
    status_doc = _render_status(status, plan)
    last_change = iso(now)
    if previous and all(previous.get(p) == out[p] for p in out):
        prev_status = load_mapping_quietly(previous.get(STATUS))
        if prev_status.get("last_change_at"):
            prev_stamp = prev_status.pop("last_change_at")
            if prev_status == status_doc:
                last_change = prev_stamp
    status_doc["last_change_at"] = last_change
    out[STATUS] = dump_yaml(status_doc, HEADERS[STATUS])
    return out


def status_only(desired_commit: str, errors: tuple[str, ...]) -> dict[str, str]:
    """``status.yaml`` alone, for a cycle that cannot act: desired is invalid and no valid revision is known."""
    doc: dict[str, Any] = {
        "desired_commit_applied": None,
        "last_valid_desired_commit": None,
        "desired_errors": list(errors),
        "note": f"desired {desired_commit[:12]} is invalid and no earlier valid revision is known: not acting",
    }
    return {STATUS: dump_yaml(doc, "rigsync status")}
