"""What a change to desired/ means, computed from committed facts alone: the pure part of ``rigsync review``.

A reviewer of a pull request that edits a sweep wants, first, every secret the change sends to rented boxes: each
``env`` reference (``T: ${GITHUB_TOKEN}``) a sweep gains or changes, marked when this controller's allowlist
(``RIGSYNC_JOB_SECRETS``, when the review is given it) does not list the name (``secret_references``). Then three
answers without handing anyone the account's key: which runs it adds, drops or changes (by content id: the same
inputs give the same id, so an edited command is a changed run, never a silent re-run); what the added work will
take in GPU-hours, dollars and time; and whether that fits in what the budget has left. This module answers from
values only (a base and a head ``Desired``, the ``Observed`` rebuilt from the committed observed/ files, and the
prices the committed files know); reading git is ``reconciler.cli._review_git``'s job.

The price comes from the planner's own estimator (``plan.estimate``) over a queue of just the new work, so the
runtime rule (archive median, ``expected_runtime``, ``max_runtime``) and the budget arithmetic have one home.
There is no market in git, so the places the work could run are the boxes held and the boxes recent attempts
ran on (observed/), or failing those the per-box price cap, which makes the figure an upper bound.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reconciler.core.actions import ReasonCode, SweepEstimate
from reconciler.core.jobenv import JOB_SECRETS_ENV, reference
from reconciler.core.model import AttemptOutcome, Desired, Observed, RunSpec
from reconciler.core.offers import box_cap_dph
from reconciler.core.suggest import search_bounds
from reconciler.core.textsafe import md_fenced, md_inline, visible
from reconciler.plan.attempts import LiveVerdicts, PendingRun, RunQueue
from reconciler.plan.common import usd
from reconciler.plan.estimate import Place, estimate, totals
from reconciler.plan.money import purse, sweep_runtimes
from reconciler.plan.render import estimate_line, search_line
from reconciler.plan.world import PLANNING_ALONE, index_world

FORMAT_VERSION = 1
MARKER = "<!-- rigsync-review -->"  # the workflow finds its one comment by this line
MAX_LISTED = 50  # runs listed per kind in markdown; the rest are counted
MAX_LINE = 300  # characters of one listed run (a command can be long)
MAX_MARKDOWN = 60_000  # GitHub refuses a comment over 65,536 characters
RECENT_PLACES = 200  # archive attempts whose box prices stand for "where the work could run"

RunKey = tuple[str, tuple[tuple[str, Any], ...], int]


@dataclass(frozen=True)
class Side:
    """One side of the comparison: a revision and what its desired/ loaded to (None: it did not load)."""

    ref: str
    commit: str | None
    desired: Desired | None
    errors: Sequence[Mapping[str, Any]] = ()  # LoadError.to_json() of each problem


def _key(spec: RunSpec) -> RunKey:
    return (spec.sweep.name, spec.params, spec.seed)


def _run_json(spec: RunSpec) -> dict[str, Any]:
    return {
        "id": spec.id, "sweep": spec.sweep.name, "params": dict(spec.params), "seed": spec.seed, "command": spec.command
    }


def _base_runs(desired: Desired | None) -> dict[RunKey, RunSpec]:
    if desired is None:
        return {}
    return {_key(r): r for r in desired.runs if r.promotion_threshold is None}


def _candidates(desired: Desired | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in desired.runs if desired is not None else ():
        if r.promotion_threshold is not None:
            out[r.sweep.name] = out.get(r.sweep.name, 0) + 1
    return out


def committed_places(
    desired: Desired, held: Iterable[Place], observed: Observed
) -> tuple[dict[str, list[Place]], dict[str, str]]:
    """Per pool, where its work could run as the committed files know it, and what that rests on.

    The boxes held (observed/fleet.yaml) and the boxes of the newest archived attempts, under the pool's per-box
    cap (``offers.box_cap_dph``); without either, one box at that cap (the estimate is then an upper bound:
    ``"cap"``).
    """
    held = [p for p in held if p[1] > 0]
    recent = [h for h in observed.history if h.dph > 0][-RECENT_PLACES:]
    out: dict[str, list[Place]] = {}
    sources: dict[str, str] = {}
    for pool in desired.fleet.pools:
        limit = box_cap_dph(pool, desired.budget)
        gpus = max(1, pool.filters.num_gpus_min)
        places = [p for p in held if p[0] <= limit]
        source = "held boxes" if places else ""
        archived = [(h.dph, gpus, h.gpu_name) for h in recent if h.dph <= limit]
        if archived:
            places += archived
            source = f"{source} and " if source else ""
            source += f"{len(archived)} archived attempt(s)"
        if not places and math.isfinite(limit):
            places, source = [(limit, gpus, "")], "cap"
        out[pool.name] = places
        sources[pool.name] = source or "none"
    return out, sources


def _one_source(sources: Iterable[str]) -> str:
    """What the prices of the pools the work goes to rest on, said once; "cap" (an upper bound) when any of them
    is priced at its cap alone."""
    said = sorted(set(sources))
    if "cap" in said:
        return "cap"
    known = [s for s in said if s != "none"]
    return "; ".join(known) if known else "none"


def secret_references(
    base: Desired | None, head: Desired, allowed: frozenset[str] | None = None
) -> list[dict[str, Any]]:
    """Each ``env`` reference of a head sweep that the base does not have as it is (a new sweep's, a new variable's,
    or a variable whose value changed): sweep, variable, the controller variable it names, ``added``/``changed``,
    and whether ``allowed`` lists it (None: the allowlist is not known here)."""
    before = {s.name: dict(s.env) for s in base.sweeps} if base is not None else {}
    out: list[dict[str, Any]] = []
    for sweep in head.sweeps:
        old = before.get(sweep.name, {})
        for variable, value in sweep.env:
            name = reference(value)
            if name is None or old.get(variable) == value:
                continue
            out.append({
                "sweep": sweep.name, "variable": variable, "reference": name,
                "change": "changed" if variable in old else "added",
                "allowed": None if allowed is None else name in allowed,
            })
    return out


def compute_review(
    base: Side, head: Side, observed: Observed, held: Iterable[Place], now: float, changed_files: Sequence[str] = (),
    allowed_secrets: frozenset[str] | None = None,
) -> dict[str, Any]:
    """The review document (``rigsync review --json``; schema ``review.schema.json``). ``allowed_secrets``: the
    controller's job-secrets allowlist when it is known (None: it is not, and no reference is marked)."""
    doc: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "base": {"ref": base.ref, "commit": base.commit, "valid": base.desired is not None},
        "head": {"ref": head.ref, "commit": head.commit, "valid": head.desired is not None},
        "valid": head.desired is not None,
        "errors": [dict(e) for e in head.errors],
        "base_errors": len(base.errors),
        "changed_files": list(changed_files),
    }
    # an invalid head expands to nothing: comparing it would list every base run as removed, which it is not
    before, after = (_base_runs(base.desired), _base_runs(head.desired)) if head.desired is not None else ({}, {})
    added = [r for k, r in after.items() if k not in before]
    removed = [r for k, r in before.items() if k not in after]
    changed = [(before[k], r) for k, r in after.items() if k in before and before[k].id != r.id]
    sweeps: dict[str, dict[str, int]] = {}

    def row(name: str) -> dict[str, int]:
        return sweeps.setdefault(
            name, {"added": 0, "removed": 0, "changed": 0, "unchanged": 0, "base_runs": 0, "head_runs": 0,
                   "promotion_candidates_base": 0, "promotion_candidates_head": 0},
        )

    for d in (base.desired, head.desired) if head.desired is not None else ():
        for s in d.sweeps if d is not None else ():
            row(s.name)
    for r in before.values():
        row(r.sweep.name)["base_runs"] += 1
    for k, r in after.items():
        c = row(r.sweep.name)
        c["head_runs"] += 1
        if k in before and before[k].id == r.id:
            c["unchanged"] += 1
    for r in added:
        row(r.sweep.name)["added"] += 1
    for r in removed:
        row(r.sweep.name)["removed"] += 1
    for _, r in changed:
        row(r.sweep.name)["changed"] += 1
    for name, n in _candidates(base.desired if head.desired is not None else None).items():
        row(name)["promotion_candidates_base"] = n
    for name, n in _candidates(head.desired).items():
        row(name)["promotion_candidates_head"] = n
    doc["sweeps"] = sweeps
    doc["secrets"] = (
        secret_references(base.desired, head.desired, allowed_secrets) if head.desired is not None else []
    )
    doc["secrets_allowlist_known"] = allowed_secrets is not None
    doc["totals"] = {
        "added": len(added), "removed": len(removed), "changed": len(changed),
        "unchanged": sum(c["unchanged"] for c in sweeps.values()),
    }
    doc["added"] = [_run_json(r) for r in added]
    doc["removed"] = [_run_json(r) for r in removed]
    doc["changed"] = [
        {"sweep": new.sweep.name, "params": dict(new.params), "seed": new.seed, "base_id": old.id, "head_id": new.id,
         "base_command": old.command, "head_command": new.command}
        for old, new in changed
    ]
    doc["estimate"] = (
        _estimate(head.desired, [r for r in added] + [new for _, new in changed], observed, held, now)
        if head.desired is not None else None
    )
    return doc


