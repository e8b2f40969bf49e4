"""Chaos: seeded schedules of injected faults over a real sweep, then the invariants checked, as a JSON table.

Each schedule is a fresh emulator (real sshd boxes on loopback), a fresh fleet repository with a bare remote, and
``rigsync run`` as real subprocesses (``python -m reconciler run``), while this driver injects faults drawn from a
seeded RNG, one every 0.8-2 s, for as long as it has faults left; then it stops injecting, lets the fleet converge,
waits two more cycles and checks every invariant against the emulator, the boxes and the remote.

Queues are on: the chaos fleet sets ``queue_ahead`` (``--queue-ahead``, default 15 s against runs of ~2 s) so that
busy GPU slots hold entries in their box's queue (``~/rigsync/queue/<slot>/<seq>-<run>.<attempt>/``) and faults
hit queued work. The queue faults need such entries: when no box ever showed one (a controller without the
box-side queue) though the schedule started twice as many attempts as it has boxes, or waited ``occasion_wait_s``
for one once an attempt ran, each is reported "not applicable: no queue entries seen"
(``faults_not_applicable_by_kind``) and another kind that needs no queue is drawn in its place.

Fault kinds (how each is injected):
- ``vanish``, ``outbid``, ``hang_resume`` (resumed 2-8 s later), ``hang_forever``: the emulator's fault API on a box
  with a live run (a run directory without ``exit_code``).
- ``api_429``, ``api_5xx``: ``fail_next`` on an API path prefix (offers, instance list, rent, instance, all of /api/),
  2-6 failures.
- ``latency``: ``set_latency`` 0.2-1.5 s on every API request, reset 3-8 s later.
- ``never_boot``: the next rented box stays ``loading`` forever (rigsync must destroy it after ``boot_timeout``).
- ``bootstrap_fail``: the fleet's bootstrap script exits 3 when ``/root/chaos-bootstrap-fail`` exists; the driver
  plants it in the next new box (``emu.host_root(iid)``) before its bootstrap has succeeded.
- ``kill_rent``, ``kill_launch``, ``kill_push_before``, ``kill_push_after``, ``kill_rebase_before``,
  ``kill_rebase_after``: the daemon is killed -9 (any moment) and restarted with ``RIGSYNC_FAILPOINTS`` arming
  ``apply.rent.after`` / ``boxes.launch.locked`` / ``git.push.before`` / ``git.push.after`` /
  ``git.rebase.before`` / ``git.rebase.after`` (``reconciler/failpoints.py``); counted when the point fired (the
  process died of SIGKILL). A rebase needs unpushed commits and a moved remote: the driver first lets a daemon die
  at ``git.push.before``, pushes as a human, then arms the rebase point. A point not reached within
  ``occasion_wait_s`` (20 s) is skipped, and another kind is drawn in its place (at most as many times as the
  schedule has faults).
- ``kill_random``: SIGKILL of the daemon at an arbitrary moment.
- ``human_push``: a researcher's commit pushed to the remote while the daemon runs: an edit of README.md, or of
  desired/ (two more seeds for the sweep, which also keeps work available while faults remain).
- ``second_daemon``: `rigsync run` from another clone while the first lives: it must be refused by the lease (exit
  non-zero, no cycle run).
- ``lease_expiry``: the daemon is SIGSTOPped past its ``--lease-stale``, a second one (another clone) takes the lease
  over, then the first is SIGCONTed: it must not act after that (no completed cycle with actions in its output, no
  commit of its author pushed after the takeover). Not attributable: the rest of an apply that SIGSTOP froze midway
  (launches and rents carry no holder), so a resumed half-cycle that acts and then fails to push is not counted.
- ``kill_with_queues``: SIGKILL of the daemon while a box holds queue entries; the daemon stays down until that box
  started one of them by itself (at least 2 s, at most 8 s: what it did is listed under ``unattended``), then a new
  one starts and the fleet must converge.
- ``stale_enqueue``: a stale controller's late enqueue. The daemon is SIGSTOPped as for ``lease_expiry``; once a
  second one holds the lease (a newer epoch) and probed the boxes (the box's ``~/rigsync/epoch`` reached the new
  epoch, or two cycles), the enqueue the frozen one would send next reaches a box with a queue: the real adapter
  over SSH with rigsync's key, a queued launch of a pending run's next attempt stamped with the old epoch. The box
  must refuse it, or take it and tombstone it ``fenced`` at its dequeue; it must never start. Then the first is
  SIGCONTed and checked as for ``lease_expiry``.
- ``vanish_with_queue``: the emulator vanishes a running box with queue entries; its queued attempts are lost with
  it, and their runs must go on as new attempts elsewhere, each exactly once.

Invariants (each violation counted under its name; the target is 0):
- ``attempt_on_two_boxes``: an attempt's directory (``runs/<run>.<attempt>``) seen on two boxes (boxes are scanned
  every 0.25 s; a launch lock is per box).
- ``concurrent_attempts``: two attempts of one run live at once: their [started_at, ended_at] intervals (a dir with
  no ended_at ends at its heartbeat's last touch) overlap, on the boxes or in the archive.
- ``duplicate_archive_record``: more than one archive line per (run_id, attempt) at the remote or in the checkout.
- ``duplicate_success``: a run archived as succeeded twice.
- ``run_lost``: a run of the sweep that is neither succeeded nor failed with its retries exhausted once the fleet
  converged (bounded: ``--converge-timeout`` after the last fault).
- ``attempt_unarchived``: an attempt directory seen on a box with no archive line.
- ``orphan_box``: a box the fleet owns still listed two cycles after the sweep is done (the fleet's min is 0).
- ``over_cap``: the emulator's ledger total past ``max_total_usd`` or ``max_daily_usd``, a box rented above
  ``max_instance_dph``, or the fleet's concurrent rate above ``max_fleet_dph``.
- ``force_push``: a non-fast-forward update in the remote's reflog, a merge commit on the branch, or a remote tip
  recorded during the schedule (every 0.5 s) that is not an ancestor of the final one.
- ``secret_leak``: the emulator's API key or a line of rigsync's SSH private key in ``git log -p --all`` of the
  remote, in observed/ of the checkout, or in any daemon's output.
- ``second_daemon_not_refused``, ``acted_after_lease_lost``: see the faults.
- ``queued_started_after_fence``: a queue entry carrying epoch E (its ``epoch`` file, else an ``epoch`` key in a JSON
  file of the entry; ``queue_entries_without_epoch`` counts entries it could not read) started on a box that had
  shown a fence above E (the scanner reads each box's ``~/rigsync/epoch`` every 0.25 s) at least 0.5 s before the
  start, or a replayed stale enqueue started at all.
- ``queued_over_budget``: an attempt queued (an entry seen on its box, or ``queued_at`` in its archive record) before
  the remote's plan said the headroom was gone (``budget: no new work fits`` or ``budget: exhausted`` in
  observed/status.yaml, sampled at each new tip) and started from its queue more than 0.5 s after that push, with no
  plan since finding room again: that plan's kills of queued work were applied before its push.
- ``vanished_queued_attempt_started``: an attempt queued on a box when it vanished started anywhere (its run must
  go on as a newer attempt).
- Directories the box's fence made in place of a stale entry (a tombstone, ``killed_reason`` ``fenced: ...``) and
  the replayed stale enqueues never ran: ``attempt_on_two_boxes`` and ``attempt_unarchived`` leave them out.

Figures:
- ``recovery_cycles`` (median, p90, max over injected faults): cycle lines printed by any `rigsync run` of the
  schedule from the injection up to and including the first one at or after the moment the fleet was healthy
  again: the fault's box gone from the provider (or resumed), every run live on it at injection running again
  (a newer attempt directory) or succeeded, and a cycle without failed actions or cycle errors after it.
- ``extra_usd``: ledger total minus what the same number of succeeded runs cost in a fault-free baseline of the
  same sweep and seed (its ledger per succeeded run); ``unproductive_usd``: ledger minus the archive's costs of the
  succeeded attempts (lost attempts, boot, bootstrap, idle, and storage of dead boxes).

Run (root: the boxes are sshd in namespaces; the defaults inject >= 200 faults in about 10-15 minutes):

    .venv/bin/python bench/chaos.py [--seed 1] [--faults 25] [--schedules 8] [--no-baseline]

Progress goes to stderr, the JSON document to stdout. ``tests/integration/test_chaos.py`` runs a small schedule.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from reconciler import demo
from reconciler.core.model import Ownership
from reconciler.emulator import Emulator

RIGSYNC = [sys.executable, "-m", "reconciler"]
HUMAN = {
    "GIT_AUTHOR_NAME": "A Researcher",
    "GIT_AUTHOR_EMAIL": "researcher@example.invalid",
    "GIT_COMMITTER_NAME": "A Researcher",
    "GIT_COMMITTER_EMAIL": "researcher@example.invalid",
}
MARKER = "chaos-bootstrap-fail"

BOX_KINDS = ("vanish", "outbid", "hang_resume", "hang_forever")
API_KINDS = ("api_429", "api_5xx", "latency")
BOOT_KINDS = ("never_boot", "bootstrap_fail")
KILL_POINTS = {
    "kill_rent": "apply.rent.after",
    "kill_launch": "boxes.launch.locked",
    "kill_push_before": "git.push.before",
    "kill_push_after": "git.push.after",
    "kill_rebase_before": "git.rebase.before",
    "kill_rebase_after": "git.rebase.after",
    "kill_launch_hang": "boxes.launch.locked",
}
DAEMON_KINDS = (*KILL_POINTS, "kill_random", "second_daemon", "lease_expiry")
QUEUE_KINDS = ("kill_with_queues", "stale_enqueue", "vanish_with_queue")  # need entries in some box's queue
KINDS = (*BOX_KINDS, *API_KINDS, *BOOT_KINDS, *DAEMON_KINDS, "human_push", *QUEUE_KINDS)
INVARIANTS = (
    "attempt_on_two_boxes", "concurrent_attempts", "duplicate_archive_record", "duplicate_success", "run_lost",
    "attempt_unarchived", "orphan_box", "over_cap", "force_push", "secret_leak", "second_daemon_not_refused",
    "acted_after_lease_lost", "queued_started_after_fence", "queued_over_budget", "vanished_queued_attempt_started",
)
QUEUE_ENTRY = re.compile(r"^(\d+)-(.+\.\d+)$")  # ~/rigsync/queue/<slot>/<seq>-<run>.<attempt>
BINDS = ("budget: no new work fits", "budget: exhausted")  # plan()'s own words when the headroom is gone
START_GRACE_S = 0.5  # a box's own start of an attempt trails its decision (dequeue, launch.sh, the wrapper)
API_PREFIXES = ("/api/v0/bundles", "/api/v1/instances", "/api/v0/asks", "/api/v0/instances", "/api/")
FAILED_LINE = re.compile(r"\d+ failed|cycle: (error|transient|unexpected)")


@dataclass
class Config:
    seed: int = 1
    faults: int = 25
    runs: int = 12  # the sweep's starting size; a human push to desired/ adds two seeds
    run_seconds: float = 2.0
    max_boxes: int = 3
    retries: int = 4
    interval_s: float = 1.0
    lease_stale_s: float = 8.0
    lease_renew_s: float = 2.0
    gap_s: tuple[float, float] = (0.8, 2.0)
    boot_delay_s: float = 0.3
    converge_timeout_s: float = 180.0
    occasion_wait_s: float = 20.0  # a fault whose precondition (a live box, a healthy daemon, a failpoint) never came
    max_total_usd: float = 1.0
    max_daily_usd: float = 1.0
    # the box-side queue: deep enough that each busy slot holds entries behind its attempt (runs of ~2 s, an
    # expected_runtime of 5 s), so faults hit queued work; "0s" turns the queue off
    queue_ahead: str = "15s"
    kinds: tuple[str, ...] = KINDS
    say: Callable[[str], None] = field(default=lambda s: print(s, file=sys.stderr, flush=True))


def git(cwd: Path, *args: str, check: bool = True) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, env={**os.environ, **HUMAN}, capture_output=True, text=True,
                          check=False, timeout=60)
    if check and proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {cwd}: {(proc.stderr + proc.stdout).strip()}")
    return proc.stdout.strip()


SWEEP = """\
# bench/chaos.py: short runs of experiments/train.py
name: chaos
priority: 10
code: [experiments]
command: >-
  {{{{ python }}}} experiments/train.py --task {{{{ task }}}} --lr {{{{ lr }}}} --seed {{{{ seed }}}}
  --seconds {seconds:g} --evals 3 --out {{{{ run_dir }}}}/metrics.jsonl
