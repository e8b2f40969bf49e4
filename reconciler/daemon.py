"""`rigsync run`: git is the interface. Follow the remote, reconcile, write what was seen back to git.

Each cycle: fetch and replay rigsync's own commits onto the remote tip; read desired/ at HEAD (a commit, never the
dirty working tree); if it is invalid keep acting on the last valid revision and report the errors; observe →
plan → apply; render observed/ deterministically and commit only when the record changed
(``observed.summary.describe_change``: boxes, launches, finished attempts, the desired revision, errors, budget,
drift; never probe noise or clock-driven fields); push with fetch/rebase/retry, never force. Exactly one reconciler
acts on a fleet: a local fcntl lock on the checkout plus a lease on its own ref of the remote
(``refs/heads/rigsync/lease/<branch>``, ``reconciler.adapters.lease``), taken and renewed every ``lease_renew_s`` by
compare-and-swap pushes that never touch the tracked branch. Between cycles it sleeps its interval, or less when
the plan asks to decide sooner (``Plan.wake_at``: a slot freeing while runs wait, a draining box's last attempt),
never less than ``MIN_WAKE_S``.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from reconciler.adapters.git import DEFAULT_AUTHOR_EMAIL, DEFAULT_AUTHOR_NAME, DEFAULT_BRANCH, DEFAULT_REMOTE
from reconciler.adapters.lease import DEFAULT_RENEW_EVERY_S, DEFAULT_STALE_AFTER_S
from reconciler.adapters.notifier import CLAIMS, Claimed, Notifier, open_notifier
from reconciler.core.actions import Action, Destroy
from reconciler.core.jobenv import ControllerEnv
from reconciler.core.model import CONTROLLER_INTERVAL_S, Desired
from reconciler.core.notify import Claim, Event, cycle_events, lease_lost_events
from reconciler.desired import load_desired
from reconciler.errors import (
    DesiredStateInvalid,
    LeaseHeld,
    LeaseLost,
    RigsyncError,
    StoreBucketMissing,
    StoreCredentialsRefused,
    TransientError,
    cause_chain,
)
from reconciler.fleet import (
    AdapterFactory,
    build_adapters,
    open_fleet,
    open_git,
    open_lease,
    open_local_lock,
    render_cycle,
    write_back,
)
from reconciler.loop import DESTROY_LATENCY_S, CycleResult, Reconciler, SystemClock
from reconciler.observed.codec import LEASE, OBSERVED_DIR, RENDERED, STATUS, SUGGESTIONS, load_yaml
from reconciler.observed.documents import ReconcilerStatus, status_only
from reconciler.observed.observed_tree import read_observed
from reconciler.observed.suggestions import merge_recorded, read_suggestions
from reconciler.observed.summary import answer_lines, describe_change
from reconciler.settings.object_store import StoreConfig

log = logging.getLogger("rigsync.run")


MIN_WAKE_S = 5.0  # the shortest sleep a plan's wake_at can ask for
REMOTE_POLL_S = 5.0  # between checks of the remote branch for new commits, which wake the loop (`rigsync run --poll`)


def with_claims(message: str | None, claimed: Claimed | None) -> str | None:
    """The cycle's commit message, owed and saying so when the cycle claimed events to notify."""
    if claimed is None or not claimed.keys:
        return message
    said = f"notify: claimed {', '.join(claimed.keys)} (sent once this commit is pushed)"
    return said if message is None else f"{message}\n\n{said}"


def sleep_until(wake_at: float | None, now: float, interval_s: float) -> float:
    """Seconds to sleep before the next cycle: ``interval_s``, or less to wake at ``wake_at``, at least
    ``MIN_WAKE_S`` (and never more than the interval)."""
    if wake_at is None or not math.isfinite(wake_at):
        return interval_s
    return min(interval_s, max(MIN_WAKE_S, wake_at - now))


@dataclass
class DaemonConfig:
    """`rigsync run`'s settings (its options); each default is the constant of the part it configures."""

    interval_s: float = CONTROLLER_INTERVAL_S
    destroy_latency_s: float = DESTROY_LATENCY_S  # the budget projects spend through it
    lease_stale_s: float = DEFAULT_STALE_AFTER_S
    lease_renew_s: float = DEFAULT_RENEW_EVERY_S
    remote_poll_s: float = REMOTE_POLL_S
    author_name: str = DEFAULT_AUTHOR_NAME
    author_email: str = DEFAULT_AUTHOR_EMAIL
    remote: str = DEFAULT_REMOTE
    branch: str = DEFAULT_BRANCH
    max_backoff_s: float = 300.0
    holder: str | None = None  # default: host + checkout path, stable across restarts of the same checkout


