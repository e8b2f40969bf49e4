"""The launch journal: every launch written down locally before it happens, so a crash cannot lose its number.

An attempt becomes known to the next cycle through ``observed/runs.yaml`` (``in_flight``), committed after the
cycle's apply, and through the probes of the boxes. A controller killed between a launch and that commit, whose
box then stops answering (hung, partitioned) before anyone probes it again, leaves an attempt nobody knows of: the
restarted controller would launch the same attempt number of that run on another box, and if the first box came
back both would run at once. So before each launch its ``InFlight`` is appended (and fsynced) to
``launches.jsonl`` in the controller's state directory; after each apply the file is rewritten to exactly the
attempts in flight (with the process group each launch recorded, ``pid``/``pid_started``, known only after it);
and opening a fleet adds the journal's attempts that neither ``in_flight`` nor the archive knows. A launch that
failed before a crash becomes an in-flight attempt no box shows: the planner requeues it ("launch never
happened"), which costs that run one attempt and nothing else.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from pathlib import Path

from reconciler.core.model import InFlight
from reconciler.errors import LaunchJournalError
from reconciler.remote.launched import valid_pid, valid_start

JOURNAL = "launches.jsonl"


def _entry(f: InFlight) -> str:
    return json.dumps(
        {
            "run_id": f.run_id,
            "attempt": f.attempt,
            "instance_id": f.instance_id,
            "gpu_mask": list(f.gpu_mask),
            "launched_at": f.launched_at,
            "sweep": f.sweep,
            "resumed_from": f.resumed_from,
            "pid": f.pid,
            "pid_started": f.pid_started,
            "epoch": f.epoch,
            "queued": f.queued,
            "seen_started_at": f.seen_started_at,
        },
        sort_keys=True,
    )


def _epoch(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _time(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


class FileLaunchJournal:
    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / JOURNAL

    def note(self, flight: InFlight) -> None:
        """Append one launch about to happen, durably."""
        try:
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(_entry(flight) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            what = f"launch {flight.run_id}.{flight.attempt}"
            raise LaunchJournalError(f"cannot note {what} in the launch journal {self.path}: {exc}") from exc

    def reset(self, in_flight: Iterable[InFlight]) -> None:
        """After an apply: the journal holds exactly the attempts in flight (atomic replace)."""
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_text("".join(_entry(f) + "\n" for f in in_flight), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as exc:
            raise LaunchJournalError(f"cannot rewrite the launch journal {self.path}: {exc}") from exc

    def read(self) -> list[InFlight]:
        """Every well-formed entry (a line torn by a crash is skipped)."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except OSError:
            return []
        out: list[InFlight] = []
        for line in text.splitlines():
            try:
                d = json.loads(line)
                out.append(
                    InFlight(
                        run_id=str(d["run_id"]),
                        attempt=int(d["attempt"]),
                        instance_id=int(d["instance_id"]),
                        gpu_mask=tuple(int(g) for g in d["gpu_mask"]),
                        launched_at=float(d["launched_at"]),
                        sweep=str(d.get("sweep") or ""),
                        resumed_from=None if d.get("resumed_from") is None else int(d["resumed_from"]),
                        # absent in the lines of older versions
                        pid=valid_pid(d.get("pid")),
                        pid_started=valid_start(d.get("pid_started")),
                        epoch=_epoch(d.get("epoch")),
                        # a queued attempt restored as a direct launch would be requeued while its box still holds it
                        queued=d.get("queued") is True,
                        seen_started_at=_time(d.get("seen_started_at")),
                    )
                )
            except (ValueError, KeyError, TypeError):
                continue
        return out

