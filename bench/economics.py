"""Economics: what a sweep costs under rigsync and under a typical in-house daemon, on the same churning market.

One sweep of runs that are long against boot time (about a minute of work each, 5 s boots) is run twice in this
invocation, each time on a fresh emulator with the same seed (so the same market), the same price drifts and the
same fault schedule (a vanish and an outbid of a box that is running work, ±10 % price drifts):

- ``rigsync``: the real ``FleetDaemon`` cycle in-process, as ``rigsync demo`` drives it (``reconciler.demo``'s
  throwaway fleet repo with a bare remote, ``make_fleet_repo`` and ``_drive`` reused), with the example fleet of
  ``desired/`` as configured: its offer filters, ranking (DLPerf per $), caps, ``max`` boxes, bootstrap, and its
  timeouts scaled by the bench's time factor (floors where an unscaled mechanism would otherwise trip: the on-box
  heartbeat is touched every 2 s, so ``heartbeat_stale`` >= 12 s, ``unreachable_grace`` >= 8 s, as the demo uses).
  The daemon's default 30 s interval, scaled.
- ``baseline``: what an in-house daemon typically does, written here against the real ``vastai`` SDK and paramiko,
  without any of rigsync's planner: rent the cheapest $/h offer passing the same filters (the fleet's, as a Vast
  query) for each pending run no idle box can take, up to the same number of boxes; poll serially (instance list,
  then one SSH command per box) every 60 s (scaled); launch over SSH with ``setsid nohup``; requeue the run of a box
  that is offline, stopped or unreachable past the same grace (and destroy that box); destroy a box after 10 min
  (scaled) idle.

- ``rigsync_interruptible`` (with ``--interruptible``): the same rigsync run with ``interruptible: {max_bid_dph:
  0.1}`` in the fleet: boxes are bid for where the market takes a bid (1.2x the minimum bid), the fault schedule's
  outbid lands on a bid box, and ``interruptible_vs_on_demand`` reports the saving over on-demand rigsync
  (``saving_fraction`` of the ledger) and the work lost to preemption (``lost_run_s``, run seconds of attempts that
  did not succeed; each requeued attempt resumes from its last synced checkpoint).

Time factor: 1/60 (a nominal 1 h run is ~1 min, a 5 min boot is 5 s, the baseline polls every 1 s and
destroys after 10 s idle). The work is ``experiments/train.py --seconds W`` (wall time W / the card's emulated speed
factor) wrapped in a tiny job script that appends its start and end (time, instance, speed, exit code) to a log
file on the host: the emulated boxes share the host's /tmp, so run seconds are measured the same way for both
policies, including attempts killed with their box.

Printed JSON, per policy (money from the emulator's per-second ledger, box lifetimes from its event log):
- ``ledger_usd``: what the emulator billed (GPU $/h while loading/running, storage while stopped/offline).
- ``lower_bound_usd``: Σ over succeeded runs of its work × the cheapest price of that work among the offers passing
  the fleet's filters at the run's start (the whole market, our own rentals included, after the drifts so far).
  Work = measured run seconds × the box's speed factor, its price per offer = dph_total / speed, so on equally fast
  cards this is exactly Σ run seconds × cheapest fitting $/h; ``lower_bound_literal_usd`` is that literal formula
  (measured seconds × cheapest fitting $/h), which is no bound when cards differ in speed (shown for comparison).
- ``cost_over_lower_bound``, ``makespan_s`` (policy start to the last run's success), ``billing_s`` (to the last box
  destroyed), ``idle_fraction`` (billed box-seconds during which no run was alive on the box, boot and storage-only
  seconds included, over all billed box-seconds), ``idle_usd_fraction`` (the same in dollars: ledger minus run
  seconds × the box's $/h), ``lost_run_s`` (run seconds of attempts that did not succeed: killed with their box, or
  duplicates), ``cost_breakdown_usd`` (the ledger split into succeeded runs, lost attempts and idle, each at the
  box's $/h), ``complete`` (every run succeeded once, nothing left billing), counts, and what each fault hit.
- ``rigsync_over_baseline``: the ratios, and ``targets`` (issue 9: cost <= 1.10x lower bound, idle <= 3 %, at least
  20 % cheaper than the baseline) with whether each was met. The figures are reported as they come.

Run (as root: the emulated boxes are sshd in namespaces; about 6-7 minutes, ``--quick`` about 2-3):

    .venv/bin/python bench/economics.py [--quick] [--seed 7] [--interruptible]
        [--only rigsync|baseline|rigsync_interruptible]

Progress goes to stderr, the JSON document to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paramiko
from vastai import VastAI

from reconciler import demo
from reconciler.adapters.vast import offer_from_record
from reconciler.daemon import DaemonConfig, FleetDaemon
from reconciler.desired import load_desired_from_dir
from reconciler.emulator import Emulator
from reconciler.emulator.market import price, speed_factor
from reconciler.emulator.testing import make_keypair
from reconciler.model import OfferFilters
from reconciler.offers import box_cap_dph, passing_offers, vast_query_terms

ROOT = Path(__file__).resolve().parents[1]
SCALE = 1 / 60  # real seconds per nominal second
DOWN_EVENTS = ("vanish", "offline", "stop", "outbid")

# The job both policies run: log start and end on the host (/tmp is shared with the emulated boxes), run the
# command in between. Standard library only; it runs with the box's python3.
JOB_SCRIPT = '''\
"""bench/economics.py job: append start/end of this attempt to a host-side log, run the command between."""
import json, os, subprocess, sys, time
log, run, attempt = sys.argv[1], sys.argv[2], sys.argv[3]
cmd = sys.argv[5:] if sys.argv[4:5] == ["--"] else sys.argv[4:]


def note(ev, **kw):
    rec = {"ev": ev, "run": run, "attempt": str(attempt), "instance": int(os.environ.get("CONTAINER_ID") or 0),
           "speed": float(os.environ.get("EMULATOR_SPEED_FACTOR") or 1.0), "t": time.time(), **kw}
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, (json.dumps(rec) + "\\n").encode())
    finally:
        os.close(fd)


note("start")
rc = subprocess.call(cmd)
note("end", rc=rc)
sys.exit(rc)
'''

TASKS = ("walker-walk", "cheetah-run")
LRS = ("3.0e-4", "1.0e-3")


@dataclass(frozen=True)
class Scenario:
    name: str
    seeds: tuple[int, ...]
    work_s: float  # train.py --seconds: wall time on a speed-1.0 card (RTX 3090); the fleet's cards run 0.35-0.7
    boot_s: float
    faults: tuple[tuple[float, str, int], ...]  # (seconds after the policy starts, kind, drift seed)
    timeout_s: float
    market_seed: int = 7
    offers: int = 200
    retries: int = 3

    @property
    def runs(self) -> int:
        return len(TASKS) * len(LRS) * len(self.seeds)


def scenario(quick: bool, seed: int) -> Scenario:
    if quick:
        return Scenario("quick", (1,), 10.0, 5.0,
                        ((6, "drift", 1), (14, "vanish", 0), (24, "outbid", 0), (34, "drift", 2)), 240.0, seed)
    return Scenario("full", (1, 2), 24.0, 5.0,
                    ((20, "drift", 1), (45, "vanish", 0), (80, "drift", 2), (110, "outbid", 0), (140, "drift", 3)),
                    420.0, seed)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------- durations and config

_DUR = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# Fleet timeouts scaled by SCALE, with floors where something on the box is not scaled (see the docstring).
FLOORS = {"idle_timeout": 0.0, "ttl": 60.0, "boot_timeout": 15.0, "unreachable_grace": 8.0, "heartbeat_stale": 12.0,
          "orphan_timeout": 15.0}


def parse_duration(text: str) -> float:
    parts = _DUR.findall(text.strip().strip("'\""))
    if not parts:
        raise ValueError(f"not a duration: {text!r}")
    return sum(float(n) * _UNIT[u] for n, u in parts)


def scaled_timeouts(fleet_text: str) -> dict[str, float]:
    """The example fleet's timeouts (whichever of FLOORS it has), scaled, floored, in seconds."""
    out = {}
    for key, floor in FLOORS.items():
        m = re.search(rf"^\s*{key}:\s*(\S+)", fleet_text, re.M)
        if m:
            out[key] = max(floor, round(parse_duration(m.group(1)) * SCALE, 1))
    return out


