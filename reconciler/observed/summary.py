"""Whether a cycle changed the fleet's record, and the commit message that says how.

main carries state changes only, one commit per cycle that changed something a reader of the history cares about:
boxes rented or ended, attempts launched or finished (and the bill of a box that ended, closed in the archive),
the desired revision applied or refused, apply errors, a budget cap starting or ceasing to bind, a sweep held back
for a job secret (``secret_not_allowed``, ``secret_missing``), drift, foreign instances. Everything else the
observed files hold moves with the clock or the probes (box status and reachability, GPU memory in use, bootstrap
and code markers, spend along its line, the last plan's counts, ``last_change_at``): it is committed with the next
meaningful change and never makes a commit by itself. So ``git log --oneline``
reads like a lab notebook::

    rented 31007001 RTX 3060 $0.11/h, 31007002 RTX 3060 $0.11/h: 4 runs pending
    tdmpc: 3 launched on 2 boxes
    tdmpc: 1 launched on 1 box, 1 succeeded (seed 2, episode_reward 612)
    destroyed 31007001: idle for 20s (idle_timeout 20s)

``describe_change`` is the one home of that rule: None when nothing meaningful changed (the daemon then writes and
commits nothing), else the message.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from reconciler.core.actions import AnswerPriceIncrease, Outcome
from reconciler.core.jobenv import held_back
from reconciler.core.model import AttemptOutcome, AttemptRecord, OverheadRecord
from reconciler.observed.codec import DRIFT, FLEET, HOSTS, RUNS, STATUS, SUGGESTIONS, load_mapping_quietly

_MAX_LISTED = 4  # boxes or attempts named one by one in a message; the rest are counted


def _boxes(doc: Mapping[str, Any], key: str = "boxes") -> dict[int, Mapping[str, Any]]:
    return {int(b["id"]): b for b in doc.get(key) or [] if isinstance(b, dict) and "id" in b}


def _in_flight(doc: Mapping[str, Any]) -> dict[tuple[str, int], Mapping[str, Any]]:
    out: dict[tuple[str, int], Mapping[str, Any]] = {}
    for f in doc.get("in_flight") or []:
        if isinstance(f, dict) and "run_id" in f:
            out[(str(f["run_id"]), int(f.get("attempt") or 0))] = f
    return out


def _pending(runs: Mapping[str, Any]) -> int:
    counts = runs.get("counts") or {}
    return sum(int(c.get("pending", 0)) + int(c.get("retrying", 0)) for c in counts.values() if isinstance(c, dict))
def _blacklisted(doc: Mapping[str, Any]) -> set[int]:
    """The machines hosts.yaml says are no longer rented (the host ledger's blacklist or avoid_machines)."""
    return {int(h["machine_id"]) for h in doc.get("hosts") or [] if isinstance(h, dict) and h.get("blacklisted")}


def _plan_warnings(status: Mapping[str, Any]) -> list[str]:
    plan = status.get("last_plan")
    warnings = plan.get("warnings") if isinstance(plan, dict) else None
    return [str(w) for w in warnings or []]


def _budget_lines(status: Mapping[str, Any]) -> list[str]:
    return [w for w in _plan_warnings(status) if w.startswith("budget:")]


def _drift(doc: Mapping[str, Any]) -> set[tuple[str, str]]:
    return {(str(d.get("class")), str(d.get("subject"))) for d in doc.get("drift") or [] if isinstance(d, dict)}


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _listed(items: Sequence[str], sep: str = ", ") -> str:
    shown = sep.join(items[:_MAX_LISTED])
    return shown + (f" and {len(items) - _MAX_LISTED} more" if len(items) > _MAX_LISTED else "")


def _box_text(box_id: int, box: Mapping[str, Any]) -> str:
    gpus = int(box.get("num_gpus") or 1)
    name = f"{gpus}x {box.get('gpu_name')}" if gpus > 1 else str(box.get("gpu_name") or "?")
    return f"{box_id} {name} ${float(box.get('dph') or 0.0):.2f}/h"


def _short(reason: str, limit: int = 80) -> str:
    return reason if len(reason) <= limit else reason[: limit - 1] + "…"


def _metric(value: float | None, key: str | None) -> str:
    if value is None:
        return ""
    return f", {key or 'metric'} {value:.4g}"


def _attempt_text(rec: AttemptRecord, key: str | None) -> str:
    if rec.phase is AttemptOutcome.SUCCEEDED:
        return f"seed {rec.seed}{_metric(rec.best_metric, key)}"
    if rec.exit_code is not None:
        return f"seed {rec.seed}, exit {rec.exit_code}"
    return f"seed {rec.seed}, {_short(rec.reason, 40) or rec.phase.value}"


def _sweep_parts(
    launched: Mapping[tuple[str, int], Mapping[str, Any]],
    archived: Sequence[AttemptRecord],
    metric_keys: Mapping[str, str],
) -> list[str]:
    sweeps = sorted({str(f.get("sweep") or "") for f in launched.values()} | {r.sweep for r in archived})
    parts: list[str] = []
    for sweep in sweeps:
        bits: list[str] = []
        mine = [f for f in launched.values() if str(f.get("sweep") or "") == sweep]
        if mine:
            boxes = {f.get("instance_id") for f in mine}
            bits.append(f"{len(mine)} launched on {_plural(len(boxes), 'box', 'boxes')}")
        for outcome in AttemptOutcome:
            recs = sorted((r for r in archived if r.sweep == sweep and r.phase is outcome), key=lambda r: r.key)
            if recs:
                what = _listed([_attempt_text(r, metric_keys.get(sweep)) for r in recs], "; ")
                bits.append(f"{len(recs)} {outcome.value} ({what})")
        parts.append(f"{sweep or 'runs'}: " + ", ".join(bits))
    return parts


def _made(doc: Mapping[str, Any]) -> dict[str, list[Mapping[str, Any]]]:
    out: dict[str, list[Mapping[str, Any]]] = {}
    for entry in doc.get("sweeps") or []:
        if isinstance(entry, dict) and isinstance(entry.get("sweep"), str):
            out[entry["sweep"]] = [c for c in entry.get("configurations") or [] if isinstance(c, dict)]
    return out


def _suggested_parts(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """A search's configurations newly recorded in observed/suggestions.yaml, per sweep."""
    before, parts = _made(old), []
    for sweep, configs in sorted(_made(new).items()):
        fresh = configs[len(before.get(sweep, [])):]
        if fresh:
            batches = sorted({str(c.get("batch")) for c in fresh})
            parts.append(
                f"{sweep}: suggested {_plural(len(fresh), 'configuration', 'configurations')}"
                f" (batch {', '.join(batches)})"
            )
    return parts


def describe_change(
    old: Mapping[str, str],
    new: Mapping[str, str | None],
    *,
    archived: Sequence[AttemptRecord] = (),
    overheads: Sequence[OverheadRecord] = (),
    destroyed: Mapping[int, str] | None = None,
    metric_keys: Mapping[str, str] | None = None,
    archive_pending: bool = False,
    answers: Sequence[str] = (),
) -> str | None:
    """The commit message for going from ``old`` to ``new`` observed files, or None when nothing meaningful changed.

    ``archived``/``overheads`` are the archive lines this cycle appends, ``destroyed`` the boxes this cycle destroyed
    with the plan's reason, ``metric_keys`` each sweep's metric name. ``archive_pending``: archive lines from an
    earlier cycle still wait to be committed (a commit is owed whatever else changed). ``answers``: this cycle's
    answers to price increases (``answer_lines``), one line each in the message's body, counted in its first line.
    """
    destroyed = destroyed or {}
    metric_keys = metric_keys or {}
    parts: list[str] = []
    of, nf = load_mapping_quietly(old.get(FLEET)), load_mapping_quietly(new.get(FLEET))
    before, after = _boxes(of), _boxes(nf)
    orun, nrun = load_mapping_quietly(old.get(RUNS)), load_mapping_quietly(new.get(RUNS))
    rented = sorted(set(after) - set(before))
    if rented:
        pending = _plural(_pending(nrun), "run", "runs")
        parts.append("rented " + _listed([_box_text(i, after[i]) for i in rented]) + f": {pending} pending")
    for box_id in sorted(set(before) - set(after)):
        if box_id in destroyed:
            parts.append(f"destroyed {box_id}: {_short(destroyed[box_id])}")
        else:
            parts.append(f"{box_id} gone from the provider's list")
    launched = {k: v for k, v in _in_flight(nrun).items() if k not in _in_flight(orun)}
    parts += _sweep_parts(launched, archived, metric_keys)
    for o in sorted(overheads, key=lambda o: o.instance_id):
        parts.append(f"closed {o.instance_id}'s bill: ${o.billed_usd:.4f}, ${o.cost_usd:.4f} outside runs")
    oh, nh = load_mapping_quietly(old.get(HOSTS)), load_mapping_quietly(new.get(HOSTS))
    blacklisted = _blacklisted(nh) - _blacklisted(oh)
    if blacklisted:
        parts.append("blacklisted machine " + ", ".join(str(m) for m in sorted(blacklisted)))
    os_, ns = load_mapping_quietly(old.get(STATUS)), load_mapping_quietly(new.get(STATUS))
    if ns.get("desired_commit_applied") and ns.get("desired_commit_applied") != os_.get("desired_commit_applied"):
        parts.append(f"applied desired {str(ns['desired_commit_applied'])[:10]}")
    if ns.get("desired_errors") != os_.get("desired_errors"):
        if ns.get("desired_errors"):
            parts.append(f"desired invalid ({_plural(len(ns['desired_errors']), 'error', 'errors')})")
        elif os_.get("desired_errors"):
            parts.append("desired valid again")
    if (ns.get("apply_errors") or []) != (os_.get("apply_errors") or []) and ns.get("apply_errors"):
        parts.append(_plural(len(ns["apply_errors"]), "apply error", "apply errors"))
    if bool(ns.get("suspended")) != bool(os_.get("suspended")) and STATUS in old:
        parts.append("suspended" if ns.get("suspended") else "resumed")
    old_budget, new_budget = _budget_lines(os_), _budget_lines(ns)
    if new_budget and new_budget != old_budget:
        parts.append(new_budget[0])  # why work stopped or was refused: a cap or the credit, with the figures
    elif old_budget and not new_budget:
        parts.append("budget: no cap binds any more")
    old_held = held_back(_plan_warnings(os_))
    parts += [f"held back: {h}" for h in held_back(_plan_warnings(ns)) if h not in old_held]  # with its reason code
    od, nd = _drift(load_mapping_quietly(old.get(DRIFT))), _drift(load_mapping_quietly(new.get(DRIFT)))
    if od != nd:
        moved = [f"+{c} {s}" for c, s in sorted(nd - od)] + [f"-{c} {s}" for c, s in sorted(od - nd)]
        parts.append("drift " + _listed(moved))
    foreign_before, foreign_after = set(_boxes(of, "foreign")), set(_boxes(nf, "foreign"))
    if foreign_before != foreign_after:
        parts.append(f"foreign instances {len(foreign_before)}→{len(foreign_after)}")
    if new.get(SUGGESTIONS) is not None and new.get(SUGGESTIONS) != old.get(SUGGESTIONS):
        parts += _suggested_parts(load_mapping_quietly(old.get(SUGGESTIONS)), load_mapping_quietly(new[SUGGESTIONS]))
    if answers:
        parts.append(_plural(len(answers), "price increase answered", "price increases answered"))
    if not parts and archive_pending:
        parts.append("archive lines of an earlier cycle")
    if not parts and not old and any(v is not None for v in new.values()):
        parts.append("first observation")
    if not parts:
        return None
    return "; ".join(parts) + ("\n\n" + "\n".join(answers) if answers else "")


def answer_lines(outcomes: Iterable[Outcome]) -> list[str]:
    """One commit-message line per price increase answered in apply: what was accepted or rejected and why (the
    plan's reason, in the past tense), one no longer pending, or an answer that failed."""
    lines: list[str] = []
    for o in outcomes:
        a = o.action
        if not isinstance(a, AnswerPriceIncrease) or o.skipped:
            continue
        verb = "accept" if a.accept else "reject"
        if o.ok and o.detail in ("accepted", "rejected"):
            rest = a.reason[len(verb):] if a.reason.startswith(verb + " ") else f" price increase: {a.reason}"
            lines.append(o.detail + rest)
        elif o.ok:
            lines.append(f"price increase {a.pending_id} on instance {a.instance_id}: {o.detail}")
        else:
            lines.append(f"failed to {verb} price increase {a.pending_id} on instance {a.instance_id}: {o.detail}")
    return lines
