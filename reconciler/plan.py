"""The decision core: ``plan(desired, observed, now) -> Plan``, a pure function of its inputs.

Everything rigsync does is decided here and nowhere else, so the whole behaviour can be tested as data
(``tests/unit/plan_cases``) and a saved plan can be reviewed before it spends money. It performs no I/O,
reads no clock and uses no randomness; iteration always follows sorted keys so two calls on equal inputs
give equal plans. Every action carries a reason, and what was considered and left alone is returned as
``Noop``s with reasons too.

Money is safety: caps are read defensively (a missing cap is "no cap", a negative or NaN cap is 0), an
offer with a nonsensical price is never rented, and only instances carrying this fleet's ownership label
are ever acted upon.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from dataclasses import dataclass, field

from reconciler.actions import (
    APPLY_ORDER,
    SIGNS,
    Action,
    Bootstrap,
    Destroy,
    Kill,
    Launch,
    Noop,
    Plan,
    Record,
    Rent,
    Requeue,
    ShipCode,
)
from reconciler.model import (
    FREE_GPU_MEMORY_MIB,
    AttemptRecord,
    BoxMemory,
    BoxProbe,
    Budget,
    Desired,
    Drift,
    DriftClass,
    Fleet,
    GpuState,
    InFlight,
    Instance,
    InstanceStatus,
    Observed,
    Offer,
    OfferFilters,
    OnExceed,
    Ownership,
    AttemptOutcome,
    Ranking,
    RunDirState,
    RunSpec,
)
from reconciler.promotion import best_by_cell, promotion_met

__all__ = [
    "effective_caps",
    "fleet_spec_hash",
    "fmt_duration",
    "offer_passes",
    "plan",
    "rent_label",
    "slot_spec_hash",
    "spec_hash",
]

DEAD_STATUSES = frozenset({InstanceStatus.STOPPED, InstanceStatus.EXITED, InstanceStatus.OFFLINE})
BOOTING_STATUSES = frozenset({InstanceStatus.CREATED, InstanceStatus.LOADING})
_FAILED_PHASES = frozenset({AttemptOutcome.FAILED, AttemptOutcome.LOST})
_EPS = 1e-9  # float slack on the fleet cap sum only, so $0.1 + $0.2 fits a $0.3 cap


# ------------------------------------------------------------------------------------------- helpers


def spec_hash(image: str, disk_gb: float, bootstrap_hash: str) -> str:
    """First 8 hex of sha256 over what a box is built from; a change makes existing boxes "drifted"."""
    payload = "\n".join((image, repr(float(disk_gb)), bootstrap_hash))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:8]


def fleet_spec_hash(fleet: Fleet) -> str:
    return spec_hash(fleet.image, fleet.disk_gb, fleet.bootstrap_hash)


def rent_label(fleet: Fleet, offer_id: int) -> str:
    """The ownership label a box rented from ``offer_id`` carries: ``rigsync:<fleet>:<spec_hash>-<offer>``."""
    return Ownership(fleet.name, f"{fleet_spec_hash(fleet)}-{offer_id}").label()


def slot_spec_hash(slot: str) -> str:
    return slot.split("-", 1)[0]


def fmt_duration(seconds: float) -> str:
    """``3600 -> "1h"``, ``725 -> "12m5s"``, ``5400 -> "1h30m"``: the two largest non-zero units."""
    if not math.isfinite(seconds):
        return "forever"
    s = max(0, int(seconds))
    parts: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if s >= size:
            parts.append(f"{s // size}{unit}")
            s %= size
    return "".join(parts[:2]) or "0s"


def _usd_h(x: float) -> str:
    return f"${x:.3f}/h"


def _usd(x: float) -> str:
    return f"${x:.2f}"


def _cap(value: float | None) -> float:
    """A budget cap as a number: None means no cap; negative or NaN is treated as 0 (safe side)."""
    if value is None:
        return math.inf
    if math.isnan(value) or value < 0:
        return 0.0
    return float(value)


def _count_cap(value: int | None) -> int:
    if value is None:
        return 0
    return max(0, int(value))


def effective_caps(desired: Desired) -> tuple[float, float]:
    """(per-instance $/h cap, fleet $/h cap) after defaulting; the per-instance one includes filters.dph_max."""
    instance_cap = min(_cap(desired.fleet.filters.dph_max), _cap(desired.budget.max_instance_dph))
    return instance_cap, _cap(desired.budget.max_fleet_dph)


def offer_passes(offer: Offer, f: OfferFilters, disk_gb: float) -> bool:
    """Whether an offer passes the fleet's filters (prices are checked against caps separately)."""
    if not math.isfinite(offer.dph_total) or offer.dph_total < 0:
        return False
    if f.gpu_names and offer.gpu_name not in f.gpu_names:
        return False
    if offer.num_gpus < max(1, f.num_gpus_min):
        return False
    if f.num_gpus_max is not None and offer.num_gpus > f.num_gpus_max:
        return False
    if f.gpu_ram_mib_min is not None and offer.gpu_ram_mib < f.gpu_ram_mib_min:
        return False
    if f.reliability_min is not None and offer.reliability < f.reliability_min:
        return False
    if f.inet_down_mbps_min is not None and offer.inet_down_mbps < f.inet_down_mbps_min:
        return False
    if f.dph_max is not None and offer.dph_total > _cap(f.dph_max):
        return False
    if f.dlperf_per_dph_min is not None and offer.dlperf_per_dph < f.dlperf_per_dph_min:
        return False
    if f.cuda_min is not None and offer.cuda < f.cuda_min:
        return False
    if f.verified and not offer.verified:
        return False
    if f.geolocations and not any(g in offer.geolocation for g in f.geolocations):
        return False
    return offer.disk_space_gb >= disk_gb


