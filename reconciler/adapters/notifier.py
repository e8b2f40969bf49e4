"""Telling people: the events ``core.notify`` found, sent with apprise (Slack, Discord, e-mail, ntfy, webhooks).

Where they go is the controller's secret: ``RIGSYNC_NOTIFY_URLS``, apprise URLs separated by commas or spaces,
never written to desired/, git, logs or argv (a failure names only the URL's scheme). Sending happens in one
background thread behind a bounded queue: ``offer`` never waits, so a destination that is down or slow never slows
or stops a cycle; what does not fit the queue, or fails, is offered again by a later cycle that sees the same fact.
Each event is sent once to each destination: every URL is its own destination, and an event one of them did not
take is retried to that one only (the others already have it; this process remembers which). The keys every
destination took (only keys, never URLs) are kept in ``observed/notified.txt``, written by the controller's thread
(``save``) and committed with the next observed commit, so a restarted controller does not send them again.

Before any of that, the daemon claims each new event (``claim``): its key, with the lease's holder and epoch, goes
into ``observed/notify-claims.jsonl``, committed and pushed with the cycle's commit, and only then is the event
offered (``offer`` with the holder sends only what that holder claimed). A controller that takes the fleet over reads
the claim in git and never sends the event, whether or not the old holder delivered it before it stopped (the rule
and its trade: ``reconciler.core.notify``). A claim leaves the file once its key is in ``notified.txt``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reconciler.core.notify import Claim, Event, may_send, to_claim
from reconciler.observed.observed_tree import write_observed

log = logging.getLogger("rigsync.notify")

URLS_ENV = "RIGSYNC_NOTIFY_URLS"
NOTIFIED = "observed/notified.txt"
CLAIMS = "observed/notify-claims.jsonl"  # events claimed before they are sent: {"key", "holder", "epoch"} a line
QUEUE_SIZE = 64
CLOSE_TIMEOUT_S = 10.0

Send = Callable[[Event], bool]  # one destination: True when it took the event


def notify_urls(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The controller's destinations: ``RIGSYNC_NOTIFY_URLS`` split on commas and white space."""
    return tuple(u for u in re.split(r"[\s,]+", environ.get(URLS_ENV, "")) if u)


THREAD = "rigsync-notify"
# libraries whose lines, logged while a notification is sent, can carry a destination's host, path or token
_QUIET = ("apprise", "urllib3.connectionpool", "urllib3.connection", "urllib3.util.retry", "requests")


_SENDING = threading.Event()  # set while the notifier's thread is inside a send


def _not_from_the_notifier(record: logging.LogRecord) -> bool:
    """Drop a line of the notifier's thread, or of apprise's worker threads while it sends (never the controller's
    own thread: a cycle's lines are kept)."""
    if record.threadName == THREAD:
        return False
    return not (_SENDING.is_set() and record.threadName != threading.main_thread().name)


def apprise_destinations(urls: Iterable[str]) -> list[Send]:
    """One ``Send`` over apprise per usable URL (a URL apprise cannot use is left out, and said by its scheme). What
    its libraries log from the sending threads is dropped (``_QUIET``), at every level: a webhook's path or a mail
    server's login is the destination's secret."""
    import apprise

    for name in _QUIET:
        logger = logging.getLogger(name)
        if _not_from_the_notifier not in logger.filters:
            logger.addFilter(_not_from_the_notifier)
    logging.getLogger("apprise").setLevel(logging.CRITICAL + 1)  # its parsing of the URLs runs in the caller's
    destinations: list[Send] = []
    schemes = []
    for url in urls:
        app = apprise.Apprise()
        if app.add(url):
            destinations.append(_apprise_send(app))
        else:
            schemes.append(url.split(":", 1)[0])
    if schemes:  # the scheme only: the rest of a URL is a secret
        log.warning("ignoring %d notification URL(s) apprise cannot use (schemes: %s)", len(schemes),
                    ", ".join(sorted(set(schemes))))
    return destinations


def _apprise_send(app: Any) -> Send:
    def send(event: Event) -> bool:
        _SENDING.set()
        try:
            return bool(app.notify(title=event.title, body=event.body))
        finally:
            _SENDING.clear()

    return send


def read_sent(checkout: Path) -> frozenset[str]:
    try:
        text = (checkout / NOTIFIED).read_text(encoding="utf-8")
    except FileNotFoundError:
        return frozenset()
    return frozenset(line.strip() for line in text.splitlines() if line.strip())


def parse_claims(text: str) -> dict[str, Claim]:
    """The claims file's text as key -> claim (a line that is not a claim, as ``claims_text`` writes it, is none)."""
    out: dict[str, Claim] = {}
    for line in text.splitlines():
        try:
            doc = json.loads(line)
            key, holder, epoch = doc["key"], doc["holder"], doc["epoch"]
        except (ValueError, TypeError, KeyError):
            continue
        if isinstance(key, str) and isinstance(holder, str) and isinstance(epoch, int) and not isinstance(epoch, bool):
            out[key] = Claim(holder, epoch)
    return out


def claims_text(claims: Mapping[str, Claim]) -> str:
    return "".join(
        json.dumps({"epoch": c.epoch, "holder": c.holder, "key": k}, sort_keys=True) + "\n"
        for k, c in sorted(claims.items())
    )