grid:
  task: [walker-walk, cheetah-run]
  lr: [1.0e-3]
seeds: [{seeds}]
resources:
  gpus: 1
max_runtime: 90s
expected_runtime: 5s
retries: {retries}
metrics:
  file: metrics.jsonl
  key: episode_reward
  goal: max
"""

BOOTSTRAP = """\
#!/bin/sh
# bench/chaos.py: fails on a box where the chaos driver planted its marker.
set -eu
if [ -e /root/{marker} ] || [ -e "$HOME/{marker}" ]; then echo "planted bootstrap failure" >&2; exit 3; fi
mkdir -p "$HOME/rigsync/env"
date -u +%Y-%m-%dT%H:%M:%SZ > "$HOME/rigsync/env/ready"
"""


def build_fleet_repo(workdir: Path, emu: Emulator, cfg: Config, name: str) -> tuple[Path, Path]:
    """The one place a chaos fleet repository is made (adapt here when desired/ changes shape)."""
    work, remote = demo.make_fleet_repo(workdir, None)
    git(remote, "config", "core.logAllRefUpdates", "true")
    # no receive.denyNonFastForwards: each lease write replaces the lease ref (a compare-and-swap, never a
    # fast-forward); the reflog check proves main itself is never forced
    fleet = work / "desired" / "fleet.yaml"
    text = fleet.read_text()
    for key, value in {
        "name": name, "max": str(cfg.max_boxes), "idle_timeout": "3s", "unreachable_grace": "5s",
        "heartbeat_stale": "10s", "boot_timeout": "8s", "ttl": "30m", "orphan_timeout": "10m",
    }.items():
        text = demo._set_key(text, key, value)
    if re.search(r"^#?\s*queue_ahead:", text, re.M):
        text = demo._set_key(text, "queue_ahead", cfg.queue_ahead)
    else:
        text = text.rstrip("\n") + f"\nqueue_ahead: {cfg.queue_ahead}  # bench/chaos.py: faults hit queued work\n"
    fleet.write_text(text)
    budget = work / "desired" / "budget.yaml"
    doc = yaml.safe_load(budget.read_text())
    doc.update(max_total_usd=cfg.max_total_usd, max_daily_usd=cfg.max_daily_usd)
    budget.write_text(yaml.safe_dump(doc, sort_keys=False))
    for old in (work / "desired" / "sweeps").glob("*.yaml"):
        old.unlink()
    seeds = ", ".join(str(s) for s in range(1, max(1, (cfg.runs + 1) // 2) + 1))
    (work / "desired" / "sweeps" / "chaos.yaml").write_text(
        SWEEP.format(seconds=cfg.run_seconds, seeds=seeds, retries=cfg.retries))
    (work / "desired" / "bootstrap.sh").write_text(BOOTSTRAP.format(marker=MARKER))
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", f"chaos fleet {name}")
    git(work, "push", "-q", "origin", "main")
    return work, remote


# ------------------------------------------------------------------------------------------------ observation


@dataclass
class DirSeen:
    first_seen: float
    started_at: float | None = None
    ended_at: float | None = None
    heartbeat: float | None = None
    exit_code: str | None = None
    killed_reason: str | None = None
    tombstone: bool = False  # made by a kill (or the box's fence) in place of a start: it never ran


@dataclass
class QueueSeen:
    """One entry seen in a box's queue (``~/rigsync/queue/<slot>/<seq>-<run>.<attempt>/``)."""

    first_seen: float
    last_seen: float
    slot: str
    epoch: int | None = None  # the lease epoch it carries (None: none readable)


def entry_epoch(entry: Path) -> int | None:
    """The epoch a queue entry carries: its ``epoch`` file, else an ``epoch`` key of a JSON file in it."""
    with contextlib.suppress(OSError, ValueError):
        return int((entry / "epoch").read_text().strip())
    for f in sorted(entry.glob("*.json")):
        with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):
            value = json.loads(f.read_text()).get("epoch")
            if value is not None:
                return int(value)
    return None