def _rank_key(ranking: Ranking, o: Offer) -> tuple[float, int]:
    if ranking is Ranking.PRICE:
        return (o.dph_total, o.id)
    if ranking is Ranking.DLPERF:
        return (-o.dlperf, o.id)
    if ranking is Ranking.RELIABILITY:
        return (-o.reliability, o.id)
    return (-o.dlperf_per_dph, o.id)


def _gpus_text(mask: tuple[int, ...]) -> str:
    return ("GPU " if len(mask) == 1 else "GPUs ") + ",".join(str(i) for i in mask)


# ------------------------------------------------------------------------------------------ internals


@dataclass
class _Box:
    inst: Instance
    own: Ownership
    probe: BoxProbe | None
    memory: BoxMemory | None
    live: list[RunDirState] = field(default_factory=list)  # pid alive, no exit code, not archived
    zombies: list[RunDirState] = field(default_factory=list)  # archived, but the process is still alive
    waiting: list[InFlight] = field(default_factory=list)  # in flight, not visible, box cannot tell yet
    destroy_reason: str | None = None
    state: str = ""  # ready | booting | bootstrapping | unreachable | drifted | unknown | dead
    free: list[GpuState] = field(default_factory=list)
    launches: int = 0
    considered: bool = False  # an action or a noop already speaks for this box

    @property
    def id(self) -> int:
        return self.inst.id

    @property
    def reachable(self) -> bool:
        return self.probe is not None and self.probe.reachable

    @property
    def has_work(self) -> bool:
        return bool(self.live or self.zombies or self.waiting)


@dataclass
class _RunState:
    spec: RunSpec
    index: int
    failed: int = 0
    succeeded: bool = False
    running: bool = False
    max_attempt: int = 0


@dataclass
class _Bin:
    """Remaining GPU capacity of a booting box or an offer rented in this plan."""

    free_gpus: int
    gpu_ram_mib: int


