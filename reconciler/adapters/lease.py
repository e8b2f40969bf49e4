"""One master per fleet: a local file lock plus a lease on its own git ref, taken by compare-and-swap pushes.

Two reconcilers acting on one fleet would rent twice and fight over runs, so exactly one may act. On one
machine ``LocalLock`` (``fcntl.flock`` on ``lock_path(checkout)``, a file in the checkout's ``.git/``) stops a
second process at once. Across machines the lease does it: a one-file commit (``lease.yaml``) on its own ref of the
remote, ``refs/heads/rigsync/lease/<branch>`` (``ports.LeaseStore``, implemented by ``adapters.git.GitRepo``), never
on the branch humans and rigsync's observed/ commits share: main carries state changes only. The holder renews a
heartbeat; anyone else refuses to act while it is fresh, and may take it over once it is older than ``stale_after``
seconds. The takeover is recorded in the file (``taken_over_from``) and in the lease commit's message.

Every write of the lease is a compare-and-swap: a push that names the version it replaces
(``--force-with-lease=<ref>:<expected sha>``; "no lease" expects the ref to be absent). A rejected push means
someone else wrote the lease since we read it (``errors.LeaseRace``): an acquirer decides again on what they wrote,
a holder has lost the lease. So of two reconcilers racing for a stale (or free) lease exactly one wins, and a
renewal racing a takeover either lands first (the taker then sees a fresh lease) or loses and stops. Each write is a
new parentless commit, so the ref does not grow a history of heartbeats.

The decisions are pure functions over the parsed file and ``now``; the heartbeat is renewed only every
``renew_every`` seconds, and on the lease ref only: no renewal ever makes a commit on the tracked branch.

**Fencing: acting only while the lease is certainly ours.** Taking the lease once per cycle is not enough: a
cycle may act for minutes (rents, code shipments, launches over SSH), and a controller that stalls (a slow
apply, a suspended laptop, a network partition) could still be acting when another one takes over. The classic
lease argument closes that gap without asking the remote before every action. Let ``T`` be the heartbeat of the
last lease we *pushed* (``GitLease.confirmed_at``: the heartbeat others read on the remote, not one only written
locally). Nobody may take the lease over before ``T + stale_after`` on *their* clock. So we may act only while

    now < T + stale_after - margin,        margin = min(FENCE_MARGIN_MAX_S, stale_after / 4)

(``fence_deadline``). The margin covers what the argument cannot see: clock skew between controllers and the
duration of the one action that starts just before the deadline (an SSH command is bounded at a minute; a
commit + push takes seconds). With the defaults (stale 300 s) that is 60 s, so we stop acting 4 minutes after
our last pushed heartbeat; with a tiny ``--lease-stale`` the margin shrinks with it (a quarter).

``apply()`` calls the fence (``GitLease.check``, through ``FleetDaemon.fence``) just before every action that
changes the world, and the daemon checks the deadline again before it commits the cycle's observed files. The
push of that commit carries a heartbeat too, in one ``--atomic`` push with the branch: the branch moves only if
the lease is still the version we wrote, so nothing of ours lands once another reconciler holds the lease. Once the
fence raises ``LeaseLost`` the controller stops acting, commits nothing (the new holder's lease and observed files
must not be overwritten, nor its lease "released"), and exits non-zero. The daemon also *renews* the lease from
inside the fence when a heartbeat is due mid-apply (``renew_due``: half ``stale_after`` since the last one pushed):
one compare-and-swap push, so a long apply keeps its lease while it is alive, and loses it only by going silent.
Checking the remote before every action (a ``git ls-remote`` per launch) would cost a round trip each and still
leave a window between check and act; the deadline bounds that window instead.

Why the next holder's first cycle is safe: it plans from the world, not from the old holder's memory — the
provider's instance list (rented boxes carry the fleet label), the run directories on the boxes (a launch is an
atomic ``mkdir``: a second launch of the same attempt fails) and the archive in git. Whatever the old holder did
before its deadline is visible there; after its deadline it does nothing.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from reconciler.errors import LeaseHeld, LeaseLost, LeaseRace, ObservedInvalid
from reconciler.observed.codec import dump_yaml, iso, load_yaml, parse_iso
from reconciler.ports import LeaseStore

DEFAULT_STALE_AFTER_S = 300.0
DEFAULT_RENEW_EVERY_S = 60.0
FENCE_MARGIN_MAX_S = 60.0  # the fencing margin's ceiling: clock skew plus one action's duration
LOCK_FILE = "rigsync.lock"
LEASE_FILE = "lease.yaml"  # the one file of a lease commit


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
        except BlockingIOError as exc:
            fh.seek(0)
            who = fh.read().strip() or "another process"
            fh.close()
            raise LeaseHeld(f"another rigsync holds the local lock {self.path} ({who})") from exc
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
    """The content of the lease (``lease.yaml`` in the lease ref's commit)."""

    holder: str
    host: str
    pid: int
    acquired_at: float
    heartbeat_at: float
    taken_over_from: str | None = None
    # Which holding of the lease this is: larger for every later acquisition or takeover, the same while one holder
    # resumes its own. It is stamped on each launch (``InFlight.epoch``), so a box can tell an older controller's
    # late command from the current one's. A released lease is removed, so the epoch cannot simply count: it is the
    # acquisition's moment in milliseconds (or one past the lease it replaces, when that is later), which grows as
    # long as two controllers' clocks disagree by less than ``stale_after``.
    epoch: int = 0

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
        state = LeaseState(
            holder=holder, host=host, pid=pid, acquired_at=now, heartbeat_at=now, epoch=next_epoch(None, now)
        )
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
            epoch=next_epoch(current, now),
        )
        msg = f"lease taken over from {current.describe()}: heartbeat {age:.0f}s old (stale after {stale_after:.0f}s)"
        return LeaseDecision(True, state, True, True, msg, current)
    msg = (
        f"the fleet's lease is held by {current.describe()}, heartbeat {max(age, 0.0):.0f}s ago; "
        f"it can be taken over when the heartbeat is older than {stale_after:.0f}s"
    )
    return LeaseDecision(False, None, False, False, msg, current)


