"""``rigsync diff``: what is observed against what is desired, for people and agents, from git alone.

It reads only committed files (desired/ through the loader, observed/*.yaml as rigsync last wrote them) at
the checkout's HEAD, so it needs no provider access and no credentials, and it never changes anything. The
desired revision is the one `rigsync run` applies (``GitRepo.pin``: the last commit that changed desired/,
not HEAD, which is usually rigsync's own observe or lease commit); observed is fresh when status.yaml says
it was written for that revision.
Per sweep it counts runs by phase; per fleet, boxes wanted against boxes held; and it lists the drift the
last cycle found with the action the plan takes about it (which is what the next plan does while the world
stays as observed).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

from reconciler.cli._common import MAX_OBSERVED_BYTES, add_checkout_arg
from reconciler.core.actions import SweepEstimate
from reconciler.core.jobenv import held_back
from reconciler.core.model import Desired, RunPhase
from reconciler.core.textsafe import md_section
from reconciler.errors import DesiredStateInvalid, ObservedInvalid, RepoError, UserError
from reconciler.observed.codec import DRIFT, FLEET, RUNS, STATUS, load_yaml
from reconciler.plan.render import estimate_line

REQUIRED = (FLEET, RUNS, DRIFT, STATUS)
# The diff's buckets (its JSON contract) over the one run phase: "failed" counts runs that will not run again.
_BUCKETS = {
    RunPhase.PENDING: "pending",
    RunPhase.RETRYING: "pending",
    RunPhase.RUNNING: "running",
    RunPhase.QUEUED: "running",  # in flight: its attempt waits in its box's queue
    RunPhase.SUCCEEDED: "done",
    RunPhase.STOPPED_EARLY: "done",  # settled by the sweep's early termination: it will not run again, not a failure
    RunPhase.BLOCKED: "failed",
}
_SCHEMAS = {FLEET: "observed-fleet", RUNS: "observed-runs", DRIFT: "observed-drift", STATUS: "observed-status"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Compare observed/ (as rigsync last committed it) with desired/ at the checkout's HEAD: "
        "runs per sweep by phase, boxes wanted vs held, and drift with the action the plan takes."
    )
    add_checkout_arg(p)
    p.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    p.add_argument(
        "--markdown", action="store_true",
        help="print the text as a markdown section for a pull-request comment (a fence no value can close)",
    )
    p.set_defaults(handler=run)


@cache
def _validator(name: str) -> jsonschema.Draft202012Validator | None:
    here = Path(__file__).resolve().parent.parent
    for candidate in (here.parent / "schemas", here / "schemas"):
        f = candidate / f"{name}.schema.json"
        if f.is_file():
            return jsonschema.Draft202012Validator(json.loads(f.read_text(encoding="utf-8")))
    return None


def _committed(repo: Path) -> tuple[Desired, dict[str, str]]:
    """desired/ and observed/*.yaml as committed at HEAD, desired pinned to its revision (``GitRepo.pin``).

    Outside a git checkout the working tree is read and the revisions stay None.
    """
    from reconciler.desired import load_desired, read_desired_files
    from reconciler.fleet import open_git

    if not (repo / ".git").exists():
        observed = {p: (repo / p).read_text(encoding="utf-8") for p in REQUIRED if (repo / p).is_file()}
        return load_desired(_require_desired_files(repo, read_desired_files(repo))), observed
    g = open_git(repo)
    try:
        head = g.head()
    except RepoError as exc:
        raise UserError(f"{repo}: no desired/ files committed") from exc  # a fresh repository without commits
    committed = g.files_at(head, "observed/", max_bytes=MAX_OBSERVED_BYTES, only=REQUIRED)
    if committed.refused:
        raise ObservedInvalid("; ".join(f"{path}: {why}" for path, why in sorted(committed.refused.items())))
    observed = {p: b.decode("utf-8", "replace") for p, b in committed.items()}
    return g.pin(load_desired(_require_desired_files(repo, g.desired_files(head))), head), observed


def _require_desired_files(repo: Path, files: dict[str, bytes]) -> dict[str, bytes]:
    if not files:
        raise UserError(f"{repo}: no desired/ files committed")
    return files


def _parse_observed(files: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    missing = [p for p in REQUIRED if p not in files]
    if missing:
        raise ObservedInvalid(
            f"{', '.join(missing)} not committed: rigsync has not written observed state here yet "
            "(run `rigsync run` against this repository first)"
        )
    out: dict[str, dict[str, Any]] = {}
    for path in REQUIRED:
        doc = load_yaml(files[path], path)
        validator = _validator(_SCHEMAS[path])
        if validator is not None:
            errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
            if errors:
                e = errors[0]
                pointer = "".join(f"/{p}" for p in e.absolute_path) or "/"
                raise ObservedInvalid(f"{path}: {pointer}: {e.message}")
        if not isinstance(doc, dict):
            raise ObservedInvalid(f"{path}: expected a mapping")
        out[path] = doc
    return out


def compute_diff(
    desired: Desired, observed: Mapping[str, Mapping[str, Any]], desired_commit: str | None
) -> dict[str, Any]:
    """The diff document (the ``--json`` contract) from a loaded desired state and parsed observed files."""
    runs_doc = observed[RUNS]
    seen: dict[str, dict[str, Any]] = {}
    for sweep_runs in (runs_doc.get("sweeps") or {}).values():
        for run_id, r in (sweep_runs or {}).items():
            seen[str(run_id)] = r
    sweeps: dict[str, dict[str, int]] = {}
    for sweep in desired.sweeps:
        sweeps[sweep.name] = {"pending": 0, "running": 0, "done": 0, "failed": 0, "total": 0}
    for spec in desired.runs:
        r = seen.get(spec.id)
        if r is None and spec.promotion_threshold is not None:
            continue  # a promotion seed is wanted only once its cell reached the threshold
        phase = RunPhase(r["phase"]) if r is not None else RunPhase.PENDING
        bucket = _BUCKETS[phase]
        c = sweeps.setdefault(spec.sweep.name, {"pending": 0, "running": 0, "done": 0, "failed": 0, "total": 0})
        c[bucket] += 1
        c["total"] += 1
    fleet_doc = observed[FLEET]
    fleet = {
        "wanted_max": 0 if desired.fleet.suspend else desired.fleet.max_instances,
        "wanted_min": 0 if desired.fleet.suspend else desired.fleet.min_instances,
        "held": int(fleet_doc.get("held") or 0),
        "dph": float(fleet_doc.get("dph") or 0.0),
    }
    drift = [
        {"class": d["class"], "subject": d["subject"], "detail": d["detail"], "action": d["action"]}
        for d in observed[DRIFT].get("drift") or []
    ]
    last_plan = observed[STATUS].get("last_plan") or {}
    return {
        "desired_commit": desired_commit,
        "observed_desired_commit": observed[STATUS].get("desired_commit_applied"),
        "sweeps": sweeps,
        "fleet": fleet,
        "drift": drift,
        # the last cycle's price of the unfinished work (it saw the market; diff does not)
        "price": list(last_plan.get("price") or []),
        "budget_warnings": [w for w in last_plan.get("warnings") or [] if str(w).startswith("budget:")],
        "blocked": held_back(last_plan.get("warnings") or []),
    }


def _text(d: Mapping[str, Any]) -> str:
    lines = []
    dc, oc = d["desired_commit"], d["observed_desired_commit"]
    lines.append(f"desired  {dc or '(working tree)'}")
    note = "" if dc is None or oc == dc else "  (observed before the newest desired commit)"
    lines.append(f"observed {oc or '(none applied yet)'}{note}")
    f = d["fleet"]
    lines.append(f"fleet: {f['held']} held, wanted {f['wanted_min']}..{f['wanted_max']}, ${f['dph']:.4f}/h")
    for name, c in d["sweeps"].items():
        lines.append(
            f"sweep {name}: {c['done']}/{c['total']} done, {c['running']} running, "
            f"{c['pending']} pending, {c['failed']} failed"
        )
    for e in d.get("price") or []:
        lines.append(f"{estimate_line(SweepEstimate.from_json(e))} (as of the last cycle)")
    for w in d.get("budget_warnings") or []:
        lines.append(f"warning: {w}")
    for b in d.get("blocked") or []:
        lines.append(f"BLOCKED: {b} (as of the last cycle)")
    if d["drift"]:
        lines.append("drift:")
        for x in d["drift"]:
            lines.append(f"  {x['class']:<17} {x['subject']}: {x['detail']} -> {x['action']}")
    else:
        lines.append("drift: none")
    return "\n".join(lines)


def diff_json(repo: Path) -> dict[str, Any]:
    """The diff of the checkout at ``repo`` as ``--json`` prints it (``rigsync mcp``'s ``diff`` returns it too)."""
    desired, observed_files = _committed(repo)
    return compute_diff(desired, _parse_observed(observed_files), desired.commit)


def run(args: argparse.Namespace) -> int:
    repo = Path(args.repo)
    if not repo.is_dir():
        raise UserError(f"{repo}: not a directory")
    try:
        doc = diff_json(repo)
    except DesiredStateInvalid as exc:
        for e in exc.errors:
            print(f"rigsync: error: {e}", file=sys.stderr)
        raise
    if args.json:
        print(json.dumps(doc, indent=2))
    elif args.markdown:
        print(md_section("rigsync: desired vs observed", _text(doc)), end="")
    else:
        print(_text(doc))
    return 0