def _estimate(
    desired: Desired, new_work: list[RunSpec], observed: Observed, held: Iterable[Place], now: float
) -> dict[str, Any]:
    done = {h.run_id for h in observed.history if h.phase is AttemptOutcome.SUCCEEDED}
    work = [r for r in new_work if r.id not in done]  # a reverted edit brings back runs already finished
    work.sort(key=lambda r: (r.sweep.order, r.sweep.name))
    world, _ = index_world(desired, observed, PLANNING_ALONE, now)
    places, sources = committed_places(desired, held, observed)
    used = [sources[p.name] for r in work if (p := desired.fleet.pool(r.sweep.pool)) is not None]
    source = _one_source(used or sources.values())
    runtimes = sweep_runtimes(desired, observed, world.gpu_dlperf, world.learned)
    prices = {name: [dph / n for dph, n, _ in here if n > 0] for name, here in places.items()}
    budget = purse(world, 0.0, runtimes, work, prices)
    by_sweep: dict[str, int] = {}
    for r in work:
        by_sweep[r.sweep.name] = by_sweep.get(r.sweep.name, 0) + 1
    queue = RunQueue(
        pending=tuple(PendingRun(r, max(1, r.sweep.gpus_per_run), r.sweep.min_gpu_ram_mib, 0, 1) for r in work),
        live_work=False,
        pending_by_sweep=by_sweep,
    )
    live = LiveVerdicts(running={}, used={}, settled=frozenset())
    estimates, warnings = estimate(world, queue, live, budget, places)
    sums = totals(estimates)
    priced = bool(estimates) and all(e.usd_low is not None for e in estimates)
    remaining = budget.remaining if budget.capped else None
    fits = "uncapped"
    if remaining is not None:
        left = max(0.0, remaining)
        if not priced:
            fits = "unknown"
        elif sums["usd_high"] <= left:
            fits = "yes"
        elif sums["usd_low"] <= left:
            fits = "maybe"
        else:
            fits = "no"
    return {
        "runs": len(work),
        "already_done": len(new_work) - len(work),
        "gpu_hours": round(sums["gpu_hours"], 4),
        "usd_low": round(sums["usd_low"], 4) if priced else None,
        "usd_high": round(sums["usd_high"], 4) if priced else None,
        "price_source": source,
        "upper_bound": source == "cap",
        "sweeps": [e.to_json() for e in estimates],
        "budget": {
            "capped": budget.capped,
            "remaining": None if remaining is None else round(max(0.0, remaining), 4),
            "tightest": budget.tightest,
            "left_low": None if remaining is None or not priced else round(max(0.0, remaining) - sums["usd_high"], 4),
            "left_high": None if remaining is None or not priced else round(max(0.0, remaining) - sums["usd_low"], 4),
            "fits": fits,
        },
        "warnings": warnings,
        # what each bayes search may still start beyond these runs, and its price at most (one home: suggest.py)
        "search": [b.to_json() for b in search_bounds(desired.sweeps, desired.runs, estimates)],
    }


