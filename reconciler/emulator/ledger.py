"""The emulator's billing ledger and event log.

Money is a safety property of rigsync (never rent past a cap), so tests and benchmarks need to read what the
emulated market charged. Charges are kept as rate segments per instance (``dph_total`` while running or
loading, storage only while stopped or offline, nothing after destroy) and integrated per second on read, so
a reading is exact at any moment without a ticking thread. Every state change and injected fault is an event.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class Ledger:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._closed: dict[int, float] = {}
        self._open: dict[int, tuple[float, float]] = {}  # instance -> (since, $/h)
        self._events: list[dict[str, Any]] = []

    def set_rate(self, instance_id: int, usd_per_hour: float) -> None:
        """From now on, bill ``instance_id`` at ``usd_per_hour`` (0 stops billing)."""
        with self._lock:
            now = self._clock()
            self._close(instance_id, now)
            if usd_per_hour > 0:
                self._open[instance_id] = (now, usd_per_hour)

    def _close(self, instance_id: int, now: float) -> None:
        seg = self._open.pop(instance_id, None)
        if seg is not None:
            since, rate = seg
            self._closed[instance_id] = self._closed.get(instance_id, 0.0) + rate * max(0.0, now - since) / 3600

    def rate(self, instance_id: int) -> float:
        with self._lock:
            seg = self._open.get(instance_id)
            return seg[1] if seg else 0.0

    def instance_usd(self, instance_id: int) -> float:
        with self._lock:
            total = self._closed.get(instance_id, 0.0)
            seg = self._open.get(instance_id)
            if seg is not None:
                total += seg[1] * max(0.0, self._clock() - seg[0]) / 3600
            return total

    def total_usd(self) -> float:
        with self._lock:
            ids = set(self._closed) | set(self._open)
        return sum(self.instance_usd(i) for i in ids)

    def burn_rate(self) -> float:
        """Current total $/h across all instances."""
        with self._lock:
            return sum(r for _, r in self._open.values())

    def log(self, type_: str, instance_id: int | None = None, **extra: Any) -> None:
        with self._lock:
            self._events.append({"t": self._clock(), "type": type_, "instance_id": instance_id, **extra})

    @property
    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(e) for e in self._events]

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            ids = sorted(set(self._closed) | set(self._open))
        return {
            "total_usd": self.total_usd(),
            "burn_usd_per_hour": self.burn_rate(),
            "instances": {str(i): {"usd": self.instance_usd(i), "usd_per_hour": self.rate(i)} for i in ids},
            "events": self.events,
        }