@dataclass(frozen=True)
class Acceptable:
    """What the fleet accepts (desired/fleet.yaml): the offer filters, disk, image and box cap both policies use."""

    filters: OfferFilters
    disk_gb: float
    image: str
    max_boxes: int
    timeouts: dict[str, float]


def acceptable() -> Acceptable:
    d = load_desired_from_dir(ROOT)
    f, pool = d.fleet, d.fleet.pools[0]
    filters = dataclasses.replace(pool.filters, dph_max=box_cap_dph(pool, d.budget))
    timeouts = scaled_timeouts((ROOT / "desired" / "fleet.yaml").read_text())
    return Acceptable(filters, pool.disk_gb, pool.image, int(f.max_instances or 1), timeouts)


# ------------------------------------------------------------------------------------- measurement helpers


class JobLog:
    def __init__(self, path: Path) -> None:
        self.path = path

    def lines(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    def busy(self) -> dict[int, float]:
        """Instances with an attempt started and not ended: instance -> when the attempt started."""
        open_: dict[tuple[int, str, str], float] = {}
        for r in self.lines():
            k = (int(r["instance"]), r["run"], r["attempt"])
            if r["ev"] == "start":
                open_[k] = float(r["t"])
            else:
                open_.pop(k, None)
        out: dict[int, float] = {}
        for (iid, _, _), t in open_.items():
            out[iid] = min(t, out.get(iid, t))
        return out


class MarketTape:
    """The cheapest fitting prices over time: a snapshot of the whole market at the start and after each drift."""

    def __init__(self, emu: Emulator, ok: Acceptable) -> None:
        self.emu, self.ok = emu, ok
        self.snaps: list[tuple[float, float, float]] = []  # (t, min $/h, min $/h per unit of speed)

    def snap(self) -> None:
        offers = [offer_from_record(price(o, self.ok.disk_gb, False)) for o in self.emu.market.all()]
        fit = passing_offers(offers, self.ok.filters, self.ok.disk_gb)
        if not fit:
            raise SystemExit("bench: no offer in the emulated market passes the fleet's filters")
        self.snaps.append((time.time(), min(o.dph_total for o in fit),
                           min(o.dph_total / speed_factor(o.gpu_name) for o in fit)))

    def at(self, t: float) -> tuple[float, float]:
        best = self.snaps[0]
        for s in self.snaps:
            if s[0] <= t:
                best = s
        return best[1], best[2]


class Faults(threading.Thread):
    """The fault schedule, relative to the policy's start: drifts at fixed times; a vanish or outbid hits the busy
    box whose current attempt started first (waiting until some box is busy)."""

    def __init__(self, emu: Emulator, sc: Scenario, log: JobLog, tape: MarketTape, t0: float) -> None:
        super().__init__(name="econ-faults", daemon=True)
        self.emu, self.sc, self.log, self.tape, self.t0 = emu, sc, log, tape, t0
        self.stop = threading.Event()
        self.fired: list[dict[str, Any]] = []

    def run(self) -> None:
        for at, kind, seed in self.sc.faults:
            while not self.stop.is_set():
                now = time.time() - self.t0
                if now < at:
                    self.stop.wait(min(0.2, at - now))
                    continue
                if kind == "drift":
                    self.emu.drift_prices(0.1, seed)
                    self.tape.snap()
                    self.fired.append({"t": round(now, 1), "kind": "drift", "max_fraction": 0.1, "seed": seed})
                    break
                alive = set(self.emu.instance_ids())
                busy = {i: t for i, t in self.log.busy().items() if i in alive}
                busy = {i: t for i, t in busy.items() if self._running(i)}
                if busy:
                    victim = min(busy, key=lambda i: (busy[i], i))
                    with contextlib.suppress(Exception):
                        (self.emu.vanish if kind == "vanish" else self.emu.outbid)(victim)
                        self.fired.append({"t": round(now, 1), "kind": kind, "instance": victim,
                                           "attempt_age_s": round(time.time() - busy[victim], 1)})
                    break
                self.stop.wait(0.2)

    def _running(self, iid: int) -> bool:
        try:
            return self.emu.status(iid) == "running"
        except Exception:
            return False


@dataclass
class PolicyRun:
    name: str
    t0: float = 0.0
    t_end: float = 0.0
    ledger_usd: float = 0.0
    events: list[dict[str, Any]] = field(default_factory=list)
    jobs: list[dict[str, Any]] = field(default_factory=list)
    tape: MarketTape | None = None
    faults: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    timed_out: bool = False
    alive_at_end: int = 0


def analyse(p: PolicyRun, runs_total: int) -> dict[str, Any]:
    boxes: dict[int, dict[str, Any]] = {}
    for ev in sorted(p.events, key=lambda x: x["t"]):
        iid = ev.get("instance_id")
        if iid is None:
            continue
        if ev["type"] == "create":
            boxes[iid] = {"created": ev["t"], "dph": float(ev["dph_total"]), "down": None, "gone": None}
        elif iid in boxes:
            b = boxes[iid]
            if ev["type"] in DOWN_EVENTS and b["down"] is None:
                b["down"] = ev["t"]
            elif ev["type"] == "start":
                b["down"] = None
            elif ev["type"] == "destroy":
                b["gone"] = ev["t"]
    for b in boxes.values():
        b["gone"] = b["gone"] if b["gone"] is not None else p.t_end
        b["up_end"] = min(b["down"] or b["gone"], b["gone"])
    starts: dict[tuple[int, str, str], dict[str, Any]] = {}
    ends: dict[tuple[int, str, str], dict[str, Any]] = {}
    for r in p.jobs:
        k = (int(r["instance"]), r["run"], r["attempt"])
        (starts if r["ev"] == "start" else ends)[k] = r
    intervals: dict[int, list[tuple[float, float]]] = {}
    succeeded: dict[str, tuple[float, float, float]] = {}  # run -> (start, end, speed), first success
    duplicate = lost_s = lost_usd = succeeded_usd = 0.0
    for k, s in starts.items():
        iid = k[0]
        if iid not in boxes:
            continue
        b = boxes[iid]
        e = ends.get(k)
        t_s = max(float(s["t"]), b["created"])
        t_e = min(float(e["t"]) if e else b["up_end"], b["up_end"])
        if t_e <= t_s:
            continue
        intervals.setdefault(iid, []).append((t_s, t_e))
        usd = (t_e - t_s) * b["dph"] / 3600
        if e is not None and int(e.get("rc", 1)) == 0 and k[1] not in succeeded:
            succeeded[k[1]] = (t_s, t_e, float(s.get("speed") or 1.0))
            succeeded_usd += usd
        else:
            duplicate += e is not None and int(e.get("rc", 1)) == 0
            lost_s += t_e - t_s
            lost_usd += usd
    billed_s = busy_s = run_usd = 0.0
    for iid, b in boxes.items():
        billed_s += b["gone"] - b["created"]
        merged: list[list[float]] = []
        for a, z in sorted(intervals.get(iid, [])):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], z)
            else:
                merged.append([a, z])
        box_busy = sum(z - a for a, z in merged)
        busy_s += box_busy
        run_usd += box_busy * b["dph"] / 3600
    assert p.tape is not None
    lb = lb_literal = run_s = 0.0
    for t_s, t_e, speed in succeeded.values():
        min_dph, min_per_speed = p.tape.at(t_s)
        secs = t_e - t_s
        run_s += secs
        lb += secs * speed * min_per_speed / 3600
        lb_literal += secs * min_dph / 3600
    last_success = max((z for _, z, _ in succeeded.values()), default=p.t_end)
    return {
        "ledger_usd": round(p.ledger_usd, 6),
        "lower_bound_usd": round(lb, 6),
        "cost_over_lower_bound": round(p.ledger_usd / lb, 3) if lb else None,
        "lower_bound_literal_usd": round(lb_literal, 6),
        "makespan_s": round(last_success - p.t0, 1),
        "billing_s": round(max((b["gone"] for b in boxes.values()), default=p.t0) - p.t0, 1),
        "idle_fraction": round(1 - busy_s / billed_s, 4) if billed_s else None,
        "idle_usd_fraction": round(1 - run_usd / p.ledger_usd, 4) if p.ledger_usd else None,
        "cost_breakdown_usd": {"succeeded_runs": round(succeeded_usd, 6), "lost_attempts": round(lost_usd, 6),
                               "idle": round(p.ledger_usd - succeeded_usd - lost_usd, 6)},
        "complete": len(succeeded) == runs_total and not duplicate and not p.alive_at_end and not p.timed_out,
        "billed_box_s": round(billed_s, 1),
        "run_s_succeeded": round(run_s, 1),
        "lost_run_s": round(lost_s, 1),
        "runs_total": runs_total,
        "runs_succeeded": len(succeeded),
        "duplicate_successes": int(duplicate),
        "attempts": len(starts),
        "boxes_rented": len(boxes),
        "rented": sorted(
            {f"{iid}: ${b['dph']:.4f}/h, up {b['up_end'] - b['created']:.0f}s, billed {b['gone'] - b['created']:.0f}s"
             for iid, b in boxes.items()}
        ),
        "faults": p.faults,
        "alive_at_end": p.alive_at_end,
        "timed_out": p.timed_out,
        **p.extra,
    }