def _search_lines(e: Mapping[str, Any]) -> list[str]:
    return [search_line(b["sweep"], b["runs"], b["usd_high"]) for b in e.get("search") or []]


def _secrets_said(doc: Mapping[str, Any]) -> str | None:
    """``2 SECRET reference(s) added or changed (1 NOT ALLOWED here)``: the headline's first words, when any."""
    refs = doc.get("secrets") or []
    if not refs:
        return None
    refused = sum(1 for r in refs if r["allowed"] is False)
    return f"{len(refs)} SECRET reference(s) added or changed" + (f" ({refused} NOT ALLOWED here)" if refused else "")


def _secret_line(r: Mapping[str, Any]) -> str:
    """``sweep tdmpc: T = ${GITHUB_TOKEN} (added): NOT in RIGSYNC_JOB_SECRETS here, held back (secret_not_allowed)``."""
    line = f"sweep {r['sweep']}: {r['variable']} = ${{{r['reference']}}} ({r['change']})"
    if r["allowed"] is False:
        line += f": NOT in {JOB_SECRETS_ENV} here, held back ({ReasonCode.SECRET_NOT_ALLOWED.value})"
    elif r["allowed"] is True:
        line += f": allowed here ({JOB_SECRETS_ENV})"
    return line if len(line) <= MAX_LINE else line[: MAX_LINE - 3] + "..."