class BoxScanner:
    """Every run directory and queue entry seen on any of the fleet's boxes, each box's fence (the lease epoch in
    ``~/rigsync/epoch``) as it rose, and when each box was seen and gone."""

    def __init__(self, emu: Emulator, fleet: str) -> None:
        self.emu, self.fleet = emu, fleet
        self.seen: dict[tuple[int, str], DirSeen] = {}
        self.queued: dict[tuple[int, str], QueueSeen] = {}  # (box, attempt dir name) -> the entry
        self.fences: dict[int, list[tuple[float, int]]] = defaultdict(list)  # box -> (read by, value) on change
        self.last_scan = 0.0
        self.box_seen: dict[int, float] = {}
        self.box_gone: dict[int, float] = {}
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="chaos-scan", daemon=True)

    def owned(self) -> list[int]:
        out = []
        for iid in self.emu.instance_ids():
            try:
                own = Ownership.parse(self.emu.instance(iid).get("label"))
            except Exception:
                continue
            if own is not None and own.fleet == self.fleet:
                out.append(iid)
        return out

    def scan(self) -> None:
        now = time.time()
        owned = self.owned()
        with self.lock:
            for iid in owned:
                self.box_seen.setdefault(iid, now)
            for iid in self.box_seen:
                if iid not in owned:
                    self.box_gone.setdefault(iid, now)
        for iid in owned:
            with contextlib.suppress(Exception):
                self._scan_queue(iid, now)
            try:
                runs = self.emu.host_root(iid) / "rigsync" / "runs"
                entries = list(runs.iterdir()) if runs.is_dir() else []
            except Exception:
                continue
            for d in entries:
                with self.lock:
                    info = self.seen.setdefault((iid, d.name), DirSeen(first_seen=now))
                for f in ("started_at", "ended_at"):
                    if getattr(info, f) is None:
                        with contextlib.suppress(OSError, ValueError):
                            setattr(info, f, float((d / f).read_text().strip()))
                if info.exit_code is None:
                    with contextlib.suppress(OSError):
                        info.exit_code = (d / "exit_code").read_text().strip()
                if info.exit_code is not None and info.killed_reason is None:
                    with contextlib.suppress(OSError):
                        info.killed_reason = (d / "killed_reason").read_text().strip()
                if not info.tombstone and info.started_at is None:
                    info.tombstone = (d / "tombstone").exists()
                with contextlib.suppress(OSError):
                    info.heartbeat = (d / "heartbeat").stat().st_mtime
        self.last_scan = now

    def _scan_queue(self, iid: int, now: float) -> None:
        root = self.emu.host_root(iid) / "rigsync"
        with contextlib.suppress(OSError, ValueError):
            fence = int((root / "epoch").read_text().strip())
            read_by = time.time()
            with self.lock:
                hist = self.fences[iid]
                if not hist or hist[-1][1] != fence:
                    hist.append((read_by, fence))
        queue = root / "queue"
        if not queue.is_dir():
            return
        for slot in queue.iterdir():
            if not slot.is_dir():
                continue
            for entry in slot.iterdir():
                m = QUEUE_ENTRY.match(entry.name)
                if m is None or not entry.is_dir():
                    continue
                with self.lock:
                    info = self.queued.setdefault((iid, m.group(2)), QueueSeen(now, now, slot.name))
                    info.last_seen = now
                if info.epoch is None:
                    info.epoch = entry_epoch(entry)

    def ever_queued(self) -> bool:
        with self.lock:
            return bool(self.queued)

    def started(self) -> int:
        with self.lock:
            return sum(1 for info in self.seen.values() if info.started_at is not None)

    def queued_now(self) -> dict[int, list[tuple[str, str]]]:
        """Boxes (still listed) with entries in their queue at the last scan, not started: box -> (name, slot)."""
        out: dict[int, list[tuple[str, str]]] = defaultdict(list)
        with self.lock:
            for (iid, name), q in self.queued.items():
                d = self.seen.get((iid, name))
                if iid not in self.box_gone and q.last_seen >= self.last_scan and (d is None or d.started_at is None):
                    out[iid].append((name, q.slot))
        return dict(out)

    def live(self) -> dict[int, list[str]]:
        """Boxes (still listed, running) with attempt dirs that have no exit code: instance -> dir names."""
        out: dict[int, list[str]] = defaultdict(list)
        with self.lock:
            items = list(self.seen.items())
            gone = set(self.box_gone)
        for (iid, name), info in items:
            if iid not in gone and info.exit_code is None and info.started_at is not None:
                out[iid].append(name)
        return dict(out)

    def start(self) -> BoxScanner:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(0.25):
            with contextlib.suppress(Exception):
                self.scan()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        with contextlib.suppress(Exception):
            self.scan()


@dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    log: Path
    checkout: Path
    author: str
    failpoint: str | None = None
    offset: int = 0  # bytes of the log already read
    cycles: int = 0


@dataclass
class Fault:
    kind: str
    t: float
    detail: str = ""
    box: int | None = None
    runs: tuple[tuple[str, int], ...] = ()  # (run_id, attempt) live on the box at injection
    resumed_at: float | None = None
    recovery_cycles: int | None = None


# ------------------------------------------------------------------------------------------------ one schedule


