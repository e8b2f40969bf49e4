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

**Fencing: acting only while the lease is certainly ours.** Taking the lease once per cycle is not enough: a
cycle may act for minutes (rents, code shipments, launches over SSH), and a controller that stalls (a slow
apply, a suspended laptop, a network partition) could still be acting when another one takes over. The classic
lease argument closes that gap without asking the remote before every action. Let ``T`` be the heartbeat of the
last lease we *pushed* (``Lease.confirmed_at``: the heartbeat others read on the remote, not one only written
locally). Nobody may take the lease over before ``T + stale_after`` on *their* clock. So we may act only while

    now < T + stale_after - margin,        margin = min(FENCE_MARGIN_MAX_S, stale_after / 4)

(``fence_deadline``). The margin covers what the argument cannot see: clock skew between controllers and the
duration of the one action that starts just before the deadline (an SSH command is bounded at a minute; a
commit + push takes seconds). With the defaults (stale 300 s) that is 60 s, so we stop acting 4 minutes after
our last pushed heartbeat; with a tiny ``--lease-stale`` the margin shrinks with it (a quarter).

``apply()`` calls the fence (``Lease.check``, through ``FleetDaemon.fence``) just before every action that
changes the world, and the daemon checks the deadline again before it commits the cycle's observed files (a commit
that carries a new heartbeat needs no check: its push is itself a compare-and-swap, see below). Once the fence
raises ``LeaseLost`` the controller stops acting, commits nothing (the new holder's lease and observed files must
not be overwritten, nor its lease "released"), and exits non-zero. The daemon also *renews* the lease from inside
the fence when a heartbeat is due mid-apply (``renew_due``: half ``stale_after`` since the last one pushed):
fetch, refuse if someone else holds the lease, commit the lease alone and push. A push of the lease is a
compare-and-swap on the remote branch (the lease file is merged as binary), so a renewal racing a takeover either
wins (and the taker sees a fresh lease) or loses with a conflict on the lease file (and we stop). So a long apply
keeps its lease while it is alive, and loses it only by going silent. Checking the remote before every action (a
``git ls-remote`` or fetch per launch) would cost a round trip each and still leave a window between check and
act; the deadline bounds that window instead.

Why the next holder's first cycle is safe: it plans from the world, not from the old holder's memory — the
provider's instance list (rented boxes carry the fleet label), the run directories on the boxes (a launch is an
atomic ``mkdir``: a second launch of the same attempt fails) and the archive in git. Whatever the old holder did
before its deadline is visible there; after its deadline it does nothing.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from reconciler.errors import LeaseHeld, LeaseLost, ObservedInvalid
from reconciler.observed.codec import LEASE, dump_yaml, iso, load_yaml, parse_iso

DEFAULT_STALE_AFTER_S = 300.0
DEFAULT_RENEW_EVERY_S = 60.0
FENCE_MARGIN_MAX_S = 60.0  # the fencing margin's ceiling: clock skew plus one action's duration
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


def fence_margin(stale_after: float) -> float:
    """How long before another controller may take over we stop acting: min(60 s, stale_after / 4)."""
    return min(FENCE_MARGIN_MAX_S, stale_after / 4.0)


def fence_deadline(confirmed_heartbeat: float, stale_after: float) -> float:
    """The last moment a holder whose lease was pushed with heartbeat ``confirmed_heartbeat`` may act (exclusive)."""
    return confirmed_heartbeat + stale_after - fence_margin(stale_after)


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
        self.confirmed_at: float | None = None  # the heartbeat of our lease as the remote has it (fencing's T)

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
        self.confirmed_at = None
        files: dict[str, str | None] = {}
        if decision.changed and decision.state is not None:
            files[LEASE] = to_yaml(decision.state)
        else:
            self.confirm()  # resumed as the remote has it (the caller synced before deciding)
        return decision, files

    def confirm(self) -> None:
        """Our current lease is on the remote now (pushed, or read from it unchanged): the fence counts from it."""
        self.confirmed_at = self.state.heartbeat_at if self.state is not None else None

    def deadline(self) -> float | None:
        """Until when we may act (``fence_deadline``), or None when no lease of ours is on the remote."""
        if self.confirmed_at is None:
            return None
        return fence_deadline(self.confirmed_at, self.stale_after)

    def renew_due(self, now: float) -> bool:
        """A heartbeat should be pushed *now*, between two actions of a long apply: the one the remote has is half a
        ``stale_after`` old (and at least ``renew_every``), or none is there.

        Short cycles never get here: their heartbeat (``renew``) goes in the cycle's own commit, so a long apply is
        the only thing that adds a lease-only commit to the history.
        """
        if self.state is None:
            return False
        due = max(self.renew_every, self.stale_after / 2.0)
        return self.confirmed_at is None or now - self.confirmed_at >= due

    def beat(self, now: float) -> dict[str, str | None]:
        """A heartbeat at ``now`` whether due or not, as the files to commit (the daemon pushes it mid-apply)."""
        if self.state is None:
            raise LeaseLost("the lease was never acquired")
        self.state = replace(self.state, heartbeat_at=now)
        return self.files()

    def check(self, now: float) -> None:
        """The fence: return while we may act, raise ``LeaseLost`` once the deadline has passed."""
        deadline = self.deadline()
        if self.state is None or deadline is None:
            raise LeaseLost("no lease of ours is on the remote; not acting")
        if now >= deadline:
            assert self.confirmed_at is not None
            raise LeaseLost(
                f"the lease's fencing deadline passed {now - deadline:.0f}s ago: last heartbeat pushed "
                f"{now - self.confirmed_at:.0f}s ago, another reconciler may take over after {self.stale_after:.0f}s "
                f"(margin {fence_margin(self.stale_after):.0f}s)"
            )

    def files(self) -> dict[str, str | None]:
        """Our lease as it stands, to commit (``{}`` when we hold none)."""
        return {LEASE: to_yaml(self.state)} if self.state is not None else {}

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
        """Give the lease up (so another reconciler need not wait for it to go stale).

        ``{}`` when the lease in the checkout is not ours (taken over): someone else's lease is never removed.
        """
        self.state = None
        self.confirmed_at = None
        on_disk = self.read()
        if on_disk is not None and on_disk.holder != self.holder:
            return {}
        return {LEASE: None}
