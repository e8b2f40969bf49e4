"""One master per fleet: a local file lock plus a lease recorded in git under ``observed/lease.yaml``.

Two reconcilers acting on one fleet would rent twice and fight over runs, so exactly one may act. On one
machine ``LocalLock`` (``fcntl.flock`` on ``lock_path(checkout)``, a file in the checkout's ``.git/``) stops a
second process at once. Across machines the lease in git does it: the holder renews a heartbeat; anyone
else refuses to act while it is fresh, and may take it over once it is older than ``stale_after`` seconds.
The takeover is recorded in the file (``taken_over_from``) and so in the commit message.

The decisions are pure functions over the parsed file and ``now``; the heartbeat is renewed only every
``renew_every`` seconds so that cycles in between leave the file, and git, untouched. Because the lease is a
file in git, a lease written by someone else between our fetch and our push makes our rebase conflict (the
git adapter marks the file binary), so two takeovers cannot both win.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from reconciler.errors import LeaseHeld, ObservedInvalid
from reconciler.observed.codec import LEASE, dump_yaml, iso, load_yaml, parse_iso

DEFAULT_STALE_AFTER_S = 300.0
DEFAULT_RENEW_EVERY_S = 60.0
LOCK_FILE = "rigsync.lock"


def lock_path(checkout: Path) -> Path:
    """The checkout's local lock: held by `rigsync run` for its whole life and by `rigsync apply` while it acts.

    It lives in the checkout's ``.git/`` (never committed, one per clone), so two processes on one machine
    acting through the same checkout exclude each other at once, before the lease in git is even read.
    """
    return Path(checkout) / ".git" / LOCK_FILE


class LocalLock:
    """An exclusive, non-blocking ``flock`` on ``path``; raises ``LeaseHeld`` naming the pid holding it."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fh: IO[str] | None = None

    def acquire(self) -> LocalLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+")  # noqa: SIM115 - held open for the life of the lock
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            who = fh.read().strip() or "another process"
            fh.close()
            raise LeaseHeld(f"another rigsync holds the local lock {self.path} ({who})") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}\n")
        fh.flush()
        self._fh = fh
        return self

    def release(self) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None

    @property
    def held(self) -> bool:
        return self._fh is not None

    def __enter__(self) -> LocalLock:
        return self.acquire()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


@dataclass(frozen=True)
class LeaseState:
    """The content of ``observed/lease.yaml``."""

    holder: str
    host: str
    pid: int
    acquired_at: float
    heartbeat_at: float
    taken_over_from: str | None = None

    def describe(self) -> str:
        return f"{self.holder} on {self.host} (pid {self.pid})"


@dataclass(frozen=True)
class LeaseDecision:
    """What ``acquire`` decided. ``state`` is the lease to write when ``changed``."""

    granted: bool
    state: LeaseState | None
    changed: bool
    takeover: bool
    message: str
    previous: LeaseState | None = None


# ------------------------------------------------------------------------------------------------- pure


def acquire(
    current: LeaseState | None, *, holder: str, host: str, pid: int, now: float, stale_after: float
) -> LeaseDecision:
    """Decide whether ``holder`` may act: a free lease is taken, our own is resumed, a stale one taken over."""
    if current is None:
        state = LeaseState(holder=holder, host=host, pid=pid, acquired_at=now, heartbeat_at=now)
        return LeaseDecision(True, state, True, False, f"lease acquired by {holder}")
    if current.holder == holder:
        state = replace(current, host=host, pid=pid, heartbeat_at=now)
        changed = (current.host, current.pid) != (host, pid)
        msg = f"lease resumed by {holder}" if changed else f"lease held by {holder}"
        return LeaseDecision(True, state if changed else current, changed, False, msg, current)
    age = now - current.heartbeat_at
    if age > stale_after:
        state = LeaseState(
            holder=holder,
            host=host,
            pid=pid,
            acquired_at=now,
            heartbeat_at=now,
            taken_over_from=f"{current.describe()}, heartbeat {iso(current.heartbeat_at)}",
        )
        msg = f"lease taken over from {current.describe()}: heartbeat {age:.0f}s old (stale after {stale_after:.0f}s)"
        return LeaseDecision(True, state, True, True, msg, current)
    msg = (
        f"the fleet's lease is held by {current.describe()}, heartbeat {max(age, 0.0):.0f}s ago; "
        f"it can be taken over when the heartbeat is older than {stale_after:.0f}s"
    )
    return LeaseDecision(False, None, False, False, msg, current)


