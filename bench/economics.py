"""Economics: what a sweep costs under rigsync and under a typical in-house daemon, on the same churning market.

One invocation runs a matrix of scenarios. Per market seed (``--seeds``, default 7 and 11) two run-length mixes,
each on both policies, each policy on a fresh emulator with that seed (so the same market), the same price drifts
and the same fault schedule (a vanish and an outbid of a box that is running work, ±10 % price drifts):

- ``long-seedN``: runs much longer than a boot: 8 runs of 24 s of speed-1 work (34-69 s on the fleet's cards,
  speed 0.35-0.7), 5 s boots.
- ``short-seedN``: runs about as long as a boot: 12 runs of 2.5 s of speed-1 work (3.6-7.1 s), 5 s boots.

and then ``defaults``: rigsync alone at its default settings, unscaled: the daemon's default 30 s interval, the
example fleet's own timeouts (idle_timeout 10m, unreachable_grace 2m, heartbeat_stale 60s, boot_timeout 15m: the
demo's short ones undone), queue_ahead as the example fleet or the fleet default gives it, 3 boxes
(``instances.max``), runs of about a minute (8 runs of 30 s of speed-1 work: 43-86 s), 5 s boots, two drifts and
no box faults (an unscaled grace would make one cost minutes of wall time).

The policies:

- ``rigsync``: the real ``FleetDaemon`` cycle in-process, as ``rigsync demo`` drives it (``reconciler.demo``'s
  throwaway fleet repo with a bare remote, ``make_fleet_repo`` and ``_drive`` reused), with the example fleet of
  ``desired/`` as configured: its offer filters, ranking, caps, ``max`` boxes, bootstrap. In the scaled scenarios
  its timeouts and queue_ahead are scaled by the bench's time factor (floors where an unscaled mechanism would
  otherwise trip: the on-box heartbeat is touched every 2 s, so ``heartbeat_stale`` >= 12 s, ``unreachable_grace``
  >= 8 s, as the demo uses) and so is the daemon's default 30 s interval.
- ``baseline``: what an in-house daemon typically does, written here against the real ``vastai`` SDK and paramiko,
  without any of rigsync's planner: rent the cheapest $/h offer passing the same filters (the fleet's, as a Vast
  query) for each pending run no idle box can take, up to the same number of boxes; poll serially (instance list,
  then one SSH command per box) every 60 s (scaled); launch over SSH with ``setsid nohup``; requeue the run of a box
  that is offline, stopped or unreachable past the same grace (and destroy that box); destroy a box after 10 min
  (scaled) idle.
- ``rigsync_interruptible`` (with ``--interruptible``, in each (seed, mix)): the same rigsync run with
  ``interruptible: {max_bid_dph: 0.1}`` in the fleet: boxes are bid for where the market takes a bid (1.2x the
  minimum bid), the fault schedule's outbid lands on a bid box, and ``interruptible_vs_on_demand`` reports the
  saving over on-demand rigsync (``saving_fraction`` of the ledger) and the work lost to preemption.

Time factor of the scaled scenarios: 1/60 (a nominal 1 h run is ~1 min, a 5 min boot is 5 s, the baseline polls
every 1 s and destroys after 10 s idle). The work is ``experiments/train.py --seconds W`` (wall time W / the card's
emulated speed factor) wrapped in a tiny job script that appends its start and end (time, instance, speed, exit
code) to a log file on the host: the emulated boxes share the host's /tmp, so run seconds are measured the same way
for both policies, including attempts killed with their box.

Concurrency: the scaled scenarios run one policy at a time (their figures are seconds long and a second controller
would share the 2 cores with the one measured); the ``defaults`` scenario runs beside them in a child process (its
controller sleeps 30 s between cycles, and its figures are at that granularity). ``--sequential`` runs it after.

Printed JSON: ``scenarios`` (per scenario its ``workload``, per policy the figures below, ``rigsync_over_baseline``,
``targets`` and ``targets_met``), a ``summary`` row per scenario, ``targets_met`` per scenario, ``host`` (cores,
load averages: other work on the host slows the controllers' cycles) and ``wall_s``. Per
policy (money from the emulator's per-second ledger, box lifetimes from its event log, attempts from the job log):
- ``ledger_usd``: what the emulator billed (GPU $/h while loading/running, storage while stopped/offline).
- ``lower_bound_usd`` (today's bound): Σ over succeeded runs of its work × the cheapest price of that work among the
  offers passing the fleet's filters at the run's start (the whole market, our own rentals included, after the
  drifts so far). Work = measured run seconds × the box's speed factor, its price per offer = dph_total / speed.
  ``lower_bound_literal_usd`` is the literal formula (measured seconds × cheapest fitting $/h), shown for
  comparison. ``cost_over_lower_bound`` = ledger / lower bound.
- ``k_box_bound_usd``: the same work W on the k = ``instances.max`` offers cheapest per unit of work (dph / speed,
  among the offers passing the filters), in parallel and finishing together: box i does speed_i × T of the work,
  T = W / Σ speed, each box billed from its first run to its last (no boot, no gap, work divisible), so the bill is
  W × Σ dph / Σ speed. Taken at the market snapshot (start or after a drift) where it is cheapest.
  ``k_box_bound`` gives k, that rate, the combined speed and T (``ideal_makespan_s``); ``cost_over_k_box_bound`` =
  ledger / k-box bound.
- ``makespan_s`` (policy start to the last run's success), ``billing_s`` (to the last box destroyed),
  ``idle_fraction`` (billed box-seconds during which no run was alive on the box, boot and storage-only seconds
  included, over all billed box-seconds), ``idle_usd_fraction`` (the same in dollars).
- ``ops_tax_usd`` (billed $ not spent on succeeded work), ``ops_tax_fraction`` and ``ops_tax_breakdown_usd``:
  ``boot`` (create to running, and again after a restart), ``bootstrap`` (running to the box's first attempt: the
  bootstrap script, code shipping and the wait for a launch), ``idle`` (running with no attempt alive after the
  first one, and all the running time of a box that never ran one), ``lost`` (attempts that did not succeed: failed,
  killed with their box), ``duplicate`` (successes of a run that had already succeeded), ``other`` (the ledger's
  rest: storage billed while a box was down, rounding); each at the box's $/h. ``ops_tax_breakdown_s`` the seconds.
- ``timelines``: per box its GPU, $/h, created and destroyed (seconds after the policy's start) and its segments in
  order: boot, bootstrap, each attempt (succeeded, lost or duplicate; run, attempt, exit code), idle, down.
- ``cost_breakdown_usd`` (succeeded runs, lost attempts, the rest), ``complete`` (every run succeeded once, nothing
  left billing), counts, and what each fault hit; for rigsync ``mean_cycle_period_s`` (its wall time over its
  cycles: the configured interval plus each cycle's own time, which a loaded host stretches).

Targets, per (seed, mix): ledger <= 1.15x the k-box bound, idle <= 3 % of billed box-seconds, ledger <= 0.80x the
baseline's and makespan <= 0.80x the baseline's. At the defaults: idle <= 12 % and ledger <= 1.30x the k-box bound.
Every scenario also needs rigsync ``complete``. The figures are reported as they come, met or not.

Run as root (the emulated boxes are sshd in namespaces). The full matrix took 18 minutes on 2 cores; ``--quick``
(the same matrix with 4 runs per scenario, the long ones of 10 s of work, the faults sooner) took 7; both with a
load average near 10 from other work on the host, so the scenarios' ``wall_s`` vary with it:

    .venv/bin/python bench/economics.py [--quick] [--seeds 7,11] [--only long,short-seed7,defaults]
        [--policies rigsync,baseline] [--interruptible] [--sequential]

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
import subprocess
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
from reconciler.core.model import OfferFilters
from reconciler.core.offers import box_cap_dph, passing_offers, vast_query_terms
from reconciler.daemon import DaemonConfig, FleetDaemon
from reconciler.desired import load_desired_from_dir
from reconciler.emulator import Emulator
from reconciler.emulator.market import price, speed_factor
from reconciler.emulator.testing import make_keypair
from reconciler.views.progress_display import LineProgress

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
    mix: str  # "long" (runs much longer than a boot), "short" (about as long as a boot), "defaults"
    seeds: tuple[int, ...]
    work_s: float  # train.py --seconds: wall time on a speed-1.0 card (RTX 3090); the fleet's cards run 0.35-0.7
    boot_s: float
    faults: tuple[tuple[float, str, int], ...]  # (seconds after the policy starts, kind, drift seed)
    timeout_s: float
    market_seed: int = 7
    scaled: bool = True  # False: rigsync at its default interval and the example fleet's timeouts, unscaled
    policies: tuple[str, ...] = ("rigsync", "baseline")
    offers: int = 200
    retries: int = 3

    @property
    def runs(self) -> int:
        return len(TASKS) * len(LRS) * len(self.seeds)


MARKET_SEEDS = (7, 11)


def scenarios(quick: bool, market_seeds: tuple[int, ...], interruptible: bool) -> list[Scenario]:
    """Per market seed the two run-length mixes (rigsync and the baseline on each), then rigsync at its defaults."""
    pol: tuple[str, ...] = ("rigsync", "baseline") + (("rigsync_interruptible",) if interruptible else ())
    out = []
    for seed in market_seeds:
        if quick:
            out.append(Scenario(f"long-seed{seed}", "long", (1,), 10.0, 5.0,
                                ((6, "drift", 1), (14, "vanish", 0), (24, "outbid", 0), (34, "drift", 2)), 240.0,
                                seed, policies=pol))
            out.append(Scenario(f"short-seed{seed}", "short", (1,), 2.5, 5.0,
                                ((4, "drift", 1), (10, "vanish", 0), (20, "drift", 2)), 180.0, seed, policies=pol))
        else:
            out.append(Scenario(f"long-seed{seed}", "long", (1, 2), 24.0, 5.0,
                                ((20, "drift", 1), (45, "vanish", 0), (80, "drift", 2), (110, "outbid", 0),
                                 (140, "drift", 3)), 420.0, seed, policies=pol))
            out.append(Scenario(f"short-seed{seed}", "short", (1, 2, 3), 2.5, 5.0,
                                ((5, "drift", 1), (12, "vanish", 0), (22, "outbid", 0), (30, "drift", 2)), 240.0,
                                seed, policies=pol))
    out.append(Scenario("defaults", "defaults", (1,) if quick else (1, 2), 30.0, 5.0,
                        ((30, "drift", 1), (150, "drift", 2)), 900.0, market_seeds[0], scaled=False,
                        policies=("rigsync",)))
    return out


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
    queue_ahead_s: float
    ranking: str


def acceptable() -> Acceptable:
    d = load_desired_from_dir(ROOT)
    f, pool = d.fleet, d.fleet.pools[0]
    filters = dataclasses.replace(pool.filters, dph_max=box_cap_dph(pool, d.budget))
    timeouts = scaled_timeouts((ROOT / "desired" / "fleet.yaml").read_text())
    return Acceptable(filters, pool.disk_gb, pool.image, int(f.max_instances or 1), timeouts, f.queue_ahead_s,
                      pool.ranking.value)


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
    """The fitting market over time: a snapshot of the whole market at the start and after each drift (the cheapest
    $/h, the cheapest $/h per unit of speed, and every fitting offer for the k-box bound)."""

    def __init__(self, emu: Emulator, ok: Acceptable) -> None:
        self.emu, self.ok = emu, ok
        self.snaps: list[tuple[float, float, float]] = []  # (t, min $/h, min $/h per unit of speed)
        self.offers: list[list[tuple[int, str, float, float]]] = []  # per snapshot: (id, gpu, $/h, speed)
        self.gpu_of: dict[int, str] = {}

    def snap(self) -> None:
        offers = [offer_from_record(price(o, self.ok.disk_gb, False)) for o in self.emu.market.all()]
        fit = passing_offers(offers, self.ok.filters, self.ok.disk_gb)
        if not fit:
            raise SystemExit("bench: no offer in the emulated market passes the fleet's filters")
        self.gpu_of.update({int(o.id): o.gpu_name for o in offers})
        self.offers.append([(int(o.id), o.gpu_name, o.dph_total, speed_factor(o.gpu_name)) for o in fit])
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


def _box_states(p: PolicyRun) -> dict[int, dict[str, Any]]:
    """Per box from the emulator's event log: its $/h, offer, and its billed life as (state, from, to) spans, the
    state ``boot`` (loading: GPU-billed), ``up`` (running) or ``down`` (vanished, offline, stopped, outbid: storage
    only) until it was destroyed (or the bench ended)."""
    boxes: dict[int, dict[str, Any]] = {}
    for ev in sorted(p.events, key=lambda x: x["t"]):
        iid = ev.get("instance_id")
        if iid is None:
            continue
        t = float(ev["t"])
        if ev["type"] == "create":
            boxes[iid] = {"created": t, "dph": float(ev["dph_total"]), "offer_id": ev.get("offer_id"),
                          "is_bid": bool(ev.get("is_bid")), "state": "boot", "since": t, "spans": [], "gone": None}
            continue
        b = boxes.get(iid)
        if b is None or b["gone"] is not None:
            continue
        new = {"running": "up", "start": "boot", "destroy": "gone"}.get(ev["type"])
        if ev["type"] in DOWN_EVENTS:
            new = "down"
        if new is None or new == b["state"]:
            continue
        b["spans"].append((b["state"], b["since"], t))
        if new == "gone":
            b["gone"] = t
        b["state"], b["since"] = new, t
    for b in boxes.values():
        if b["gone"] is None:
            b["spans"].append((b["state"], b["since"], p.t_end))
            b["gone"] = p.t_end
        b["spans"] = [s for s in b["spans"] if s[2] > s[1]]
        b["ups"] = [(a, z) for state, a, z in b["spans"] if state == "up"]
    return boxes


def _up_end(b: dict[str, Any], t: float) -> float:
    """When the box's up span holding (or next after) ``t`` ended: an attempt cannot outlive its box's running."""
    return float(next((z for _, z in b["ups"] if z > t), t))


def _merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for a, z in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], z)
        else:
            merged.append([a, z])
    return [(a, z) for a, z in merged]


def _minus(span: tuple[float, float], cut: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The parts of ``span`` outside the (merged, sorted) intervals ``cut``."""
    out, a = [], span[0]
    for c0, c1 in cut:
        if c1 <= a or c0 >= span[1]:
            continue
        if c0 > a:
            out.append((a, c0))
        a = max(a, c1)
    if a < span[1]:
        out.append((a, span[1]))
    return out


