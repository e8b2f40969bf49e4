"""observed/ as files: what rigsync saw and did, rendered as deterministic YAML for humans and agents to diff.

Every cycle renders the same five files from the same facts. They must be byte-identical when the world did
not change, because rigsync commits only when a file changed: so no "last cycle at" stamps, no GPU memory or
utilisation readings, no running metrics. Facts that do change are kept (a box's start time, a run's phase).
Two values move with the clock and get special care:

* ``status.yaml`` carries ``last_change_at``: the time of the last cycle in which anything else changed. The
  renderer compares with the previous files and keeps the old stamp when nothing else differs.
* ``budget.yaml`` carries spend as an *anchor* (spend at ``as_of`` while the fleet burned ``fleet_dph``):
  spend between anchors is a straight line, so a new anchor is written only when the rate changes, the UTC
  day rolls over, or the caller's spend drifts from the line. ``read_memory(now=...)`` extrapolates it.

The reverse, ``read_memory``, rebuilds the cross-cycle memory (first seen, unreachable since, in-flight
attempts, spend) from the committed files after a restart.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from reconciler.actions import Plan
from reconciler.errors import ObservedInvalid
from reconciler.model import (
    FREE_GPU_MEMORY_MIB,
    AttemptRecord,
    BoxMemory,
    Desired,
    InFlight,
    Instance,
    MetricGoal,
    Observed,
    Ownership,
    RunPhase,
    RunSpec,
    Spend,
    run_dir_name,
)
from reconciler.promotion import succeeded_metrics, wanted_ids
from reconciler.runphase import RunTally, live_attempts, run_phase, tally_runs

FLEET = "observed/fleet.yaml"
RUNS = "observed/runs.yaml"
DRIFT = "observed/drift.yaml"
BUDGET = "observed/budget.yaml"
STATUS = "observed/status.yaml"
LEASE = "observed/lease.yaml"
RENDERED = (BUDGET, DRIFT, FLEET, RUNS, STATUS)

FORMAT_VERSION = 1
RUN_PHASES = tuple(p.value for p in RunPhase)
_SPEND_TOLERANCE_USD = 0.01
_SPEND_TOLERANCE_REL = 0.005


@dataclass(frozen=True)
class ReconcilerStatus:
    """The reconciler's own state, as ``status.yaml`` reports it."""

    desired_commit_applied: str | None = None
    last_valid_desired_commit: str | None = None
    desired_errors: tuple[str, ...] = ()
    apply_errors: tuple[str, ...] = ()
    holder: str | None = None


# ------------------------------------------------------------------------------------------------ helpers