def next_epoch(replaced: LeaseState | None, now: float) -> int:
    """The epoch of a lease acquired at ``now`` in place of ``replaced`` (None: no lease there)."""
    return max(int(now * 1000), (replaced.epoch if replaced is not None else 0) + 1)


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
        "epoch": state.epoch,
    }
    return dump_yaml(doc, "rigsync lease: the one reconciler acting on this fleet, and its last heartbeat")


def from_yaml(text: str, path: str = LEASE_FILE) -> LeaseState | None:
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
            # a lease written before epochs existed: its acquisition's moment, as ``next_epoch`` would have said
            epoch=_epoch_of(doc, acquired if acquired is not None else (heartbeat or 0.0)),
        )
    except KeyError as exc:
        raise ObservedInvalid(f"{path}: missing {exc.args[0]!r}") from exc
    except (TypeError, ValueError) as exc:
        raise ObservedInvalid(f"{path}: malformed ({exc})") from exc


def _epoch_of(doc: dict[str, Any], acquired_at: float) -> int:
    """The lease's epoch; for a lease written before epochs existed, its acquisition's moment as ``next_epoch``
    would have said."""
    epoch = doc.get("epoch")
    if isinstance(epoch, int) and not isinstance(epoch, bool) and epoch >= 0:
        return epoch
    return int(acquired_at * 1000)


# ---------------------------------------------------------------------------------------------- thin I/O

# (expected version, lease text, commit message) -> the new version: a compare-and-swap of the lease, by default
# ``LeaseStore.swap_lease``; the daemon passes its atomic push of the branch plus the lease instead
Swap = Callable[[str | None, str, str], str | None]


