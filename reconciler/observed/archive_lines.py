"""The run archive's line format: one JSON line per finished attempt or ended box's overhead, pure.

Encoding and parsing a line (and finding its ``(run_id, attempt)`` key cheaply) touch no file, so the views and
``review_git`` read committed archive lines through this module without the archive adapter
(``reconciler.adapters.archive``, which owns the shards on disk and the write-ahead journal).
"""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any, TypeVar

from reconciler.core.model import OVERHEAD_KEY, AttemptOutcome, AttemptRecord, OverheadRecord, Scalar
from reconciler.core.textsafe import visible
from reconciler.observed.codec import RUNS_DIR

UNDATED_SHARD = "undated"

Record = AttemptRecord | OverheadRecord
R = TypeVar("R", AttemptRecord, OverheadRecord)
OVERHEAD_KIND = "overhead"

# The order fields appear in on each line: identity first, then where it ran, then when, cost and result.
FIELD_ORDER = (
    "run_id",
    "attempt",
    "sweep",
    "phase",
    "params",
    "seed",
    "exit_code",
    "reason",
    "code_commit",
    "desired_commit",
    "image",
    "instance_id",
    "machine_id",
    "gpu_name",
    "dph",
    "started_at",
    "ended_at",
    "cost_usd",
    "best_metric",
    "final_metric",
    "harvest",
    "resumed_from",
    "queued_at",
    "progress",
    "stderr_tail",
)
# written only when set: older lines stay as they were
OPTIONAL_FIELDS = ("harvest", "resumed_from", "queued_at", "progress", "stderr_tail")


# The order of an overhead line's fields: its kind and box first, then the money, then when and what.
OVERHEAD_FIELD_ORDER = (
    "kind",
    "instance_id",
    "cost_usd",
    "billed_usd",
    "attempts_usd",
    "attempts",
    "estimated",
    "reason",
    "machine_id",
    "gpu_name",
    "num_gpus",
    "dph",
    "started_at",
    "ended_at",
    "reachable_at",
    "ready_at",
    "pool",
)


def shard_name(record: Record) -> str:
    """``YYYY-MM`` of the attempt's end (UTC), falling back to its start; ``undated`` when it has neither."""
    when = record.ended_at if record.ended_at is not None else record.started_at
    if when is None:
        return UNDATED_SHARD
    return dt.datetime.fromtimestamp(when, tz=dt.UTC).strftime("%Y-%m")


def shard_path(record: Record) -> str:
    """The repository path of the shard ``record`` belongs in."""
    return f"{RUNS_DIR}/{shard_name(record)}.jsonl"


def _line(d: dict[str, Any]) -> str:
    """Compact JSON, unicode kept, but DEL, C1 and bidi characters as ``\\u`` escapes (``textsafe.visible``): the
    same values, and a reviewer reading the archive in a diff sees them (json already escapes the C0 controls)."""
    return visible(json.dumps(d, separators=(",", ":"), ensure_ascii=False, allow_nan=False))


def record_to_json(record: AttemptRecord) -> str:
    """One compact line (no newline), fields in ``FIELD_ORDER``, params as an object in grid order."""
    d: dict[str, Any] = {
        "run_id": record.run_id,
        "attempt": record.attempt,
        "sweep": record.sweep,
        "phase": record.phase.value,
        "params": {k: v for k, v in record.params},
        "seed": record.seed,
        "exit_code": record.exit_code,
        "reason": record.reason,
        "code_commit": record.code_commit,
        "desired_commit": record.desired_commit,
        "image": record.image,
        "instance_id": record.instance_id,
        "machine_id": record.machine_id,
        "gpu_name": record.gpu_name,
        "dph": record.dph,
        "started_at": record.started_at,
        "ended_at": record.ended_at,
        "cost_usd": record.cost_usd,
        "best_metric": record.best_metric,
        "final_metric": record.final_metric,
    }
    for name in OPTIONAL_FIELDS:
        value = getattr(record, name)
        if value is not None:
            d[name] = value
    return _line(d)


def overhead_to_json(record: OverheadRecord) -> str:
    """One compact overhead line (no newline), fields in ``OVERHEAD_FIELD_ORDER``."""
    d: dict[str, Any] = {
        "kind": OVERHEAD_KIND,
        "instance_id": record.instance_id,
        "cost_usd": record.cost_usd,
        "billed_usd": record.billed_usd,
        "attempts_usd": record.attempts_usd,
        "attempts": record.attempts,
        "estimated": record.estimated,
        "reason": record.reason,
        "machine_id": record.machine_id,
        "gpu_name": record.gpu_name,
        "num_gpus": record.num_gpus,
        "dph": record.dph,
        "started_at": record.started_at,
        "ended_at": record.ended_at,
    }
    # written only when known: older lines stay as they were
    if record.reachable_at is not None:
        d["reachable_at"] = record.reachable_at
    if record.ready_at is not None:
        d["ready_at"] = record.ready_at
    if record.pool:
        d["pool"] = record.pool
    return _line(d)


def entry_to_json(record: Record) -> str:
    """The archive line of either kind of record."""
    return overhead_to_json(record) if isinstance(record, OverheadRecord) else record_to_json(record)


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def _opt_str(v: Any) -> str | None:
    return None if v is None else str(v)