@dataclass
class DaemonCycle:
    """What one cycle did: its one log line, and what tests look at."""

    desired_commit: str | None
    acted: bool
    commit: str | None
    counts: dict[str, int]
    failures: int
    desired_errors: tuple[str, ...]
    result: CycleResult | None = None
    wall_s: float = 0.0

    def line(self) -> str:
        what = ", ".join(f"{v} {k}" for k, v in sorted(self.counts.items())) or "no changes"
        parts = [
            f"desired {self.desired_commit[:12] if self.desired_commit else '-'}",
            what if self.acted else f"not acting ({what})",
            f"{self.failures} failed" if self.failures else "",
            f"committed {self.commit[:12]}" if self.commit else "no commit",
            f"{len(self.desired_errors)} desired error(s)" if self.desired_errors else "",
            f"{self.wall_s:.2f}s",
        ]
        return "cycle: " + "; ".join(p for p in parts if p)


class FleetDaemon:
    notifier: Notifier | None = None  # RIGSYNC_NOTIFY_URLS's destinations (``adapters.notifier``); None: tell nobody

    def __init__(
        self,
        repo_dir: Path,
        *,
        config: DaemonConfig | None = None,
        state_dir: str | None = None,
        adapters: AdapterFactory = build_adapters,
        clock: SystemClock | None = None,
        api_url: str | None = None,
        data_dir: str | None = None,
        store: StoreConfig | None = None,
    ) -> None:
        # the job-secrets allowlist is checked first: a bad RIGSYNC_JOB_SECRETS stops the controller at start
        self.controller_env = ControllerEnv(os.environ)
        self.repo_dir = Path(repo_dir).resolve()
        self.config = config or DaemonConfig()
        self.state_dir_override = state_dir
        self.data_dir = data_dir  # where harvests and checkpoints go (``adapters.store``); None: its default
        self.store = store  # an S3-compatible store instead (``--store``); None: the data dir
        self.adapters = adapters
        self.api_url = api_url  # the controller's provider URL (None: RIGSYNC_API_URL or Vast.ai), never desired/'s
        self.clock = clock or SystemClock()
        self.on_action: Callable[[Action], None] = lambda action: None  # each action apply starts (the demo's progress)
        self.git = open_git(
            self.repo_dir,
            remote=self.config.remote,
            branch=self.config.branch,
            author_name=self.config.author_name,
            author_email=self.config.author_email,
        )
        host = socket.gethostname()
        holder = self.config.holder or f"rigsync@{host}:{self.repo_dir}"
        self.lease = open_lease(
            self.git,
            holder=holder,
            host=host,
            pid=os.getpid(),
            stale_after=self.config.lease_stale_s,
            renew_every=self.config.lease_renew_s,
        )
        self.local_lock = open_local_lock(self.repo_dir)
        self.last_valid: Desired | None = None
        self.reconciler: Reconciler | None = None
        self._fleet_key: tuple[str, str] | None = None
        self.stop_event = threading.Event()
        self.wake_event = threading.Event()
        self._reported_invalid: str | None = None
        self.lease_lost: str | None = None  # set once the fence fired: act no more, commit nothing, exit non-zero
        self.notifier = open_notifier(os.environ, self.repo_dir)

    # ------------------------------------------------------------------------------------------ the lease

    def acquire(self) -> str:
        """Take the local lock and the fleet lease; raise LeaseHeld naming the holder when refused."""
        self.local_lock.acquire()
        for what in self.git.recover():
            log.warning("cleared %s left by an earlier rigsync in %s", what, self.repo_dir)
        decision = self.lease.acquire(self.clock.now())
        if decision.takeover:
            log.warning("%s", decision.message)
        return decision.message

    def fence(self) -> None:
        """``ports.Fence``: return while this daemon may act, else raise ``LeaseLost`` (and remember it).

        When a heartbeat is due it is pushed first, on its own (``_push_heartbeat``), so a long apply keeps the
        lease while it is alive; then the deadline rule decides (``Lease.check``,
        explained in ``reconciler.adapters.lease``).
        """
        self._fenced(renew=True)

    def _fenced(self, *, renew: bool) -> None:
        if self.lease_lost is not None:
            raise LeaseLost(self.lease_lost)
        try:
            if renew and self.lease.renew_due(self.clock.now()):
                self._push_heartbeat()
            self.lease.check(self.clock.now())
        except LeaseLost as exc:
            self.lease_lost = str(exc)
            raise

    def _push_heartbeat(self) -> None:
        """A heartbeat now, by compare-and-swap on the lease ref (``Lease.beat``).

        A failed push is not fatal by itself: the deadline still counts from the last heartbeat pushed, and the
        next fence tries again. A lease that is someone else's now (the swap lost to a takeover) is: ``LeaseLost``.
        """
        try:
            self.lease.beat(self.clock.now())
        except LeaseLost:
            raise
        except RigsyncError as exc:
            log.warning("could not push the lease's heartbeat (acting on until its deadline): %s", exc)

    def _push(self) -> None:
        """Push the branch with a heartbeat in the same atomic push: it lands only while the lease is ours."""
        try:
            self.lease.beat(
                self.clock.now(), lambda expected, text, message: self.git.push(lease=(expected, text, message))
            )
        except LeaseLost as exc:
            self.lease_lost = str(exc)
            raise

    def release(self) -> None:
        if self.lease_lost is not None:  # the lease may be someone else's now: never write over it
            self.local_lock.release()
            return
        try:
            self.lease.release()
        except RigsyncError as exc:
            log.warning("could not release the lease: %s", exc)
        finally:
            self.local_lock.release()

    # ------------------------------------------------------------------------------------------ one cycle

    def _reconciler_for(self, desired: Desired) -> Reconciler:
        fleet = desired.fleet
        key = (fleet.name, fleet.provider)
        if self.reconciler is None or key != self._fleet_key:
            if self.reconciler is not None:
                self.reconciler.shell.close()
            self.reconciler = open_fleet(
                self.repo_dir,
                fleet,
                git=self.git,
                state_dir=self.state_dir_override,
                adapters=self.adapters,
                clock=self.clock,
                should_stop=self.stop_event.is_set,
                cycle_s=self.config.interval_s,
                destroy_latency_s=self.config.destroy_latency_s,
                api_url=self.api_url,
                data_dir=self.data_dir,
                store=self.store,
                controller_env=self.controller_env,
            )
            self._fleet_key = key
        self.reconciler.fence = self.fence
        self.reconciler.epoch = lambda: self.lease.epoch
        self.reconciler.on_action = self.on_action
        return self.reconciler

    def cycle(self) -> DaemonCycle:
        started = self.clock.now()
        self.git.sync_to_remote()
        self.lease.renew(started)  # a heartbeat on the lease ref when one is due; LeaseLost if it is not ours
        files = self.git.desired_files("HEAD")
        desired_errors: tuple[str, ...] = ()
        desired_commit = self.git.desired_commit("HEAD")
        try:
            desired = self.git.pin(load_desired(files), "HEAD")
            self.last_valid = desired
        except DesiredStateInvalid as exc:
            desired_errors = tuple(str(e) for e in exc.errors)
            if desired_commit != self._reported_invalid:  # once per broken revision; status.yaml keeps saying it
                self._reported_invalid = desired_commit
                for e in desired_errors:
                    log.error("desired %s is invalid: %s", desired_commit[:12], e)
            if self.last_valid is None:
                self.last_valid = self._last_valid_from_status()
            if self.last_valid is None:
                return self._commit_status_only(desired_commit, desired_errors, started)
            desired = self.last_valid
        rec = self._reconciler_for(desired)
        # what another controller recorded while this one stood by (observed/suggestions.yaml) is used, never redone
        rec.suggestions = merge_recorded(rec.suggestions, read_suggestions(self.repo_dir))
        result = rec.cycle(desired)
        applied = result.applied
        if applied is not None and applied.lease_lost is not None:
            self.lease_lost = applied.lease_lost
        if self.lease_lost is not None:
            raise LeaseLost(self.lease_lost)
        # Actions apply skipped because we were asked to stop are not failures: the next run plans them again.
        failures = applied.failure_lines() if applied else ()
        status = ReconcilerStatus(
            desired_commit_applied=desired.commit,
            last_valid_desired_commit=self.last_valid.commit if self.last_valid else None,
            desired_errors=desired_errors,
            apply_errors=failures,
            holder=self.lease.holder,
        )
        _, rendered = render_cycle(rec, desired, result.observed, result.plan, status, self.repo_dir)
        committed = self._committed_observed()
        # events are claimed in this cycle's commit and sent only once it is pushed (``adapters.notifier``)
        events = cycle_events(desired, result.observed, result.plan) if self.notifier is not None else ()
        claimed = self._claim(events)
        message = describe_change(
            committed,
            rendered,
            archived=applied.archived if applied else (),
            overheads=applied.overheads if applied else (),
            destroyed={a.instance_id: a.reason for a in result.plan.actions if isinstance(a, Destroy)},
            metric_keys={r.sweep.name: r.sweep.metric_key for r in desired.runs if r.sweep.metric_key},
            archive_pending=bool(rec.archive.pending_lines()) or self.git.archive_uncommitted(),
            answers=answer_lines(applied.outcomes) if applied else (),
        )
        message = with_claims(message, claimed)
        commit = None
        if message is not None:  # probe noise and the clock alone leave observed/ (and git) untouched
            out: dict[str, str | None] = dict(rendered)
            if claimed is not None and claimed.changed:
                out[CLAIMS] = claimed.text
            if LEASE in committed:  # the lease lived here before it got its own ref: drop the stale copy
                out[LEASE] = None
            # The commit speaks for the fleet: not once another reconciler may hold it.
            self._fenced(renew=False)
            commit = write_back(self.git, rec.archive, out, message)
        if commit or self.git.unpushed():
            self._push()
        counts = result.plan.counts()
        # Whether or not it committed, a cycle is reported done only while the lease is still ours, as the last
        # thing before it is printed: one frozen past the lease's deadline (SIGSTOP, a swapped-out VM) ends as
        # lease lost instead of reporting its actions as a normal cycle and going on to the next.
        self._fenced(renew=False)
        if self.notifier is not None:  # never waits: a destination that is down is the notifier's thread's problem
            self.notifier.offer(events, holder=self.lease.holder)
        return DaemonCycle(
            desired_commit=desired.commit,
            acted=not desired.fleet.suspend,
            commit=commit,
            counts=counts,
            failures=len(failures),
            desired_errors=desired_errors,
            result=result,
            wall_s=self.clock.now() - started,
        )

    def _claim(self, events: tuple[Event, ...]) -> Claimed | None:
        """The notifier's claims for this cycle's commit, against the claims file at HEAD (None: no notifier)."""
        if self.notifier is None:
            return None
        blobs = self.git.files_at("HEAD", OBSERVED_DIR + "/", only={CLAIMS})
        committed = blobs[CLAIMS].decode("utf-8", "replace") if CLAIMS in blobs else ""
        return self.notifier.claim(events, Claim(self.lease.holder, self.lease.epoch), committed)

    def _committed_observed(self) -> dict[str, str]:
        """The observed documents as HEAD has them: what this cycle's change is measured against."""
        blobs = self.git.files_at("HEAD", OBSERVED_DIR + "/", only={*RENDERED, LEASE, SUGGESTIONS})
        return {path: blob.decode("utf-8", "replace") for path, blob in blobs.items()}

    def _last_valid_from_status(self) -> Desired | None:
        """After a restart, the last valid revision is the one observed/status.yaml says was applied."""
        text = read_observed(self.repo_dir).get(STATUS)
        if not text:
            return None
        try:
            doc = load_yaml(text, STATUS)
            commit = doc.get("last_valid_desired_commit") if isinstance(doc, dict) else None
            if not commit:
                return None
            return self.git.pin(load_desired(self.git.desired_files(str(commit))), str(commit))
        except (RigsyncError, DesiredStateInvalid):
            return None

    def _commit_status_only(self, desired_commit: str, errors: tuple[str, ...], started: float) -> DaemonCycle:
        files: dict[str, str | None] = dict(status_only(desired_commit, errors))
        self._fenced(renew=False)
        commit = self.git.commit_observed(files, {}, f"desired {desired_commit[:12]} invalid, not acting")
        if commit or self.git.unpushed():
            self._push()
        return DaemonCycle(desired_commit, False, commit, {}, 0, errors, None, self.clock.now() - started)

    # ------------------------------------------------------------------------------------------- forever

    def _watch(self) -> Callable[[], None]:
        """Wake the loop on edits under desired/ in the checkout and when the remote branch moves."""
        from watchdog.events import FileSystemEvent, FileSystemEventHandler
        from watchdog.observers import Observer

        wake = self.wake_event

        class OnChange(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:
                wake.set()

        observer = Observer()
        desired_dir = self.repo_dir / "desired"
        if desired_dir.is_dir():
            observer.schedule(OnChange(), str(desired_dir), recursive=True)
        observer.start()

        def poll_remote() -> None:
            last = None
            while not self.stop_event.wait(self.config.remote_poll_s):
                try:
                    out = self.git.remote_head()
                except RigsyncError:
                    continue  # a flaky remote only delays the wake-up
                if last is not None and out != last:
                    wake.set()
                last = out

        poller = threading.Thread(target=poll_remote, name="rigsync-remote-poll", daemon=True)
        poller.start()

        def stop() -> None:
            observer.stop()
            observer.join(timeout=2)

        return stop

    def next_sleep_s(self, cyc: DaemonCycle | None) -> float:
        """How long to sleep after ``cyc``: until its plan's ``wake_at`` (``plan.wake``) when that is sooner than the
        interval, never less than ``MIN_WAKE_S`` (a forecast that is wrong, or an end that is overdue, cannot spin
        the loop)."""
        wake = cyc.result.plan.wake_at if cyc is not None and cyc.result is not None else None
        if wake is None:
            return self.config.interval_s
        return sleep_until(wake, self.clock.now(), self.config.interval_s)

    def run_forever(self, *, once: bool = False, on_cycle: Callable[[DaemonCycle], None] | None = None) -> int:
        def on_term(signum: int, frame: FrameType | None) -> None:
            log.info("signal %d: finishing the current action, then exiting", signum)
            self.stop_event.set()
            self.wake_event.set()

        previous = {s: signal.signal(s, on_term) for s in (signal.SIGTERM, signal.SIGINT)}
        print(self.acquire(), flush=True)
        stop_watch = None if once else self._watch()
        backoff = 0.0
        code = 0
        cyc: DaemonCycle | None = None
        try:
            while not self.stop_event.is_set():
                self.wake_event.clear()
                try:
                    cyc = self.cycle()
                    print(cyc.line(), flush=True)
                    if on_cycle:
                        on_cycle(cyc)
                    backoff = 0.0
                    code = 1 if cyc.desired_errors or cyc.failures else 0
                except LeaseLost as exc:
                    self.lease_lost = str(exc)
                    log.error(
                        "LEASE LOST: %s. Stopped acting; nothing of this cycle is committed; exiting so that only "
                        "the new holder acts (restart to queue for the lease again)", exc
                    )
                    print(f"cycle: LEASE LOST: {exc}; stopped acting, committing nothing, exiting", flush=True)
                    if self.notifier is not None and self.last_valid is not None:
                        lost = lease_lost_events(self.last_valid, self.lease.holder, self.lease.epoch, exc)
                        self.notifier.offer(lost)
                    try:  # commits made while we thought we held the lease are not the fleet's record: drop them
                        self.git.drop_unpushed()
                    except RigsyncError as drop:
                        log.warning("could not drop unpushed commits after losing the lease: %s", drop)
                    raise
                except (LeaseHeld, StoreCredentialsRefused, StoreBucketMissing):
                    raise  # the controller's own settings: retrying cannot help, one line and a non-zero exit
                except Exception as exc:  # the cycle failed, the daemon does not: back off and try again
                    backoff = min(self.config.max_backoff_s, max(2.0, backoff * 2))
                    if isinstance(exc, RigsyncError):
                        kind = "transient" if isinstance(exc, TransientError) else "error"
                        log.debug("cycle failed: %s", cause_chain(exc))
                    else:  # a library's surprise (KeyboardInterrupt and SystemExit are not Exceptions: they end it)
                        log.exception("cycle: unexpected %s", type(exc).__name__)
                        kind = f"unexpected {type(exc).__name__}"
                    then = "exiting (--once)" if once else f"retrying in {backoff:.0f}s"
                    print(f"cycle: {kind}: {exc}; {then}", flush=True)
                    code = 1
                if once:
                    break
                self.wake_event.wait(timeout=backoff or self.next_sleep_s(cyc))
            if self.stop_event.is_set():
                code = 0  # asked to stop (SIGTERM/SIGINT): the current action finished, nothing failed by it
        finally:
            if stop_watch:
                stop_watch()
            if self.reconciler is not None:
                self.reconciler.shell.close()
            if self.notifier is not None:
                self.notifier.close()
            for s, h in previous.items():
                signal.signal(s, h)
            self.release() if not once else self.local_lock.release()
        return code
