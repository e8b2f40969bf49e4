"""What the box's Python programs share: reading rigsync's files, and the one rule of box activity
(``box_activity``; why it is here once: ``reconciler.box``'s docstring). Runs on a box: standard library only."""

from __future__ import annotations

import math
import os
from typing import NamedTuple

RUNS_DIR = "runs"  # under RIGSYNC_ROOT: one directory per attempt (launch.sh)
BOOTSTRAP_DIR = "bootstrap"  # under RIGSYNC_ROOT: <hash>.pid|.ok|.failed (bootstrap.sh, bootstrap_run.sh)
WATCHDOG_DIR = "watchdog"  # under RIGSYNC_ROOT: the watchdog's files
STARTED_FILE = "started_at"  # in WATCHDOG_DIR: the box's start, written by the watchdog

SMALL_FILE_BYTES = 4096  # what is read of pid, exit_code, started_at and the like (a line each)


def alive(pid: int) -> bool:
    """True when ``pid`` exists and is not a zombie (the same test as lib.sh's ``_rs_alive``)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OSError, OverflowError):  # past a C int (a box's pid file): no such process
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True


def read(path: str, limit: int = SMALL_FILE_BYTES) -> str | None:
    """A small file's text (its first ``limit`` bytes), stripped; None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", "replace").strip()
    except (OSError, ValueError):
        return None


def num(text: str | None) -> float | None:
    """A finite number written as text (``started_at``, ``ended_at``); None for anything else."""
    if text is None or text == "":
        return None
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def read_pid(path: str) -> int | None:
    """The pid the file ``path`` holds, or None."""
    pid = read(path)
    if not pid or len(pid) > 10 or not pid.isascii() or not pid.isdigit():
        return None
    return int(pid) if int(pid) > 1 else None  # 0 would be "my own group", 1 is init: never a run's wrapper


def pid_alive(path: str) -> bool:
    """The process whose pid the file ``path`` holds is alive."""
    pid = read_pid(path)
    return pid is not None and alive(pid)


def bootstrap_running(bdir: str, name: str, names: set[str]) -> bool:
    """``<hash>.pid`` in ``bdir`` (listing ``names``) is a bootstrap running: no .ok or .failed yet, pid alive."""
    h = name[: -len(".pid")]
    return h + ".ok" not in names and h + ".failed" not in names and pid_alive(os.path.join(bdir, name))


def boot_time(now: float) -> float | None:
    """The kernel's boot (in a container: its host's); None when unknown."""
    try:
        with open("/proc/uptime") as f:
            return now - float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def recorded_start(root: str) -> float | None:
    """The box's start as the watchdog recorded it, or None."""
    return num(read(os.path.join(root, WATCHDOG_DIR, STARTED_FILE)))


def box_started_at(root: str, now: float) -> float | None:
    """The box's start as the probe and the watchdog read it: the watchdog's record, else the kernel's boot."""
    started = recorded_start(root)
    return started if started is not None else boot_time(now)


QUEUE_DIR = "queue"  # under RIGSYNC_ROOT: <slot>/<seq>-<run>.<attempt>/ entries (enqueue.sh)
DRAIN_FILE = "drain"  # under RIGSYNC_ROOT: the controller marked the box draining (drain.sh)


class Activity(NamedTuple):
    alive: bool  # a run or a bootstrap process is alive now
    last_at: float | None  # the latest time anything happened on the box, if anything did
    queued: bool = False  # an attempt waits in the box's queue: work, as a live run is


def box_activity(root: str, started_at: float | None = None) -> Activity:
    """What the run directories (``runs/*/``) and the bootstrap markers say, read afresh: the one activity rule.

    Activity is the box's start (``started_at``, if given), a run directory created (the launch lock, before the
    wrapper wrote anything), a run started, its heartbeat, its end, and a bootstrap finished or failed. Alive is a
    run's wrapper or an unfinished bootstrap still running; an entry in the queue is work too (``queued``). A
    controller's probe is not activity: it is contact, which the watchdog counts on its own.
    """
    times: list[float] = [] if started_at is None else [started_at]
    live = False
    rdir = os.path.join(root, RUNS_DIR)
    for name in listdir(rdir):
        d = os.path.join(rdir, name)
        if not os.path.isdir(d):
            continue
        live = live or pid_alive(os.path.join(d, "pid"))
        for t in (
            mtime(d),
            mtime(os.path.join(d, "heartbeat")),
            num(read(os.path.join(d, "started_at"))),
            num(read(os.path.join(d, "ended_at"))),
        ):
            if t is not None:
                times.append(t)
    bdir = os.path.join(root, BOOTSTRAP_DIR)
    names = listdir(bdir)
    nameset = set(names)
    for name in names:
        path = os.path.join(bdir, name)
        if name.endswith((".ok", ".failed")):
            t = mtime(path)
            if t is not None:
                times.append(t)
        elif name.endswith(".pid"):
            live = live or bootstrap_running(bdir, name, nameset)
    qdir = os.path.join(root, QUEUE_DIR)
    queued = any(n[:1].isdigit() for slot in listdir(qdir) for n in listdir(os.path.join(qdir, slot)))
    return Activity(live, max(times) if times else None, queued)


def unharvested(root: str) -> int:
    """How many run directories lack the controller's ``harvested`` mark (a draining box waits for none)."""
    rdir = os.path.join(root, RUNS_DIR)
    return sum(not os.path.exists(os.path.join(rdir, n, "harvested")) for n in listdir(rdir))
