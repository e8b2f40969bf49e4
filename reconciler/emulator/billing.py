"""The emulator's billing ledger, the account's credit, and the event log.

Money is a safety property of rigsync (never rent past a cap), so tests and benchmarks need to read what the
emulated market charged, and rigsync reads the same figures through the API (``/api/v0/charges/``,
``/api/v0/users/current``). Charges are kept as rate segments per instance and integrated per second on read,
so a reading is exact at any moment (and over any window) without a ticking thread. Each segment bills two
parts, as Vast does: the active rental (``gpu``: ``dph_total`` minus storage, only while ``loading``/``running``)
and ``storage`` (``storage_cost × disk / 720`` per hour for every second the instance exists, stopped or not);
nothing after destroy. The account starts with ``credit`` dollars (plus any ``deposit``); what was billed comes
off it. Every state change and injected fault is an event.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class _Segment:
    since: float
    until: float | None  # None: still open
    gpu_per_hour: float
    storage_per_hour: float

    @property
    def per_hour(self) -> float:
        return self.gpu_per_hour + self.storage_per_hour

    def overlap_h(self, start: float, end: float, now: float) -> float:
        """Hours of this segment inside ``[start, end]`` (an open segment runs until ``now``)."""
        lo = max(self.since, start)
        hi = min(self.until if self.until is not None else now, end)
        return max(0.0, hi - lo) / 3600.0


@dataclass(frozen=True)
class Charge:
    """What one instance was billed inside a window: the active-rental and storage parts, with their hours."""

    instance_id: int
    start: float  # first billed second inside the window
    end: float  # last billed second inside the window
    gpu_usd: float
    gpu_hours: float
    storage_usd: float
    storage_hours: float

    @property
    def usd(self) -> float:
        return self.gpu_usd + self.storage_usd


class Ledger:
    def __init__(self, clock: Callable[[], float] = time.time, credit: float = 1000.0) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._segments: dict[int, list[_Segment]] = {}
        self._deposits: list[tuple[float, float]] = [(clock(), float(credit))]  # (when, usd)
        self._events: list[dict[str, Any]] = []

    # ---- billing -------------------------------------------------------------------------------------------
    def set_rate(
        self, instance_id: int, usd_per_hour: float, storage_per_hour: float | None = None, *, at: float | None = None
    ) -> None:
        """From now (or from ``at``, a moment since the last change: a price cutover found a tick late) on, bill
        ``instance_id`` at ``usd_per_hour`` in all (0 stops billing).

        ``storage_per_hour`` is the storage part of that rate (the rest is the active rental); by default the
        whole rate is the active rental.
        """
        with self._lock:
            now = self._clock()
            segs0 = self._segments.get(instance_id)
            if at is not None and at < now and (not segs0 or segs0[-1].since <= at):
                now = at
            segs = self._segments.setdefault(instance_id, [])
            if segs and segs[-1].until is None:
                segs[-1].until = now
            if usd_per_hour > 0:
                storage = min(max(0.0, storage_per_hour or 0.0), usd_per_hour)
                segs.append(_Segment(now, None, usd_per_hour - storage, storage))

    def rate(self, instance_id: int) -> float:
        with self._lock:
            segs = self._segments.get(instance_id)
            return segs[-1].per_hour if segs and segs[-1].until is None else 0.0

    def instance_ids(self) -> list[int]:
        """Every instance that was ever billed, in id order."""
        with self._lock:
            return sorted(i for i, segs in self._segments.items() if segs)

    def charge(
        self, instance_id: int, start: float = float("-inf"), end: float = float("inf"), *, at: float | None = None
    ) -> Charge | None:
        """What ``instance_id`` was billed inside ``[start, end]`` (None when nothing was), read now or, for a test
        that would otherwise wait for time to pass, as the bill will read at the later moment ``at``."""
        with self._lock:
            now = self._clock() if at is None else at
            gpu = gpu_h = sto = sto_h = 0.0
            first: float | None = None
            last: float | None = None
            for seg in self._segments.get(instance_id, ()):
                hours = seg.overlap_h(start, end, now)
                if hours <= 0:
                    continue
                lo = max(seg.since, start)
                hi = min(seg.until if seg.until is not None else now, end)
                first = lo if first is None else min(first, lo)
                last = hi if last is None else max(last, hi)
                gpu += seg.gpu_per_hour * hours
                sto += seg.storage_per_hour * hours
                if seg.gpu_per_hour > 0:
                    gpu_h += hours
                if seg.storage_per_hour > 0:
                    sto_h += hours
            if first is None or last is None:
                return None
            return Charge(instance_id, first, last, gpu, gpu_h, sto, sto_h)

    def instance_usd(self, instance_id: int, *, at: float | None = None) -> float:
        c = self.charge(instance_id, at=at)
        return c.usd if c is not None else 0.0

    def total_usd(self) -> float:
        return sum(self.instance_usd(i) for i in self.instance_ids())

    def usd_between(self, start: float, end: float) -> float:
        """Everything billed inside ``[start, end]`` (e.g. one UTC day), across all instances."""
        total = 0.0
        for i in self.instance_ids():
            c = self.charge(i, start, end)
            total += c.usd if c is not None else 0.0
        return total

    def burn_rate(self) -> float:
        """Current total $/h across all instances."""
        with self._lock:
            return sum(segs[-1].per_hour for segs in self._segments.values() if segs and segs[-1].until is None)

    # ---- the account -----------------------------------------------------------------------------------------
    def deposit(self, usd: float) -> None:
        """Add ``usd`` of credit to the account (a top-up)."""
        with self._lock:
            self._deposits.append((self._clock(), float(usd)))

    @property
    def deposits(self) -> list[tuple[float, float]]:
        with self._lock:
            return list(self._deposits)

    def credit_usd(self) -> float:
        """What the account has left: deposits minus everything billed (below zero once only storage bills)."""
        with self._lock:
            paid = sum(usd for _, usd in self._deposits)
        return paid - self.total_usd()

    # ---- events ----------------------------------------------------------------------------------------------
    def log(self, type_: str, instance_id: int | None = None, **extra: Any) -> None:
        with self._lock:
            self._events.append({"t": self._clock(), "type": type_, "instance_id": instance_id, **extra})

    @property
    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(e) for e in self._events]

    def snapshot(self) -> dict[str, Any]:
        ids = self.instance_ids()
        return {
            "total_usd": self.total_usd(),
            "burn_usd_per_hour": self.burn_rate(),
            "credit_usd": self.credit_usd(),
            "instances": {str(i): {"usd": self.instance_usd(i), "usd_per_hour": self.rate(i)} for i in ids},
            "events": self.events,
        }