def renew(state: LeaseState, now: float, renew_every: float = DEFAULT_RENEW_EVERY_S) -> LeaseState | None:
    """The renewed lease when a heartbeat is due, else None (nothing to write, nothing to commit)."""
    if now - state.heartbeat_at < renew_every:
        return None
    return replace(state, heartbeat_at=now)


def to_yaml(state: LeaseState) -> str:
    doc: dict[str, Any] = {
        "holder": state.holder,
        "host": state.host,
        "pid": state.pid,
        "acquired_at": iso(state.acquired_at),
        "heartbeat_at": iso(state.heartbeat_at),
        "taken_over_from": state.taken_over_from,
    }
    return dump_yaml(doc, "rigsync lease: the one reconciler acting on this fleet, and its last heartbeat")


def from_yaml(text: str, path: str = LEASE) -> LeaseState | None:
    """Parse the lease file; an empty file means no lease."""
    doc = load_yaml(text, path)
    if doc is None:
        return None
    if not isinstance(doc, dict):
        raise ObservedInvalid(f"{path}: expected a mapping")
    try:
        acquired = parse_iso(doc.get("acquired_at"), f"{path}: acquired_at")
        heartbeat = parse_iso(doc["heartbeat_at"], f"{path}: heartbeat_at")
        return LeaseState(
            holder=str(doc["holder"]),
            host=str(doc.get("host") or ""),
            pid=int(doc.get("pid") or 0),
            acquired_at=acquired if acquired is not None else (heartbeat or 0.0),
            heartbeat_at=heartbeat if heartbeat is not None else 0.0,
            taken_over_from=None if doc.get("taken_over_from") is None else str(doc["taken_over_from"]),
        )
    except KeyError as exc:
        raise ObservedInvalid(f"{path}: missing {exc.args[0]!r}") from exc
    except (TypeError, ValueError) as exc:
        raise ObservedInvalid(f"{path}: malformed ({exc})") from exc


# ---------------------------------------------------------------------------------------------- thin I/O


class Lease:
    """The lease over the checkout at ``root``: reads ``observed/lease.yaml``, returns files to commit.

    It never commits by itself; the loop passes the returned mapping to ``GitRepo.commit_observed`` (and
    should fetch and sync before ``acquire`` so it decides on the remote's lease, not a stale local copy).
    """

    def __init__(
        self,
        root: Path,
        *,
        holder: str,
        host: str,
        pid: int,
        stale_after: float = DEFAULT_STALE_AFTER_S,
        renew_every: float = DEFAULT_RENEW_EVERY_S,
    ) -> None:
        self.root = Path(root)
        self.holder, self.host, self.pid = holder, host, pid
        self.stale_after = stale_after
        self.renew_every = renew_every
        self.state: LeaseState | None = None

    def read(self) -> LeaseState | None:
        p = self.root / LEASE
        if not p.is_file():
            return None
        return from_yaml(p.read_text(encoding="utf-8"))

    def acquire(self, now: float) -> tuple[LeaseDecision, dict[str, str | None]]:
        """Take, resume or take over the lease; raises ``LeaseHeld`` naming the holder when refused."""
        decision = acquire(
            self.read(), holder=self.holder, host=self.host, pid=self.pid, now=now, stale_after=self.stale_after
        )
        if not decision.granted:
            raise LeaseHeld(decision.message)
        self.state = decision.state
        files: dict[str, str | None] = {}
        if decision.changed and decision.state is not None:
            files[LEASE] = to_yaml(decision.state)
        return decision, files

    def renew(self, now: float) -> dict[str, str | None]:
        """``{lease path: content}`` when a heartbeat is due, else ``{}``.

        Raises ``LeaseHeld`` if the committed lease now names someone else (we were taken over).
        """
        if self.state is None:
            raise LeaseHeld("the lease was never acquired")
        on_disk = self.read()
        if on_disk is not None and on_disk.holder != self.holder:
            raise LeaseHeld(f"the fleet's lease was taken over by {on_disk.describe()}")
        new = renew(self.state, now, self.renew_every)
        if new is None:
            return {}
        self.state = new
        return {LEASE: to_yaml(new)}

    def release(self) -> dict[str, str | None]:
        """Give the lease up (so another reconciler need not wait for it to go stale)."""
        self.state = None
        return {LEASE: None}
