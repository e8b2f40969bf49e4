"""One view of the account (`rigsync fleets`): every instance the provider lists, grouped by fleet and pool.

Pure: it is handed the provider's instance list and, for each fleet checkout given, its fleet (desired/) and the
attempts its observed/runs.yaml holds in flight; it reads and contacts nothing itself.

* A box's fleet and slot come from its ownership label (``model.Ownership.parse``, the one home); its pool from
  the slot, by the fleet's own rule (``identity.slot_pool``) when a checkout of that fleet is given, else by the
  slot's ``-<pool>`` suffix alone (``identity.label_pool``; none: the pool is unknown, null).
* A box with no rigsync label is hand-rented: it is listed, in a group of its own, last.
* What a box runs: the in-flight attempts of the checkout whose fleet owns it, on that box (a checkout never
  speaks for another fleet's boxes). Which repo it belongs to: that checkout's, as it was named.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from reconciler.core.identity import label_pool, slot_pool
from reconciler.core.model import Fleet, InFlight, Instance, Ownership
from reconciler.observed.codec import iso
from reconciler.views.status_md import duration


@dataclass(frozen=True)
class Checkout:
    """One fleet checkout given to the view: as it was named, its fleet, the attempts it holds in flight."""

    repo: str
    fleet: Fleet
    in_flight: tuple[InFlight, ...] = ()


def _run_entry(f: InFlight) -> dict[str, Any]:
    return {"run_id": f.run_id, "attempt": f.attempt, "sweep": f.sweep, "queued": f.queued}


def _box_entry(inst: Instance, now: float, runs: Iterable[InFlight]) -> dict[str, Any]:
    return {
        "id": inst.id, "label": inst.label, "status": inst.status.value, "gpu_name": inst.gpu_name,
        "num_gpus": inst.num_gpus, "dph": round(inst.dph_total, 6),
        "age_s": round(max(0.0, now - inst.start_date), 1) if inst.start_date > 0 else None,
        "runs": [_run_entry(f) for f in sorted(runs, key=lambda f: (f.run_id, f.attempt))],
    }


def account_json(instances: Sequence[Instance], checkouts: Sequence[Checkout], now: float) -> dict[str, Any]:
    """The account as ``rigsync fleets --json`` prints it (``schemas/cli-fleets.schema.json``)."""
    by_fleet: dict[str, Checkout] = {}
    for given in checkouts:
        by_fleet.setdefault(given.fleet.name, given)  # the first checkout named for a fleet speaks for it
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    hand: list[dict[str, Any]] = []
    for inst in sorted(instances, key=lambda i: i.id):
        own = Ownership.parse(inst.label)
        if own is None:
            hand.append(_box_entry(inst, now, ()))
            continue
        c = by_fleet.get(own.fleet)
        pool = slot_pool(c.fleet, own.slot) if c is not None else label_pool(own.slot)
        runs = [f for f in c.in_flight if f.instance_id == inst.id] if c is not None else []
        g = groups.setdefault((own.fleet, pool or ""), {
            "fleet": own.fleet, "pool": pool, "repo": c.repo if c is not None else None, "hand_rented": False,
            "instances": [],
        })
        g["instances"].append(_box_entry(inst, now, runs))
    out = [groups[k] for k in sorted(groups)]
    if hand:
        out.append({"fleet": None, "pool": None, "repo": None, "hand_rented": True, "instances": hand})
    for g in out:
        g["dph"] = round(sum(b["dph"] for b in g["instances"]), 6)
    return {
        "as_of": iso(now),
        "repos": [{"repo": k.repo, "fleet": k.fleet.name} for k in checkouts],
        "count": len(instances),
        "dph": round(sum(i.dph_total for i in instances), 6),
        "groups": out,
    }


def _runs_text(runs: list[dict[str, Any]]) -> str:
    if not runs:
        return "-"
    return ", ".join(f"{r['run_id']}.{r['attempt']}" + (" (queued)" if r["queued"] else "") for r in runs)


def account_text(doc: dict[str, Any]) -> str:
    """The account as ``rigsync fleets`` prints it: a heading per group, a line per box, the total."""
    lines: list[str] = []
    for g in doc["groups"]:
        n = len(g["instances"])
        head = "hand-rented (no rigsync label)" if g["hand_rented"] else (
            f"fleet {g['fleet']} / pool {g['pool'] if g['pool'] is not None else '?'}"
        )
        where = f"  repo {g['repo']}" if g["repo"] is not None else ""
        lines.append(f"{head}{where}: {n} box{'es' if n != 1 else ''}, ${g['dph']:.3f}/h")
        for b in g["instances"]:
            lines.append(
                f"  {b['id']:>10}  {b['num_gpus']}x {b['gpu_name']:<14} ${b['dph']:.3f}/h  "
                f"{duration(b['age_s']):>7}  {b['status']:<10} runs: {_runs_text(b['runs'])}"
            )
    if not doc["groups"]:
        lines.append("no instances on the account")
    lines.append(f"total: {doc['count']} instance{'s' if doc['count'] != 1 else ''}, ${doc['dph']:.3f}/h")
    return "\n".join(lines)