def _line_object(line: str | bytes) -> dict[str, Any]:
    try:
        d = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc.msg}") from exc
    if not isinstance(d, dict):
        raise ValueError("not a JSON object")
    kind = d.get("kind")
    if kind is not None and kind not in ("attempt", OVERHEAD_KIND):
        raise ValueError(f"unknown kind {kind!r}")
    return d


def entry_from_json(line: str | bytes) -> Record:
    """Parse one archive line of either kind; raises ValueError (with the reason) on anything malformed."""
    d = _line_object(line)
    return _overhead(d) if d.get("kind") == OVERHEAD_KIND else _attempt(d)


def record_from_json(line: str | bytes) -> AttemptRecord:
    """Parse one attempt line; raises ValueError (with the reason) on anything malformed, or on an overhead line."""
    d = _line_object(line)
    if d.get("kind") == OVERHEAD_KIND:
        raise ValueError("an overhead line, not an attempt")
    return _attempt(d)


def _overhead(d: dict[str, Any]) -> OverheadRecord:
    try:
        return OverheadRecord(
            instance_id=int(d["instance_id"]),
            billed_usd=float(d["billed_usd"]),
            attempts_usd=float(d.get("attempts_usd", 0.0)),
            attempts=int(d.get("attempts", 0)),
            cost_usd=float(d["cost_usd"]),
            machine_id=int(d.get("machine_id", 0)),
            gpu_name=str(d.get("gpu_name", "")),
            num_gpus=int(d.get("num_gpus", 0)),
            dph=float(d.get("dph", 0.0)),
            started_at=_opt_float(d.get("started_at")),
            ended_at=_opt_float(d.get("ended_at")),
            reachable_at=_opt_float(d.get("reachable_at")),
            ready_at=_opt_float(d.get("ready_at")),
            pool=str(d.get("pool", "")),
            estimated=bool(d.get("estimated", False)),
            reason=str(d.get("reason", "")),
        )
    except KeyError as exc:
        raise ValueError(f"missing field {exc.args[0]!r}") from exc
    except (TypeError, ValueError) as exc:
        raise ValueError(str(exc)) from exc


def _attempt(d: dict[str, Any]) -> AttemptRecord:
    try:
        params_raw = d.get("params") or {}
        if not isinstance(params_raw, dict):
            raise ValueError("params must be an object")
        params: tuple[tuple[str, Scalar], ...] = tuple((str(k), v) for k, v in params_raw.items())
        exit_code = d.get("exit_code")
        return AttemptRecord(
            run_id=str(d["run_id"]),
            attempt=int(d["attempt"]),
            sweep=str(d.get("sweep", "")),
            phase=AttemptOutcome(d["phase"]),
            params=params,
            seed=int(d.get("seed", 0)),
            exit_code=None if exit_code is None else int(exit_code),
            code_commit=_opt_str(d.get("code_commit")),
            desired_commit=_opt_str(d.get("desired_commit")),
            image=str(d.get("image", "")),
            instance_id=int(d.get("instance_id", 0)),
            machine_id=int(d.get("machine_id", 0)),
            gpu_name=str(d.get("gpu_name", "")),
            dph=float(d.get("dph", 0.0)),
            started_at=_opt_float(d.get("started_at")),
            ended_at=_opt_float(d.get("ended_at")),
            cost_usd=float(d.get("cost_usd", 0.0)),
            best_metric=_opt_float(d.get("best_metric")),
            final_metric=_opt_float(d.get("final_metric")),
            reason=str(d.get("reason", "")),
            harvest=_opt_str(d.get("harvest")),
            stderr_tail=_opt_str(d.get("stderr_tail")),
            resumed_from=None if d.get("resumed_from") is None else int(d["resumed_from"]),
            queued_at=_opt_float(d.get("queued_at")),
            progress=_opt_float(d.get("progress")),
        )
    except KeyError as exc:
        raise ValueError(f"missing field {exc.args[0]!r}") from exc
    except (TypeError, ValueError) as exc:
        raise ValueError(str(exc)) from exc


# Lines rigsync writes start with the key; reading just that keeps loading a million keys to about a second.
_KEY_PREFIX = re.compile(rb'\{"run_id":"([^"\\]*)","attempt":([0-9]+),')
_OVERHEAD_PREFIX = re.compile(rb'\{"kind":"overhead","instance_id":([0-9]+),')


def key_of(line: bytes) -> tuple[str, int]:
    """The ``(run_id, attempt)`` key of one line (``(OVERHEAD_KEY, instance_id)`` for an overhead line), read from
    its prefix when rigsync wrote it; raises ValueError, KeyError or TypeError on a line that is no record."""
    if line.rstrip().endswith(b"}"):
        m = _KEY_PREFIX.match(line)
        if m is not None:
            return (m.group(1).decode("utf-8"), int(m.group(2)))
        m = _OVERHEAD_PREFIX.match(line)
        if m is not None:
            return (OVERHEAD_KEY, int(m.group(1)))
    d = json.loads(line)
    if d.get("kind") == OVERHEAD_KIND:
        return (OVERHEAD_KEY, int(d["instance_id"]))
    return (str(d["run_id"]), int(d["attempt"]))