class Schedule:
    def __init__(self, cfg: Config, index: int, tmp: Path, faults: int) -> None:
        self.cfg, self.index, self.tmp, self.n_faults = cfg, index, tmp, faults
        self.rng = random.Random(cfg.seed * 1000 + index)
        self.name = f"chaos{index}"
        self.faults: list[Fault] = []
        self.skipped: Counter[str] = Counter()
        self.not_applicable: Counter[str] = Counter()
        self.na_why: set[str] = set()
        self.stale: list[tuple[int, str, int, str]] = []  # replayed stale enqueues: box, attempt, epoch, answer
        self.vanished_queued: list[tuple[int, str]] = []  # (box, attempt) queued on a box when it vanished
        self.binding: list[tuple[float, bool]] = []  # (seen by, the remote's last plan says the headroom is gone)
        self.unattended: list[str] = []  # kill_with_queues: what the boxes did while no controller ran
        self.violations: dict[str, list[str]] = defaultdict(list)
        self.procs: list[Proc] = []
        self.cycle_lines: list[tuple[float, str]] = []
        self.tips: list[str] = []
        self.timers: list[tuple[float, Callable[[], None]]] = []
        self.clones = 0
        self.pending: Callable[[], bool] | None = None  # a multi-step daemon fault in progress; True when done
        self.redraw = 0  # multi-step faults skipped (a failpoint not reached): each is replaced by another draw
        self.pending_since = 0.0
        self.bootstrap_plant: Fault | None = None
        self.known_boxes: set[int] = set()
        self.hung: set[int] = set()
        self._fed = 0.0
        # set up in run()
        self.emu: Emulator
        self.state: Path
        self.work: Path
        self.remote: Path
        self.human: Path
        self.scanner: BoxScanner
        self.main: Proc

    # ---- processes
    def env(self, failpoint: str | None) -> dict[str, str]:
        env = {**os.environ, "VAST_API_KEY": self.emu.api_key, "RIGSYNC_STATE_DIR": str(self.state),
               "RIGSYNC_API_URL": self.emu.url, "PYTHONUNBUFFERED": "1"}
        env.pop("RIGSYNC_FAILPOINTS", None)
        if failpoint:
            env["RIGSYNC_FAILPOINTS"] = failpoint
        return env

    def start(self, checkout: Path, author: str, failpoint: str | None = None) -> Proc:
        log = self.tmp / f"daemon-{len(self.procs)}.log"
        with open(log, "wb") as fh:
            popen = subprocess.Popen(
                [*RIGSYNC, "run", "--repo", str(checkout), "--interval", f"{self.cfg.interval_s:g}",
                 "--lease-stale", f"{self.cfg.lease_stale_s:g}", "--lease-renew", f"{self.cfg.lease_renew_s:g}",
                 "--poll", "1", "--destroy-latency", "2", "--author", author],
                env=self.env(failpoint), stdout=fh, stderr=subprocess.STDOUT, cwd=self.tmp,
            )
        p = Proc(popen, log, checkout, author, failpoint)
        self.procs.append(p)
        return p

    def new_clone(self) -> Path:
        self.clones += 1
        path = self.tmp / f"clone{self.clones}"
        git(self.tmp, "clone", "-q", str(self.remote), str(path))
        return path

    def read_logs(self) -> None:
        now = time.time()
        for p in self.procs:
            try:
                with open(p.log, "rb") as fh:
                    fh.seek(p.offset)
                    data = fh.read()
            except OSError:
                continue
            end = data.rfind(b"\n")
            if end < 0:
                continue
            p.offset += end + 1
            for line in data[: end + 1].decode(errors="replace").splitlines():
                if line.startswith("cycle:"):
                    p.cycles += 1
                    self.cycle_lines.append((now, line))

    def ensure_daemon(self) -> None:
        if self.main.popen.poll() is not None and self.pending is None:
            self.main = self.start(self.main.checkout, self.main.author)

    def kill(self, p: Proc, sig: int = signal.SIGKILL) -> None:
        if p.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.popen.send_signal(sig)
            if sig == signal.SIGKILL:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.popen.wait(timeout=10)

    # ---- the human
    def human_push(self, desired: bool) -> str:
        for _ in range(10):
            git(self.human, "pull", "-q", "--rebase", "origin", "main")
            if desired:
                path = self.human / "desired" / "sweeps" / "chaos.yaml"
                text = path.read_text()
                m = re.search(r"^seeds: \[(.*)\]$", text, re.M)
                assert m is not None
                seeds = [int(s) for s in m.group(1).split(",")]
                seeds += [max(seeds) + 1, max(seeds) + 2]
                path.write_text(text.replace(m.group(0), f"seeds: [{', '.join(map(str, seeds))}]"))
                msg = "sweep: two more seeds"
            else:
                with open(self.human / "README.md", "a") as fh:
                    fh.write(f"\nnote {time.time():.3f}\n")
                msg = "README: a note"
            git(self.human, "add", "-A")
            git(self.human, "commit", "-q", "-m", msg)
            proc = subprocess.run(["git", "push", "-q", "origin", "HEAD:main"], cwd=self.human,
                                  env={**os.environ, **HUMAN}, capture_output=True, check=False)
            if proc.returncode == 0:
                return git(self.human, "rev-parse", "HEAD")
            git(self.human, "reset", "-q", "--hard", "origin/main")
        raise RuntimeError("the human could not push in 10 tries")

    def expected_runs(self) -> dict[str, int]:
        """Run id -> retries, as desired/ at the remote tip says."""
        from reconciler.desired import load_desired

        git(self.human, "pull", "-q", "--rebase", "origin", "main")
        files = {}
        for p in (self.human / "desired").rglob("*"):
            if p.is_file():
                files[str(p.relative_to(self.human))] = p.read_bytes()
        d = load_desired(files)
        return {r.id: self.retries_of(d, r.sweep.name) for r in d.runs}

    @staticmethod
    def retries_of(d: Any, sweep: str) -> int:
        for s in d.sweeps:
            if s.name == sweep:
                return int(s.retries)
        return 0

    def archive(self) -> list[dict[str, Any]]:
        names = git(self.remote, "ls-tree", "--name-only", "refs/heads/main", "observed/runs/").split()
        out = []
        for n in names:
            text = git(self.remote, "show", f"refs/heads/main:{n}", check=False)
            out += [json.loads(line) for line in text.splitlines() if line.strip()]
        return [r for r in out if r.get("kind") != "overhead"]

    def budget_binds(self) -> bool:
        """rigsync's own verdict at the remote: the last plan said a cap stops new work (a "budget:" warning)."""
        text = git(self.remote, "show", "refs/heads/main:observed/status.yaml", check=False)
        with contextlib.suppress(yaml.YAMLError):
            doc = yaml.safe_load(text) or {}
            warnings = (doc.get("last_plan") or {}).get("warnings") or []
            return any(str(w).startswith("budget:") for w in warnings)
        return False

    def headroom_gone(self, tip: str) -> bool:
        """The last plan pushed at ``tip`` said no new work fits the budget (``plan()``'s ``budget.binds``)."""
        text = git(self.remote, "show", f"{tip}:observed/status.yaml", check=False)
        with contextlib.suppress(yaml.YAMLError, AttributeError):
            doc = yaml.safe_load(text) or {}
            warnings = (doc.get("last_plan") or {}).get("warnings") or []
            return any(str(w).startswith(BINDS) for w in warnings)
        return False

    def lease_epoch(self) -> int:
        text = git(self.remote, "show", "refs/heads/rigsync/lease/main:lease.yaml", check=False)
        with contextlib.suppress(yaml.YAMLError, ValueError, TypeError):
            doc = yaml.safe_load(text) if text else None
            if isinstance(doc, dict):
                return int(doc.get("epoch") or 0)
        return 0

    def unfinished(self, expected: dict[str, int], lines: list[dict[str, Any]]) -> set[str]:
        done: set[str] = set()
        tries: Counter[str] = Counter()
        for r in lines:
            if r["phase"] == "succeeded":
                done.add(r["run_id"])
            tries[r["run_id"]] += 1
        return {rid for rid, retries in expected.items() if rid not in done and tries[rid] < retries + 1}

    # ---- faults
    def live_box(self) -> tuple[int, tuple[tuple[str, int], ...]] | None:
        live = self.scanner.live()
        candidates = [i for i in sorted(live) if self._status(i) == "running" and not self._hung(i)]
        if not candidates:
            return None
        iid = self.rng.choice(candidates)
        runs = tuple((n.rsplit(".", 1)[0], int(n.rsplit(".", 1)[1])) for n in sorted(live[iid]))
        return iid, runs

    def queued_box(self) -> tuple[int, tuple[tuple[str, int], ...], list[tuple[str, str]]] | None:
        """A running box with entries in its queue: it, the attempts live or queued on it, and its entries."""
        queued = self.scanner.queued_now()
        live = self.scanner.live()
        candidates = [i for i in sorted(queued) if self._status(i) == "running" and not self._hung(i)]
        if not candidates:
            return None
        iid = self.rng.choice(candidates)
        names = sorted({*live.get(iid, []), *(n for n, _ in queued[iid])})
        runs = tuple((n.rsplit(".", 1)[0], int(n.rsplit(".", 1)[1])) for n in names)
        return iid, runs, queued[iid]

    def queue_not_applicable(self, kind: str) -> str | None:
        """Why a queue fault cannot apply to this schedule (None: it can, now or later)."""
        if kind not in QUEUE_KINDS:
            return None
        if self.cfg.queue_ahead.strip() in ("0", "0s", "0m"):
            return "not applicable: queue_ahead is 0"
        if not self.scanner.ever_queued() and self.scanner.started() > 2 * self.cfg.max_boxes:
            return "not applicable: no queue entries seen"
        return None

    def _status(self, iid: int) -> str:
        try:
            return self.emu.status(iid)
        except Exception:
            return "gone"

    def _hung(self, iid: int) -> bool:
        return iid in self.hung

    def main_is_healthy(self) -> bool:
        return self.main.popen.poll() is None and self.main.cycles >= 1

    def try_inject(self, kind: str) -> bool:
        """Inject ``kind`` if its precondition holds now; True when it was injected (or started, for daemon ones)."""
        now = time.time()
        rng, emu = self.rng, self.emu
        if kind in BOX_KINDS:
            pick = self.live_box()
            if pick is None:
                return False
            iid, runs = pick
            f = Fault(kind, now, box=iid, runs=runs)
            if kind == "vanish":
                emu.vanish(iid)
            elif kind == "outbid":
                emu.outbid(iid)
            else:
                emu.hang(iid)
                self.hung.add(iid)
                if kind == "hang_resume":
                    delay = rng.uniform(2.0, 8.0)
                    f.detail = f"resume after {delay:.1f}s"

                    def resume(iid: int = iid, f: Fault = f) -> None:
                        with contextlib.suppress(Exception):
                            emu.resume(iid)
                            f.resumed_at = time.time()
                        self.hung.discard(iid)

                    self.timers.append((now + delay, resume))
            self.record(f)
            return True
        if kind == "vanish_with_queue":
            qpick = self.queued_box()
            if qpick is None:
                return False
            iid, runs, entries = qpick
            emu.vanish(iid)
            self.vanished_queued += [(iid, name) for name, _ in entries]
            self.record(Fault(kind, now, box=iid, runs=runs,
                              detail=f"queued {', '.join(n for n, _ in entries)}"))
            return True
        if kind in ("api_429", "api_5xx"):
            prefix = rng.choice(API_PREFIXES)
            n = rng.randint(2, 6)
            status = 429 if kind == "api_429" else rng.choice((500, 502, 503))
            emu.fail_next(prefix, n, status)
            self.record(Fault(kind, now, detail=f"{n}x {status} on {prefix}"))
            return True
        if kind == "latency":
            secs = round(rng.uniform(0.2, 1.5), 2)
            emu.set_latency(secs)
            delay = rng.uniform(3.0, 8.0)
            self.timers.append((now + delay, lambda: emu.set_latency(0.0)))
            self.record(Fault(kind, now, detail=f"{secs}s for {delay:.1f}s"))
            return True
        if kind == "never_boot":
            emu.never_boot(None)
            self.record(Fault(kind, now, detail="the next rented box"))
            return True
        if kind == "bootstrap_fail":
            if self.bootstrap_plant is not None:
                return False
            self.bootstrap_plant = Fault(kind, now)
            self.known_boxes = set(self.scanner.box_seen)
            return True  # recorded when it lands on a box
        if kind == "human_push":
            desired = rng.random() < 0.5
            sha = self.human_push(desired)
            what = "desired/: two more seeds" if desired else "README.md"
            self.record(Fault(kind, now, detail=f"{what} {sha[:8]}"))
            return True
        if kind not in (*DAEMON_KINDS, "kill_with_queues", "stale_enqueue") or self.pending is not None \
                or not self.main_is_healthy():
            return False
        if kind == "kill_random":
            self.kill(self.main)
            self.record(Fault(kind, now))
            self.main = self.start(self.main.checkout, self.main.author)
            return True
        if kind in KILL_POINTS:
            self.start_kill_at(kind)
            return True
        if kind == "second_daemon":
            self.start_second_daemon()
            return True
        if kind == "lease_expiry":
            self.start_lease_expiry()
            return True
        if kind == "kill_with_queues":
            qpick = self.queued_box()
            if qpick is None:
                return False
            self.start_kill_with_queues(*qpick)
            return True
        if kind == "stale_enqueue":
            qpick = self.queued_box()
            epoch = self.lease_epoch()
            if qpick is None or epoch <= 0:
                return False
            self.start_lease_expiry(stale=(epoch, qpick[0], qpick[2][0][1]))
            return True
        return False

    def record(self, f: Fault) -> None:
        self.faults.append(f)
        self.cfg.say(f"  [{self.name}] {len(self.faults):3d} {f.kind}"
                     + (f" box {f.box}" if f.box else "") + (f" {f.detail}" if f.detail else ""))

    def _begin(self, step: Callable[[], bool]) -> None:
        self.pending = step
        self.pending_since = time.time()

    def start_kill_at(self, kind: str) -> None:
        point = KILL_POINTS[kind]
        checkout, author = self.main.checkout, self.main.author
        stages: list[str] = []
        if kind.startswith("kill_rebase"):
            stages.append("git.push.before")  # leave an unpushed commit, then a human moves the remote
        stages.append(point)
        state: dict[str, Any] = {"proc": None, "t": 0.0}

        def arm(fp: str) -> None:
            self.kill(self.main)
            hits = self.rng.randint(1, 2) if kind == "kill_launch" else 1
            self.main = self.start(checkout, author, failpoint=f"{fp}:{hits}")
            state["proc"], state["t"] = self.main, time.time()

        arm(stages[0])

        def step() -> bool:
            p = state["proc"]
            assert isinstance(p, Proc)
            fp = (p.failpoint or "").split(":")[0]
            rc = p.popen.poll()
            if rc == -signal.SIGKILL:
                f = Fault(kind if fp == point else "kill_push_before", time.time(), detail=f"at {fp}")
                if kind == "kill_launch_hang":
                    self.hang_fresh_launch(f, state["t"])
                self.record(f)
                stages.pop(0)
                if stages:
                    self.human_push(False)
                    self.record(Fault("human_push", time.time(), detail="README.md, to make a rebase"))
                    arm(stages[0])
                    return False
                self.main = self.start(checkout, author)
                return True
            if rc is not None or time.time() - state["t"] > self.cfg.occasion_wait_s:
                self.skipped[kind] += 1
                self.redraw += 1
                self.cfg.say(f"  [{self.name}] {kind}: {fp} not reached (rc {rc})")
                if rc is not None:
                    self.main = self.start(checkout, author)
                return True  # an armed daemon that goes on is a normal one (it may still fire: then restarted)
            return False

        self._begin(step)

    def hang_fresh_launch(self, f: Fault, since: float) -> None:
        """The box of the attempt launched just before the kill hangs before any controller sees it again."""
        self.scanner.scan()
        with self.scanner.lock:
            fresh = [(info.first_seen, iid, name) for (iid, name), info in self.scanner.seen.items()
                     if info.first_seen >= since and info.exit_code is None]
        if not fresh:
            f.detail += "; no fresh attempt dir found"
            return
        _, iid, name = max(fresh)
        with contextlib.suppress(Exception):
            self.emu.hang(iid)
            self.hung.add(iid)
        f.box = iid
        f.runs = ((name.rsplit(".", 1)[0], int(name.rsplit(".", 1)[1])),)
        f.detail += f"; then box {iid} (holding {name}, not yet recorded) hung"

    def start_second_daemon(self) -> None:
        clone = self.new_clone()
        before = self.lease_holder()
        p = self.start(clone, f"rigsync-second{self.clones}")
        t0 = time.time()

        def step() -> bool:
            rc = p.popen.poll()
            if rc is None and time.time() - t0 < 30:
                return False
            self.read_logs()
            text = p.log.read_text(errors="replace")
            refused = rc not in (None, 0) and "cycle:" not in text and self.lease_holder() == before
            if rc is None:
                self.kill(p)
            f = Fault("second_daemon", t0, detail=f"rc {rc}: {text.strip().splitlines()[-1:]}")
            self.record(f)
            if not refused:
                self.violations["second_daemon_not_refused"].append(
                    f"seed {self.cfg.seed} schedule {self.index}: second daemon rc {rc}, lease {before} -> "
                    f"{self.lease_holder()}: {text[-600:]}")
            return True

        self._begin(step)

    def lease_holder(self) -> str | None:
        text = git(self.remote, "show", "refs/heads/rigsync/lease/main:lease.yaml", check=False)
        doc = yaml.safe_load(text) if text else None
        return str(doc.get("holder")) if isinstance(doc, dict) else None

    def start_kill_with_queues(
        self, iid: int, runs: tuple[tuple[str, int], ...], entries: list[tuple[str, str]]
    ) -> None:
        """SIGKILL the daemon while box ``iid`` holds queue entries; keep it down until the box started one of them
        by itself (or 8 s), then restart it: the restarted daemon must converge."""
        self.kill(self.main)
        t0 = time.time()
        checkout, author = self.main.checkout, self.main.author
        names = [n for n, _ in entries]
        f = Fault("kill_with_queues", t0, runs=runs, detail=f"box {iid} queued {', '.join(names)}")

        def step() -> bool:
            now = time.time()
            with self.scanner.lock:
                started = [n for n in names if (d := self.scanner.seen.get((iid, n))) is not None
                           and d.started_at is not None and d.started_at >= t0]
            if not started and now - t0 < 8.0:
                return False
            if now - t0 < 2.0:
                return False
            what = (f"box {iid} started {started[0]} {now - t0:.1f}s into the outage, with no controller"
                    if started else f"box {iid} started none of its queue in {now - t0:.1f}s without a controller")
            f.detail += f"; {what}"
            self.unattended.append(what)
            self.record(f)
            self.main = self.start(checkout, author)
            return True

        self._begin(step)

    def replay_enqueue(self, iid: int, slot: str, epoch: int) -> tuple[str, str]:
        """A stale controller's late enqueue, sent as it would: the real adapter over SSH with rigsync's key, a
        queued launch of the attempt the stale controller would have given next (a pending run's next attempt)
        stamped with its old lease ``epoch``. Returns the attempt's directory name and the box's answer."""
        from reconciler.adapters.box_control import ShellBoxes
        from reconciler.adapters.vast import VastProvider
        from reconciler.core.model import MetricGoal
        from reconciler.fleet import open_shell
        from reconciler.ports import LaunchJob

        expected = self.expected_runs()
        lines = self.archive()
        todo = sorted(self.unfinished(expected, lines)) or sorted(expected)
        run_id = todo[0]
        with self.scanner.lock:
            names = [n for _, n in (*self.scanner.seen, *self.scanner.queued)]
        attempts = [int(n.rsplit(".", 1)[1]) for n in names if n.rsplit(".", 1)[0] == run_id]
        attempts += [int(r["attempt"]) for r in lines if r["run_id"] == run_id]
        attempt = max(attempts, default=0) + 1
        name = f"{run_id}.{attempt}"
        inst = None
        for _ in range(10):  # the emulator's API may be failing on purpose
            with contextlib.suppress(Exception):
                listed = VastProvider(api_key=self.emu.api_key, server_url=self.emu.url).list_instances()
                inst = next((i for i in listed if i.id == iid), None)
                break
            time.sleep(0.5)
        if inst is None:
            return name, "not sent: the box is not listed"
        mask = tuple(int(g) for g in slot.split("_") if g.isdigit()) or (0,)
        job = LaunchJob(run_id=run_id, attempt=attempt, gpu_mask=mask, command="sleep 2", code_commit=None,
                        desired_commit=None, sweep="chaos", params=(), seed=0, metrics_file="metrics.jsonl",
                        metric_key=None, metric_goal=MetricGoal.MAX, max_runtime_s=90.0, queued=True, epoch=epoch)
        key = next(self.state.rglob("id_ed25519"))
        shell = open_shell(key, self.tmp / "chaos_known_hosts")
        try:
            answer = ShellBoxes(shell).launch(inst, job)
        except Exception as e:
            return name, f"refused: {type(e).__name__}: {str(e)[:160]}"
        finally:
            shell.close()
        return name, f"accepted: {answer.strip()[:80]!r}"

    def start_lease_expiry(self, stale: tuple[int, int, str] | None = None) -> None:
        """SIGSTOP the daemon past its lease, let another take over, SIGCONT it: it must not act. With ``stale``
        (its epoch, a box with a queue, a slot there), once the taker-over holds the lease and probed the box, the
        frozen holder's late enqueue reaches that box (``replay_enqueue``): refused, or tombstoned ``fenced``."""
        first = self.main
        first.popen.send_signal(signal.SIGSTOP)
        t0 = time.time()
        state: dict[str, Any] = {"second": None, "cont_at": None, "offset": 0, "tip": None, "replayed": stale is None,
                                 "held_at": None}
        kind = "lease_expiry" if stale is None else "stale_enqueue"

        def step() -> bool:
            now = time.time()
            if state["second"] is None:
                if now - t0 < self.cfg.lease_stale_s + 2.0:
                    return False
                clone = self.new_clone()
                state["second"] = self.start(clone, f"rigsync-b{self.clones}")
                return False
            second: Proc = state["second"]
            if state["cont_at"] is None:
                holder = self.lease_holder() or ""
                if str(second.checkout) not in holder and now - t0 < self.cfg.lease_stale_s + 40:
                    if second.popen.poll() is not None:  # refused (the first's lease not stale yet?): retry
                        state["second"] = self.start(second.checkout, second.author)
                    return False
                if not state["replayed"]:
                    assert stale is not None
                    old, iid, slot = stale
                    state["held_at"] = state["held_at"] or now
                    new = self.lease_epoch()
                    with self.scanner.lock:
                        fence = max((v for _, v in self.scanner.fences.get(iid, [])), default=0)
                    probed = fence >= new > old or second.cycles >= 2
                    if not probed and now - state["held_at"] < 20.0:
                        return False
                    if self._status(iid) != "running" or self._hung(iid):  # gone meanwhile: another with a queue
                        again = self.queued_box()
                        if again is not None:
                            iid, slot = again[0], again[2][0][1]
                    name, answer = self.replay_enqueue(iid, slot, old)
                    self.stale.append((iid, name, old, answer))
                    state["replayed"] = True
                    state["detail"] = (f"box {iid} (fence {fence}) got {name} at epoch {old} < {new}: {answer}")
                self.read_logs()
                state["offset"] = first.log.stat().st_size
                state["tip"] = git(self.remote, "rev-parse", "refs/heads/main")
                first.popen.send_signal(signal.SIGCONT)
                state["cont_at"] = now
                detail = f"stopped {now - t0:.1f}s, taken over by {second.author}"
                if stale is not None:
                    detail += f"; {state.get('detail')}"
                self.record(Fault(kind, t0, detail=detail))  # the box is not faulted: recovery is the takeover's
                return False
            if now - state["cont_at"] < max(6.0, 4 * self.cfg.interval_s):
                return False
            self.read_logs()
            after = first.log.read_bytes()[state["offset"]:].decode(errors="replace")
            acted = [ln for ln in after.splitlines()
                     if ln.startswith("cycle: desired") and "not acting" not in ln and "no changes" not in ln]
            own = git(self.remote, "log", "--format=%H %an %s", f"{state['tip']}..refs/heads/main")
            own_commits = [ln for ln in own.splitlines() if f" {first.author} " in f" {ln} "]
            if acted or own_commits:
                self.violations["acted_after_lease_lost"].append(
                    f"seed {self.cfg.seed} schedule {self.index}: after SIGCONT the first daemon printed "
                    f"{acted[:3]} and pushed {own_commits[:3]}")
            self.kill(first)
            self.main = second  # the taker-over goes on as the fleet's controller
            return True

        self._begin(step)

    def plant_bootstrap_marker(self) -> None:
        f = self.bootstrap_plant
        if f is None:
            return
        for iid in self.scanner.owned():
            if iid in self.known_boxes:
                continue
            self.known_boxes.add(iid)
            try:
                root = self.emu.host_root(iid)
                ok = list((root / "rigsync" / "bootstrap").glob("*.ok")) if (root / "rigsync").exists() else []
                if ok:
                    continue
                (root / MARKER).write_text("planted by bench/chaos.py\n")
            except Exception:
                continue
            f.box, f.t, f.detail = iid, time.time(), f"marker planted in box {iid}"
            self.record(f)
            self.bootstrap_plant = None
            return
        if time.time() - f.t > 2 * self.cfg.occasion_wait_s:
            self.skipped["bootstrap_fail"] += 1
            self.bootstrap_plant = None

    # ---- the schedule
    def plan_kinds(self) -> list[str]:
        kinds = [k for k in self.cfg.kinds]
        order: list[str] = []
        rng = self.rng
        first = kinds[:]
        rng.shuffle(first)
        order += first[: self.n_faults]
        weights = {k: (0.3 if k == "lease_expiry" else 1.0) for k in kinds}
        while len(order) < self.n_faults:
            order.append(rng.choices(kinds, weights=[weights[k] for k in kinds])[0])
        return order

    def tick(self) -> None:
        now = time.time()
        for t, fn in [x for x in self.timers if x[0] <= now]:
            self.timers.remove((t, fn))
            fn()
        self.read_logs()
        if self.pending is not None:
            if self.pending():
                self.pending = None
        else:
            self.ensure_daemon()
        self.plant_bootstrap_marker()
        with contextlib.suppress(RuntimeError):
            tip = git(self.remote, "rev-parse", "refs/heads/main")
            if not self.tips or self.tips[-1] != tip:
                self.tips.append(tip)
                binds = self.headroom_gone(tip)
                if not self.binding or self.binding[-1][1] != binds:
                    self.binding.append((time.time(), binds))

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        t_start = time.monotonic()
        with Emulator(seed=cfg.seed + self.index, offers=150, boot_delay=cfg.boot_delay_s) as emu:
            self.emu = emu
            self.state = self.tmp / "state"
            self.state.mkdir()
            self.work, self.remote = build_fleet_repo(self.tmp / "fleet", emu, cfg, self.name)
            self.human = self.new_clone()
            self.scanner = BoxScanner(emu, self.name).start()
            self.main = self.start(self.work, "rigsync")
            try:
                self._inject_all()
                t_faults_done = time.time()
                converged = self._converge()
                summary = self._check(converged)
            finally:
                for p in self.procs:
                    if p.popen.poll() is None:
                        with contextlib.suppress(ProcessLookupError):
                            p.popen.send_signal(signal.SIGCONT)
                            p.popen.send_signal(signal.SIGTERM)
                for p in self.procs:
                    try:
                        p.popen.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        self.kill(p)
                self.scanner.stop()
                for iid in self.scanner.owned():
                    with contextlib.suppress(Exception):
                        emu.destroy_instance(iid)
            summary["ledger_usd"] = round(emu.ledger.total_usd(), 6)
        summary["converge_s"] = round(time.time() - t_faults_done, 1)
        summary["wall_s"] = round(time.monotonic() - t_start, 1)
        return summary

    def _inject_all(self) -> None:
        kinds = self.plan_kinds()
        next_at = time.time() + 3.0
        waiting_since: float | None = None
        replacements = 0
        while kinds or self.pending is not None or self.bootstrap_plant is not None:
            self.tick()
            now = time.time()
            while self.redraw:
                self.redraw -= 1
                if replacements < self.n_faults:
                    replacements += 1
                    kinds.append(self.rng.choice(self.cfg.kinds))
            if kinds and now >= next_at:
                kind = kinds[0]
                why = self.queue_not_applicable(kind)
                if why is None and kind in QUEUE_KINDS and waiting_since is not None \
                        and now - waiting_since > self.cfg.occasion_wait_s and not self.scanner.ever_queued():
                    why = "not applicable: no queue entries seen"
                if why is not None:
                    # drawn, and said plainly; another kind that needs no queue takes its place
                    kinds.pop(0)
                    waiting_since = None
                    self.not_applicable[kind] += 1
                    self.na_why.add(why)
                    self.cfg.say(f"  [{self.name}] {kind}: {why}")
                    others = [k for k in self.cfg.kinds if k not in QUEUE_KINDS]
                    if others and replacements < self.n_faults:
                        replacements += 1
                        kinds.append(self.rng.choice(others))
                    continue
                if self.try_inject(kind):
                    kinds.pop(0)
                    waiting_since = None
                    next_at = now + self.rng.uniform(*self.cfg.gap_s)
                else:
                    if kind not in QUEUE_KINDS or self.scanner.started() > 0:  # a queue needs a fleet at work
                        waiting_since = waiting_since or now
                    if waiting_since is not None and now - waiting_since > self.cfg.occasion_wait_s and not (
                            kind in QUEUE_KINDS and not self.scanner.ever_queued()):  # that one: not applicable
                        self.skipped[kind] += 1
                        self.cfg.say(f"  [{self.name}] skipped {kind}: no occasion in {self.cfg.occasion_wait_s:g}s")
                        kinds.pop(0)
                        waiting_since = None
                        # a skipped kind is replaced by another draw (at most n_faults times), so a quiet history
                        # (few pushes to kill at, few launches) does not shrink the schedule below its size
                        if replacements < self.n_faults:
                            replacements += 1
                            kinds.append(self.rng.choice([k for k in self.cfg.kinds if k != kind] or [kind]))
                # keep work available while faults remain: a human adds seeds when the sweep runs dry
                if kinds and now - self._fed > 5.0:
                    self._fed = now
                    with contextlib.suppress(Exception):
                        exp = self.expected_runs()
                        if len(self.unfinished(exp, self.archive())) < self.cfg.max_boxes + 1:
                            sha = self.human_push(True)
                            self.record(Fault("human_push", now, detail=f"desired/: two more seeds {sha[:8]}"))
            time.sleep(0.2)

    def _converge(self) -> bool:
        deadline = time.time() + self.cfg.converge_timeout_s
        while self.timers:
            self.tick()
            time.sleep(0.2)
        expected = self.expected_runs()
        while time.time() < deadline:
            self.tick()
            lines = self.archive()
            if not self.scanner.owned() and (not self.unfinished(expected, lines) or self.budget_binds()):
                settled = len(self.cycle_lines)
                while len(self.cycle_lines) < settled + 2 and time.time() < deadline + 30:
                    self.tick()
                    time.sleep(0.2)
                return True
            time.sleep(0.5)
        return False

    # ---- the invariants
    def _check(self, converged: bool) -> dict[str, Any]:
        v = self.violations
        tag = f"seed {self.cfg.seed} schedule {self.index}"
        self.scanner.stop()
        lines = self.archive()
        expected = self.expected_runs()
        # One archive record per attempt; one success per run.
        keys = Counter((r["run_id"], r["attempt"]) for r in lines)
        for k, n in keys.items():
            if n > 1:
                v["duplicate_archive_record"].append(f"{tag}: {k} archived {n} times at the remote")
        from reconciler.adapters.archive import ShardedRunArchive

        local = Counter(r.key for r in ShardedRunArchive(self.main.checkout).records())
        for k, n in local.items():
            if n > 1:
                v["duplicate_archive_record"].append(f"{tag}: {k} archived {n} times in the checkout")
        succ = Counter(r["run_id"] for r in lines if r["phase"] == "succeeded")
        for rid, n in succ.items():
            if n > 1:
                v["duplicate_success"].append(f"{tag}: run {rid} succeeded {n} times")
        held = self.unfinished(expected, lines) if self.budget_binds() else set()
        for rid in sorted(self.unfinished(expected, lines) - held):
            tries = [(r["attempt"], r["phase"]) for r in lines if r["run_id"] == rid]
            v["run_lost"].append(f"{tag}: run {rid} neither succeeded nor exhausted: {tries}"
                                 + ("" if converged else " (did not converge in time)"))
        # Attempts on boxes. A directory the box's fence made in place of a stale entry (a tombstone, killed_reason
        # "fenced: ...") never ran, nor did a replayed stale enqueue that never started: neither counts here.
        stale = {(iid, name) for iid, name, _, _ in self.stale
                 if (d := self.scanner.seen.get((iid, name))) is None or d.started_at is None}
        where: dict[str, list[int]] = defaultdict(list)
        for (iid, name), info in self.scanner.seen.items():
            fenced = info.tombstone and info.started_at is None and (info.killed_reason or "").startswith("fenced")
            if (iid, name) in stale or fenced:
                continue
            where[name].append(iid)
        for name, iids in where.items():
            if len(iids) > 1:
                dirs = {i: self.scanner.seen[(i, name)] for i in iids}
                v["attempt_on_two_boxes"].append(f"{tag}: {name} on boxes {iids}: {dirs}")
            rid, att = name.rsplit(".", 1)
            if (rid, int(att)) not in keys:
                v["attempt_unarchived"].append(f"{tag}: {name} ran on box {iids} but was never archived")
        self._check_queues(tag, lines)
        spans: dict[str, list[tuple[float, float, int, str]]] = defaultdict(list)
        for (iid, name), info in self.scanner.seen.items():
            if info.started_at is None:
                continue
            rid, att = name.rsplit(".", 1)
            end = info.ended_at or info.heartbeat or info.started_at
            spans[rid].append((info.started_at, end, int(att), f"dir {name} on box {iid}"))
        for r in lines:  # a lost attempt's end is when it was noticed, not when it stopped: boxes tell those
            if r.get("started_at") and r.get("ended_at") and r["phase"] != "lost":
                spans[r["run_id"]].append((float(r["started_at"]), float(r["ended_at"]), int(r["attempt"]),
                                           f"archived attempt {r['attempt']}"))
        for rid, ss in spans.items():
            ss.sort()
            for i, (s1, e, att_a, a) in enumerate(ss):
                for s2, e2, att_b, b in ss[i + 1:]:
                    if att_b != att_a and s2 < e - 0.05:
                        v["concurrent_attempts"].append(
                            f"{tag}: run {rid}: {a} [{s1:.2f}, {e:.2f}] and {b} [{s2:.2f}, {e2:.2f}] overlap"
                        )
        # Orphans.
        left = self.scanner.owned()
        if left:
            v["orphan_box"].append(f"{tag}: boxes {left} still listed after the sweep")
        # Money.
        budget = yaml.safe_load((self.work / "desired" / "budget.yaml").read_text())
        total = self.emu.ledger.total_usd()
        for cap in ("max_total_usd", "max_daily_usd"):
            if budget.get(cap) is not None and total > float(budget[cap]) + 1e-6:
                v["over_cap"].append(f"{tag}: ledger ${total:.6f} > {cap} ${budget[cap]}")
        rates: dict[int, float] = {}
        for ev in sorted(self.emu.ledger.events, key=lambda e: e["t"]):
            box_id, typ = ev.get("instance_id"), ev["type"]
            if box_id is None:
                continue
            iid = int(box_id)
            if typ == "create":
                dph = float(ev.get("dph_total") or 0)
                if budget.get("max_instance_dph") and dph > float(budget["max_instance_dph"]) + 1e-9:
                    v["over_cap"].append(f"{tag}: box {iid} rented at ${dph}/h")
                rates[iid] = dph
                fleet = sum(rates.values())
                if budget.get("max_fleet_dph") and fleet > float(budget["max_fleet_dph"]) + 1e-9:
                    v["over_cap"].append(f"{tag}: fleet at ${fleet:.4f}/h after renting box {iid}")
            elif typ in ("destroy", "vanish", "outbid", "stop"):
                rates.pop(iid, None)
        # No force push.
        reflog = (self.remote / "logs" / "refs" / "heads" / "main").read_text().splitlines()
        for entry in reflog:
            old, new = entry.split()[:2]
            if set(old) != {"0"} and subprocess.run(["git", "merge-base", "--is-ancestor", old, new],
                                                     cwd=self.remote, check=False).returncode != 0:
                v["force_push"].append(f"{tag}: non-fast-forward update {old[:8]} -> {new[:8]}")
        final = git(self.remote, "rev-parse", "refs/heads/main")
        for tip in self.tips:
            if subprocess.run(["git", "merge-base", "--is-ancestor", tip, final], cwd=self.remote,
                              check=False).returncode != 0:
                v["force_push"].append(f"{tag}: recorded tip {tip[:8]} is not an ancestor of {final[:8]}")
        merges = git(self.remote, "rev-list", "--merges", "refs/heads/main")
        if merges:
            v["force_push"].append(f"{tag}: merge commits on the branch: {merges.split()[:3]}")
        # No secret anywhere.
        secrets = [self.emu.api_key]
        for key in self.state.rglob("id_ed25519"):
            body = [ln for ln in key.read_text().splitlines() if ln and not ln.startswith("-----")]
            secrets += [ln for ln in body if len(ln) >= 16]
        texts = {"git log -p --all (remote)": git(self.remote, "log", "-p", "--all")}
        for p in self.procs:
            texts[f"daemon log {p.log.name}"] = p.log.read_text(errors="replace")
        for clone in {p.checkout for p in self.procs}:
            for f in (clone / "observed").rglob("*") if (clone / "observed").is_dir() else []:
                if f.is_file():
                    texts[f"{f}"] = f.read_text(errors="replace")
        for where_, text in texts.items():
            for s in secrets:
                if s and s in text:
                    v["secret_leak"].append(f"{tag}: a secret ({s[:4]}...) in {where_}")
        # Recovery cycles and money.
        self._recovery()
        cost_succeeded = sum(float(r.get("cost_usd") or 0) for r in lines if r["phase"] == "succeeded")
        return {
            "schedule": self.index,
            "converged": converged,
            "faults": dict(Counter(f.kind for f in self.faults)),
            "skipped": dict(self.skipped),
            "not_applicable": dict(self.not_applicable),
            "not_applicable_why": sorted(self.na_why),
            "queue_entries_seen": len(self.scanner.queued),
            # entries whose epoch could not be read (no ``epoch`` file or JSON key): queued_started_after_fence
            # cannot judge those, so the number is shown
            "queue_entries_without_epoch": sum(1 for q in self.scanner.queued.values() if q.epoch is None),
            "fences_seen": {str(i): [f for _, f in h] for i, h in self.scanner.fences.items()},
            "stale_enqueues": [f"box {i} {n} epoch {e}: {a}" for i, n, e, a in self.stale],
            "unattended": list(self.unattended),
            "runs": len(expected),
            "runs_succeeded": len(succ),
            "runs_failed_exhausted": len(expected) - len(succ) - len(self.unfinished(expected, lines)),
            "runs_held_by_budget": len(held),
            "ledger_vs_total_cap": round(self.emu.ledger.total_usd() / float(budget["max_total_usd"]), 4),
            "attempts": len(keys),
            "boxes_rented": len(self.scanner.box_seen),
            "cycles": len(self.cycle_lines),
            "daemons_started": len(self.procs),
            "recovery_cycles": [f.recovery_cycles for f in self.faults],
            "recovery_by_kind": {k: [f.recovery_cycles for f in self.faults if f.kind == k]
                                 for k in sorted({f.kind for f in self.faults})},
            "succeeded_attempts_usd": round(cost_succeeded, 6),
            "violations": {k: list(vals) for k, vals in v.items() if vals},
        }

    def _check_queues(self, tag: str, lines: list[dict[str, Any]]) -> None:
        """The queue's invariants: nothing from an older epoch starts once a box was shown a newer one, nothing
        queued starts once the budget's headroom is gone, and an attempt queued on a box that vanished never runs
        (its run goes on as a new attempt, elsewhere)."""
        v = self.violations
        sc = self.scanner
        for iid, name, epoch, answer in self.stale:
            d = sc.seen.get((iid, name))
            if answer.startswith("accepted") and d is not None and d.started_at is not None and not d.tombstone:
                v["queued_started_after_fence"].append(
                    f"{tag}: stale enqueue {name} (epoch {epoch}) on box {iid} started at {d.started_at:.2f}: {answer}")
        for (iid, name), q in sc.queued.items():
            d = sc.seen.get((iid, name))
            if not q.epoch or d is None or d.started_at is None:
                continue
            known = [f for t, f in sc.fences.get(iid, []) if t < d.started_at - START_GRACE_S]
            if known and max(known) > q.epoch:
                v["queued_started_after_fence"].append(
                    f"{tag}: {name} (epoch {q.epoch}) started on box {iid} at {d.started_at:.2f}, after the box "
                    f"held epoch {max(known)}")
        # When each attempt given to a queue was queued (seen there first, or its archived queued_at).
        queued_at = {k: q.first_seen for k, q in sc.queued.items()}
        for r in lines:
            if r.get("queued_at") and r.get("instance_id"):
                k = (int(r["instance_id"]), f"{r['run_id']}.{r['attempt']}")
                queued_at[k] = min(queued_at.get(k, float("inf")), float(r["queued_at"]))
        for (iid, name), q_at in sorted(queued_at.items()):
            d = sc.seen.get((iid, name))
            if d is None or d.started_at is None:
                continue
            said = [(t, b) for t, b in self.binding if t < d.started_at - START_GRACE_S]
            # queued before the plan that found the headroom gone was pushed, started after it (and no plan since
            # found room again): that plan should have taken it out of the queue
            if said and said[-1][1] and q_at < said[-1][0]:
                v["queued_over_budget"].append(
                    f"{tag}: {name}, queued on box {iid} at {q_at:.2f}, started from its queue at "
                    f"{d.started_at:.2f}, after the remote's plan at {said[-1][0]:.2f} said no new work fits")
        for iid, name in self.vanished_queued:
            ran = [(i, info.started_at) for (i, n), info in sc.seen.items() if n == name and info.started_at]
            if ran:
                v["vanished_queued_attempt_started"].append(
                    f"{tag}: {name}, queued on box {iid} when it vanished, started on {ran}")

    def _recovery(self) -> None:
        seen = self.scanner.seen
        first_dir: dict[tuple[str, int], float] = {}
        for (_iid, name), info in seen.items():
            run_name, att_text = name.rsplit(".", 1)
            k = (run_name, int(att_text))
            first_dir[k] = min(first_dir.get(k, info.first_seen), info.first_seen)
        done_at: dict[str, float] = {}
        for r in self.archive():
            if r["phase"] == "succeeded" and r.get("ended_at"):
                done_at[r["run_id"]] = min(done_at.get(r["run_id"], 1e18), float(r["ended_at"]))
        for f in self.faults:
            healthy = f.t
            if f.box is not None:
                back = self.scanner.box_gone.get(f.box)
                if f.resumed_at is not None:
                    back = min(back or f.resumed_at, f.resumed_at)
                healthy = max(healthy, back if back is not None else float("inf"))
            for rid, att in f.runs:
                again = [when for (r, a), when in first_dir.items() if r == rid and a > att]
                cands = [*again, *([done_at[rid]] if rid in done_at else [])]
                healthy = max(healthy, min(cands) if cands else float("inf"))
            if f.kind == "never_boot":
                nb = [e for e in self.emu.ledger.events if e["type"] == "never_boot" and e.get("instance_id")
                      and e["t"] >= f.t - 1]
                if nb:
                    iid = int(nb[0]["instance_id"])
                    healthy = max(healthy, self.scanner.box_gone.get(iid, float("inf")))
            count = 0
            for t, line in self.cycle_lines:
                if t <= f.t:
                    continue
                count += 1
                if t >= healthy and not FAILED_LINE.search(line):
                    f.recovery_cycles = count
                    break