@dataclass(frozen=True)
class Claimed:
    """What one cycle claimed: the new keys, and the claims file as the cycle's commit must hold it (``text``,
    ``changed`` from the committed one; None when no claim is left)."""

    keys: tuple[str, ...]
    text: str | None
    changed: bool


class Notifier:
    """Sends events once each, in the background; see the module docstring."""

    def __init__(self, checkout: Path, destinations: Sequence[Send], *, queue_size: int = QUEUE_SIZE) -> None:
        self.checkout = checkout
        self._destinations = tuple(destinations)
        self._sent = set(read_sent(checkout))
        self._took: dict[str, set[int]] = {}  # per key not yet sent everywhere: the destinations (indices) that took it
        self._saved = frozenset(self._sent)
        self._pending: set[str] = set()  # queued or being sent
        self._claims: dict[str, Claim] = {}  # key -> who claimed it, as the last ``claim`` left them
        self._told_not_ours: set[str] = set()
        self._lock = threading.Lock()
        self._queue: queue.Queue[Event | None] = queue.Queue(maxsize=queue_size)
        self._thread = threading.Thread(target=self._run, name=THREAD, daemon=True)
        self._thread.start()

    def claim(self, events: Iterable[Event], claimer: Claim, committed: str) -> Claimed:
        """Claim for ``claimer`` (the lease's holder and epoch) the events no controller claimed or delivered
        (``committed``: the claims file at the checkout's HEAD); the claims file the cycle's commit must carry.
        Delivered claims are dropped."""
        delivered = read_sent(self.checkout)
        with self._lock:
            self._sent |= delivered
            delivered = frozenset(self._sent)
        claims = {k: c for k, c in parse_claims(committed).items() if k not in delivered}
        keys = to_claim(events, delivered, claims)
        claims.update(dict.fromkeys(keys, claimer))
        with self._lock:
            self._claims = claims
        text = claims_text(claims) or None
        return Claimed(keys, text, (text or "") != committed)

    def offer(self, events: Iterable[Event], *, holder: str | None = None) -> int:
        """Queue the events not sent yet and not already queued; never waits. Returns how many were queued.

        ``holder``: the lease's holder this controller is; only the events it claimed (``claim``) are sent, once the
        claim is pushed. None: events no other controller produces (its own lost lease), sent unclaimed."""
        queued = 0
        for event in events:
            with self._lock:
                if event.key in self._sent or event.key in self._pending:
                    continue
                if holder is not None and not may_send(event.key, self._sent, self._claims, holder):
                    self._not_ours(event.key, holder)
                    continue
                self._pending.add(event.key)
            try:
                self._queue.put_nowait(event)
                queued += 1
            except queue.Full:
                with self._lock:
                    self._pending.discard(event.key)
                log.warning("notification queue full: %s left for a later cycle", event.key)
        self.save()
        return queued

    def _not_ours(self, key: str, holder: str) -> None:
        """Say once that ``key`` is another controller's claim (the caller holds the lock)."""
        other = self._claims.get(key)
        if other is not None and other.holder != holder and key not in self._told_not_ours:
            self._told_not_ours.add(key)
            log.warning("notification %s was claimed by %s (lease epoch %d), which may have sent it: not sent again",
                        key, other.holder, other.epoch)

    def waiting(self) -> int:
        """Events queued or being sent, not delivered yet."""
        with self._lock:
            return len(self._pending)

    def sent(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._sent)

    def save(self) -> None:
        """Write the keys delivered so far to ``observed/notified.txt`` when they changed (the caller's thread)."""
        sent = self.sent()
        if sent != self._saved:
            write_observed(self.checkout, {NOTIFIED: "".join(f"{k}\n" for k in sorted(sent))}, {})
            self._saved = sent

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Let the queue drain for at most ``timeout_s``, then save what was delivered."""
        with contextlib.suppress(queue.Full):  # full and stuck: the thread is a daemon, the exit does not wait
            self._queue.put(None, timeout=timeout_s)
        self._thread.join(timeout=timeout_s)
        self.save()

    def _run(self) -> None:
        while True:
            event = self._queue.get()
            if event is None:
                return
            with self._lock:
                took = set(self._took.get(event.key, ()))
            missed = []
            for n, send in enumerate(self._destinations):
                if n in took:
                    continue
                try:
                    ok = send(event)
                except Exception as exc:  # a destination's library failing is reported, never fatal to the controller
                    log.warning("notification %s to destination %d failed: %s", event.key, n + 1, type(exc).__name__)
                    ok = False
                if ok:
                    took.add(n)
                else:
                    missed.append(n + 1)
            with self._lock:
                self._pending.discard(event.key)
                if missed:
                    self._took[event.key] = took
                else:
                    self._took.pop(event.key, None)
                    self._sent.add(event.key)
            if missed:
                log.warning("notification %s not delivered to destination(s) %s of %d; a later cycle retries those",
                            event.key, ", ".join(map(str, missed)), len(self._destinations))


def open_notifier(environ: Mapping[str, str], checkout: Path) -> Notifier | None:
    """The controller's notifier, or None when ``RIGSYNC_NOTIFY_URLS`` names no destination."""
    urls = notify_urls(environ)
    if not urls:
        return None
    return Notifier(checkout, apprise_destinations(urls))