def k_box_rate(offers: list[tuple[int, str, float, float]], k: int) -> tuple[float, float]:
    """The k offers cheapest per unit of work (dph / speed) run the work in parallel, finishing together: box i does
    speed_i x T of it, so T = W / Σ speed and the bill T x Σ dph. Returns (Σ dph / Σ speed, Σ speed): the $/h of one
    unit of speed-1 work on those k boxes, and their combined speed."""
    best = sorted(offers, key=lambda o: (o[2] / o[3], o[0]))[: max(1, k)]
    speed = sum(o[3] for o in best)
    return sum(o[2] for o in best) / speed, speed


def analyse(p: PolicyRun, runs_total: int, k: int) -> dict[str, Any]:
    boxes = _box_states(p)
    starts: dict[tuple[int, str, str], dict[str, Any]] = {}
    ends: dict[tuple[int, str, str], dict[str, Any]] = {}
    for r in p.jobs:
        key = (int(r["instance"]), r["run"], r["attempt"])
        (starts if r["ev"] == "start" else ends)[key] = r
    attempts: dict[int, list[dict[str, Any]]] = {}
    succeeded: dict[str, tuple[float, float, float]] = {}  # run -> (start, end, speed), first success
    duplicate = 0
    lost_s = 0.0
    usd = {"succeeded": 0.0, "duplicate": 0.0, "lost": 0.0}
    for key, s in sorted(starts.items(), key=lambda kv: float(kv[1]["t"])):
        iid = key[0]
        if iid not in boxes:
            continue
        b = boxes[iid]
        e = ends.get(key)
        t_s = max(float(s["t"]), b["created"])
        up_end = _up_end(b, t_s)
        t_e = min(float(e["t"]) if e else up_end, up_end)
        if t_e <= t_s:
            continue
        ok_ = e is not None and int(e.get("rc", 1)) == 0
        if ok_ and key[1] not in succeeded:
            kind = "succeeded"
            succeeded[key[1]] = (t_s, t_e, float(s.get("speed") or 1.0))
        elif ok_:
            kind, duplicate = "duplicate", duplicate + 1
        else:
            kind = "lost"
        if kind != "succeeded":
            lost_s += t_e - t_s
        usd[kind] += (t_e - t_s) * b["dph"] / 3600
        attempts.setdefault(iid, []).append({"kind": kind, "t0": t_s, "t1": t_e, "run": key[1], "attempt": key[2],
                                             "rc": None if e is None else e.get("rc")})
    billed_s = busy_s = run_usd = 0.0
    tax_s = {"boot": 0.0, "bootstrap": 0.0, "idle": 0.0, "down": 0.0}
    tax_usd = {"boot": 0.0, "bootstrap": 0.0, "idle": 0.0}
    timelines = []
    gpu_of = p.tape.gpu_of if p.tape is not None else {}
    for iid, b in sorted(boxes.items()):
        billed_s += b["gone"] - b["created"]
        mine = attempts.get(iid, [])
        merged = _merge([(a["t0"], a["t1"]) for a in mine])
        box_busy = sum(z - a for a, z in merged)
        busy_s += box_busy
        run_usd += box_busy * b["dph"] / 3600
        first = merged[0][0] if merged else None
        segs: list[dict[str, Any]] = []
        for state, a, z in b["spans"]:
            if state != "up":
                kind = "boot" if state == "boot" else "down"
                segs.append({"kind": kind, "t0": a, "t1": z})
                continue
            for g0, g1 in _minus((a, z), merged):
                kind = "bootstrap" if first is not None and g1 <= first else "idle"
                segs.append({"kind": kind, "t0": g0, "t1": g1})
        segs.extend(mine)
        segs.sort(key=lambda s: (s["t0"], s["t1"]))
        for s in segs:
            if s["kind"] in tax_s:
                tax_s[s["kind"]] += s["t1"] - s["t0"]
                if s["kind"] in tax_usd:
                    tax_usd[s["kind"]] += (s["t1"] - s["t0"]) * b["dph"] / 3600
        timelines.append({
            "instance": iid, "gpu": gpu_of.get(b["offer_id"]), "dph": round(b["dph"], 4), "bid": b["is_bid"],
            "created_s": round(b["created"] - p.t0, 1), "destroyed_s": round(b["gone"] - p.t0, 1),
            "segments": [{**{k_: v for k_, v in s.items() if k_ not in ("t0", "t1") and v is not None},
                          "t0": round(s["t0"] - p.t0, 1), "t1": round(s["t1"] - p.t0, 1)} for s in segs],
        })
    assert p.tape is not None
    lb = lb_literal = run_s = work = 0.0
    for t_s, t_e, speed in succeeded.values():
        min_dph, min_per_speed = p.tape.at(t_s)
        secs = t_e - t_s
        run_s += secs
        work += secs * speed
        lb += secs * speed * min_per_speed / 3600
        lb_literal += secs * min_dph / 3600
    rate, k_speed = min((k_box_rate(offers, k) for offers in p.tape.offers), key=lambda x: x[0])
    k_bound = work * rate / 3600
    last_success = max((z for _, z, _ in succeeded.values()), default=p.t_end)
    tax = {
        "boot": tax_usd["boot"], "bootstrap": tax_usd["bootstrap"], "idle": tax_usd["idle"],
        "lost": usd["lost"], "duplicate": usd["duplicate"],
    }
    tax["other"] = p.ledger_usd - usd["succeeded"] - sum(tax.values())  # storage while down; rounding
    return {
        "ledger_usd": round(p.ledger_usd, 6),
        "lower_bound_usd": round(lb, 6),
        "cost_over_lower_bound": round(p.ledger_usd / lb, 3) if lb else None,
        "k_box_bound_usd": round(k_bound, 6),
        "cost_over_k_box_bound": round(p.ledger_usd / k_bound, 3) if k_bound else None,
        "k_box_bound": {"k": k, "usd_per_speed1_hour": round(rate, 6), "combined_speed": round(k_speed, 3),
                        "work_speed1_s": round(work, 1), "ideal_makespan_s": round(work / k_speed, 1)},
        "lower_bound_literal_usd": round(lb_literal, 6),
        "makespan_s": round(last_success - p.t0, 1),
        "billing_s": round(max((b["gone"] for b in boxes.values()), default=p.t0) - p.t0, 1),
        "idle_fraction": round(1 - busy_s / billed_s, 4) if billed_s else None,
        "idle_usd_fraction": round(1 - run_usd / p.ledger_usd, 4) if p.ledger_usd else None,
        "ops_tax_usd": round(p.ledger_usd - usd["succeeded"], 6),
        "ops_tax_fraction": round(1 - usd["succeeded"] / p.ledger_usd, 4) if p.ledger_usd else None,
        "ops_tax_breakdown_usd": {k_: round(v, 6) for k_, v in tax.items()},
        "ops_tax_breakdown_s": {**{k_: round(v, 1) for k_, v in tax_s.items()}, "lost_and_duplicate": round(lost_s, 1)},
        "cost_breakdown_usd": {"succeeded_runs": round(usd["succeeded"], 6),
                               "lost_attempts": round(usd["lost"] + usd["duplicate"], 6),
                               "idle": round(p.ledger_usd - usd["succeeded"] - usd["lost"] - usd["duplicate"], 6)},
        "complete": len(succeeded) == runs_total and not duplicate and not p.alive_at_end and not p.timed_out,
        "billed_box_s": round(billed_s, 1),
        "run_s_succeeded": round(run_s, 1),
        "lost_run_s": round(lost_s, 1),
        "runs_total": runs_total,
        "runs_succeeded": len(succeeded),
        "duplicate_successes": duplicate,
        "attempts": len(starts),
        "boxes_rented": len(boxes),
        "faults": p.faults,
        "alive_at_end": p.alive_at_end,
        "timed_out": p.timed_out,
        **p.extra,
        "timelines": timelines,
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


def fleet_settings(sc: Scenario, ok: Acceptable) -> dict[str, str]:
    """What the bench writes into the fleet's settings: scaled, the example fleet's timeouts scaled and floored and
    queue_ahead (the fleet default) scaled; unscaled, the example fleet's own timeouts (undoing the demo's short
    ones) and queue_ahead left at whatever the example fleet or the default says."""
    if sc.scaled:
        out = {k: f"{v:g}s" for k, v in ok.timeouts.items()}
        qa = ok.queue_ahead_s
        out["queue_ahead"] = f"{round(qa * SCALE, 1):g}s"
        return out
    text = (ROOT / "desired" / "fleet.yaml").read_text()
    out = {}
    for key in demo.DEMO_TIMEOUTS:
        m = re.search(rf"^\s*{key}:\s*(\S+)", text, re.M)
        if m:
            out[key] = m.group(1)
    return out


def bench_fleet_repo(workdir: Path, settings: dict[str, str], extra: str = "") -> None:
    """The demo's throwaway fleet repo at ``workdir`` with ``settings`` set in its fleet.yaml (``extra`` appended)
    and no sweep yet: the bench writes its own (bench/economics.py, bench/search.py)."""
    demo.make_fleet_repo(workdir, None)
    fleet = workdir / "desired" / "fleet.yaml"
    text = fleet.read_text()
    for key, value in settings.items():
        text = demo._set_key(text, key, value) if re.search(rf"^\s*#?\s*{key}:", text, re.M) \
            else text + f"{key}: {value}\n"
    fleet.write_text(text + extra)
    for old in (workdir / "desired" / "sweeps").glob("*.yaml"):
        old.unlink()


MAX_BID_DPH = 0.1  # the interruptible run's fleet.yaml interruptible.max_bid_dph (the example fleet caps boxes at 0.15)


def run_rigsync_interruptible(sc: Scenario, ok: Acceptable, tmp: Path) -> PolicyRun:
    """rigsync with ``interruptible: {max_bid_dph: MAX_BID_DPH}``: bid boxes where the market takes a bid."""
    return run_rigsync(sc, ok, tmp, max_bid_dph=MAX_BID_DPH)


def run_rigsync(sc: Scenario, ok: Acceptable, tmp: Path, max_bid_dph: float | None = None) -> PolicyRun:
    name = "rigsync" if max_bid_dph is None else "rigsync_interruptible"
    tag = f"{sc.name}/{name}"
    res = PolicyRun(name)
    log = JobLog(tmp / f"jobs-{sc.name}-{name}.jsonl")
    workdir = tmp / sc.name / name / "fleet"
    workdir.parent.mkdir(parents=True)
    state = tmp / sc.name / name / "state"
    interval = round(DaemonConfig().interval_s * SCALE, 2) if sc.scaled else DaemonConfig().interval_s
    settings = fleet_settings(sc, ok)
    old_key = os.environ.get("VAST_API_KEY")
    with Emulator(seed=sc.market_seed, offers=sc.offers, boot_delay=sc.boot_s) as emu:
        try:
            os.environ["VAST_API_KEY"] = emu.api_key
            extra = f"interruptible: {{max_bid_dph: {max_bid_dph}}}\n" if max_bid_dph is not None else ""
            bench_fleet_repo(workdir, settings, extra)
            (workdir / "desired" / "sweeps" / "econ.yaml").write_text(sweep_yaml(sc, log.path))
            (workdir / "experiments" / "econ_job.py").write_text(JOB_SCRIPT)
            demo._git(workdir, "add", "-A")
            demo._git(workdir, "commit", "-q", "-m", f"bench: the economics sweep ({sc.name}), fleet settings")
            demo._git(workdir, "push", "-q", "origin", "main")
            daemon = FleetDaemon(workdir, config=DaemonConfig(interval_s=interval, lease_renew_s=30.0),
                                 state_dir=str(state), api_url=emu.url)
            daemon.acquire()
            res.tape = MarketTape(emu, ok)
            res.t0 = time.time()
            res.tape.snap()
            faults = Faults(emu, sc, log, res.tape, res.t0)
            faults.start()
            opts = demo.DemoOptions(timeout_s=sc.timeout_s, interval_s=interval, say=lambda s: say(f"{tag} {s}"))
            try:
                drive_t0 = time.monotonic()
                summary = demo._drive(daemon, emu, opts, LineProgress(opts.say), None, drive_t0)
                drive_s = time.monotonic() - drive_t0
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
                         "mean_cycle_period_s": round(drive_s / max(1, summary.cycles), 2),
                         "config": {"interval_s": interval, **settings,
                                    "max_boxes": ok.max_boxes, "ranking": ok.ranking,
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
    log = JobLog(tmp / f"jobs-{sc.name}-baseline.jsonl")
    kp = make_keypair(tmp / f"baseline-key-{sc.name}")
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


def target(value: float | None, limit: float) -> dict[str, Any]:
    return {"value": value, "limit": limit, "met": value is not None and value <= limit}


def judge(sc: Scenario, res: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The scenario's ratios and targets: per (seed, mix) against the k-box bound and the baseline; at the defaults
    against the k-box bound only (no baseline is run there)."""
    out: dict[str, Any] = {}
    r, b = res.get("rigsync"), res.get("baseline")
    if "rigsync" in res and "rigsync_interruptible" in res:
        on_demand, spot = res["rigsync"], res["rigsync_interruptible"]
        out["interruptible_vs_on_demand"] = {
            "saving_fraction": round(1 - spot["ledger_usd"] / on_demand["ledger_usd"], 3)
            if on_demand.get("ledger_usd") else None,
            "ledger_usd": [on_demand["ledger_usd"], spot["ledger_usd"]],
            "lost_run_s": [on_demand.get("lost_run_s"), spot.get("lost_run_s")],
            "makespan_s": [on_demand.get("makespan_s"), spot.get("makespan_s")],
            "complete": [on_demand.get("complete"), spot.get("complete")],
        }
    if r is None:
        return out
    t: dict[str, Any] = {"rigsync_complete": {"value": r["complete"], "met": bool(r["complete"])}}
    if sc.mix == "defaults":
        t["ledger_le_1.30x_k_box_bound"] = target(r["cost_over_k_box_bound"], 1.30)
        t["idle_fraction_le_0.12"] = target(r["idle_fraction"], 0.12)
    else:
        t["ledger_le_1.15x_k_box_bound"] = target(r["cost_over_k_box_bound"], 1.15)
        t["idle_fraction_le_0.03"] = target(r["idle_fraction"], 0.03)
    if b is not None:
        def ratio(k: str) -> float | None:
            return round(r[k] / b[k], 3) if r.get(k) and b.get(k) else None

        out["rigsync_over_baseline"] = {k: ratio(k) for k in ("ledger_usd", "makespan_s", "billing_s",
                                                              "idle_fraction", "ops_tax_usd", "cost_over_k_box_bound")}
        t["ledger_le_0.80x_baseline"] = target(out["rigsync_over_baseline"]["ledger_usd"], 0.80)
        t["makespan_le_0.80x_baseline"] = target(out["rigsync_over_baseline"]["makespan_s"], 0.80)
    out["targets"] = t
    out["targets_met"] = all(v["met"] for v in t.values())
    return out


def run_scenario(sc: Scenario, ok: Acceptable, tmp: Path, policies: set[str] | None) -> dict[str, Any]:
    fns: dict[str, Callable[[Scenario, Acceptable, Path], PolicyRun]] = {
        "rigsync": run_rigsync, "baseline": run_baseline, "rigsync_interruptible": run_rigsync_interruptible}
    doc: dict[str, Any] = {
        "workload": {"mix": sc.mix, "runs": sc.runs, "work_s_at_speed_1": sc.work_s, "boot_s": sc.boot_s,
                     "time_scale": "1/60" if sc.scaled else "1 (unscaled)", "market_seed": sc.market_seed,
                     "offers": sc.offers, "retries": sc.retries, "fault_schedule_s": [list(f) for f in sc.faults]},
    }
    res: dict[str, dict[str, Any]] = {}
    for name in sc.policies:
        if policies and name not in policies:
            continue
        say(f"== {sc.name}/{name}")
        started = time.monotonic()
        res[name] = analyse(fns[name](sc, ok, tmp), sc.runs, ok.max_boxes)
        res[name]["wall_s"] = round(time.monotonic() - started, 1)
        brief = {k: v for k, v in res[name].items() if not isinstance(v, (list, dict))}
        say(f"== {sc.name}/{name}: {json.dumps(brief)}")
    doc.update(res)
    doc.update(judge(sc, res))
    return doc


def summary_row(name: str, doc: dict[str, Any]) -> dict[str, Any]:
    r = doc.get("rigsync") or {}
    row = {"scenario": name, "ledger_usd": r.get("ledger_usd"), "k_box_bound_usd": r.get("k_box_bound_usd"),
           "cost_over_k_box_bound": r.get("cost_over_k_box_bound"), "idle_fraction": r.get("idle_fraction"),
           "ops_tax_fraction": r.get("ops_tax_fraction"), "makespan_s": r.get("makespan_s"),
           "complete": r.get("complete")}
    if "rigsync_over_baseline" in doc:
        row["ledger_over_baseline"] = doc["rigsync_over_baseline"]["ledger_usd"]
        row["makespan_over_baseline"] = doc["rigsync_over_baseline"]["makespan_s"]
    row["targets_met"] = doc.get("targets_met")
    row["missed"] = sorted(k for k, v in (doc.get("targets") or {}).items() if not v["met"])
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a short smoke run: 4 runs per scenario, shorter faults")
    ap.add_argument("--seeds", default=",".join(str(s) for s in MARKET_SEEDS),
                    help="the emulated market seeds, comma-separated (default 7,11; the first also for defaults)")
    ap.add_argument("--only", help="scenarios to run, comma-separated: names (long-seed7, short-seed11, defaults) "
                    "or mixes (long, short, defaults)")
    ap.add_argument("--policies", help="policies to run, comma-separated (rigsync, baseline, rigsync_interruptible)")
    ap.add_argument("--interruptible", action="store_true",
                    help=f"also run rigsync with interruptible: {{max_bid_dph: {MAX_BID_DPH}}} in each (seed, mix) "
                    "and report its saving over on-demand rigsync and the work lost to preemption")
    ap.add_argument("--sequential", action="store_true",
                    help="run the defaults scenario after the others instead of beside them")
    args = ap.parse_args()
    seeds = tuple(int(s) for s in args.seeds.split(",") if s.strip())
    chosen = scenarios(args.quick, seeds, args.interruptible)
    if args.only:
        want = {w.strip() for w in args.only.split(",") if w.strip()}
        unknown = want - {s.name for s in chosen} - {s.mix for s in chosen}
        if unknown:
            ap.error(f"--only: no scenario {', '.join(sorted(unknown))} (have {', '.join(s.name for s in chosen)})")
        chosen = [s for s in chosen if s.name in want or s.mix in want]
    policies = {p.strip() for p in args.policies.split(",")} if args.policies else None
    ok = acceptable()
    tmp = Path(tempfile.mkdtemp(prefix="rigsync-econ-"))
    os.chmod(tmp, 0o755)
    started = time.monotonic()
    beside = not args.sequential and len(chosen) > 1 and any(s.mix == "defaults" for s in chosen)
    out: dict[str, Any] = {
        "bench": "economics", "variant": "quick" if args.quick else "full",
        "concurrency": ("the defaults scenario (30 s cycles, mostly asleep) in a child process beside the scaled "
                        "scenarios, which run one policy at a time" if beside else "one policy at a time"),
        "host": {"cpus": os.cpu_count(), "loadavg_at_start": [round(x, 2) for x in os.getloadavg()]},
        "scenarios": {},
    }
    child: subprocess.Popen[str] | None = None
    try:
        if beside:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--only", "defaults", "--seeds", args.seeds,
                   "--sequential"] + (["--quick"] if args.quick else []) + (
                       ["--policies", args.policies] if args.policies else [])
            child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
            chosen = [s for s in chosen if s.mix != "defaults"]
        for sc in chosen:
            out["scenarios"][sc.name] = run_scenario(sc, ok, tmp, policies)
        if child is not None:
            text, _ = child.communicate()
            if child.returncode != 0:
                out["scenarios"]["defaults"] = {"error": f"child exited {child.returncode}"}
            else:
                out["scenarios"].update(json.loads(text)["scenarios"])
    finally:
        if child is not None and child.poll() is None:
            child.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    out["summary"] = [summary_row(n, d) for n, d in out["scenarios"].items()]
    out["targets_met"] = {n: d.get("targets_met") for n, d in out["scenarios"].items()}
    out["host"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    out["wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
