"""Human text for plans and status: Terraform-style, one line per action with a sign, target and reason."""

from __future__ import annotations

from typing import Any

from reconciler.actions import SIGNS, Kind, Plan
from reconciler.model import Desired, Observed, owns
from reconciler.runphase import count_phases, run_phases

VERBS = {
    Kind.RENT: "to rent",
    Kind.DESTROY: "to destroy",
    Kind.BOOTSTRAP: "to bootstrap",
    Kind.SHIP_CODE: "to ship code",
    Kind.LAUNCH: "to launch",
    Kind.KILL: "to kill",
    Kind.REQUEUE: "to requeue",
    Kind.RECORD: "to record",
}


def plan_text(plan: Plan, *, show_noops: bool = False) -> str:
    lines: list[str] = []
    if plan.suspended:
        lines.append("fleet is suspended: observing and reporting only")
    width = max((len(a.target) for a in plan.actions), default=0)
    for a in plan.actions:
        lines.append(f"  {SIGNS[a.kind]} {a.kind.value:<10} {a.target:<{width}}  {a.reason}")
    if show_noops:
        for n in plan.noops:
            lines.append(f"    {'noop':<10} {n.target:<{width}}  {n.reason}")
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


def status_json(desired: Desired, observed: Observed) -> dict[str, Any]:
    mine: list[dict[str, Any]] = []
    foreign: list[dict[str, Any]] = []
    for inst in sorted(observed.instances, key=lambda i: i.id):
        probe = observed.probe(inst.id)
        row = {
            "id": inst.id,
            "label": inst.label,
            "status": inst.status.value,
            "gpu": f"{inst.num_gpus}x {inst.gpu_name}",
            "dph": inst.dph_total,
            "reachable": None if probe is None else probe.reachable,
            "runs": sorted(f"{r.run_id}.{r.attempt}" for r in (probe.runs if probe else ()) if r.exit_code is None),
        }
        (mine if owns(desired.fleet.name, inst.label) else foreign).append(row)
    return {
        "fleet": desired.fleet.name,
        "boxes": mine,
        "foreign": foreign,
        "runs": count_phases(run_phases(desired.runs, observed)),
        "dph": round(sum(float(b["dph"]) for b in mine), 6),
        "spend": {"today_usd": round(observed.spend.today_usd, 6), "total_usd": round(observed.spend.total_usd, 6)},
    }


def status_text(doc: dict[str, Any]) -> str:
    lines = [f"fleet {doc['fleet']}: {len(doc['boxes'])} box(es), ${doc['dph']:.4f}/h now"]
    for b in doc["boxes"]:
        reach = {None: "-", True: "reachable", False: "UNREACHABLE"}[b["reachable"]]
        runs = ", ".join(b["runs"]) or "idle"
        lines.append(f"  {b['id']:>10}  {b['status']:<8} {b['gpu']:<18} ${b['dph']:.4f}/h  {reach:<11} {runs}")
    for f in doc["foreign"]:
        lines.append(f"  {f['id']:>10}  foreign (label {f['label']!r}): not ours, left alone")
    runs = doc["runs"]
    lines.append("runs: " + ", ".join(f"{k} {v}" for k, v in runs.items()))
    return "\n".join(lines)