# ------------------------------------------------------------------------------------- the workload


def train_args(task: str, lr: str, seed: int, sc: Scenario, out: str) -> list[str]:
    return ["experiments/train.py", "--task", task, "--lr", lr, "--seed", str(seed), "--seconds", f"{sc.work_s:g}",
            "--out", out]


def max_runtime_s(sc: Scenario) -> int:
    return int(sc.work_s / 0.3 * 2) + 30  # twice the slowest card's wall time, plus slack


def sweep_yaml(sc: Scenario, log: Path) -> str:
    return f"""\
# bench/economics.py: {sc.runs} runs of ~{sc.work_s:g}s of speed-1.0 work (train.py), timed by a host-side job log
name: econ
priority: 10
code: [experiments]
command: >-
  {{{{ python }}}} experiments/econ_job.py {log} {{{{ run_id }}}} {{{{ attempt }}}} --
  {{{{ python }}}} experiments/train.py --task {{{{ task }}}} --lr {{{{ lr }}}} --seed {{{{ seed }}}}
  --seconds {sc.work_s:g} --out {{{{ run_dir }}}}/metrics.jsonl
grid:
  task: [{", ".join(TASKS)}]
  lr: [{", ".join(LRS)}]
seeds: [{", ".join(str(s) for s in sc.seeds)}]
resources:
  gpus: 1
  min_gpu_ram_gib: 4
max_runtime: {max_runtime_s(sc)}s
retries: {sc.retries}
metrics:
  file: metrics.jsonl
  key: episode_reward
  goal: max
"""