def _secret_lines(doc: Mapping[str, Any], limit: int | None = None) -> list[str]:
    """What the review says first: each reference and what it sends where, bounded at ``limit`` lines."""
    refs = doc.get("secrets") or []
    if not refs:
        return []
    shown = refs if limit is None else refs[:limit]
    lines = [
        "secrets this change sends to rented boxes (the controller's values of these variables, at launch):",
        *(f"  {_secret_line(r)}" for r in shown),
    ]
    if len(refs) > len(shown):
        lines.append(f"  ... and {len(refs) - len(shown)} more (rigsync review --json lists them all)")
    if not doc.get("secrets_allowlist_known"):
        lines.append(f"  (this controller's allowlist is not known here: set {JOB_SECRETS_ENV} to mark them)")
    return lines


def headline(doc: Mapping[str, Any]) -> str:
    """``+6 runs, -0, ~0.40 GPU-h, $0.04-$0.06, fits: $4.94-$4.96 of $5.00 left after it``, after the count of
    secret references when the change adds or changes any."""
    if not doc["valid"]:
        return f"desired/ is invalid at head: {len(doc['errors'])} error(s)"
    t = doc["totals"]
    said = _secrets_said(doc)
    parts = [said] if said else []
    parts += [f"+{t['added']} run(s)", f"-{t['removed']}", f"{t['changed']} changed"]
    e = doc["estimate"]
    if e is not None and e["runs"]:
        parts.append(f"~{e['gpu_hours']:.2f} GPU-h")
        if e["usd_low"] is not None:
            price = f"{usd(e['usd_low'])}-{usd(e['usd_high'])}"
            parts.append(f"at most {usd(e['usd_high'])}" if e["upper_bound"] else price)
        b = e["budget"]
        if b["fits"] in ("yes", "maybe", "no"):
            verdict = {"yes": "fits", "maybe": "may not fit", "no": "does NOT fit"}[b["fits"]]
            parts.append(
                f"{verdict}: {usd(b['left_low'])}-{usd(b['left_high'])} of {usd(b['remaining'])} left after it"
            )
        elif b["fits"] == "uncapped":
            parts.append("no budget cap")
    return ", ".join(parts)


def _run_line(r: Mapping[str, Any]) -> str:
    params = " ".join(f"{k}={v}" for k, v in r["params"].items())
    line = f"{r.get('id') or r.get('head_id')}  seed={r['seed']}  {params}"
    return line if len(line) <= MAX_LINE else line[: MAX_LINE - 3] + "..."


def _listing(title: str, lines: list[str]) -> str:
    if not lines:
        return ""
    shown = lines[:MAX_LISTED]
    rest = len(lines) - len(shown)
    text = "\n".join(shown) + (f"\n... and {rest} more (rigsync review --json lists them all)" if rest else "")
    return f"<details><summary>{visible(title)} ({len(lines)})</summary>\n\n{md_fenced(text)}\n</details>\n\n"


