"""Faults of the instance list and rate limits per identity, as the real service shows them (issue 33).

* ``ListFaults``: the instance list lies. It answers ``success: false`` with HTTP 200 (Vast's
  ``deprecated_endpoint``), a reply without the list, pages cut short (each page loses its last row while the
  counts and tokens stay as they were), or a page token that never ends (the last page names itself again); and it
  hides instances (one by one, or every one created from now on) while ``GET /api/v0/instances/{id}/`` still shows
  them. The vastai SDK's ``show_instances`` reads the first two as an empty account, the third as fewer boxes, and
  loops forever on the fourth.
* ``ListFaults.ignore_bids``: a create rents on-demand whatever bid it carries, and answers success as ever
  (vast-cli PR #403: a spot search followed by a create without the bid rents on-demand, silently).
* ``RateLimits``: token buckets per identity (the key a request presents: the account's, or one instance's
  ``CONTAINER_API_KEY``) and per endpoint (method and path, ids folded), answered with HTTP 429 and no
  ``Retry-After`` (``rate-limits-and-errors.mdx``).
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from reconciler.emulator.exceptions import ApiError

LIST_FAULTS = ("success_false", "no_list", "cut_short", "endless_token")


@dataclass
class _ListFault:
    kind: str
    remaining: int | None  # list requests it still answers (None: until cleared)
    error: str


class ListFaults:
    """What the instance list does wrong now. Thread-safe; the emulator logs each change in its ledger."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fault: _ListFault | None = None
        self._hidden: set[int] = set()
        self._hide_new = False
        self._ignore_bids = False

    def set(self, kind: str | None, n: int | None = None, error: str = "deprecated_endpoint") -> None:
        """From now on the next ``n`` list requests (each page is one; None: until set again) answer ``kind``,
        one of ``LIST_FAULTS`` (None: the list tells the truth again)."""
        if kind is not None and kind not in LIST_FAULTS:
            raise ApiError(400, "invalid_args", f"Unknown list fault {kind!r}: one of {', '.join(LIST_FAULTS)}.")
        if n is not None and n < 1:
            raise ApiError(400, "invalid_args", f"Invalid n {n!r}: a positive count of list requests, or null.")
        with self._lock:
            self._fault = _ListFault(kind, n, error or "deprecated_endpoint") if kind is not None else None

    def take(self) -> tuple[str, str] | None:
        """Called per list request: (fault, error code) to answer it with, or None (the truth)."""
        with self._lock:
            fault = self._fault
            if fault is None:
                return None
            if fault.remaining is not None:
                fault.remaining -= 1
                if fault.remaining <= 0:
                    self._fault = None
            return fault.kind, fault.error

    def hide(self, instance_id: int, hidden: bool = True) -> None:
        with self._lock:
            if hidden:
                self._hidden.add(instance_id)
            else:
                self._hidden.discard(instance_id)

    def hide_new(self, on: bool) -> None:
        with self._lock:
            self._hide_new = on

    def ignore_bids(self, on: bool) -> None:
        with self._lock:
            self._ignore_bids = on

    def bids_ignored(self) -> bool:
        """Creates rent on-demand whatever bid they carry (the rent is not what was asked, and nothing says so)."""
        with self._lock:
            return self._ignore_bids

    def created(self, instance_id: int) -> bool:
        """A new instance: hidden from the list when every new one is. Returns whether it is."""
        with self._lock:
            if self._hide_new:
                self._hidden.add(instance_id)
            return instance_id in self._hidden

    def listed(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``records`` less the hidden instances."""
        with self._lock:
            hidden = set(self._hidden)
        return [r for r in records if r["id"] not in hidden]


def lying_page(fault: str, error: str, reply: dict[str, Any], start: int) -> dict[str, Any]:
    """A true page reply (``start``: its first row's offset) as ``fault`` answers it instead."""
    if fault == "success_false":
        return {"success": False, "error": error,
                "msg": "This endpoint is deprecated; use /api/v1/instances/." if error == "deprecated_endpoint"
                else f"Instance list unavailable: {error}."}
    if fault == "no_list":
        return {k: v for k, v in reply.items() if k != "instances"}
    if fault == "cut_short":
        return {**reply, "instances": reply["instances"][:-1]}
    # endless_token: the last page names itself again (the first page: the token of the first page)
    return {**reply, "next_token": reply["next_token"] or str(start)}


_IDS = re.compile(r"/\d+(?=/|$)")


def endpoint_key(method: str, path: str) -> str:
    """The endpoint a request goes to, its ids folded (``PUT /api/v0/asks/{id}/``): one bucket per endpoint."""
    return f"{method} {_IDS.sub('/{id}', path.rstrip('/'))}/"


def identity_of(key: str) -> str:
    """A short stable name for the key a request presented (never the key itself), "" for none."""
    return hashlib.sha256(key.encode()).hexdigest()[:12] if key else ""


class RateLimits:
    """Per identity and endpoint, a bucket of ``burst`` requests refilled at ``per_s`` a second, for the paths under
    each limited prefix (the longest prefix that matches rules). Nothing is limited until ``set``."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._rules: dict[str, tuple[float, float]] = {}  # path prefix -> (per_s, burst)
        self._buckets: dict[tuple[str, str], tuple[float, float]] = {}  # (identity, endpoint) -> (tokens, at)

    def set(self, path_prefix: str, per_s: float | None, burst: int = 1) -> None:
        """Limit the paths under ``path_prefix`` (per_s None or 0: no limit there any more)."""
        if per_s is not None and (per_s < 0 or burst < 1):
            raise ApiError(400, "invalid_args", "per_s must be >= 0 and burst >= 1.")
        with self._lock:
            if not per_s:
                self._rules.pop(path_prefix, None)
            else:
                self._rules[path_prefix] = (float(per_s), float(burst))
            self._buckets.clear()  # every bucket starts full under the new rules

    def _rule(self, path: str) -> tuple[float, float] | None:
        prefixes = [p for p in self._rules if path.startswith(p)]
        return self._rules[max(prefixes, key=len)] if prefixes else None

    def allow(self, identity: str, method: str, path: str) -> bool:
        """Take one request from the bucket of (``identity``, this endpoint); False: answer 429."""
        with self._lock:
            rule = self._rule(path)
            if rule is None:
                return True
            per_s, burst = rule
            key = (identity, endpoint_key(method, path))
            now = self._clock()
            tokens, at = self._buckets.get(key, (burst, now))
            tokens = min(burst, tokens + (now - at) * per_s)
            if tokens < 1.0:
                self._buckets[key] = (tokens, now)
                return False
            self._buckets[key] = (tokens - 1.0, now)
            return True