# ------------------------------------------------------------------------------------- rigsync


MAX_BID_DPH = 0.1  # the interruptible run's fleet.yaml interruptible.max_bid_dph (the example fleet caps boxes at 0.15)


def run_rigsync_interruptible(sc: Scenario, ok: Acceptable, tmp: Path) -> PolicyRun:
    """rigsync with ``interruptible: {max_bid_dph: MAX_BID_DPH}``: bid boxes where the market takes a bid."""
    return run_rigsync(sc, ok, tmp, max_bid_dph=MAX_BID_DPH)


def run_rigsync(sc: Scenario, ok: Acceptable, tmp: Path, max_bid_dph: float | None = None) -> PolicyRun:
    name = "rigsync" if max_bid_dph is None else "rigsync_interruptible"
    res = PolicyRun(name)
    log = JobLog(tmp / f"jobs-{name}.jsonl")
    workdir = tmp / name / "fleet"
    workdir.parent.mkdir(parents=True)
    state = tmp / name / "state"
    interval = round(DaemonConfig().interval_s * SCALE, 2)
    old_key = os.environ.get("VAST_API_KEY")
    with Emulator(seed=sc.market_seed, offers=sc.offers, boot_delay=sc.boot_s) as emu:
        try:
            os.environ["VAST_API_KEY"] = emu.api_key
            demo.make_fleet_repo(workdir, None)
            fleet = workdir / "desired" / "fleet.yaml"
            text = fleet.read_text()
            for key, secs in ok.timeouts.items():
                text = demo._set_key(text, key, f"{secs:g}s")
            if max_bid_dph is not None:
                text += f"interruptible: {{max_bid_dph: {max_bid_dph}}}\n"
            fleet.write_text(text)
            for old in (workdir / "desired" / "sweeps").glob("*.yaml"):
                old.unlink()
            (workdir / "desired" / "sweeps" / "econ.yaml").write_text(sweep_yaml(sc, log.path))
            (workdir / "experiments" / "econ_job.py").write_text(JOB_SCRIPT)
            demo._git(workdir, "add", "-A")
            demo._git(workdir, "commit", "-q", "-m", "bench: the economics sweep, fleet timeouts scaled")
            demo._git(workdir, "push", "-q", "origin", "main")
            daemon = FleetDaemon(workdir, config=DaemonConfig(interval_s=interval, lease_renew_s=30.0),
                                 state_dir=str(state), api_url=emu.url)
            daemon.acquire()
            res.tape = MarketTape(emu, ok)
            res.t0 = time.time()
            res.tape.snap()
            faults = Faults(emu, sc, log, res.tape, res.t0)
            faults.start()
            opts = demo.DemoOptions(timeout_s=sc.timeout_s, interval_s=interval, say=lambda s: say(f"{name} {s}"))
            try:
                summary = demo._drive(daemon, emu, opts, None, time.monotonic())
            finally:
                faults.stop.set()
                faults.join(timeout=5)
                if daemon.reconciler is not None:
                    daemon.reconciler.shell.close()
                daemon.release()
            res.t_end = time.time()
            res.timed_out = summary.timed_out
            res.alive_at_end = len(emu.instance_ids())
            res.ledger_usd = emu.ledger.total_usd()
            res.events = emu.ledger.events
            res.jobs = log.lines()
            res.faults = faults.fired
            res.extra = {"cycles": summary.cycles, "runs_failed": summary.runs_failed,
                         "config": {"interval_s": interval, **{k: f"{v:g}s" for k, v in ok.timeouts.items()},
                                    "max_boxes": ok.max_boxes, "ranking": "dlperf_per_dph",
                                    "max_bid_dph": max_bid_dph},
                         "bid_boxes": sum(1 for e in emu.ledger.events if e["type"] == "create" and e.get("is_bid"))}
        finally:
            if old_key is None:
                os.environ.pop("VAST_API_KEY", None)
            else:
                os.environ["VAST_API_KEY"] = old_key
    return res