def markdown(doc: Mapping[str, Any]) -> str:
    """The review as one pull-request comment: headline, per-sweep counts, price lines, the first runs of each
    kind; bounded under GitHub's comment limit whatever the size of the change, every value made safe."""
    out = [MARKER, f"### rigsync review: {md_inline(headline(doc))}", ""]
    secrets = _secret_lines(doc, MAX_LISTED)
    if secrets:  # first, before anything else: a reviewer must not miss a token sent to a stranger's box
        out.append(f"> [!WARNING]\n> **{md_inline(_secrets_said(doc) or '')}**\n")
        out.append(md_fenced("\n".join(secrets)))
    base, head = doc["base"], doc["head"]
    out.append(
        f"base {md_inline(base['ref'])} (`{(base['commit'] or '?')[:12]}`) → head {md_inline(head['ref'])} "
        f"(`{(head['commit'] or '?')[:12]}`)"
    )
    out.append("")
    if doc["errors"]:
        lines = [_error_line(e) for e in doc["errors"]]
        out.append(f"**Validation failed** ({len(lines)} error(s)):\n")
        out.append(md_fenced("\n".join(lines[:MAX_LISTED]) + (f"\n... and {len(lines) - MAX_LISTED} more"
                                                               if len(lines) > MAX_LISTED else "")))
    if doc["base_errors"]:
        out.append(
            f"(the base's desired/ did not load: {doc['base_errors']} error(s); every head run counts as added)\n"
        )
    if doc["sweeps"]:
        out.append("| sweep | added | removed | changed | unchanged | runs at head |")
        out.append("|---|---:|---:|---:|---:|---:|")
        rows = sorted(doc["sweeps"].items())
        for name, c in rows[:MAX_LISTED]:
            out.append(
                f"| {md_inline(name)} | {c['added']} | {c['removed']} | {c['changed']} | {c['unchanged']} "
                f"| {c['head_runs']} |"
            )
        if len(rows) > MAX_LISTED:
            out.append(f"| ... {len(rows) - MAX_LISTED} more sweep(s) | | | | | |")
        out.append("")
    e = doc["estimate"]
    if e is not None and e["runs"]:
        lines = [estimate_line(SweepEstimate.from_json(s)) for s in e["sweeps"][:MAX_LISTED]]
        lines += _search_lines(e)
        lines.append(f"prices from: {e['price_source']}" + (" (an upper bound)" if e["upper_bound"] else ""))
        if e["budget"]["tightest"]:
            lines.append(f"budget: {e['budget']['tightest']}")
        lines += [f"warning: {w}" for w in e["warnings"][:MAX_LISTED]]
        if e["already_done"]:
            lines.append(f"{e['already_done']} new run id(s) already succeeded earlier (not priced)")
        out.append(md_fenced("\n".join(lines)))
    out.append(_listing("Added runs", [_run_line(r) for r in doc["added"]]))
    out.append(_listing("Removed runs", [_run_line(r) for r in doc["removed"]]))
    out.append(_listing(
        "Changed runs (same sweep, params and seed; new content id)",
        [f"{c['base_id']} -> {_run_line(c)}" for c in doc["changed"]],
    ))
    text = "\n".join(x for x in out if x is not None)
    if len(text) > MAX_MARKDOWN:  # only pathological values get here (each part is bounded already)
        text = text[: MAX_MARKDOWN - 200] + "\n\n(review cut short: see rigsync review --json)\n"
    return text.rstrip("\n") + "\n"


def _error_line(e: Mapping[str, Any]) -> str:
    where = str(e["file"])
    if e.get("line") is not None:
        where += f":{e['line']}"
        if e.get("column") is not None:
            where += f":{e['column']}"
    return f"{where}: {e.get('pointer') or '/'}: {e['message']}"


def text(doc: Mapping[str, Any]) -> str:
    """The review for a terminal."""
    lines = [headline(doc), *_secret_lines(doc)]
    lines.append(f"base {doc['base']['ref']} {doc['base']['commit'] or '?'}")
    lines.append(f"head {doc['head']['ref']} {doc['head']['commit'] or '?'}")
    lines += [_error_line(e) for e in doc["errors"]]
    for name, c in sorted(doc["sweeps"].items()):
        lines.append(
            f"sweep {name}: +{c['added']} -{c['removed']} ~{c['changed']} ={c['unchanged']} ({c['head_runs']} at head)"
        )
    e = doc["estimate"]
    if e is not None and e["runs"]:
        lines += [estimate_line(SweepEstimate.from_json(s)) for s in e["sweeps"]]
        lines += _search_lines(e)
        lines.append(f"prices from: {e['price_source']}" + (" (an upper bound)" if e["upper_bound"] else ""))
        lines += [f"warning: {w}" for w in e["warnings"]]
    lines += [f"+ {_run_line(r)}" for r in doc["added"]]
    lines += [f"- {_run_line(r)}" for r in doc["removed"]]
    lines += [f"~ {c['base_id']} -> {_run_line(c)}" for c in doc["changed"]]
    return "\n".join(lines)


__all__ = [
    "MARKER", "Side", "committed_places", "compute_review", "headline", "markdown", "secret_references", "text"
]
