"""rigsync's watchdog: the kill switch on every box, which works with the controller dead (its rules, its start and
its API call: ``reconciler.box``'s docstring). Standard library only, Python 3.8 syntax, like the probe.

Usage: ``watchdog.py TTL_S|none IDLE_TIMEOUT_S ORPHAN_TIMEOUT_S`` with ``RIGSYNC_ROOT``, ``CONTAINER_ID``,
``CONTAINER_API_KEY`` and ``RIGSYNC_API_URL`` in the environment.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import urllib.error
import urllib.request
from typing import NamedTuple

from reconciler.box.boxlib import (
    DRAIN_FILE,
    STARTED_FILE,
    WATCHDOG_DIR,
    box_activity,
    mtime,
    recorded_start,
    unharvested,
)

FORMAT = 1
API_URL_ENV = "RIGSYNC_API_URL"
DIR = WATCHDOG_DIR  # under RIGSYNC_ROOT
TOUCH_FILE = "touched"  # refreshed by the probe: the controller was here
LOG_FILE = "watchdog.log"
LOG_MAX_BYTES = 1 << 20
REQUEST_TIMEOUT_S = 30.0
BACKOFF_MAX_S = 60.0
AFTER_DESTROY_S = 30.0
# The idle rule waits at least this long after the controller's last probe: a live controller probes every cycle
# and is the one to retire its idle boxes (after harvesting them), whatever idle_timeout says.
CONTROLLER_GRACE_S = 60.0  # a destroyed box disappears with us in it; still here after this long: ask again


class Verdict(NamedTuple):
    reason: str  # "ttl", "orphan", "drained" or "idle"
    text: str


def decide(
    now: float,
    *,
    started_at: float,
    ttl_s: float | None,
    idle_timeout_s: float,
    orphan_timeout_s: float,
    touched_at: float | None,
    run_activity_at: float | None,
    run_alive: bool,
    queued: bool = False,
    draining: bool = False,
    unharvested: int = 0,
) -> Verdict | None:
    """Whether to destroy the box now, and why. Pure: every input is an argument, times in seconds.

    ``started_at`` is the box's start, ``touched_at`` the controller's last probe (None: never), and
    ``run_activity_at``/``run_alive``/``queued``/``unharvested`` what the run directories and the queue say
    (``boxlib.box_activity``, the rule the probe reports to the controller too); ``draining``: the drain marker.
    """
    up = now - started_at
    if ttl_s is not None and up >= ttl_s:
        return Verdict("ttl", f"up {up:.0f}s >= ttl {ttl_s:.0f}s")
    contact = started_at if touched_at is None else max(started_at, touched_at)
    silent = now - contact
    if silent >= orphan_timeout_s:
        who = "since the box started" if touched_at is None else "since its last probe"
        return Verdict("orphan", f"no controller for {silent:.0f}s ({who}) >= orphan_timeout {orphan_timeout_s:.0f}s")
    if run_alive or queued:
        return None
    if draining and unharvested == 0:
        return Verdict("drained", "draining, queue empty, nothing alive, every run harvested")
    quiet = now - (contact if run_activity_at is None else max(contact, run_activity_at))
    if quiet >= idle_timeout_s and silent >= CONTROLLER_GRACE_S:
        return Verdict(
            "idle", f"no run and no controller for {quiet:.0f}s >= idle_timeout {idle_timeout_s:.0f}s "
            f"(no controller for {silent:.0f}s)",
        )
    return None


def check_interval(ttl_s: float | None, idle_timeout_s: float, orphan_timeout_s: float) -> float:
    """How often to look: a tenth of the shortest limit, between 1 and 30 seconds."""
    shortest = min(t for t in (ttl_s, idle_timeout_s, orphan_timeout_s) if t is not None)
    return min(30.0, max(1.0, shortest / 10.0))


# ------------------------------------------------------------------------------------- reading the box


def record_start(root: str, now: float) -> float:
    """The box's start, written at the watchdog's first start and kept: the probe reads it too."""
    t = recorded_start(root)
    if t is not None:
        return t
    path = os.path.join(root, DIR, STARTED_FILE)
    tmp = path + ".tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "w") as f:
            f.write(f"{now:.6f}\n")
        os.replace(tmp, path)
    except OSError:
        pass
    return now


# ------------------------------------------------------------------------------------------ acting


def log(wdir: str, message: str) -> None:
    path = os.path.join(wdir, LOG_FILE)
    line = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + " " + message + "\n"
    try:
        if os.path.getsize(path) > LOG_MAX_BYTES:
            os.replace(path, path + ".1")
    except OSError:
        pass
    try:
        with open(path, "a") as f:
            f.write(line)
    except OSError:
        sys.stderr.write(line)


def destroy(api_url: str, instance_id: str, key: str, timeout: float = REQUEST_TIMEOUT_S) -> tuple[bool, str]:
    """Ask the provider to destroy this instance. (done, what happened); never raises, never shows the key."""
    url = f"{api_url.rstrip('/')}/api/v0/instances/{instance_id}/"
    req = urllib.request.Request(
        url,
        data=b"{}",
        method="DELETE",
        headers={"Authorization": "Bearer " + key, "Content-Type": "application/json", "Accept": "application/json"},
    )
    try:  # urllib never follows a redirect of a DELETE: the key goes to api_url and nowhere else
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = resp.read(4096)
            status = resp.status
    except urllib.error.HTTPError as exc:
        body = exc.read(4096) if exc.fp is not None else b""
        if exc.code == 404:
            return True, f"HTTP 404: the instance is gone already ({_msg(body)})"
        return False, f"HTTP {exc.code}: {_msg(body)}"
    except Exception as exc:  # URLError, timeouts, TLS, a reset connection: all retried
        return False, f"{type(exc).__name__}: {exc}"
    try:
        doc = json.loads(body or b"{}")
    except ValueError:
        doc = None
    if isinstance(doc, dict) and doc.get("success") is False:
        if doc.get("error") == "no_such_instance":
            return True, "the instance is gone already"
        return False, f"HTTP {status}: refused: {_msg(body)}"
    return True, f"HTTP {status}: destroy accepted"


def _msg(body: bytes) -> str:
    try:
        doc = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace").strip()[:200] or "(no body)"
    if isinstance(doc, dict):
        return str(doc.get("msg") or doc.get("error") or doc.get("detail") or doc)[:200]
    return str(doc)[:200]


def _limit(text: str) -> float | None:
    if text.lower() in ("", "none", "inf"):
        return None
    v = float(text)
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"a limit must be a positive number of seconds, not {text!r}")
    return v


def main(argv: list[str]) -> int:
    root = os.environ.get("RIGSYNC_ROOT") or ""
    if not root:
        sys.stderr.write("watchdog: RIGSYNC_ROOT is not set\n")
        return 2
    wdir = os.path.join(root, DIR)
    os.makedirs(wdir, exist_ok=True)
    try:
        ttl_s = _limit(argv[0])
        idle_s, orphan_s = _limit(argv[1]), _limit(argv[2])
        if idle_s is None or orphan_s is None:
            raise ValueError("idle_timeout and orphan_timeout are required")
    except (IndexError, ValueError) as exc:
        log(wdir, f"not started: bad arguments {argv!r}: {exc}")
        return 2
    iid = os.environ.get("CONTAINER_ID", "")
    key = os.environ.get("CONTAINER_API_KEY", "")
    api_url = os.environ.get(API_URL_ENV, "")
    # Without these it cannot act; it keeps running and logging, so the problem is visible on the box.
    missing = [n for n, v in (("CONTAINER_ID", iid), ("CONTAINER_API_KEY", key), (API_URL_ENV, api_url)) if not v]
    if iid and not iid.isdigit():
        missing.append("CONTAINER_ID (not a number)")
    interval = check_interval(ttl_s, idle_s, orphan_s)
    started = record_start(root, time.time())
    log(wdir, f"watching instance {iid or '?'} via {api_url or '?'}: ttl {ttl_s}, idle_timeout {idle_s}, "
        f"orphan_timeout {orphan_s}, every {interval:g}s; box start {started:.0f} (pid {os.getpid()})")
    backoff = 1.0
    said = ""
    while True:
        now = time.time()
        try:
            act = box_activity(root, started)
            draining = os.path.exists(os.path.join(root, DRAIN_FILE))
            verdict = decide(
                now, started_at=started, ttl_s=ttl_s, idle_timeout_s=idle_s, orphan_timeout_s=orphan_s,
                touched_at=mtime(os.path.join(wdir, TOUCH_FILE)), run_activity_at=act.last_at, run_alive=act.alive,
                queued=act.queued, draining=draining, unharvested=unharvested(root) if draining else 0,
            )
        except Exception as exc:  # never die of a surprise: log it and look again
            log(wdir, f"check failed: {type(exc).__name__}: {exc}")
            time.sleep(interval)
            continue
        if verdict is None:
            if said:
                log(wdir, f"no longer due for destroy ({said})")
                said = ""
            backoff = 1.0
            time.sleep(interval)
            continue
        if verdict.reason != said:
            log(wdir, f"destroying instance {iid}: {verdict.reason}: {verdict.text}")
            said = verdict.reason
        if missing:
            log(wdir, "cannot destroy: missing " + ", ".join(missing))
            time.sleep(min(BACKOFF_MAX_S, max(backoff, interval)))
            backoff = min(backoff * 2, BACKOFF_MAX_S)
            continue
        done, what = destroy(api_url, iid, key)
        log(wdir, f"destroy {iid}: {what}")
        if done:
            backoff = 1.0
            time.sleep(AFTER_DESTROY_S)
        else:
            time.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