# ------------------------------------------------------------------------------------------------ the table


def run_schedules(cfg: Config, schedules: int, faults: int, baseline: bool, keep: bool = False) -> dict[str, Any]:
    started = time.monotonic()
    out: dict[str, Any] = {"bench": "chaos", "seed": cfg.seed, "schedules": schedules, "faults_per_schedule": faults,
                           "config": {"runs": cfg.runs, "run_seconds": cfg.run_seconds, "max_boxes": cfg.max_boxes,
                                      "retries": cfg.retries, "interval_s": cfg.interval_s,
                                      "lease_stale_s": cfg.lease_stale_s, "max_total_usd": cfg.max_total_usd,
                                      "queue_ahead": cfg.queue_ahead}}
    base: dict[str, Any] | None = None
    root = Path(tempfile.mkdtemp(prefix="rigsync-chaos-"))
    os.chmod(root, 0o755)
    try:
        if baseline:
            cfg.say("== baseline (no faults)")
            tmp = root / "baseline"
            tmp.mkdir()
            base = Schedule(cfg, 0, tmp, 0).run()
            cfg.say(f"== baseline: {json.dumps({k: x for k, x in base.items() if not isinstance(x, list | dict)})}")
        results = []
        for i in range(1, schedules + 1):
            cfg.say(f"== schedule {i} (seed {cfg.seed})")
            tmp = root / f"s{i}"
            tmp.mkdir()
            res = Schedule(cfg, i, tmp, faults).run()
            results.append(res)
            cfg.say(f"== schedule {i}: {json.dumps({k: x for k, x in res.items() if k != 'recovery_cycles'})}")
    finally:
        if keep:
            cfg.say(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    kinds: Counter[str] = Counter()
    skipped: Counter[str] = Counter()
    not_applicable: Counter[str] = Counter()
    violations: dict[str, int] = dict.fromkeys(INVARIANTS, 0)  # every invariant listed, 0 when it held
    details: list[str] = []
    rec: list[int] = []
    unrecovered = 0
    by_kind: dict[str, list[int]] = defaultdict(list)
    for r in results:
        kinds.update(r["faults"])
        skipped.update(r["skipped"])
        not_applicable.update(r["not_applicable"])
        for k, vals in r["violations"].items():
            violations[k] = violations.get(k, 0) + len(vals)
            details += vals
        for c in r["recovery_cycles"]:
            if c is None:
                unrecovered += 1
            else:
                rec.append(c)
        for k, cs in r["recovery_by_kind"].items():
            by_kind[k] += [c for c in cs if c is not None]
    ledger = sum(r["ledger_usd"] for r in results)
    succeeded = sum(r["runs_succeeded"] for r in results)
    out["faults_injected"] = sum(kinds.values())
    out["faults_by_kind"] = dict(sorted(kinds.items()))
    out["faults_skipped_by_kind"] = dict(sorted(skipped.items()))
    out["faults_not_applicable_by_kind"] = dict(sorted(not_applicable.items()))
    out["not_applicable_why"] = sorted({w for r in results for w in r["not_applicable_why"]})
    out["queue_entries_seen"] = sum(r["queue_entries_seen"] for r in results)
    out["queue_entries_without_epoch"] = sum(r["queue_entries_without_epoch"] for r in results)
    out["stale_enqueues"] = [s for r in results for s in r["stale_enqueues"]]
    out["unattended"] = [s for r in results for s in r["unattended"]]
    out["violations_by_invariant"] = violations
    out["violations_total"] = sum(violations.values())
    out["violation_details"] = details[:50]
    out["recovery_cycles"] = {
        "median": statistics.median(rec) if rec else None,
        "p90": sorted(rec)[int(0.9 * (len(rec) - 1))] if rec else None,
        "max": max(rec) if rec else None,
        "faults_measured": len(rec),
        "faults_not_recovered_by_the_end": unrecovered,
        "median_by_kind": {k: statistics.median(v) for k, v in sorted(by_kind.items()) if v},
        "max_by_kind": {k: max(v) for k, v in sorted(by_kind.items()) if v},
    }
    money: dict[str, Any] = {
        "ledger_usd": round(ledger, 6),
        "runs_succeeded": succeeded,
        "unproductive_usd": round(ledger - sum(r["succeeded_attempts_usd"] for r in results), 6),
        "runs_held_by_budget": sum(r.get("runs_held_by_budget", 0) for r in results),
        "max_ledger_vs_total_cap": max((r.get("ledger_vs_total_cap", 0.0) for r in results), default=0.0),
    }
    if base is not None and base["runs_succeeded"]:
        per_run = base["ledger_usd"] / base["runs_succeeded"]
        money["baseline_usd_per_succeeded_run"] = round(per_run, 6)
        money["extra_usd"] = round(ledger - per_run * succeeded, 6)
        money["extra_fraction"] = round(ledger / (per_run * succeeded) - 1, 3) if succeeded else None
        out["baseline"] = {k: x for k, x in base.items() if k not in ("recovery_cycles", "recovery_by_kind")}
    out["money"] = money
    out["schedules_detail"] = [{k: x for k, x in r.items() if k not in ("recovery_cycles", "recovery_by_kind",
                                                                       "violations")} for r in results]
    out["wall_s"] = round(time.monotonic() - started, 1)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--faults", type=int, default=25, help="faults per schedule (default 25)")
    ap.add_argument("--schedules", type=int, default=8, help="schedules (default 8: 200 faults)")
    ap.add_argument("--runs", type=int, default=12, help="the sweep's starting size")
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated fault kinds (default: all)")
    ap.add_argument("--queue-ahead", default=Config.queue_ahead,
                    help="the fleet's queue_ahead (default %(default)s: entries stay queued; 0s: no queue)")
    ap.add_argument("--keep", action="store_true", help="keep the fleet repositories and daemon logs")
    ap.add_argument("--no-baseline", action="store_true", help="skip the fault-free baseline (no extra_usd)")
    ap.add_argument("--max-total-usd", type=float, default=Config.max_total_usd,
                    help="the budget's total (and daily) cap; set it below what the sweep costs to prove a binding "
                    "cap holds under faults (on_exceed: drain): runs it holds back count as held, not lost")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # clean up daemons and boxes
    kinds = tuple(k for k in args.kinds.split(",") if k)
    unknown = set(kinds) - set(KINDS)
    if unknown:
        ap.error(f"unknown fault kinds: {sorted(unknown)}; known: {', '.join(KINDS)}")
    cfg = Config(seed=args.seed, faults=args.faults, runs=args.runs, kinds=kinds, max_total_usd=args.max_total_usd,
                 max_daily_usd=args.max_total_usd, queue_ahead=args.queue_ahead)
    out = run_schedules(cfg, args.schedules, args.faults, not args.no_baseline, args.keep)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