def iso(ts: float | None) -> str | None:
    """POSIX seconds → ``YYYY-MM-DDTHH:MM:SSZ`` (UTC, whole seconds), None stays None."""
    if ts is None:
        return None
    return dt.datetime.fromtimestamp(round(ts), tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, dt.datetime):
        return (value if value.tzinfo else value.replace(tzinfo=dt.UTC)).timestamp()
    try:
        parsed = dt.datetime.strptime(str(value), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError as exc:
        raise ObservedInvalid(f"{where}: {value!r} is not a UTC time like 2026-11-03T12:00:00Z") from exc
    return parsed.timestamp()


def _day(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%d")


def _money(x: float) -> float:
    return round(float(x), 6)


# Parsing with libyaml when present is only faster; dumping stays pure Python so every machine writes the same bytes.
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _safe_load(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)


def dump_yaml(data: Any, header: str) -> str:
    """The one YAML style of observed/: a comment header, sorted keys, block style, unicode, no wrapping."""
    body = yaml.safe_dump(data, sort_keys=True, default_flow_style=False, allow_unicode=True, width=10_000)
    return f"# {header}\n# Written by rigsync; do not edit (rigsync never reads desired/ from here).\n{body}"


def load_yaml(text: str, path: str) -> Any:
    try:
        return _safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else path
        problem = getattr(exc, "problem", None) or str(exc)
        raise ObservedInvalid(f"{where}: not valid YAML: {problem}") from exc


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ObservedInvalid(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _fleet_name(desired: Desired | None, observed: Observed) -> str:
    return desired.fleet.name if desired is not None else observed.fleet_name


def owned_instances(instances: tuple[Instance, ...], fleet: str) -> list[Instance]:
    out = []
    for inst in instances:
        own = Ownership.parse(inst.label)
        if own is not None and (not fleet or own.fleet == fleet):
            out.append(inst)
    return sorted(out, key=lambda i: i.id)


# ------------------------------------------------------------------------------------------------ fleet


def _render_fleet(fleet: str, observed: Observed) -> dict[str, Any]:
    owned = owned_instances(observed.instances, fleet)
    owned_ids = {i.id for i in owned}
    probes = observed.probes_by_id()
    on_gpu: dict[tuple[int, int], str] = {}
    for p in observed.probes:
        for r in p.runs:
            if r.exit_code is None and r.pid_alive:
                for gi in r.gpu_mask:
                    on_gpu[(p.instance_id, gi)] = run_dir_name(r.run_id, r.attempt)
    for f in observed.in_flight:
        for gi in f.gpu_mask:
            on_gpu.setdefault((f.instance_id, gi), run_dir_name(f.run_id, f.attempt))
    boxes = []
    for inst in owned:
        own = Ownership.parse(inst.label)
        probe = probes.get(inst.id)
        mem = observed.memory_of(inst.id)
        gpus = []
        if probe is not None and probe.reachable:
            for g in sorted(probe.gpus, key=lambda g: g.index):
                gpus.append(
                    {
                        "index": g.index,
                        "memory_total_mib": g.memory_total_mib,
                        "busy": g.memory_used_mib > FREE_GPU_MEMORY_MIB,
                        "run": on_gpu.get((inst.id, g.index)),
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
                "dph": _money(inst.dph_total),
                "machine_id": inst.machine_id,
                "image": inst.image,
                "interruptible": inst.is_bid,
                "started_at": iso(inst.start_date),
                "reachable": None if probe is None else probe.reachable,
                "first_seen_at": iso(mem.first_seen_at) if mem else None,
                "unreachable_since": iso(mem.unreachable_since) if mem else None,
                "bootstrapped": sorted(probe.bootstrap_hashes) if probe and probe.reachable else [],
                "code_commits": sorted(probe.code_commits) if probe and probe.reachable else [],
                "gpus": gpus,
            }
        )
    foreign = [
        {
            "id": i.id,
            "label": i.label,
            "status": i.status.value,
            "gpu_name": i.gpu_name,
            "num_gpus": i.num_gpus,
            "dph": _money(i.dph_total),
        }
        for i in sorted(observed.instances, key=lambda i: i.id)
        if i.id not in owned_ids
    ]
    memory = [
        {
            "instance_id": m.instance_id,
            "first_seen_at": iso(m.first_seen_at),
            "unreachable_since": iso(m.unreachable_since),
        }
        for m in sorted(observed.memory, key=lambda m: m.instance_id)
    ]
    return {
        "format_version": FORMAT_VERSION,
        "fleet": fleet,
        "held": len(owned),
        "dph": _money(sum(i.dph_total for i in owned)),
        "boxes": boxes,
        "foreign": foreign,
        "memory": memory,
    }


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

    def entry(run_id: str, spec: RunSpec | None) -> dict[str, Any]:
        recs = sorted(history.get(run_id, []), key=lambda r: r.attempt)
        goal = spec.metric_goal if spec else MetricGoal.MAX
        best: float | None = None
        for r in recs:
            best = _better(best, r.best_metric, goal)
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
            sweeps.setdefault(spec.sweep, {})[spec.id] = entry(spec.id, spec)
    else:
        sweep_of: dict[str, str] = {}
        for rec in observed.history:
            sweep_of[rec.run_id] = rec.sweep
        for f in observed.in_flight:
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
    in_flight = [
        {
            "run_id": f.run_id,
            "attempt": f.attempt,
            "instance_id": f.instance_id,
            "gpu_mask": list(f.gpu_mask),
            "launched_at": iso(f.launched_at),
            "sweep": f.sweep,
        }
        for f in sorted(observed.in_flight, key=lambda f: (f.run_id, f.attempt))
    ]
    return {
        "format_version": FORMAT_VERSION,
        "desired_commit": desired.commit if desired is not None else None,
        "counts": counts,
        "sweeps": sweeps,
        "in_flight": in_flight,
    }


# ------------------------------------------------------------------------------------------- drift, budget


def _render_drift(plan: Plan) -> dict[str, Any]:
    entries = sorted(
        ({"class": d.cls.value, "subject": d.subject, "detail": d.detail, "action": d.action} for d in plan.drift),
        key=lambda e: (e["subject"], e["class"], e["detail"], e["action"]),
    )
    return {"format_version": FORMAT_VERSION, "drift": entries}


def _spend_anchor(previous: Mapping[str, Any] | None, fleet_dph: float, spend: Spend, now: float) -> dict[str, Any]:
    fresh: dict[str, Any] = {
        "as_of": iso(now),
        "day": _day(now),
        "fleet_dph": _money(fleet_dph),
        "today_usd": _money(spend.today_usd),
        "total_usd": _money(spend.total_usd),
    }
    if not previous:
        return fresh
    try:
        at = parse_iso(previous["as_of"], "spend.as_of")
        rate = float(previous["fleet_dph"])
        today0 = float(previous["today_usd"])
        total0 = float(previous["total_usd"])
        day0 = str(previous["day"])
    except (KeyError, TypeError, ValueError, ObservedInvalid):
        return fresh
    if at is None or day0 != _day(now) or abs(rate - fresh["fleet_dph"]) > 1e-9:
        return fresh
    hours = max(0.0, now - at) / 3600.0
    tol_total = max(_SPEND_TOLERANCE_USD, _SPEND_TOLERANCE_REL * spend.total_usd)
    tol_today = max(_SPEND_TOLERANCE_USD, _SPEND_TOLERANCE_REL * spend.today_usd)
    if (
        abs(total0 + rate * hours - spend.total_usd) > tol_total
        or abs(today0 + rate * hours - spend.today_usd) > tol_today
    ):
        return fresh
    return dict(previous)


def _render_budget(
    desired: Desired | None, fleet_dph: float, plan: Plan, spend: Spend, now: float, previous: Mapping[str, Any] | None
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
    prev_spend = previous.get("spend") if previous else None
    return {
        "format_version": FORMAT_VERSION,
        "caps": caps,
        "fleet_dph": _money(fleet_dph),
        "planned_fleet_dph": _money(plan.fleet_dph_after),
        "spend": _spend_anchor(prev_spend if isinstance(prev_spend, dict) else None, fleet_dph, spend, now),
    }


def _render_status(status: ReconcilerStatus, plan: Plan) -> dict[str, Any]:
    return {
        "format_version": FORMAT_VERSION,
        "holder": status.holder,
        "desired_commit_applied": status.desired_commit_applied,
        "last_valid_desired_commit": status.last_valid_desired_commit,
        "desired_valid": not status.desired_errors,
        "desired_errors": list(status.desired_errors),
        "apply_errors": list(status.apply_errors),
        "suspended": plan.suspended,
        "last_plan": {"counts": plan.counts(), "warnings": list(plan.warnings)},
    }


_HEADERS = {
    FLEET: "rigsync observed fleet: owned boxes, their GPUs and what runs on each, $/h; foreign instances",
    RUNS: "rigsync observed runs: per sweep, per run id: phase, attempts, instance, best metric",
    DRIFT: "rigsync observed drift: how the world differs from desired, and what the plan does about it",
    BUDGET: "rigsync observed budget: caps, fleet $/h, spend anchor (spend grows at fleet_dph after as_of)",
    STATUS: "rigsync reconciler status: desired commit applied, errors, last change",
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
    """The five observed/*.yaml files for this cycle, keyed by repository path.

    ``observed`` is the state after apply (its ``memory``, ``in_flight``, ``history`` and ``spend`` are what
    the next cycle should start from). ``previous`` holds the files as last committed (missing ones may be
    left out); with it, an unchanged world renders byte-identical files.
    """
    previous = previous or {}
    fleet = _fleet_name(desired, observed)
    fleet_doc = _render_fleet(fleet, observed)
    prev_budget: dict[str, Any] | None = None
    if BUDGET in previous:
        try:
            loaded = _safe_load(previous[BUDGET])
            prev_budget = loaded if isinstance(loaded, dict) else None
        except yaml.YAMLError:
            prev_budget = None
    out = {
        FLEET: dump_yaml(fleet_doc, _HEADERS[FLEET]),
        RUNS: dump_yaml(_render_runs(desired, observed), _HEADERS[RUNS]),
        DRIFT: dump_yaml(_render_drift(plan), _HEADERS[DRIFT]),
        BUDGET: dump_yaml(
            _render_budget(desired, fleet_doc["dph"], plan, observed.spend, now, prev_budget), _HEADERS[BUDGET]
        ),
    }
    status_doc = _render_status(status, plan)
    last_change = iso(now)
    if previous and all(previous.get(p) == out[p] for p in out):
        try:
            prev_status = _safe_load(previous.get(STATUS, "")) or {}
        except yaml.YAMLError:
            prev_status = {}
        if isinstance(prev_status, dict) and prev_status.get("last_change_at"):
            prev_stamp = prev_status.pop("last_change_at")
            if prev_status == status_doc:
                last_change = prev_stamp
    status_doc["last_change_at"] = last_change
    out[STATUS] = dump_yaml(status_doc, _HEADERS[STATUS])
    return out


# ---------------------------------------------------------------------------------------- commit messages


def _load_quiet(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        d = _safe_load(text)
    except yaml.YAMLError:
        return {}
    return d if isinstance(d, dict) else {}


def _owned_ids(doc: Mapping[str, Any]) -> set[int]:
    return {int(b["id"]) for b in doc.get("boxes") or [] if isinstance(b, dict) and "id" in b}


def _running(doc: Mapping[str, Any]) -> set[tuple[str, int]]:
    out: set[tuple[str, int]] = set()
    for runs in (doc.get("sweeps") or {}).values():
        for run_id, r in (runs or {}).items():
            if isinstance(r, dict) and r.get("phase") == "running":
                out.add((str(run_id), int(r.get("attempts") or 0)))
    return out


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def summarize_change(old: Mapping[str, str], new: Mapping[str, str], appended: int) -> str:
    """A one-line commit message saying what changed, e.g. ``observe: +1 box, 3 runs finished, 2 launched``."""
    parts: list[str] = []
    of, nf = _load_quiet(old.get(FLEET)), _load_quiet(new.get(FLEET))
    before, after = _owned_ids(of), _owned_ids(nf)
    if after - before:
        parts.append("+" + _plural(len(after - before), "box", "boxes"))
    if before - after:
        parts.append("-" + _plural(len(before - after), "box", "boxes"))
    if appended:
        parts.append(_plural(appended, "run finished", "runs finished"))
    launched = _running(_load_quiet(new.get(RUNS))) - _running(_load_quiet(old.get(RUNS)))
    if launched:
        parts.append(f"{len(launched)} launched")
    od, nd = _load_quiet(old.get(DRIFT)).get("drift") or [], _load_quiet(new.get(DRIFT)).get("drift") or []
    if od != nd:
        parts.append(f"drift {len(od)}→{len(nd)}")
    os_, ns = _load_quiet(old.get(STATUS)), _load_quiet(new.get(STATUS))
    if ns.get("desired_commit_applied") and ns.get("desired_commit_applied") != os_.get("desired_commit_applied"):
        parts.append(f"applied desired {str(ns['desired_commit_applied'])[:10]}")
    if ns.get("desired_errors") and ns.get("desired_errors") != os_.get("desired_errors"):
        parts.append(f"desired invalid ({len(ns['desired_errors'])} error(s))")
    if ns.get("apply_errors") and ns.get("apply_errors") != os_.get("apply_errors"):
        parts.append(_plural(len(ns["apply_errors"]), "apply error", "apply errors"))
    ol, nl = _load_quiet(old.get(LEASE)), _load_quiet(new.get(LEASE))
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


# ------------------------------------------------------------------------------------------ reading back


def read_observed(root: Path) -> dict[str, str]:
    """The observed/*.yaml files present in the checkout at ``root`` (missing ones are left out)."""
    out: dict[str, str] = {}
    for rel in (*RENDERED, LEASE):
        p = Path(root) / rel
        if p.is_file():
            out[rel] = p.read_text(encoding="utf-8")
    return out


def read_memory(root: Path, *, now: float | None = None) -> tuple[tuple[BoxMemory, ...], tuple[InFlight, ...], Spend]:
    """Rebuild cross-cycle memory from the observed files at ``root`` (missing files mean empty memory).

    With ``now``, spend is extrapolated along the committed anchor (boxes kept billing while rigsync was
    down), with today's spend restarting at UTC midnight.
    """
    files = read_observed(root)
    return memory_from_files(files, now=now)


def memory_from_files(
    files: Mapping[str, str], *, now: float | None = None
) -> tuple[tuple[BoxMemory, ...], tuple[InFlight, ...], Spend]:
    fleet = _mapping(load_yaml(files[FLEET], FLEET), FLEET) if FLEET in files else {}
    runs = _mapping(load_yaml(files[RUNS], RUNS), RUNS) if RUNS in files else {}
    budget = _mapping(load_yaml(files[BUDGET], BUDGET), BUDGET) if BUDGET in files else {}
    memory: list[BoxMemory] = []
    for n, m in enumerate(fleet.get("memory") or []):
        where = f"{FLEET}: memory[{n}]"
        try:
            first = parse_iso(m["first_seen_at"], where + ".first_seen_at")
            memory.append(
                BoxMemory(
                    instance_id=int(m["instance_id"]),
                    first_seen_at=first if first is not None else 0.0,
                    unreachable_since=parse_iso(m.get("unreachable_since"), where + ".unreachable_since"),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ObservedInvalid(f"{where}: malformed box memory ({exc})") from exc
    in_flight: list[InFlight] = []
    for n, f in enumerate(runs.get("in_flight") or []):
        where = f"{RUNS}: in_flight[{n}]"
        try:
            launched = parse_iso(f["launched_at"], where + ".launched_at")
            in_flight.append(
                InFlight(
                    run_id=str(f["run_id"]),
                    attempt=int(f["attempt"]),
                    instance_id=int(f["instance_id"]),
                    gpu_mask=tuple(int(g) for g in f.get("gpu_mask") or ()),
                    launched_at=launched if launched is not None else 0.0,
                    sweep=str(f.get("sweep") or ""),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ObservedInvalid(f"{where}: malformed in-flight attempt ({exc})") from exc
    spend = Spend()
    anchor = budget.get("spend")
    if isinstance(anchor, dict):
        try:
            today = float(anchor.get("today_usd") or 0.0)
            total = float(anchor.get("total_usd") or 0.0)
            rate = float(anchor.get("fleet_dph") or 0.0)
            at = parse_iso(anchor.get("as_of"), f"{BUDGET}: spend.as_of")
        except (TypeError, ValueError) as exc:
            raise ObservedInvalid(f"{BUDGET}: spend: malformed ({exc})") from exc
        spend = Spend(today_usd=today, total_usd=total)
        if now is not None and at is not None:
            spend = spend.accrued(rate, at, now)
    return tuple(memory), tuple(in_flight), spend


def to_json(files: Mapping[str, str]) -> dict[str, Any]:
    """The parsed observed files, for tools that want one JSON document."""
    return {p: load_yaml(t, p) for p, t in sorted(files.items())}