# ------------------------------------------------------------------------------------- baseline


@dataclass
class Job:
    run: str
    argv: list[str]
    attempts: int = 0


@dataclass
class Box:
    iid: int
    created: float
    job: Job | None = None
    launched: bool = False
    idle_since: float | None = None
    unreachable_since: float | None = None
    client: paramiko.SSHClient | None = None
    shipped: bool = False


class Baseline:
    """A typical in-house GPU daemon: cheapest $/h per pending run, serial polling, SSH, destroy after idle."""

    def __init__(self, emu: Emulator, sc: Scenario, ok: Acceptable, key: Path, log: JobLog) -> None:
        self.sc, self.ok, self.key, self.log = sc, ok, key, log
        self.v = VastAI(api_key=emu.api_key, server_url=emu.url)
        self.query = " ".join(vast_query_terms(ok.filters, ok.disk_gb))  # the fleet's filters, as a user types them
        self.poll_s = 60 * SCALE
        self.idle_s = 600 * SCALE
        self.grace_s = ok.timeouts.get("unreachable_grace", 8.0)
        self.boot_timeout_s = ok.timeouts.get("boot_timeout", 15.0)
        self.pending: deque[Job] = deque(
            Job(f"{task}-{lr}-{seed}", train_args(task, lr, seed, sc, "out/metrics.jsonl"))
            for task in TASKS for lr in LRS for seed in sc.seeds
        )
        self.total = len(self.pending)
        self.done: set[str] = set()
        self.failed: set[str] = set()
        self.boxes: dict[int, Box] = {}
        self.polls = 0
        self.api_errors = 0

    # -- provider
    def _api(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:  # a flaky API: try again next poll
            self.api_errors += 1
            say(f"baseline: API error {type(exc).__name__}: {str(exc)[:120]}")
            return None

    def destroy(self, box: Box, why: str) -> None:
        say(f"baseline: destroy {box.iid} ({why})")
        if box.client is not None:
            box.client.close()
        self._api(lambda: self.v.destroy_instance(id=box.iid))
        self.boxes.pop(box.iid, None)

    def requeue(self, box: Box) -> None:
        job, box.job = box.job, None
        if job is None:
            return
        if job.attempts > self.sc.retries:
            self.failed.add(job.run)
        else:
            self.pending.appendleft(job)

    def rent(self, job: Job) -> bool:
        offers = self._api(lambda: self.v.search_offers(query=self.query, order="dph_total", limit=5,
                                                         storage=self.ok.disk_gb))
        for o in offers or []:
            def create(o: dict[str, Any] = o) -> Any:
                return self.v.create_instance(id=o["id"], image=self.ok.image, disk=self.ok.disk_gb,
                                              label="inhouse-worker", ssh=True, direct=True)

            r = self._api(create)
            if isinstance(r, dict) and r.get("new_contract"):
                iid = int(r["new_contract"])
                self.boxes[iid] = Box(iid, time.time(), job=job)
                say(f"baseline: rent {iid} {o['gpu_name']} at ${o['dph_total']:.4f}/h for {job.run}")
                return True
        return False

    # -- SSH
    def _ssh(self, box: Box, rec: dict[str, Any], command: str) -> tuple[int, str]:
        if box.client is None:
            c = paramiko.SSHClient()
            c.set_missing_host_key_policy(paramiko.AutoAddPolicy())  # throwaway boxes, as in-house tools do
            c.connect(rec["ssh_host"], int(rec["ssh_port"]), username="root", key_filename=str(self.key),
                      timeout=5, banner_timeout=5, auth_timeout=5, look_for_keys=False, allow_agent=False)
            box.client = c
        _, out, _ = box.client.exec_command(command, timeout=10)
        text = out.read().decode(errors="replace")
        return out.channel.recv_exit_status(), text

    def _launch(self, box: Box, rec: dict[str, Any]) -> None:
        assert box.job is not None
        if not box.shipped:
            self._ssh(box, rec, "mkdir -p ~/job/experiments")
            assert box.client is not None
            with box.client.open_sftp() as sftp:
                sftp.put(str(ROOT / "experiments" / "train.py"), "job/experiments/train.py")
                with sftp.open("job/experiments/econ_job.py", "w") as fh:
                    fh.write(JOB_SCRIPT)
            box.shipped = True
        job = box.job
        job.attempts += 1
        rdir = f"runs/{job.run}.{job.attempts}"
        argv = [a if a != "out/metrics.jsonl" else f"{rdir}/metrics.jsonl" for a in job.argv]
        inner = (f"python3 experiments/econ_job.py {shlex.quote(str(self.log.path))} {job.run} {job.attempts} -- "
                 f"python3 {' '.join(shlex.quote(a) for a in argv)}; echo $? > {rdir}/exit_code")
        cmd = (f"cd ~/job || exit 1; mkdir -p {rdir} || exit 1; CUDA_VISIBLE_DEVICES=0 setsid nohup "
               f"sh -c {shlex.quote(inner)} > {rdir}/out.log 2>&1 < /dev/null &")
        rc, _ = self._ssh(box, rec, cmd)
        if rc != 0:
            raise OSError(f"launch exited {rc}")
        box.launched = True
        say(f"baseline: launch {job.run} attempt {job.attempts} on {box.iid}")

    # -- one serial poll
    def poll(self) -> None:
        self.polls += 1
        rows = self._api(self.v.show_instances)
        if rows is None:
            return
        by_id = {int(r["id"]): r for r in rows if isinstance(r, dict)}
        now = time.time()
        for box in list(self.boxes.values()):
            rec = by_id.get(box.iid)
            status = rec.get("actual_status") if rec else "gone"
            if status in ("offline", "stopped", "exited", "gone"):
                self.requeue(box)
                self.destroy(box, f"status {status}")
                continue
            if status != "running":
                if now - box.created > self.boot_timeout_s:
                    self.requeue(box)
                    self.destroy(box, "boot timeout")
                continue
            assert rec is not None
            try:
                if box.job is not None and not box.launched:
                    self._launch(box, rec)
                elif box.job is not None:
                    _, out = self._ssh(box, rec, f"cat ~/job/runs/{box.job.run}.{box.job.attempts}/exit_code "
                                                 "2>/dev/null || echo running")
                    if out.strip() != "running":
                        job, box.job, box.launched, box.idle_since = box.job, None, False, now
                        if out.strip() == "0":
                            self.done.add(job.run)
                        elif job.attempts > self.sc.retries:
                            self.failed.add(job.run)
                        else:
                            self.pending.append(job)
                box.unreachable_since = None
            except Exception as exc:
                if box.client is not None:
                    box.client.close()
                    box.client = None
                box.unreachable_since = box.unreachable_since or now
                if now - box.unreachable_since > self.grace_s:
                    say(f"baseline: {box.iid} unreachable ({type(exc).__name__}: {exc})")
                    box.launched = False
                    self.requeue(box)
                    self.destroy(box, "unreachable past grace")
                continue
            if box.job is None and box.idle_since is not None and now - box.idle_since > self.idle_s:
                self.destroy(box, f"idle {now - box.idle_since:.0f}s")
        # Hand pending runs to idle boxes first, then rent the cheapest offer per run, up to the box cap.
        while self.pending:
            idle = next((b for b in self.boxes.values() if b.job is None and b.iid in by_id
                         and by_id[b.iid].get("actual_status") == "running"), None)
            if idle is not None:
                idle.job = self.pending.popleft()
                try:
                    self._launch(idle, by_id[idle.iid])
                except Exception:
                    idle.launched = False  # retried next poll
                continue
            if len(self.boxes) >= self.ok.max_boxes or not self.rent(self.pending[0]):
                break
            self.pending.popleft()

    def finished(self) -> bool:
        return len(self.done | self.failed) >= self.total and not self.boxes

    def destroy_all(self) -> None:
        for box in list(self.boxes.values()):
            self.destroy(box, "bench timeout")


def run_baseline(sc: Scenario, ok: Acceptable, tmp: Path) -> PolicyRun:
    res = PolicyRun("baseline")
    log = JobLog(tmp / "jobs-baseline.jsonl")
    kp = make_keypair(tmp / "baseline-key")
    with Emulator(seed=sc.market_seed, offers=sc.offers, boot_delay=sc.boot_s) as emu:
        VastAI(api_key=emu.api_key, server_url=emu.url).create_ssh_key(ssh_key=kp.public)
        b = Baseline(emu, sc, ok, kp.private_path, log)
        res.tape = MarketTape(emu, ok)
        res.t0 = time.time()
        res.tape.snap()
        faults = Faults(emu, sc, log, res.tape, res.t0)
        faults.start()
        deadline = time.monotonic() + sc.timeout_s
        try:
            while not b.finished():
                if time.monotonic() > deadline:
                    res.timed_out = True
                    b.destroy_all()
                    break
                b.poll()
                if b.finished():
                    break
                time.sleep(b.poll_s)
        finally:
            faults.stop.set()
            faults.join(timeout=5)
            for box in b.boxes.values():
                if box.client is not None:
                    box.client.close()
        res.t_end = time.time()
        res.alive_at_end = len(emu.instance_ids())
        res.ledger_usd = emu.ledger.total_usd()
        res.events = emu.ledger.events
        res.jobs = log.lines()
        res.faults = faults.fired
        res.extra = {"polls": b.polls, "api_errors": b.api_errors, "runs_failed": len(b.failed),
                     "config": {"poll_s": b.poll_s, "idle_destroy_s": b.idle_s, "unreachable_grace_s": b.grace_s,
                                "boot_timeout_s": b.boot_timeout_s, "max_boxes": ok.max_boxes,
                                "order": "dph_total ascending", "query": b.query}}
    return res


# ------------------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4 shorter runs and a compressed fault schedule")
    ap.add_argument("--seed", type=int, default=7, help="the emulated market's seed (default 7, the demo's)")
    ap.add_argument("--only", choices=("rigsync", "baseline", "rigsync_interruptible"),
                    help="run one policy only (no ratios)")
    ap.add_argument("--interruptible", action="store_true",
                    help=f"also run rigsync with interruptible: {{max_bid_dph: {MAX_BID_DPH}}} and report its saving "
                    "over on-demand rigsync and the work lost to preemption")
    args = ap.parse_args()
    sc = scenario(args.quick, args.seed)
    ok = acceptable()
    tmp = Path(tempfile.mkdtemp(prefix="rigsync-econ-"))
    os.chmod(tmp, 0o755)
    started = time.monotonic()
    out: dict[str, Any] = {
        "bench": "economics",
        "variant": sc.name,
        "workload": {"runs": sc.runs, "work_s_at_speed_1": sc.work_s, "boot_s": sc.boot_s, "time_scale": "1/60",
                     "market_seed": sc.market_seed, "offers": sc.offers, "retries": sc.retries,
                     "fault_schedule_s": [list(f) for f in sc.faults]},
    }
    try:
        results: dict[str, dict[str, Any]] = {}
        policies: list[tuple[str, Any]] = [("rigsync", run_rigsync), ("baseline", run_baseline)]
        if args.interruptible or args.only == "rigsync_interruptible":
            policies.append(("rigsync_interruptible", run_rigsync_interruptible))
        for name, fn in policies:
            if args.only and args.only != name:
                continue
            say(f"== {name}")
            p = fn(sc, ok, tmp)
            results[name] = analyse(p, sc.runs)
            say(f"== {name}: {json.dumps({k: v for k, v in results[name].items() if not isinstance(v, list)})}")
        out.update(results)
        if "rigsync" in results and "rigsync_interruptible" in results:
            on_demand, spot = results["rigsync"], results["rigsync_interruptible"]
            out["interruptible_vs_on_demand"] = {
                "saving_fraction": round(1 - spot["ledger_usd"] / on_demand["ledger_usd"], 3)
                if on_demand.get("ledger_usd") else None,
                "ledger_usd": [on_demand["ledger_usd"], spot["ledger_usd"]],
                "lost_run_s": [on_demand.get("lost_run_s"), spot.get("lost_run_s")],
                "makespan_s": [on_demand.get("makespan_s"), spot.get("makespan_s")],
                "complete": [on_demand.get("complete"), spot.get("complete")],
            }
        if "rigsync" in results and "baseline" in results:
            r, b = results["rigsync"], results["baseline"]

            def ratio(k: str) -> float | None:
                return round(r[k] / b[k], 3) if r.get(k) and b.get(k) else None

            out["rigsync_over_baseline"] = {k: ratio(k) for k in
                                            ("ledger_usd", "makespan_s", "billing_s", "idle_fraction",
                                             "cost_over_lower_bound")}
            cost_ratio = out["rigsync_over_baseline"]["ledger_usd"]
            out["targets"] = {
                "rigsync_cost_over_lower_bound_le_1.10": (r["cost_over_lower_bound"] or 99) <= 1.10,
                "rigsync_idle_fraction_le_0.03": (r["idle_fraction"] or 1) <= 0.03,
                "rigsync_at_least_20pct_cheaper_than_baseline": cost_ratio is not None and cost_ratio <= 0.80,
            }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out["wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