class _Planner:
    def __init__(self, desired: Desired, observed: Observed, now: float) -> None:
        self.d = desired
        self.o = observed
        self.now = now
        self.fleet = desired.fleet
        self.actions: list[Action] = []
        self.noops: list[Noop] = []
        self.drift: list[Drift] = []
        self.warnings: list[str] = []
        self.current_spec = fleet_spec_hash(self.fleet)
        self.handled: set[tuple[str, int]] = set()  # attempts that already got an action this plan
        self.kill_failed: set[tuple[str, int]] = set()  # killed past max runtime: counts as failed

    # ---------------------------------------------------------------------------------- entry point

    def run(self) -> Plan:
        self._index()
        self._budget()
        self._collect_attempts()
        self._records()
        self._wanted()
        self._box_hard_limits()
        self._max_instances()
        self._live_attempts()
        self._in_flight()
        self._run_states()
        self._box_readiness()
        self._launch()
        self._idle_and_surplus()
        self._rent()
        self._box_noops()
        return self._finish()

    # -------------------------------------------------------------------------------------- indexing

    def _index(self) -> None:
        d, o = self.d, self.o
        self.runs: dict[str, RunSpec] = {}
        self.run_index: dict[str, int] = {}
        for i, r in enumerate(d.runs):
            if r.id not in self.runs:
                self.runs[r.id] = r
                self.run_index[r.id] = i
            else:
                self.warnings.append(f"run id {r.id} appears twice in desired; the first is used")
        self.history: dict[str, list[AttemptRecord]] = defaultdict(list)
        self.archived: dict[tuple[str, int], AttemptRecord] = {}
        for h in o.history:
            self.history[h.run_id].append(h)
            self.archived[h.key] = h
        probes = {p.instance_id: p for p in o.probes}
        memory = {m.instance_id: m for m in o.memory}
        self.listed_ids = {i.id for i in o.instances}
        self.boxes: dict[int, _Box] = {}
        for inst in sorted(o.instances, key=lambda i: i.id):
            own = Ownership.parse(inst.label)
            if own is None or own.fleet != self.fleet.name:
                subject = f"instance/{inst.id}"
                why = "no rigsync label" if own is None else f"owned by fleet {own.fleet!r}"
                self.noops.append(Noop(reason=f"foreign instance ({why}): reported, never touched", subject=subject))
                detail = f"label {inst.label!r}, {inst.gpu_name} x{inst.num_gpus}"
                self.drift.append(Drift(DriftClass.FOREIGN, subject, detail, "none"))
                continue
            if inst.id in self.boxes:
                continue
            self.boxes[inst.id] = _Box(inst, own, probes.get(inst.id), memory.get(inst.id))

    def _budget(self) -> None:
        b: Budget = self.d.budget
        spend = self.o.spend
        reasons: list[str] = []
        daily, total = _cap(b.daily_usd), _cap(b.total_usd)
        if b.daily_usd is not None and not spend.today_usd < daily:
            reasons.append(f"spent today {_usd(spend.today_usd)} >= daily_usd {_usd(daily)}")
        if b.total_usd is not None and not spend.total_usd < total:
            reasons.append(f"spent in total {_usd(spend.total_usd)} >= total_usd {_usd(total)}")
        self.over_budget = bool(reasons)
        self.halt = self.over_budget and b.on_exceed is OnExceed.HALT
        self.budget_text = "; ".join(reasons)

    # -------------------------------------------------------------------------------------- attempts

    def _collect_attempts(self) -> None:
        """Sort what the reachable boxes show into finished (to record), live, and leftovers."""
        self.visible: set[tuple[str, int]] = set()
        self.finished: list[tuple[_Box, RunDirState]] = []
        self.occupied: dict[int, set[int]] = defaultdict(set)
        self.max_attempt: dict[str, int] = defaultdict(int)
        for h in self.o.history:
            self.max_attempt[h.run_id] = max(self.max_attempt[h.run_id], h.attempt)
        for f in self.o.in_flight:
            self.max_attempt[f.run_id] = max(self.max_attempt[f.run_id], f.attempt)
        for box in self.boxes.values():
            if not box.reachable or box.probe is None:
                continue
            for rd in sorted(box.probe.runs, key=lambda r: (r.run_id, r.attempt)):
                key = (rd.run_id, rd.attempt)
                self.visible.add(key)
                self.max_attempt[rd.run_id] = max(self.max_attempt[rd.run_id], rd.attempt)
                alive = rd.exit_code is None and rd.pid_alive
                if alive:
                    self.occupied[box.id].update(rd.gpu_mask)
                if key in self.archived:
                    if alive:
                        box.zombies.append(rd)
                    continue
                if rd.exit_code is not None:
                    self.finished.append((box, rd))
                else:
                    box.live.append(rd)

    def _records(self) -> None:
        self.recorded: dict[str, list[tuple[AttemptOutcome, float | None]]] = defaultdict(list)
        for box, rd in self.finished:
            phase = AttemptOutcome.SUCCEEDED if rd.exit_code == 0 else AttemptOutcome.FAILED
            self.recorded[rd.run_id].append((phase, rd.best_metric))
            self.handled.add((rd.run_id, rd.attempt))
            self._add(
                Record(
                    reason=f"exited with code {rd.exit_code} on instance/{box.id}",
                    run_id=rd.run_id,
                    attempt=rd.attempt,
                    instance_id=box.id,
                    phase=phase.value,
                    exit_code=rd.exit_code,
                )
            )

    def _wanted(self) -> None:
        """Base runs, plus promotion seeds whose cell's best base metric reached their threshold."""
        metrics: dict[str, list[float | None]] = defaultdict(list)
        for run_id, recs in self.history.items():
            metrics[run_id].extend(h.best_metric for h in recs if h.phase is AttemptOutcome.SUCCEEDED)
        for run_id, recorded in self.recorded.items():
            metrics[run_id].extend(m for ph, m in recorded if ph is AttemptOutcome.SUCCEEDED)
        best = best_by_cell(self.runs.values(), metrics)
        self.wanted: set[str] = set()
        waiting_promo: dict[str, int] = defaultdict(int)
        for r in self.runs.values():
            if promotion_met(r, best):
                self.wanted.add(r.id)
            else:
                waiting_promo[r.sweep] += 1
        for sweep, n in sorted(waiting_promo.items()):
            self.noops.append(
                Noop(
                    reason=f"{n} promotion seed(s) wait for their cell's best metric to reach the threshold",
                    subject=f"sweep/{sweep}",
                )
            )

    # ----------------------------------------------------------------------------------------- boxes

    def _destroy(self, box: _Box, reason: str) -> None:
        if box.destroy_reason is not None:
            return
        box.destroy_reason = reason
        box.state = "dead"
        box.considered = True
        self._add(Destroy(reason=reason, instance_id=box.id, dph=box.inst.dph_total))

    def _box_hard_limits(self) -> None:
        """Destroys that do not depend on the work: budget halt, provider status, timeouts, failed bootstrap."""
        f = self.fleet
        for box in self.boxes.values():
            inst, subj = box.inst, f"instance/{box.id}"
            if self.halt:
                self._destroy(box, f"over budget, on_exceed halt: {self.budget_text}")
                continue
            if inst.status is InstanceStatus.STOPPED:
                self._destroy(box, "stopped (outbid?): stopped boxes still bill storage; destroying, never stopping")
                self.drift.append(Drift(DriftClass.OUTBID, subj, "provider reports the box stopped", f"destroy {subj}"))
                continue
            if inst.status in DEAD_STATUSES:
                self._destroy(box, f"provider reports the box {inst.status.value}; it cannot run work")
                continue
            age = self.now - inst.start_date
            if f.ttl_s is not None and age > _cap(f.ttl_s):
                self._destroy(box, f"past its ttl: up {fmt_duration(age)} > ttl {fmt_duration(_cap(f.ttl_s))}")
                continue
            if inst.status in BOOTING_STATUSES:
                if age > f.boot_timeout_s:
                    reason = (
                        f"still {inst.status.value} after {fmt_duration(age)} > "
                        f"boot_timeout {fmt_duration(f.boot_timeout_s)}"
                    )
                    self._destroy(box, reason)
                    self.drift.append(Drift(DriftClass.BOOT_TIMEOUT, subj, reason, f"destroy {subj}"))
                else:
                    box.state = "booting"
                continue
            if inst.status is not InstanceStatus.RUNNING:
                box.state = "unknown"
                continue
            if not box.reachable:
                since = self.now
                if box.memory is not None and box.memory.unreachable_since is not None:
                    since = box.memory.unreachable_since
                down = self.now - since
                err = f" ({box.probe.error})" if box.probe is not None and box.probe.error else ""
                if down > f.unreachable_grace_s:
                    reason = (
                        f"unreachable for {fmt_duration(down)} > unreachable_grace "
                        f"{fmt_duration(f.unreachable_grace_s)}{err}"
                    )
                    self._destroy(box, reason)
                    self.drift.append(Drift(DriftClass.UNREACHABLE, subj, reason, f"destroy {subj}"))
                else:
                    box.state = "unreachable"
                    detail = f"unreachable for {fmt_duration(down)}{err}"
                    self.drift.append(Drift(DriftClass.UNREACHABLE, subj, detail, "none"))
                continue
            probe = box.probe
            assert probe is not None
            bh = f.bootstrap_hash
            if bh and bh in probe.bootstrap_failed and bh not in probe.bootstrap_hashes:
                self._destroy(box, f"bootstrap {bh} failed on this box")
                continue
            if slot_spec_hash(box.own.slot) != self.current_spec:
                box.state = "drifted"
                continue
            if bh and bh not in probe.bootstrap_hashes:
                box.state = "bootstrapping"
                continue
            box.state = "ready"
        # In-flight attempts the box cannot show (unreachable, still booting) are work we must not discard.
        for fl in self.o.in_flight:
            key = (fl.run_id, fl.attempt)
            if key in self.archived or key in self.visible:
                continue
            b = self.boxes.get(fl.instance_id)
            if b is not None and b.destroy_reason is None and not b.reachable:
                b.waiting.append(fl)
                self.occupied[b.id].update(fl.gpu_mask)

    def _alive(self) -> list[_Box]:
        return [b for b in self.boxes.values() if b.destroy_reason is None]

    def _max_instances(self) -> None:
        cap = _count_cap(self.fleet.max_instances)
        alive = self._alive()
        extra = len(alive) - cap
        if extra <= 0:
            return
        order = sorted(alive, key=lambda b: (b.has_work, -b.inst.dph_total, b.id))
        for b in order[:extra]:
            what = "busy" if b.has_work else "idle"
            self._destroy(
                b, f"{len(alive)} owned boxes > max_instances {cap}; this one is {what} at {_usd_h(b.inst.dph_total)}"
            )

    def _requeue(self, run_id: str, attempt: int, instance_id: int, reason: str) -> None:
        self.handled.add((run_id, attempt))
        self._add(Requeue(reason=reason, run_id=run_id, attempt=attempt, instance_id=instance_id))

    def _kill(self, box: _Box, rd: RunDirState, reason: str) -> None:
        self.handled.add((rd.run_id, rd.attempt))
        self._add(Kill(reason=reason, instance_id=box.id, run_id=rd.run_id, attempt=rd.attempt))

    def _live_attempts(self) -> None:
        f = self.fleet
        self.running_by_run: dict[str, list[tuple[_Box, RunDirState]]] = defaultdict(list)
        for box in self.boxes.values():
            for rd in box.zombies:
                if box.destroy_reason is None:
                    phase = self.archived[(rd.run_id, rd.attempt)].phase.value
                    self._kill(box, rd, f"attempt already archived as {phase}, but its process is still alive")
            for rd in box.live:
                subj = f"run/{rd.run_id}.{rd.attempt}"
                if box.destroy_reason is not None:
                    self._requeue(
                        rd.run_id, rd.attempt, box.id, f"its box instance/{box.id} is destroyed: {box.destroy_reason}"
                    )
                    continue
                if not rd.pid_alive:
                    detail = "wrapper process gone without an exit code"
                    self._requeue(rd.run_id, rd.attempt, box.id, f"lost: {detail}")
                    self.drift.append(Drift(DriftClass.JOB_CRASHED, subj, detail, f"requeue {subj}"))
                    continue
                hb = rd.heartbeat_age_s
                if hb is not None and hb > f.heartbeat_stale_s:
                    detail = f"heartbeat {fmt_duration(hb)} old > heartbeat_stale {fmt_duration(f.heartbeat_stale_s)}"
                    self._requeue(rd.run_id, rd.attempt, box.id, f"lost: {detail}")
                    self.drift.append(Drift(DriftClass.JOB_CRASHED, subj, detail, f"requeue {subj}"))
                    continue
                if rd.run_id not in self.wanted:
                    self._kill(box, rd, "no longer desired")
                    continue
                spec = self.runs[rd.run_id]
                if rd.started_at is not None and self.now - rd.started_at > spec.max_runtime_s:
                    self.kill_failed.add((rd.run_id, rd.attempt))
                    self._kill(
                        box,
                        rd,
                        f"exceeded max runtime {fmt_duration(spec.max_runtime_s)} "
                        f"(running for {fmt_duration(self.now - rd.started_at)})",
                    )
                    continue
                self.running_by_run[rd.run_id].append((box, rd))
        # A duplicate daemon once launched the same seed twice; keep the oldest attempt, stop the others.
        for run_id in sorted(self.running_by_run):
            group = sorted(self.running_by_run[run_id], key=lambda t: (t[1].attempt, t[0].id))
            keep = group[0]
            for box, rd in group[1:]:
                self._kill(
                    box,
                    rd,
                    f"duplicate: attempt {keep[1].attempt} of this run is already running on instance/{keep[0].id}",
                )
            self.running_by_run[run_id] = [keep]
            box, rd = keep
            spec = self.runs[run_id]
            ran = fmt_duration(self.now - rd.started_at) if rd.started_at is not None else "?"
            beat = fmt_duration(rd.heartbeat_age_s) + " ago" if rd.heartbeat_age_s is not None else "not yet"
            self.noops.append(
                Noop(
                    reason=(
                        f"running for {ran} of max {fmt_duration(spec.max_runtime_s)} on {_gpus_text(rd.gpu_mask)}; "
                        f"heartbeat {beat}"
                    ),
                    subject=f"run/{rd.run_id}.{rd.attempt}@{box.id}",
                )
            )

    def _in_flight(self) -> None:
        """Attempts we launched that no reachable box shows and the archive does not know."""
        self.waiting_runs: set[str] = set()
        for fl in sorted(self.o.in_flight, key=lambda x: (x.run_id, x.attempt, x.instance_id)):
            key = (fl.run_id, fl.attempt)
            if key in self.archived or key in self.visible or key in self.handled:
                continue
            subj_inst = f"instance/{fl.instance_id}"
            box = self.boxes.get(fl.instance_id)
            if box is None:
                why = "vanished" if fl.instance_id not in self.listed_ids else "no longer carries our label"
                self._requeue(fl.run_id, fl.attempt, fl.instance_id, f"box {subj_inst} {why}")
                self.drift.append(
                    Drift(
                        DriftClass.DESTROYED_BY_HAND,
                        subj_inst,
                        f"owned box running run/{fl.run_id}.{fl.attempt} is no longer listed as ours",
                        f"requeue run/{fl.run_id}.{fl.attempt}",
                    )
                )
            elif box.destroy_reason is not None:
                self._requeue(fl.run_id, fl.attempt, box.id, f"its box {subj_inst} is destroyed: {box.destroy_reason}")
            elif box.reachable:
                self._requeue(fl.run_id, fl.attempt, box.id, f"launch never happened: no run dir on {subj_inst}")
            else:
                self.waiting_runs.add(fl.run_id)
                self.noops.append(
                    Noop(
                        reason=f"launched on {subj_inst} which cannot be checked now ({box.state}); waiting",
                        subject=f"run/{fl.run_id}.{fl.attempt}@{fl.instance_id}",
                    )
                )

    def _run_states(self) -> None:
        self.pending: list[_RunState] = []
        self.live_work = bool(self.running_by_run) or bool(self.waiting_runs)
        killed: dict[str, int] = defaultdict(int)
        for rid, _a in self.kill_failed:
            killed[rid] += 1
        requeued: dict[str, int] = defaultdict(int)
        for a in self.actions:
            if isinstance(a, Requeue):
                requeued[a.run_id] += 1
        for run_id in sorted(self.wanted, key=lambda r: self.run_index[r]):
            spec = self.runs[run_id]
            st = _RunState(spec, self.run_index[run_id], max_attempt=self.max_attempt.get(run_id, 0))
            for h in self.history.get(run_id, ()):
                if h.phase is AttemptOutcome.SUCCEEDED:
                    st.succeeded = True
                elif h.phase in _FAILED_PHASES:
                    st.failed += 1
            for ph, _m in self.recorded.get(run_id, ()):
                if ph is AttemptOutcome.SUCCEEDED:
                    st.succeeded = True
                else:
                    st.failed += 1
            st.failed += killed.get(run_id, 0) + requeued.get(run_id, 0)
            st.running = run_id in self.running_by_run or run_id in self.waiting_runs
            if st.succeeded or st.running:
                continue
            allowed = 1 + max(0, spec.retries)
            if st.failed >= allowed:
                self.noops.append(
                    Noop(
                        reason=f"blocked: {st.failed} of {allowed} allowed attempt(s) failed or lost; no more launches",
                        subject=f"run/{run_id}",
                    )
                )
                continue
            self.pending.append(st)
        self.pending.sort(key=lambda s: (-s.spec.priority, s.spec.sweep_order, s.index))

    def _box_readiness(self) -> None:
        f = self.fleet
        for box in self.boxes.values():
            if box.destroy_reason is not None:
                continue
            if box.state == "drifted":
                if box.has_work:
                    n = len(box.live) + len(box.waiting)
                    self._noop_box(
                        box,
                        f"spec drifted (slot {box.own.slot}, now {self.current_spec}); "
                        f"waiting for {n} attempt(s) to finish",
                    )
                else:
                    self._destroy(
                        box,
                        f"spec drifted: box built for {slot_spec_hash(box.own.slot)}, "
                        f"fleet spec is now {self.current_spec}",
                    )
            elif box.state == "bootstrapping" and box.probe is not None:
                bh = f.bootstrap_hash
                if bh in box.probe.bootstrap_running:
                    self._noop_box(box, f"bootstrap {bh} running")
                elif not self.halt:
                    box.considered = True
                    self._add(
                        Bootstrap(reason=f"bootstrap {bh} not done on this box", instance_id=box.id, script_hash=bh)
                    )
            elif box.state == "ready" and box.probe is not None:
                used = self.occupied.get(box.id, set())
                box.free = sorted(
                    (g for g in box.probe.gpus if g.index not in used and g.memory_used_mib <= FREE_GPU_MEMORY_MIB),
                    key=lambda g: g.index,
                )

    def _noop_box(self, box: _Box, reason: str) -> None:
        box.considered = True
        self.noops.append(Noop(reason=reason, subject=f"instance/{box.id}"))

    # ---------------------------------------------------------------------------------------- launch

    def _launch(self) -> None:
        self.unplaced: list[_RunState] = []
        if self.halt:
            self.unplaced = list(self.pending)
            return
        open_boxes = [b for b in self.boxes.values() if b.state == "ready" and b.destroy_reason is None and b.free]
        failed_reqs: set[tuple[int, int]] = set()
        code = self.d.code_commit
        for st in self.pending:
            spec = st.spec
            g, ram = max(1, spec.gpus), spec.min_gpu_ram_mib
            if (g, ram) in failed_reqs or not open_boxes:
                self.unplaced.append(st)
                continue
            placed = False
            for box in open_boxes:
                chosen = [gpu for gpu in box.free if gpu.memory_total_mib >= ram][:g] if ram else box.free[:g]
                if len(chosen) < g:
                    continue
                mask = tuple(gpu.index for gpu in chosen)
                taken = set(mask)
                box.free = [gpu for gpu in box.free if gpu.index not in taken]
                if box.launches == 0 and code and box.probe is not None and code not in box.probe.code_commits:
                    self._add(ShipCode(reason=f"commit {code} is not on this box yet", instance_id=box.id, commit=code))
                box.launches += 1
                box.considered = True
                attempt = st.max_attempt + 1
                allowed = 1 + max(0, spec.retries)
                used = st.failed + 1
                self._add(
                    Launch(
                        reason=f"pending (attempt {used} of {allowed} allowed) on {_gpus_text(mask)}",
                        instance_id=box.id,
                        run_id=spec.id,
                        attempt=attempt,
                        gpu_mask=mask,
                        command=spec.command,
                        code_commit=code,
                        sweep=spec.sweep,
                    )
                )
                placed = True
                if not box.free:
                    open_boxes = [b for b in open_boxes if b.free]
                break
            if not placed:
                failed_reqs.add((g, ram))
                self.unplaced.append(st)

    # ------------------------------------------------------------------------------- idle and surplus

    def _idle_and_surplus(self) -> None:
        f = self.fleet
        no_work = not self.pending and not self.live_work
        candidates: list[tuple[_Box, str]] = []
        for box in self.boxes.values():
            if box.destroy_reason is not None or box.has_work or box.launches:
                continue
            idle_for: float | None = None
            if box.state == "ready" and box.probe is not None:
                idle_for = self.now - (box.probe.last_activity_at or box.inst.start_date)
            if idle_for is not None and idle_for > f.idle_timeout_s:
                timeout = fmt_duration(f.idle_timeout_s)
                candidates.append((box, f"idle for {fmt_duration(idle_for)} > idle_timeout {timeout}"))
            elif no_work:
                candidates.append((box, "surplus: no pending or running work in the fleet"))
            elif idle_for is not None and box.state == "ready":
                timeout = fmt_duration(f.idle_timeout_s)
                self._noop_box(box, f"idle for {fmt_duration(idle_for)} (idle_timeout {timeout}); kept")
        keep_at_least = min(_count_cap(f.min_instances), _count_cap(f.max_instances))
        spare = len(self._alive()) - keep_at_least
        for box, reason in sorted(candidates, key=lambda t: (-t[0].inst.dph_total, t[0].id)):
            if spare > 0:
                self._destroy(box, reason)
                spare -= 1
            else:
                self._noop_box(box, f"{reason}; kept to hold min_instances {keep_at_least}")

    # ----------------------------------------------------------------------------------------- rent

    def _rent(self) -> None:
        f = self.fleet
        subj = f"fleet/{f.name}"
        if self.halt:
            return
        # Runs that boxes already on their way (booting, bootstrapping, briefly unreachable) will take.
        bins = _Bins()
        for box in self._alive():
            if box.state in ("booting", "bootstrapping", "unreachable"):
                busy = len(self.occupied.get(box.id, ()))
                if box.inst.num_gpus - busy > 0:
                    bins.add(_Bin(box.inst.num_gpus - busy, box.inst.gpu_ram_mib))
        uncovered: list[_RunState] = []
        waits_for_booting: dict[str, int] = defaultdict(int)
        for st in self.unplaced:
            if bins.fit(st.spec):
                waits_for_booting[st.spec.sweep] += 1
            else:
                uncovered.append(st)
        alive = self._alive()
        count = len(alive)
        fleet_dph = sum(x.inst.dph_total for x in alive)
        max_n = _count_cap(f.max_instances)
        min_n = min(_count_cap(f.min_instances), max_n)
        instance_cap, fleet_cap = effective_caps(self.d)
        offers = sorted(
            (o for o in self.o.offers if offer_passes(o, f.filters, f.disk_gb)),
            key=lambda o: _rank_key(f.ranking, o),
        )
        used: set[int] = set()
        pointers: dict[tuple[int, int], int] = {}
        rented_bins = _Bins()
        covered_by_rent: dict[str, int] = defaultdict(int)
        blocked: dict[str, int] = defaultdict(int)  # cap message -> runs it left waiting
        blocked_req: dict[tuple[int, int], str] = {}
        unplaced_by_sweep: dict[str, int] = defaultdict(int)

        def pick(g: int, ram: int) -> Offer | None:
            start = pointers.get((g, ram), 0)
            i = start
            while i < len(offers):
                o = offers[i]
                if (
                    o.id not in used
                    and o.num_gpus >= g
                    and o.gpu_ram_mib >= ram
                    and o.dph_total <= instance_cap
                    and fleet_dph + o.dph_total <= fleet_cap + _EPS
                ):
                    pointers[(g, ram)] = i
                    return o
                i += 1
            pointers[(g, ram)] = i
            return None

        def why_not(g: int, ram: int) -> str:
            fitting = [o for o in offers if o.id not in used and o.num_gpus >= g and o.gpu_ram_mib >= ram]
            if not fitting:
                return f"no unused offer passes the filters for {g} GPU(s) with >= {ram} MiB each"
            cheapest = min(o.dph_total for o in fitting)
            if cheapest > instance_cap:
                return (
                    f"instance price cap: cheapest fitting offer {_usd_h(cheapest)} > {_usd_h(instance_cap)} "
                    f"(min of filters.dph_max and budget.max_instance_dph)"
                )
            return (
                f"fleet cap: fleet {_usd_h(fleet_dph)} + cheapest fitting offer {_usd_h(cheapest)} "
                f"> max_fleet_dph {_usd_h(fleet_cap)}"
            )

        def rent(o: Offer, reason: str) -> None:
            nonlocal count, fleet_dph
            used.add(o.id)
            count += 1
            fleet_dph += o.dph_total
            self._add(
                Rent(
                    reason=reason,
                    offer_id=o.id,
                    label=rent_label(f, o.id),
                    image=f.image,
                    disk_gb=f.disk_gb,
                    dph=o.dph_total,
                    gpu_name=o.gpu_name,
                    num_gpus=o.num_gpus,
                )
            )

        for st in uncovered:
            spec = st.spec
            g, ram = max(1, spec.gpus), spec.min_gpu_ram_mib
            if rented_bins.fit(spec):
                covered_by_rent[spec.sweep] += 1
                continue
            unplaced_by_sweep[spec.sweep] += 1
            if self.over_budget:
                blocked[f"over budget, on_exceed drain: {self.budget_text}; renting nothing"] += 1
                continue
            if (g, ram) in blocked_req:
                blocked[blocked_req[(g, ram)]] += 1
                continue
            if count >= max_n:
                blocked[f"instance cap: {count} owned or rented box(es) = max_instances {max_n}"] += 1
                continue
            o = pick(g, ram)
            if o is None:
                msg = why_not(g, ram)
                blocked_req[(g, ram)] = msg
                blocked[msg] += 1
                continue
            unplaced_by_sweep[spec.sweep] -= 1
            covered_by_rent[spec.sweep] += 1
            n_slots = o.num_gpus // g
            rent(
                o,
                f"pending run {spec.id} needs {g} GPU(s); best by {f.ranking.value}: {o.gpu_name} x{o.num_gpus} "
                f"at {_usd_h(o.dph_total)} ({n_slots} slot(s))",
            )
            rented_bins.add(_Bin(o.num_gpus - g, o.gpu_ram_mib))
        # Keep the floor: min_instances boxes even with no work.
        while count < min_n:
            if self.over_budget:
                blocked[f"over budget, on_exceed drain: {self.budget_text}; not renting for min_instances {min_n}"] += 0
                break
            o = pick(1, 0)
            if o is None:
                blocked[f"min_instances {min_n}: {why_not(1, 0)}"] += 0
                break
            rent(
                o,
                f"keeping min_instances {min_n} ({count} owned or rented); best by {f.ranking.value}: "
                f"{o.gpu_name} x{o.num_gpus} at {_usd_h(o.dph_total)}",
            )
        for msg, n in sorted(blocked.items()):
            tail = f"; {n} pending run(s) wait" if n else ""
            self.noops.append(Noop(reason=f"{msg}{tail}", subject=subj))
        sweeps = sorted(set(waits_for_booting) | set(covered_by_rent) | set(unplaced_by_sweep))
        for sweep in sweeps:
            parts = []
            if waits_for_booting.get(sweep):
                parts.append(f"{waits_for_booting[sweep]} wait for boxes already booting")
            if covered_by_rent.get(sweep):
                parts.append(f"{covered_by_rent[sweep]} wait for boxes rented now")
            if unplaced_by_sweep.get(sweep):
                parts.append(f"{unplaced_by_sweep[sweep]} have no capacity")
            total = waits_for_booting.get(sweep, 0) + covered_by_rent.get(sweep, 0) + unplaced_by_sweep.get(sweep, 0)
            self.noops.append(
                Noop(reason=f"{total} pending run(s) not launched: " + ", ".join(parts), subject=f"sweep/{sweep}")
            )
        if self.over_budget:
            first = "none"
            self.drift.append(Drift(DriftClass.OVER_BUDGET, "budget", self.budget_text, first))

    # ----------------------------------------------------------------------------------------- noops

    def _box_noops(self) -> None:
        f = self.fleet
        for box in self.boxes.values():
            if box.considered or box.destroy_reason is not None:
                continue
            inst = box.inst
            if box.state == "booting":
                reason = (
                    f"{inst.status.value} for {fmt_duration(self.now - inst.start_date)} "
                    f"(boot_timeout {fmt_duration(f.boot_timeout_s)})"
                )
            elif box.state == "unreachable":
                since = box.memory.unreachable_since if box.memory and box.memory.unreachable_since else self.now
                reason = (
                    f"unreachable for {fmt_duration(self.now - since)} "
                    f"(grace {fmt_duration(f.unreachable_grace_s)}); waiting"
                )
            elif box.state == "unknown":
                reason = f"provider status {inst.status.value}; left alone this cycle"
            else:
                busy = len(self.occupied.get(box.id, ()))
                reason = f"busy: {busy} of {inst.num_gpus} GPU(s) in use, {len(box.free)} free"
                if not box.free and not box.live and not box.zombies:
                    reason = f"no free GPU (memory in use by something else) on {inst.num_gpus} GPU(s)"
            self._noop_box(box, reason)

    # ---------------------------------------------------------------------------------------- finish

    def _add(self, a: Action) -> None:
        self.actions.append(a)

    def _finish(self) -> Plan:
        owned = list(self.boxes.values())
        before = sum(b.inst.dph_total for b in owned)
        destroyed = sum(a.dph for a in self.actions if isinstance(a, Destroy))
        rented = sum(a.dph for a in self.actions if isinstance(a, Rent))
        actions = self.actions
        noops = list(self.noops)
        drift = list(self.drift)
        if self.halt and self.over_budget:
            first = next((a for a in sorted(actions, key=_order) if isinstance(a, Destroy)), None)
            act = f"destroy {first.target}" if first else "none"
            drift.append(Drift(DriftClass.OVER_BUDGET, "budget", self.budget_text, act))
        suspended = self.fleet.suspend
        if suspended:
            kept: list[Action] = []
            for a in actions:
                if isinstance(a, Record):
                    kept.append(a)
                else:
                    noops.append(
                        Noop(reason=f"suspended: would {SIGNS[a.kind]} {a.target} ({a.reason})", subject=a.target)
                    )
            actions = kept
            drift = [Drift(x.cls, x.subject, x.detail, "none") for x in drift]
            destroyed = rented = 0.0
        return Plan(
            actions=tuple(sorted(actions, key=_order)),
            noops=tuple(sorted(noops, key=lambda n: (n.subject, n.reason))),
            # rounded like the JSON so a saved plan reads back equal (0.1 + 0.2 is not 0.3 in floats)
            fleet_dph_before=round(before, 6),
            fleet_dph_after=round(before - destroyed + rented, 6),
            desired_commit=self.d.commit,
            suspended=suspended,
            warnings=tuple(self.warnings),
            drift=tuple(sorted(drift, key=lambda x: (x.cls.value, x.subject, x.action))),
        )


def _order(a: Action) -> tuple[int, str]:
    return (APPLY_ORDER[a.kind], a.target)


class _Bins:
    """First-fit over boxes-to-be; full ones at the front are skipped for good, keeping packing near O(n)."""

    def __init__(self) -> None:
        self.items: list[_Bin] = []
        self.lo = 0

    def add(self, b: _Bin) -> None:
        self.items.append(b)

    def fit(self, spec: RunSpec) -> bool:
        g = max(1, spec.gpus)
        while self.lo < len(self.items) and self.items[self.lo].free_gpus <= 0:
            self.lo += 1
        for i in range(self.lo, len(self.items)):
            b = self.items[i]
            if b.free_gpus >= g and b.gpu_ram_mib >= spec.min_gpu_ram_mib:
                b.free_gpus -= g
                return True
        return False


def plan(desired: Desired, observed: Observed, now: float) -> Plan:
    """Decide what to do to move ``observed`` towards ``desired`` at time ``now``. Pure and deterministic."""
    return _Planner(desired, observed, now).run()