class GitLease:
    """This reconciler's lease over the store (``ports.LeaseStore``): taken, renewed and released by compare-and-swap.

    ``version`` is the store's version of the lease as we last read or wrote it: the value every write expects.
    """

    def __init__(
        self,
        store: LeaseStore,
        *,
        holder: str,
        host: str,
        pid: int,
        stale_after: float = DEFAULT_STALE_AFTER_S,
        renew_every: float = DEFAULT_RENEW_EVERY_S,
    ) -> None:
        self.store = store
        self.holder, self.host, self.pid = holder, host, pid
        self.stale_after = stale_after
        self.renew_every = renew_every
        self.state: LeaseState | None = None
        self.version: str | None = None
        self.confirmed_at: float | None = None  # the heartbeat of our lease as the remote has it (fencing's T)

    def read_versioned(self) -> tuple[str | None, LeaseState | None]:
        """(version, lease) as the store has it now."""
        version, text = self.store.read_lease()
        return version, (from_yaml(text) if text else None)

    def read(self) -> LeaseState | None:
        return self.read_versioned()[1]

    def acquire(self, now: float, tries: int = 5) -> LeaseDecision:
        """Take, resume or take over the lease; raises ``LeaseHeld`` naming the holder when refused.

        A lost compare-and-swap (someone wrote the lease between our read and our push) decides again on what they
        wrote: of two reconcilers racing for a free or stale lease, the loser sees the winner's fresh one and refuses.
        """
        for _ in range(tries):
            version, current = self.read_versioned()
            decision = acquire(
                current, holder=self.holder, host=self.host, pid=self.pid, now=now, stale_after=self.stale_after
            )
            if not decision.granted or decision.state is None:
                raise LeaseHeld(decision.message)
            if decision.changed:
                try:
                    version = self.store.swap_lease(version, to_yaml(decision.state), f"lease: {decision.message}")
                except LeaseRace:
                    continue
            self.state, self.version = decision.state, version
            self.confirm()  # written by us, or resumed as the remote has it
            return decision
        raise LeaseHeld("could not take the fleet's lease: it kept changing under us")

    @property
    def epoch(self) -> int:
        """The epoch of the lease this reconciler holds (0: none)."""
        return self.state.epoch if self.state is not None else 0

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
        ``stale_after`` old, or none is there. Half, whatever ``renew_every`` says: a live holder's lease must never
        reach its fencing deadline (``stale_after`` less at most a quarter) for want of a heartbeat."""
        if self.state is None:
            return False
        return self.confirmed_at is None or now - self.confirmed_at >= self.stale_after / 2.0

    def renew(self, now: float) -> bool:
        """Push a heartbeat when one is due (``renew``: every ``renew_every``); False when none was due.

        Raises ``LeaseLost`` when the remote's lease is not ours any more (taken over, or removed).
        """
        if self.state is None:
            raise LeaseLost("the lease was never acquired")
        new = renew(self.state, now, self.renew_every)
        if new is None:
            return False
        self._swap(new, self.store.swap_lease)
        return True

    def beat(self, now: float, swap: Swap | None = None) -> None:
        """A heartbeat at ``now`` whether due or not, through ``swap`` (default: the store's compare-and-swap).

        The daemon pushes one mid-apply, and one with every commit of the tracked branch (its atomic push).
        """
        if self.state is None:
            raise LeaseLost("the lease was never acquired")
        self._swap(replace(self.state, heartbeat_at=now), swap or self.store.swap_lease)

    def _swap(self, new: LeaseState, swap: Swap) -> None:
        try:
            # The ref holds one commit, replaced by every write: a takeover stays on its message as on the file
            message = "lease: heartbeat"
            if new.taken_over_from:
                message += f" (taken over from {new.taken_over_from})"
            version = swap(self.version, to_yaml(new), message)
        except LeaseRace as exc:
            _, remote = self.read_versioned()
            if remote is None:
                raise LeaseLost(f"the fleet's lease was removed from the remote ({exc})") from exc
            raise LeaseLost(f"the fleet's lease was taken over by {remote.describe()}") from exc
        self.state, self.version = new, version
        self.confirm()

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

    def release(self) -> bool:
        """Give the lease up (so another reconciler need not wait for it to go stale); whether it was removed.

        A compare-and-swap delete: a lease someone else wrote since (a takeover) is never removed.
        """
        state, version = self.state, self.version
        self.state = None
        self.confirmed_at = None
        if state is None or version is None:
            return False
        try:
            self.store.swap_lease(version, None, f"lease: released by {self.holder}")
        except LeaseRace:
            return False
        self.version = None
        return True
