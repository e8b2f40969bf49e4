"""Human text for plans and status: Terraform-style, one line per action with a sign, target and reason."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from reconciler.core import contract
from reconciler.core.actions import SIGNS, Kind, Plan, SweepEstimate
from reconciler.core.jobenv import held_back
from reconciler.core.model import AttemptOutcome, Desired, Observed, owns
from reconciler.core.runphase import count_phases, is_unfinished, live_progress, run_phases
from reconciler.core.suggest import SearchBound

VERBS = {
    Kind.RENT: "to rent",
    Kind.DESTROY: "to destroy",
    Kind.BOOTSTRAP: "to bootstrap",
    Kind.SHIP_CODE: "to ship code",
    Kind.LAUNCH: "to launch",
    Kind.DRAIN: "to drain",
    Kind.KILL: "to kill",
    Kind.REQUEUE: "to requeue",
    Kind.RECORD: "to record",
    Kind.SYNC_CHECKPOINT: "checkpoint(s) to sync",
    Kind.CLOSE_BILL: "bill(s) to close",
    Kind.ANSWER_PRICE_INCREASE: "price increase(s) to answer",
}


def plan_text(plan: Plan, *, show_noops: bool = False, searches: Sequence[SearchBound] = ()) -> str:
    """The plan for people; ``searches``: what each bayes search may still start (``suggest.search_bounds``)."""
    lines: list[str] = []
    if plan.suspended:
        lines.append("fleet is suspended: observing and reporting only")
    width = max((len(a.target) for a in plan.actions), default=0)
    for a in plan.actions:
        lines.append(f"  {SIGNS[a.kind]} {a.kind.value:<10} {a.target:<{width}}  {a.reason}")
    if show_noops:
        for n in plan.noops:
            lines.append(f"    {'noop':<10} {n.target:<{width}}  {n.reason}")
    for e in plan.estimates:
        lines.append("  " + estimate_line(e))
    for b in searches:
        lines.append("  " + search_line(b.sweep, b.runs, b.usd_high))
    for w in plan.warnings:
        lines.append(f"  warning: {w}")
    counts = plan.counts()
    parts = [f"{counts.get(k.value, 0)} {verb}" for k, verb in VERBS.items() if counts.get(k.value)]
    summary = ", ".join(parts) if parts else "no changes"
    lines.append(
        f"Plan: {summary}. Fleet $/h: {plan.fleet_dph_before:.4f} -> {plan.fleet_dph_after:.4f}"
        + (f" (desired {plan.desired_commit[:12]})" if plan.desired_commit else "")
    )
    return "\n".join(lines)


def _money(x: float | None) -> str:
    if x is None:
        return "?"
    return f"${x:.2f}" if abs(x) >= 1 or x == 0 else f"${x:.4f}"


def _hours(h: float) -> str:
    return f"{h * 60:.0f}m" if h < 1 else f"{h:.1f}h"


def search_line(sweep: str, runs: int, usd_high: float | None) -> str:
    """``search tune: the search may still start 8 runs, at most $1.20`` (``suggest.SearchBound``, as JSON too)."""
    return f"search {sweep}: the search may still start {runs} run(s), at most {_money(usd_high)}"


def estimate_line(e: SweepEstimate) -> str:
    """``price tdmpc: 8 pending + 2 running, 2.5 GPU-h (median of 12 runs: 15m), $0.25-$0.80, ETA 1.2h on 6 GPUs``."""
    source = {
        "archive": f"median of {e.runtime_samples} run(s): {_hours(e.runtime_h)}",
        "expected_runtime": f"expected_runtime {_hours(e.runtime_h)}",
        "max_runtime": f"max_runtime {_hours(e.runtime_h)}, an upper bound",
    }.get(e.runtime_source, e.runtime_source)
    price = f"{_money(e.usd_low)}-{_money(e.usd_high)}" if e.usd_low is not None else "no price known"
    eta = f", ETA {_hours(e.eta_h)} on {e.fleet_gpus} GPU(s)" if e.eta_h is not None else ""
    left = ""
    if e.budget_left_low is not None and e.budget_left_high is not None:
        left = f"; budget left after: {_money(e.budget_left_low)}-{_money(e.budget_left_high)}"
    return (
        f"price {e.sweep}: {e.pending_runs} pending + {e.running_runs} running, {e.gpu_hours:.2f} GPU-h "
        f"({source}), {price}{eta}{left}"
    )


def status_json(
    desired: Desired, observed: Observed, plan: Plan | None = None, now: float | None = None
) -> dict[str, Any]:
    """What `rigsync status --json` prints; with the plan for this observation, its budget lines and price; each
    box's contract end, and with ``now`` (the observation's time) the seconds left until it."""
    mine: list[dict[str, Any]] = []
    foreign: list[dict[str, Any]] = []
    progress = live_progress(desired.runs, observed)
    for inst in sorted(observed.instances, key=lambda i: i.id):
        probe = observed.probe(inst.id)
        row = {
            "id": inst.id,
            "label": inst.label,
            "status": inst.status.value,
            "gpu": f"{inst.num_gpus}x {inst.gpu_name}",
            "dph": inst.dph_total,
            "reachable": None if probe is None else probe.reachable,
            "host_key_changed": probe is not None and probe.host_key_changed,
            "runs": sorted(f"{r.run_id}.{r.attempt}" for r in (probe.runs if probe else ()) if is_unfinished(r)),
            # given to the box's queue, not started yet: as the box says it, or (it does not answer) as launched
            "queued": sorted(
                f"{q.run_id}.{q.attempt}" for q in probe.queued
            ) if probe is not None and probe.reachable else sorted(
                f"{f.run_id}.{f.attempt}" for f in observed.memory.in_flight if f.instance_id == inst.id and f.queued
            ),
            # "run.attempt" → the fraction of its work done, for the live runs here whose sweep declares ``progress``
            "progress": {
                f"{r.run_id}.{r.attempt}": round(progress[(r.run_id, r.attempt)], 4)
                for r in (probe.runs if probe else ())
                if (r.run_id, r.attempt) in progress
            },
            # its contract's end (``reconciler.core.contract``): the host takes the box back then; None: no end said
            "end_date": contract.box_end(inst, observed.memory.accepted_increases),
            "ends_in_s": None if now is None else contract.time_left(inst, now, observed.memory.accepted_increases),
        }
        (mine if owns(desired.fleet.name, inst.label) else foreign).append(row)
    spend = observed.memory.spend
    return {
        "fleet": desired.fleet.name,
        "boxes": mine,
        "foreign": foreign,
        "runs": count_phases(run_phases(desired.runs, observed)),
        "dph": round(sum(float(b["dph"]) for b in mine), 6),
        "spend": {"today_usd": round(spend.today_usd, 6), "total_usd": round(spend.total_usd, 6)},
        "credit_usd": None if observed.credit_usd is None else round(observed.credit_usd, 6),
        "budget": [w for w in (plan.warnings if plan else ()) if w.startswith("budget:")],
        # renting held back by the rent rate or the backoff after failures (reconciler/plan/renting.py)
        "renting": [w for w in (plan.warnings if plan else ()) if w.startswith("renting:")],
        "price": [e.to_json() for e in plan.estimates] if plan else [],
        # sweeps whose launches are held back, and why (a secret the controller does not set)
        "blocked": held_back(plan.warnings if plan else ()),
        # attempts the provider took (outbid boxes): resumed from their checkpoints, no retry spent
        "preempted": sum(1 for r in observed.history if r.phase is AttemptOutcome.PREEMPTED),
    }


def status_text(doc: dict[str, Any]) -> str:
    lines = [f"fleet {doc['fleet']}: {len(doc['boxes'])} box(es), ${doc['dph']:.4f}/h now"]
    for b in doc["boxes"]:
        reach = {None: "-", True: "reachable", False: "UNREACHABLE"}[b["reachable"]]
        if b.get("host_key_changed"):
            reach = "HOST KEY CHANGED (untrusted)"
        done = b.get("progress") or {}
        runs = ", ".join(f"{r} ({done[r]:.0%})" if r in done else r for r in b["runs"]) or "idle"
        if b.get("queued"):
            runs += "; queued " + ", ".join(b["queued"])
        if b.get("ends_in_s") is not None:
            runs += f"; contract ends in {_hours(float(b['ends_in_s']) / 3600.0)}"
        lines.append(f"  {b['id']:>10}  {b['status']:<8} {b['gpu']:<18} ${b['dph']:.4f}/h  {reach:<11} {runs}")
    for f in doc["foreign"]:
        lines.append(f"  {f['id']:>10}  foreign (label {f['label']!r}): not ours, left alone")
    runs = doc["runs"]
    lines.append("runs: " + ", ".join(f"{k} {v}" for k, v in runs.items()))
    if doc.get("preempted"):
        lines.append(f"preempted: {doc['preempted']} attempt(s) taken by the provider, resumed, no retry spent")
    spend = doc["spend"]
    credit = doc.get("credit_usd")
    lines.append(
        f"spend: {_money(spend['today_usd'])} today, {_money(spend['total_usd'])} in total"
        + (f"; account credit {_money(credit)}" if credit is not None else "")
    )
    for e in doc.get("price") or []:
        lines.append(estimate_line(SweepEstimate.from_json(e)))
    lines.extend(doc.get("budget") or [])
    lines.extend(doc.get("renting") or [])
    lines.extend(f"BLOCKED: {b}" for b in doc.get("blocked") or [])
    return "\n".join(lines)
