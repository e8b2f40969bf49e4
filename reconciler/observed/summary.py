"""The commit message of an observe commit: one line saying what changed, e.g. ``observe: +1 box, 2 launched``.

It compares the observed files as last committed with the ones about to be written, so ``git log --oneline``
reads as the fleet's history without opening a diff.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reconciler.model import RunPhase
from reconciler.observed.codec import DRIFT, FLEET, HOSTS, LEASE, RUNS, STATUS, load_mapping_quietly


def _owned_ids(doc: Mapping[str, Any]) -> set[int]:
    return {int(b["id"]) for b in doc.get("boxes") or [] if isinstance(b, dict) and "id" in b}


def _running(doc: Mapping[str, Any]) -> set[tuple[str, int]]:
    out: set[tuple[str, int]] = set()
    for runs in (doc.get("sweeps") or {}).values():
        for run_id, r in (runs or {}).items():
            if isinstance(r, dict) and r.get("phase") == RunPhase.RUNNING.value:
                out.add((str(run_id), int(r.get("attempts") or 0)))
    return out


def _blacklisted(doc: Mapping[str, Any]) -> set[int]:
    """The machines hosts.yaml says are no longer rented (the host ledger's blacklist or avoid_machines)."""
    return {int(h["machine_id"]) for h in doc.get("hosts") or [] if isinstance(h, dict) and h.get("blacklisted")}


def _budget_lines(status: Mapping[str, Any]) -> list[str]:
    plan = status.get("last_plan")
    warnings = plan.get("warnings") if isinstance(plan, dict) else None
    return [str(w) for w in warnings or [] if str(w).startswith("budget:")]


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def summarize_change(old: Mapping[str, str], new: Mapping[str, str | None], appended: int) -> str:
    """A one-line commit message saying what changed between ``old`` and ``new`` (None: a deleted file).

    ``appended`` is the number of attempts archived with this commit.
    """
    parts: list[str] = []
    of, nf = load_mapping_quietly(old.get(FLEET)), load_mapping_quietly(new.get(FLEET))
    before, after = _owned_ids(of), _owned_ids(nf)
    if after - before:
        parts.append("+" + _plural(len(after - before), "box", "boxes"))
    if before - after:
        parts.append("-" + _plural(len(before - after), "box", "boxes"))
    if appended:
        parts.append(_plural(appended, "run finished", "runs finished"))
    launched = _running(load_mapping_quietly(new.get(RUNS))) - _running(load_mapping_quietly(old.get(RUNS)))
    if launched:
        parts.append(f"{len(launched)} launched")
    od = load_mapping_quietly(old.get(DRIFT)).get("drift") or []
    nd = load_mapping_quietly(new.get(DRIFT)).get("drift") or []
    if od != nd:
        parts.append(f"drift {len(od)}→{len(nd)}")
    oh, nh = load_mapping_quietly(old.get(HOSTS)), load_mapping_quietly(new.get(HOSTS))
    blacklisted = _blacklisted(nh) - _blacklisted(oh)
    if blacklisted:
        parts.append("blacklisted machine " + ", ".join(str(m) for m in sorted(blacklisted)))
    os_, ns = load_mapping_quietly(old.get(STATUS)), load_mapping_quietly(new.get(STATUS))
    if ns.get("desired_commit_applied") and ns.get("desired_commit_applied") != os_.get("desired_commit_applied"):
        parts.append(f"applied desired {str(ns['desired_commit_applied'])[:10]}")
    if ns.get("desired_errors") and ns.get("desired_errors") != os_.get("desired_errors"):
        parts.append(f"desired invalid ({len(ns['desired_errors'])} error(s))")
    if ns.get("apply_errors") and ns.get("apply_errors") != os_.get("apply_errors"):
        parts.append(_plural(len(ns["apply_errors"]), "apply error", "apply errors"))
    old_budget, new_budget = _budget_lines(os_), _budget_lines(ns)
    if new_budget and new_budget != old_budget:
        parts.append(new_budget[0])  # why work stopped or was refused: a cap or the credit, with the figures
    elif old_budget and not new_budget:
        parts.append("budget: no cap binds any more")
    ol, nl = load_mapping_quietly(old.get(LEASE)), load_mapping_quietly(new.get(LEASE))
    if LEASE in new and new.get(LEASE) is not None and ol != nl:
        if nl.get("taken_over_from") and nl.get("taken_over_from") != ol.get("taken_over_from"):
            parts.append(f"lease taken over from {nl['taken_over_from']}")
        elif ol.get("holder") != nl.get("holder"):
            parts.append(f"lease acquired by {nl.get('holder')}")
        else:
            parts.append("lease renewed")
    elif LEASE in new and new.get(LEASE) is None and old.get(LEASE):
        parts.append("lease released")
    if not parts:
        changed = sorted(
            p.rsplit("/", 1)[-1].removesuffix(".yaml") for p in set(old) | set(new) if old.get(p) != new.get(p)
        )
        parts.append("update " + ", ".join(changed) if changed else "no change")
    return "observe: " + ", ".join(parts)
