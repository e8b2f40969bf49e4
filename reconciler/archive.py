"""The run archive: one JSON line per finished attempt, append-only, sharded by month under observed/runs/.

It is the long memory of every sweep (what ran where, for how long, at what cost, with what result) and
lives in git so it can be diffed, grepped and analysed with nothing but the repository.

Appends must stay cheap however large the archive grows and must never duplicate a record when a crashed
cycle is retried. So the set of ``(run_id, attempt)`` keys is loaded once per ``RunArchive`` (one pass over
the shards, parsing only what a key needs) and kept in memory; an append checks that set and opens only the
shard it writes to, in append mode. A line cut short by a crash (no trailing newline) is ignored on load and
terminated before the next append, so the retried record lands on a line of its own.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from reconciler.errors import ArchiveCorrupt, RepoError
from reconciler.model import AttemptOutcome, AttemptRecord, Scalar

RUNS_DIR = "observed/runs"
UNDATED_SHARD = "undated"

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
)


def shard_name(record: AttemptRecord) -> str:
    """``YYYY-MM`` of the attempt's end (UTC), falling back to its start; ``undated`` when it has neither."""
    when = record.ended_at if record.ended_at is not None else record.started_at
    if when is None:
        return UNDATED_SHARD
    return dt.datetime.fromtimestamp(when, tz=dt.UTC).strftime("%Y-%m")


def shard_path(record: AttemptRecord) -> str:
    """The repository path of the shard ``record`` belongs in."""
    return f"{RUNS_DIR}/{shard_name(record)}.jsonl"


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
    return json.dumps(d, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def _opt_str(v: Any) -> str | None:
    return None if v is None else str(v)


def record_from_json(line: str | bytes) -> AttemptRecord:
    """Parse one archive line; raises ValueError (with the reason) on anything malformed."""
    try:
        d = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc.msg}") from exc
    if not isinstance(d, dict):
        raise ValueError("not a JSON object")
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
        )
    except KeyError as exc:
        raise ValueError(f"missing field {exc.args[0]!r}") from exc
    except (TypeError, ValueError) as exc:
        raise ValueError(str(exc)) from exc


# Lines rigsync writes start with the key; reading just that keeps loading a million keys to about a second.
_KEY_PREFIX = re.compile(rb'\{"run_id":"([^"\\]*)","attempt":([0-9]+),')


def _key_of(line: bytes) -> tuple[str, int]:
    m = _KEY_PREFIX.match(line)
    if m is not None and line.rstrip().endswith(b"}"):
        return (m.group(1).decode("utf-8"), int(m.group(2)))
    d = json.loads(line)
    return (str(d["run_id"]), int(d["attempt"]))


def _repair_tail(path: Path) -> None:
    """Make the shard end with a newline: terminate a complete last record, cut off a torn one.

    Only the bytes after the last newline are looked at, so this stays cheap on any shard size.
    """
    if not path.exists():
        return
    with open(path, "r+b") as fh:
        end = fh.seek(0, os.SEEK_END)
        if end == 0:
            return
        fh.seek(end - 1)
        if fh.read(1) == b"\n":
            return
        pos, tail = end, b""
        while pos > 0 and b"\n" not in tail:
            step = min(4096, pos)
            pos -= step
            fh.seek(pos)
            tail = fh.read(step) + tail
        cut = tail.rfind(b"\n") + 1  # 0 when the torn line is the whole file
        fragment = tail[cut:]
        try:
            _key_of(fragment)
            fh.seek(end)
            fh.write(b"\n")
        except (ValueError, KeyError, TypeError):
            fh.truncate(pos + cut)


class RunArchive:
    """The archive under ``<root>/observed/runs/``; ``root`` is the checkout."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.dir = self.root / RUNS_DIR
        self._keys: set[tuple[str, int]] | None = None

    def shards(self) -> list[Path]:
        if not self.dir.is_dir():
            return []
        return sorted(p for p in self.dir.iterdir() if p.suffix == ".jsonl" and p.is_file())

    def _lines(self, path: Path) -> Iterator[tuple[int, bytes]]:
        """Non-empty lines with their numbers; a final line without a newline (a torn write) is skipped."""
        with open(path, "rb") as fh:
            for n, line in enumerate(fh, start=1):
                if not line.endswith(b"\n"):
                    # Torn by a crash mid-append, unless it parses: then only the newline was lost.
                    try:
                        _key_of(line)
                    except (ValueError, KeyError, TypeError):
                        return
                stripped = line.strip()
                if stripped:
                    yield n, stripped

    def _load_keys(self) -> set[tuple[str, int]]:
        if self._keys is None:
            keys: set[tuple[str, int]] = set()
            for shard in self.shards():
                for n, line in self._lines(shard):
                    try:
                        keys.add(_key_of(line))
                    except (ValueError, KeyError, TypeError) as exc:
                        raise ArchiveCorrupt(f"{shard}:{n}: not an archive record ({exc})") from exc
            self._keys = keys
        return self._keys

    def __contains__(self, key: object) -> bool:
        return key in self._load_keys()

    def __len__(self) -> int:
        return len(self._load_keys())

    def records(self) -> Iterator[AttemptRecord]:
        """Every record, shard by shard in month order, each key once (the first written wins)."""
        seen: set[tuple[str, int]] = set()
        for shard in self.shards():
            for n, line in self._lines(shard):
                try:
                    rec = record_from_json(line)
                except ValueError as exc:
                    raise ArchiveCorrupt(f"{shard}:{n}: not an archive record ({exc})") from exc
                if rec.key in seen:
                    continue
                seen.add(rec.key)
                yield rec

    def encode_new(self, records: Iterable[AttemptRecord]) -> tuple[list[AttemptRecord], dict[str, bytes]]:
        """The records not yet archived (deduplicated among themselves too) and the bytes to append per shard.

        Nothing is written and the key set is not updated; ``append`` does both.
        """
        keys = self._load_keys()
        fresh: list[AttemptRecord] = []
        batch: set[tuple[str, int]] = set()
        out: dict[str, list[str]] = {}
        for rec in records:
            if rec.key in keys or rec.key in batch:
                continue
            batch.add(rec.key)
            fresh.append(rec)
            out.setdefault(shard_path(rec), []).append(record_to_json(rec) + "\n")
        return fresh, {path: "".join(lines).encode("utf-8") for path, lines in sorted(out.items())}

    def append(self, records: Iterable[AttemptRecord]) -> list[AttemptRecord]:
        """Append the records not yet archived to their shards; return them. Re-appending is a no-op."""
        fresh, blobs = self.encode_new(records)
        keys = self._load_keys()
        for rel, blob in blobs.items():
            path = self.root / rel
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                _repair_tail(path)
                with open(path, "ab") as fh:
                    fh.write(blob)
                    fh.flush()
                    os.fsync(fh.fileno())
            except OSError as exc:
                raise RepoError(f"cannot append to {path}: {exc}") from exc
        for rec in fresh:
            keys.add(rec.key)
        return fresh
