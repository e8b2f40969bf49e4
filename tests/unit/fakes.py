"""In-memory fakes of the ports for the unit tier: a market, rented boxes and a clock, all in one ``FakeWorld``.

The real ``observe()``, ``plan()``, ``apply()`` and ``Reconciler`` run over these; only the world is fake. It is
kept small and honest — it does what the run protocol says a box does, not what the planner would like:

- ``FakeProvider`` (the ``Provider`` port): a market of offers (an offer is one machine: renting it takes it off
  the market), rentals that boot for ``boot_s`` (listed as loading, without an address) and then run, an idempotent
  destroy (a gone instance counts as destroyed), and billing as Vast does it: every rental bills its ``dph_total``
  per second from create until it is destroyed or vanishes (``billed``, ``ledger_usd``), its charges outlive it
  (``billed_costs``), and the account's ``credit`` is what is left of ``credit0`` (None: the provider cannot say).
  ``unbilled`` holds instances the provider has no charge for (a missing field).
- ``FakeBoxes`` (the ``BoxControl`` port): one ``FakeBox`` per booted rental holding GPUs, run directories, shipped
  code commits and bootstrap markers. A launch takes the launch lock (a second launch of the same attempt is
  ``LaunchLockHeld``); a run holds its GPUs' memory while its process lives, beats its heartbeat while time
  passes, ends after its ``Work`` with that exit code, or is ended by the wrapper's own max-runtime guard (143)
  or by a kill (the exit code given); a launch whose code commit was never shipped exits 127 at once, as the
  wrapper does when the code directory is missing. Bootstrap runs detached for ``bootstrap_s``.
- The box-side queue, as the box keeps it: a queued launch (``LaunchJob.queued``) is an entry behind its GPU slot;
  the box starts the next entry of a slot the moment the slot's GPUs are free (at the second the run before it
  ended, whenever the world is next looked at), with a pid and start tick of its own that its run directory then
  reports. A kill of a queued entry tombstones it (it never starts); a draining box takes no more entries; the box
  keeps the highest lease epoch it was shown and refuses launches and entries of an older one.
- Faults, injected on purpose: ``vanish`` (the rental and its box are gone), ``hang`` (the box answers nothing:
  every probe and command is ``HostUnreachable``), ``freeze_run`` (a run's process lives but its heartbeat stops),
  and ``fail_next(method, exception)`` (the next call of a port method raises, e.g. a ``KeyError`` from an SDK or
  an ``OSError`` from an SSH library).
- ``FakeShell`` (the ``Shell`` port) only lets the reconciler forget and close connections: in the unit tier,
  nothing reaches a box except through ``BoxControl``. ``FakeArchive`` is the run archive in memory.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from tarutil import tar_of

from reconciler.core.actions import Plan
from reconciler.core.model import (
    DEFAULT_POOL,
    AttemptRecord,
    BoxProbe,
    Budget,
    Controller,
    Desired,
    Endpoint,
    Fleet,
    FleetMemory,
    GpuState,
    InFlight,
    Instance,
    InstanceStatus,
    MetricGoal,
    Observed,
    Offer,
    OfferFilters,
    OverheadRecord,
    Pool,
    PriceIncrease,
    QueuedEntry,
    RunDirState,
    RunSpec,
    Sweep,
)
from reconciler.errors import (
    HostUnreachable,
    LaunchLockHeld,
    LeaseRace,
    PriceIncreaseGone,
    ProviderPermanent,
    RejectedByProvider,
    RemoteCommandFailed,
)
from reconciler.loop import Reconciler
from reconciler.observe import observe
from reconciler.plan import plan
from reconciler.ports import (
    ATTEMPT_TAR,
    BootstrapCache,
    CheckpointUploaded,
    CommandResult,
    Download,
    Launched,
    LaunchJob,
    RentalAsk,
    Upload,
)

R = TypeVar("R", AttemptRecord, OverheadRecord)

T0 = 1_000_000.0
RUN_GPU_MIB = 3000  # what a live run holds on each of its GPUs
WRAPPER_TIMEOUT_EXIT = 143  # the wrapper's max-runtime guard ends the command with SIGTERM


@dataclass
class FakeClock:
    t: float = T0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += max(0.0, seconds)

    advance = sleep


@dataclass(frozen=True)
class Work:
    """What a launched command does on a fake box: works for ``seconds``, then exits with ``exit_code``."""

    seconds: float = 300.0
    exit_code: int = 0
    best_metric: float | None = None


@dataclass
class FakeRun:
    run_id: str
    attempt: int
    gpu_mask: tuple[int, ...]
    started_at: float | None
    heartbeat_at: float | None
    code_commit: str | None = None
    desired_commit: str | None = None
    max_runtime_s: float = math.inf
    work: Work | None = None  # None: works until it is killed
    pid_alive: bool = True
    exit_code: int | None = None
    ended_at: float | None = None
    frozen: bool = False  # the process lives but its heartbeat stopped
    killed_reason: str | None = None
    best_metric: float | None = None
    final_metric: float | None = None
    pid: int | None = None  # the box's own launch of it (an attempt it started from its queue)
    pid_started: int | None = None

    def end(self, at: float, exit_code: int, reason: str | None = None) -> None:
        self.pid_alive = False
        self.exit_code = exit_code
        self.ended_at = at
        self.heartbeat_at = at  # the wrapper touches it once more on the way out
        if reason is not None:
            self.killed_reason = reason

    @property
    def holds_gpus(self) -> bool:
        return self.pid_alive and self.exit_code is None

    def state(self, now: float) -> RunDirState:
        return RunDirState(
            run_id=self.run_id,
            attempt=self.attempt,
            gpu_mask=self.gpu_mask,
            pid_alive=self.pid_alive,
            started_at=self.started_at,
            heartbeat_age_s=None if self.heartbeat_at is None else max(0.0, now - self.heartbeat_at),
            exit_code=self.exit_code,
            ended_at=self.ended_at,
            code_commit=self.code_commit,
            desired_commit=self.desired_commit,
            best_metric=self.best_metric,
            final_metric=self.final_metric,
            pid=self.pid,
            pid_started=self.pid_started,
        )


@dataclass
class FakeQueued:
    """One entry of a fake box's queue: the attempt the box starts when its slot frees."""

    job: LaunchJob
    work: Callable[[LaunchJob], Work]  # what its command does, decided when the box starts it
    queued_at: float


@dataclass
class FakeBox:
    instance_id: int
    num_gpus: int
    gpu_ram_mib: int
    last_activity_at: float | None
    gpu_base_mib: dict[int, int] = field(default_factory=dict)  # memory used by something that is not a run
    code_commits: list[str] = field(default_factory=list)
    bootstrap_ok: list[str] = field(default_factory=list)
    bootstrap_failed: list[str] = field(default_factory=list)
    bootstrap_running: dict[str, float] = field(default_factory=dict)  # hash -> when it finishes
    runs: dict[tuple[str, int], FakeRun] = field(default_factory=dict)
    hung: bool = False
    disk_free_gb: float | None = 100.0
    python: str | None = "/usr/bin/python3"
    ticked_at: float = 0.0
    queue: list[FakeQueued] = field(default_factory=list)  # in order: per slot, the first of its mask is next
    epoch: int | None = None  # the highest lease epoch it was shown (its fence)
    draining: bool = False
    pids: Iterator[int] = field(default_factory=lambda: itertools.count(7000))

    def touch(self, at: float) -> None:
        self.last_activity_at = at if self.last_activity_at is None else max(self.last_activity_at, at)

    def tick(self, now: float, bootstrap_fails: bool) -> None:
        for h, done_at in sorted(self.bootstrap_running.items()):
            if done_at <= now:
                del self.bootstrap_running[h]
                (self.bootstrap_failed if bootstrap_fails else self.bootstrap_ok).append(h)
                self.touch(done_at)
        self._end_runs(now)
        while self._start_next(now):  # an entry started in the past may have ended by now: its next follows
            self._end_runs(now)
        self.ticked_at = max(self.ticked_at, now)

    def _start_next(self, now: float) -> bool:
        """Start the first entry whose slot is free, at the moment its GPUs freed; False: none can start."""
        for n, entry in enumerate(self.queue):
            mask = set(entry.job.gpu_mask)
            holders = [r for r in self.runs.values() if mask & set(r.gpu_mask) and r.exit_code is None]
            if any(r.holds_gpus for r in holders):
                continue
            freed = max([r.ended_at for r in self.runs.values() if mask & set(r.gpu_mask) and r.ended_at is not None],
                        default=entry.queued_at)
            at = min(now, max(entry.queued_at, freed))
            if any(self.queue[k].job.gpu_mask and mask & set(self.queue[k].job.gpu_mask) for k in range(n)):
                continue  # an earlier entry of this slot goes first
            del self.queue[n]
            job = entry.job
            run = FakeRun(
                job.run_id, job.attempt, tuple(job.gpu_mask), at, now, job.code_commit, job.desired_commit,
                max_runtime_s=job.max_runtime_s, work=entry.work(job), pid=next(self.pids), pid_started=int(at),
            )
            self.runs[(job.run_id, job.attempt)] = run
            self.touch(at)
            if job.code_commit and job.code_commit not in self.code_commits:
                run.end(at, 127)
            return True
        return False

    def _end_runs(self, now: float) -> None:
        for run in self.runs.values():
            if not run.holds_gpus or run.started_at is None:
                continue
            guard = math.ceil(run.max_runtime_s) if math.isfinite(run.max_runtime_s) else None
            done = run.started_at + run.work.seconds if run.work is not None else None
            if done is not None and done <= now and (guard is None or done < run.started_at + guard):
                assert run.work is not None
                run.end(done, run.work.exit_code)
                run.best_metric = run.final_metric = run.work.best_metric
                self.touch(done)
            elif guard is not None and run.started_at + guard <= now:
                run.end(run.started_at + guard, WRAPPER_TIMEOUT_EXIT, f"max_runtime_s {guard} exceeded")
                self.touch(run.started_at + guard)
            elif now > self.ticked_at and not run.frozen:
                run.heartbeat_at = now

    def probe(self, now: float) -> BoxProbe:
        used = dict(self.gpu_base_mib)
        for run in self.runs.values():
            if run.holds_gpus:
                for g in run.gpu_mask:
                    used[g] = used.get(g, 0) + RUN_GPU_MIB
        return BoxProbe(
            instance_id=self.instance_id,
            reachable=True,
            gpus=tuple(GpuState(g, used.get(g, 0), self.gpu_ram_mib) for g in range(self.num_gpus)),
            disk_free_gb=self.disk_free_gb,
            python=self.python,
            bootstrap_hashes=tuple(self.bootstrap_ok),
            bootstrap_failed=tuple(self.bootstrap_failed),
            bootstrap_running=tuple(sorted(self.bootstrap_running)),
            code_commits=tuple(self.code_commits),
            runs=tuple(r.state(now) for _, r in sorted(self.runs.items())),
            last_activity_at=self.last_activity_at,
            queued=self._queued(),
            epoch=self.epoch,
            draining=self.draining,
        )

    def _queued(self) -> tuple[QueuedEntry, ...]:
        position: dict[tuple[int, ...], int] = {}
        out = []
        for entry in self.queue:
            mask = tuple(entry.job.gpu_mask)
            n = position.get(mask, 0)
            position[mask] = n + 1
            out.append(QueuedEntry(entry.job.run_id, entry.job.attempt, mask, entry.job.epoch, n))
        return tuple(out)


@dataclass
class _Rental:
    instance: Instance  # as listed once running
    ready_at: float | None  # None: listed exactly as ``instance`` says (status included)


class FakeWorld:
    """The market, the rentals and their boxes, and the clock they share; ``provider`` and ``boxes`` are the ports."""

    def __init__(
        self,
        offers: Iterable[Offer] = (),
        *,
        clock: FakeClock | None = None,
        boot_s: float = 60.0,
        bootstrap_s: float = 30.0,
        bootstrap_fails: bool = False,
        work: Callable[[LaunchJob], Work] = lambda job: Work(),
    ) -> None:
        self.clock = clock or FakeClock()
        self.market: dict[int, Offer] = {o.id: o for o in offers}
        self.rentals: dict[int, _Rental] = {}
        self.boxes: dict[int, FakeBox] = {}
        self.boot_s = boot_s
        self.bootstrap_s = bootstrap_s
        self.bootstrap_fails = bootstrap_fails
        self.job_stderr: dict[tuple[str, int], bytes] = {}  # what an attempt's job wrote to stderr (default: nothing)
        self.job_files: dict[tuple[str, int], dict[str, bytes]] = {}  # more files its run directory holds (metrics)
        self.objects: dict[str, bytes] = {}  # what boxes uploaded with presigned URLs, by store key
        self.work = work
        self.price_increases: dict[int, PriceIncrease] = {}  # pending, by id (a test adds them)
        self.price_answers: list[tuple[int, bool]] = []  # (pending id, accepted) as the controller answered
        self.rent_asks: dict[int, RentalAsk | None] = {}  # what each rent told the provider it asked for, by offer
        self.credit0: float | None = 1000.0  # the account's deposits; None: the provider does not say its credit
        self.unbilled: set[int] = set()  # instances the provider reports no charge for
        self._bill_closed: dict[int, float] = {}
        self._bill_open: dict[int, tuple[float, float]] = {}  # instance -> (billing since, $/h)
        self.calls: list[str] = []  # every port call, in order ("launch 1001 r1.1", ...)
        self.forgotten: list[int] = []
        self._faults: dict[str, list[BaseException]] = {}
        self._ids = itertools.count(1001)
        self._pids = itertools.count(4242)
        self.provider = FakeProvider(self)
        self.box_control = FakeBoxes(self)

    # ------------------------------------------------------------------------------------------- faults

    def fail_next(self, method: str, exc: BaseException, times: int = 1) -> None:
        """The next ``times`` calls of the port method ``method`` (e.g. "launch", "create_instance") raise ``exc``."""
        self._faults.setdefault(method, []).extend([exc] * times)

    def vanish(self, instance_id: int) -> None:
        """The rental is gone from the provider's list and its box with everything it ran (a host failure)."""
        self.rentals.pop(instance_id, None)
        self.boxes.pop(instance_id, None)
        self.bill(instance_id, 0.0)

    # ----------------------------------------------------------------------------------------------- billing

    def bill(self, instance_id: int, usd_per_hour: float, since: float | None = None) -> None:
        """From ``since`` (default now) on, ``instance_id`` bills ``usd_per_hour`` (0: stops billing)."""
        now = self.clock.now() if since is None else since
        seg = self._bill_open.pop(instance_id, None)
        if seg is not None:
            self._bill_closed[instance_id] = self._bill_closed.get(instance_id, 0.0) + seg[1] * max(
                0.0, now - seg[0]) / 3600.0
        if usd_per_hour > 0:
            self._bill_open[instance_id] = (now, usd_per_hour)

    def billed(self, instance_id: int) -> float:
        """What the instance was billed so far (the provider's figure, and the ledger's)."""
        total = self._bill_closed.get(instance_id, 0.0)
        seg = self._bill_open.get(instance_id)
        if seg is not None:
            total += seg[1] * max(0.0, self.clock.now() - seg[0]) / 3600.0
        return total

    def ledger_usd(self) -> float:
        """Everything the account was billed: the figure rigsync's spend must match."""
        return sum(self.billed(i) for i in set(self._bill_closed) | set(self._bill_open))

    def hang(self, instance_id: int, hung: bool = True) -> None:
        self.boxes[instance_id].hung = hung

    def freeze_run(self, instance_id: int, run_id: str, attempt: int) -> None:
        self.boxes[instance_id].runs[(run_id, attempt)].frozen = True

    def _enter(self, method: str, what: str = "") -> None:
        self.calls.append(f"{method} {what}".strip())
        self.tick()
        queue = self._faults.get(method)
        if queue:
            raise queue.pop(0)

    # -------------------------------------------------------------------------------------------- time

    def tick(self) -> None:
        """Bring the world up to the clock: boots finish, runs end, heartbeats beat, bootstraps complete."""
        now = self.clock.now()
        for iid, rental in self.rentals.items():
            if iid not in self.boxes and rental.ready_at is not None and rental.ready_at <= now:
                inst = rental.instance
                self.boxes[iid] = FakeBox(iid, inst.num_gpus, inst.gpu_ram_mib, rental.ready_at,
                                          ticked_at=rental.ready_at)
        for box in self.boxes.values():
            box.tick(now, self.bootstrap_fails)

    # ---------------------------------------------------------------------------------------- queries

    def listed(self) -> list[Instance]:
        now = self.clock.now()
        out = []
        for _, rental in sorted(self.rentals.items()):
            inst = rental.instance
            if rental.ready_at is not None and now < rental.ready_at:
                inst = replace(inst, status=InstanceStatus.LOADING, direct=None, proxy=None)
            out.append(inst)
        return out

    def live_runs(self) -> list[tuple[int, FakeRun]]:
        return [(iid, r) for iid, box in sorted(self.boxes.items()) for r in box.runs.values() if r.holds_gpus]

    # ------------------------------------------------------------------------------ from an observation

    @classmethod
    def from_observed(cls, observed: Observed, clock: FakeClock, **kwargs: object) -> FakeWorld:
        """A world that an ``observe()`` at ``clock.now()`` sees as ``observed`` (instances, probes, offers)."""
        world = cls(observed.offers, clock=clock, **kwargs)  # type: ignore[arg-type]
        world.credit0 = observed.credit_usd  # what the snapshot's provider said the credit was
        probes = observed.probes_by_id()
        for inst in observed.instances:
            addressed = inst if inst.ssh is not None else replace(inst, direct=Endpoint(f"10.0.{inst.id}.1", 22))
            world.rentals[inst.id] = _Rental(addressed, ready_at=None)
            # What it billed before the snapshot is in the snapshot's spend; this world bills it from now on.
            world.bill(inst.id, inst.dph_total)
            probe = probes.get(inst.id)
            if probe is None:
                continue
            box = FakeBox(inst.id, inst.num_gpus, inst.gpu_ram_mib, probe.last_activity_at, ticked_at=clock.now())
            box.hung = not probe.reachable
            box.disk_free_gb, box.python = probe.disk_free_gb, probe.python
            box.code_commits = list(probe.code_commits)
            box.bootstrap_ok = list(probe.bootstrap_hashes)
            box.bootstrap_failed = list(probe.bootstrap_failed)
            box.bootstrap_running = {h: math.inf for h in probe.bootstrap_running}
            for rd in probe.runs:
                hb = None if rd.heartbeat_age_s is None else clock.now() - rd.heartbeat_age_s
                box.runs[(rd.run_id, rd.attempt)] = FakeRun(
                    rd.run_id, rd.attempt, rd.gpu_mask, rd.started_at, hb, rd.code_commit, rd.desired_commit,
                    pid_alive=rd.pid_alive, exit_code=rd.exit_code, ended_at=rd.ended_at,
                    best_metric=rd.best_metric, final_metric=rd.final_metric,
                )
            box.epoch, box.draining = probe.epoch, probe.draining
            held = {g for r in box.runs.values() if r.holds_gpus for g in r.gpu_mask}
            box.gpu_base_mib = {g.index: g.memory_used_mib for g in probe.gpus if g.index not in held}
            world.boxes[inst.id] = box
        return world


class FakeProvider:
    """The ``Provider`` port over a ``FakeWorld``."""

    def __init__(self, world: FakeWorld) -> None:
        self.world = world

    def search_offers(self, filters: OfferFilters, disk_gb: float, limit: int = 200) -> list[Offer]:
        self.world._enter("search_offers")
        return sorted(self.world.market.values(), key=lambda o: o.id)[:limit]

    def list_instances(self) -> list[Instance]:
        self.world._enter("list_instances")
        return self.world.listed()

    def create_instance(
        self,
        offer_id: int,
        *,
        image: str,
        disk_gb: float,
        label: str,
        onstart: str,
        env: dict[str, str],
        bid_dph: float | None = None,
        asked: RentalAsk | None = None,
    ) -> int:
        w = self.world
        w._enter("create_instance", str(offer_id))
        w.rent_asks[offer_id] = asked
        offer = w.market.pop(offer_id, None)
        if offer is None:
            raise RejectedByProvider(f"rent offer {offer_id}: no_such_ask", status=404, code="no_such_ask")
        iid = next(w._ids)
        now = w.clock.now()
        inst = Instance(
            id=iid,
            label=label,
            status=InstanceStatus.RUNNING,
            gpu_name=offer.gpu_name,
            num_gpus=offer.num_gpus,
            gpu_ram_mib=offer.gpu_ram_mib,
            dph_total=offer.dph_total,
            start_date=now,
            machine_id=offer.machine_id,
            image=image,
            direct=Endpoint(f"10.0.{iid}.1", 22),
        )
        w.rentals[iid] = _Rental(inst, ready_at=now + w.boot_s)
        w.bill(iid, offer.dph_total)
        w.tick()
        return iid

    def destroy_instance(self, instance_id: int) -> None:
        self.world._enter("destroy_instance", str(instance_id))
        self.world.vanish(instance_id)

    def ensure_ssh_key(self, public_key: str) -> None:
        self.world._enter("ensure_ssh_key")

    def account_credit(self) -> float:
        w = self.world
        w._enter("account_credit")
        if w.credit0 is None:
            raise ProviderPermanent("show user: the reply has no numeric credit")
        return w.credit0 - w.ledger_usd()

    def billed_costs(self, since: float, now: float) -> dict[int, float]:
        w = self.world
        w._enter("billed_costs")
        ids = set(w._bill_closed) | set(w._bill_open)
        return {i: w.billed(i) for i in sorted(ids - w.unbilled)}

    def pending_price_increases(self) -> list[PriceIncrease]:
        self.world._enter("pending_price_increases")
        return sorted(self.world.price_increases.values(), key=lambda p: p.id)

    def answer_price_increase(self, pending_id: int, *, accept: bool) -> None:
        w = self.world
        w._enter("answer_price_increase", str(pending_id))
        if w.price_increases.pop(pending_id, None) is None:
            raise PriceIncreaseGone(f"price increase {pending_id}: no_pending_price_increase", status=404,
                                    code="no_pending_price_increase")
        w.price_answers.append((pending_id, accept))


class FakeBoxes:
    """The ``BoxControl`` port over a ``FakeWorld``: what the run protocol does to a box, in memory."""

    def __init__(self, world: FakeWorld) -> None:
        self.world = world

    def probe_many(self, boxes: Sequence[Instance], *, timeout: float, epoch: int = 0) -> list[BoxProbe]:
        w = self.world
        w._enter("probe_many", " ".join(str(b.id) for b in boxes))
        out = []
        for inst in boxes:
            box = w.boxes.get(inst.id)
            if inst.ssh is None:
                out.append(BoxProbe(inst.id, False, error="no ssh address yet"))
            elif box is None:
                out.append(BoxProbe(inst.id, False, error=f"HostUnreachable: {inst.ssh.host}: connection refused"))
            elif box.hung:
                out.append(BoxProbe(inst.id, False, error=f"HostUnreachable: {inst.ssh.host}: no answer within "
                                                          f"{timeout:g}s"))
            else:
                out.append(box.probe(w.clock.now()))
        return out

    def _box(self, inst: Instance) -> FakeBox:
        if inst.ssh is None:
            raise RemoteCommandFailed(f"instance {inst.id} has no ssh address")
        box = self.world.boxes.get(inst.id)
        if box is None:
            raise HostUnreachable(f"{inst.ssh.host}: connection refused")
        if box.hung:
            raise HostUnreachable(f"{inst.ssh.host}: no answer within 60s")
        return box

    def launch(self, box: Instance, job: LaunchJob) -> Launched:
        w = self.world
        w._enter("launch", f"{box.id} {job.run_id}.{job.attempt}")
        b = self._box(box)
        key = (job.run_id, job.attempt)
        if key in b.runs or any((q.job.run_id, q.job.attempt) == key for q in b.queue):
            raise LaunchLockHeld(f"runs/{job.run_id}.{job.attempt} exists: this attempt was launched before")
        if b.epoch is not None and job.epoch < b.epoch:
            raise RemoteCommandFailed(f"exit 5: fenced: epoch {job.epoch} is older than this box's {b.epoch}")
        if job.epoch:
            b.epoch = max(b.epoch or 0, job.epoch)
        now = w.clock.now()
        if job.queued:
            if b.draining:
                raise RemoteCommandFailed("exit 6: draining: this box takes no more queue entries")
            b.queue.append(FakeQueued(job, w.work, now))
            b.touch(now)
            b.tick(now, w.bootstrap_fails)  # its slot may be free already
            return Launched(queued=True)
        run = FakeRun(
            job.run_id, job.attempt, tuple(job.gpu_mask), now, now, job.code_commit, job.desired_commit,
            max_runtime_s=job.max_runtime_s, work=w.work(job),
        )
        b.runs[key] = run
        b.touch(now)
        if job.code_commit and job.code_commit not in b.code_commits:
            run.end(now, 127)  # the wrapper cannot cd into the code directory
        next(w._pids)  # the wrapper's pid: the fake reports no start tick with it, so no process group
        return Launched()

    def drain(self, box: Instance) -> None:
        self.world._enter("drain", str(box.id))
        self._box(box).draining = True

    def mark_harvested(self, box: Instance, run_id: str, attempt: int) -> None:
        """Nothing to mark in memory (the box-queue helper's port method; the plan-queue helper owns this file)."""

    def kill(
        self, box: Instance, run_id: str, attempt: int, *, exit_code: int, reason: str, pid: int | None = None,
        pid_started: int | None = None,
    ) -> None:
        w = self.world
        w._enter("kill", f"{box.id} {run_id}.{attempt}")
        b = self._box(box)
        b.queue = [q for q in b.queue if (q.job.run_id, q.job.attempt) != (run_id, attempt)]
        run = b.runs.get((run_id, attempt))
        now = w.clock.now()
        if run is None:  # kill.sh's tombstone: the launch lock taken, so a late launch of it never starts
            run = b.runs[(run_id, attempt)] = FakeRun(run_id, attempt, (), None, None)
            run.end(now, exit_code, f"never launched here: {reason}")
            return
        if run.exit_code is None:
            run.end(now, exit_code)
            b.touch(now)
        run.pid_alive = False
        run.killed_reason = reason

    def bootstrap(self, box: Instance, script: str, script_hash: str, cache: BootstrapCache | None = None) -> str:
        """As the box does, without a bootstrap cache (the fake's world has no store boxes reach: its ``presigner``
        is None, so apply never hands one)."""
        w = self.world
        w._enter("bootstrap", f"{box.id} {script_hash}")
        if cache is not None:
            raise AssertionError("the fake boxes take no bootstrap cache: no presigner in the fake world")
        b = self._box(box)
        if script_hash in b.bootstrap_ok:
            return "ok"
        if script_hash in b.bootstrap_running:
            return "running"
        if script_hash in b.bootstrap_failed:
            b.bootstrap_failed.remove(script_hash)
        b.bootstrap_running[script_hash] = w.clock.now() + w.bootstrap_s
        return f"started {next(w._pids)}"

    def ship_code(self, box: Instance, commit: str, tar: bytes) -> None:
        w = self.world
        w._enter("ship_code", f"{box.id} {commit}")
        b = self._box(box)
        if commit not in b.code_commits:
            b.code_commits.append(commit)

    def harvest(
        self, box: Instance, run_id: str, attempt: int, *, what: str, patterns: Sequence[str], cap_bytes: int
    ) -> bytes:
        """A harvest stream as the box program writes it: the logs (empty here) and the manifest."""
        self.world._enter("harvest", f"{box.id} {run_id}.{attempt} {what}")
        return tar_of(self._harvested(box, run_id, attempt, what, cap_bytes))

    def _harvested(self, box: Instance, run_id: str, attempt: int, what: str, cap_bytes: int) -> dict[str, bytes]:
        """The files a harvest takes (the manifest last), by name."""
        w = self.world
        b = self._box(box)
        if (run_id, attempt) not in b.runs:
            raise RemoteCommandFailed(f"exit 3: no run directory runs/{run_id}.{attempt} on this box")
        stderr = w.job_stderr.get((run_id, attempt), b"")
        files = {"stderr.log": stderr, "stdout.log": b""} if what == "run" else {}
        if what == "run":
            files.update(w.job_files.get((run_id, attempt), {}))
        manifest = {"v": 1, "what": what, "cap": cap_bytes, "bytes": sum(len(v) for v in files.values()),
                    "files": [[k, len(v)] for k, v in files.items()],
                    "skipped": [], "resumed_from": None}
        files[".rigsync-harvest.json"] = json.dumps(manifest).encode()
        return files

    def stage_resume(self, box: Instance, run_id: str, attempt: int, tar: bytes) -> None:
        self.world._enter("stage_resume", f"{box.id} {run_id}.{attempt}")
        self._box(box)

    # -- direct transfers: the box writes ``world.objects`` (the store's objects, by key) itself

    def upload_harvest(
        self, box: Instance, run_id: str, attempt: int, *, patterns: Sequence[str], cap_bytes: int,
        uploads: Mapping[str, Upload],
    ) -> None:
        self.world._enter("upload_harvest", f"{box.id} {run_id}.{attempt}")
        files = self._harvested(box, run_id, attempt, "run", cap_bytes)
        self.world.objects[uploads[ATTEMPT_TAR].key] = tar_of(files)
        for name, upload in uploads.items():
            if name != ATTEMPT_TAR and name in files:  # a file the run did not write is skipped
                self.world.objects[upload.key] = files[name]

    def upload_checkpoint(
        self, box: Instance, run_id: str, attempt: int, *, path: str, cap_bytes: int, upload: Upload
    ) -> CheckpointUploaded:
        self.world._enter("upload_checkpoint", f"{box.id} {run_id}.{attempt}")
        tar = tar_of(self._harvested(box, run_id, attempt, "checkpoint", cap_bytes))
        self.world.objects[upload.key] = tar
        return CheckpointUploaded(size=len(tar), sha256=hashlib.sha256(tar).hexdigest(), complete=True)

    def stage_resume_from(self, box: Instance, run_id: str, attempt: int, download: Download) -> None:
        self.world._enter("stage_resume_from", f"{box.id} {run_id}.{attempt}")
        self._box(box)
        data = self.world.objects.get(download.key)
        if data is None:
            raise RemoteCommandFailed("checkpoint download exited 3 (refused by the store): get: HTTP 404")
        if len(data) != download.size or hashlib.sha256(data).hexdigest() != download.sha256:
            raise RemoteCommandFailed("checkpoint download exited 5 (size or SHA-256 mismatch)")

    def forget(self, box: Instance) -> None:
        self.world.calls.append(f"forget {box.id}")
        self.world.forgotten.append(box.id)


class FakeShell:
    """The ``Shell`` port in the unit tier: the reconciler may forget and close connections, nothing more."""

    def __init__(self) -> None:
        self.forgotten: list[Endpoint] = []
        self.closed = False

    def run(
        self, endpoint: Endpoint, command: str, *, stdin: bytes | None = None, timeout: float = 30.0,
        max_stdout: int | None = None,
    ) -> CommandResult:
        raise AssertionError("the unit tier reaches boxes through BoxControl, never with shell commands")

    def run_many(
        self, targets: dict[int, tuple[Endpoint, str]], *, timeout: float = 10.0, max_stdout: int | None = None
    ) -> dict[int, CommandResult | Exception]:
        raise AssertionError("the unit tier reaches boxes through BoxControl, never with shell commands")

    def forget(self, endpoint: Endpoint) -> None:
        self.forgotten.append(endpoint)

    def close(self) -> None:
        self.closed = True


class FakeArchive:
    """The run archive in memory: append-only, idempotent by key (attempts and boxes' overhead lines)."""

    def __init__(self, records: Iterable[AttemptRecord] = ()) -> None:
        self._records: list[AttemptRecord | OverheadRecord] = []
        self.append(list(records))

    def records(self) -> Iterator[AttemptRecord]:
        """The attempts, as ``RunArchive.records`` yields them (overhead lines are not attempts)."""
        return iter([r for r in self._records if isinstance(r, AttemptRecord)])

    def overheads(self) -> Iterator[OverheadRecord]:
        return iter([r for r in self._records if isinstance(r, OverheadRecord)])

    def append(self, records: list[R]) -> list[R]:
        keys = {r.key for r in self._records}
        new = []
        for r in records:
            if r.key not in keys:
                keys.add(r.key)
                new.append(r)
        self._records.extend(new)
        return new


class MemoryLeaseStore:
    """``ports.LeaseStore`` in memory: versions ``v1``, ``v2``...; a swap expecting another version is ``LeaseRace``."""

    def __init__(self) -> None:
        self.version: str | None = None
        self.text: str | None = None
        self.messages: list[str] = []
        self._n = 0

    def read_lease(self) -> tuple[str | None, str | None]:
        return self.version, self.text

    def swap_lease(self, expected: str | None, text: str | None, message: str) -> str | None:
        if expected != self.version:
            raise LeaseRace(f"expected {expected}, found {self.version}")
        self._n += 1
        self.version = None if text is None else f"v{self._n}"
        self.text = text
        self.messages.append(message)
        return self.version


def code_tar(commit: str, paths: tuple[str, ...]) -> bytes:
    return f"tar of {', '.join(paths)} at {commit}".encode()


def offer(oid: int, *, gpus: int = 1, dph: float = 0.2, gpu_name: str = "RTX 3090", ram_mib: int = 24576) -> Offer:
    return Offer(
        id=oid,
        machine_id=oid,
        gpu_name=gpu_name,
        num_gpus=gpus,
        gpu_ram_mib=ram_mib,
        dph_total=dph,
        dlperf=20.0 * gpus,
        dlperf_per_dph=20.0 * gpus / dph,
        reliability=0.99,
        inet_down_mbps=500.0,
        cuda=12.2,
        verified=True,
        geolocation="SE",
        disk_space_gb=100.0,
    )


# A run's fields that are its sweep's, by the flat names tests write them with (``flat_run_spec``).
SWEEP_FIELD_OF_RUN = {
    "priority": "priority", "sweep_order": "order", "gpus": "gpus_per_run", "min_gpu_ram_mib": "min_gpu_ram_mib",
    "max_runtime_s": "max_runtime_s", "retries": "retries", "metrics_file": "metrics_file", "metric_key": "metric_key",
    "metric_goal": "metric_goal", "expected_runtime_s": "expected_runtime_s", "env": "env",
    "stall_timeout_s": "stall_timeout_s", "stall_gpu_util_pct": "stall_gpu_util_pct", "pool": "pool",
    "max_preemptions": "max_preemptions",
}


def flat_run_spec(
    *,
    id: str,
    sweep: str,
    cell: str,
    params: tuple[tuple[str, Any], ...],
    seed: int,
    command: str,
    promotion_threshold: float | None = None,
    **sweep_fields: Any,
) -> RunSpec:
    """A run written the tests' short way, with its sweep's fields (gpus, retries, pool, ...) beside its own: those
    become the fields of its ``Sweep`` (named ``sweep``, its command template the run's command)."""
    of_sweep = {SWEEP_FIELD_OF_RUN[k]: v for k, v in sweep_fields.items()}
    return RunSpec(
        id=id,
        sweep=Sweep(name=sweep, command=command, **of_sweep),
        cell=cell,
        params=params,
        seed=seed,
        command=command,
        promotion_threshold=promotion_threshold,
    )


def run_spec(i: int, *, gpus: int = 1, retries: int = 2, max_runtime_s: float = 3600.0) -> RunSpec:
    return flat_run_spec(
        id=f"r{i}",
        sweep="s",
        cell=f"c{i}",
        params=(("i", i),),
        seed=i,
        command=f"python train.py --i {i}",
        priority=0,
        sweep_order=0,
        gpus=gpus,
        min_gpu_ram_mib=0,
        max_runtime_s=max_runtime_s,
        retries=retries,
        metrics_file="metrics.jsonl",
        metric_key="reward",
        metric_goal=MetricGoal.MAX,
    )


def desired_state(
    n_runs: int, *, max_instances: int = 2, bootstrap: str = "", fleet_name: str = "lab", **run_kw: Any
) -> Desired:
    """A fleet of up to ``max_instances`` boxes and ``n_runs`` one-GPU runs (``r0`` ...), code pinned at c0ffee."""
    pool = Pool(
        name=DEFAULT_POOL,
        max_instances=max_instances,
        bootstrap_script=bootstrap,
        bootstrap_hash=hashlib.sha256(bootstrap.encode()).hexdigest()[:16] if bootstrap else "",
    )
    fleet = Fleet(name=fleet_name, max_instances=max_instances, pools=(pool,))
    runs = tuple(run_spec(i, **run_kw) for i in range(n_runs))
    return Desired(fleet=fleet, budget=Budget(), sweeps=(), runs=runs, commit="d35173d", code_commit="c0ffee")


def fake_reconciler(world: FakeWorld, archive: FakeArchive | None = None, **kw: Any) -> Reconciler:
    """The real ``Reconciler`` over ``world`` and ``archive`` (a fresh one by default); ``kw``: memory, journal..."""
    return Reconciler(
        provider=world.provider,
        shell=FakeShell(),
        archive=archive if archive is not None else FakeArchive(),  # type: ignore[arg-type]
        code_tar=code_tar,
        clock=world.clock,  # type: ignore[arg-type]
        box_control=world.box_control,
        **kw,
    )


def observe_and_plan(
    world: FakeWorld, desired: Desired, archive: FakeArchive, env_names: frozenset[str] = frozenset()
) -> tuple[Observed, Plan]:
    """What the real ``observe()`` sees of ``world`` now (with ``env_names`` allowed and set on the controller), and
    its plan."""
    now = world.clock.now()
    observed, _ = observe(desired, world.provider, world.box_control, tuple(archive.records()), FleetMemory(), now)
    memory = replace(observed.memory, in_flight=launched(observed))
    observed = replace(observed, memory=memory)
    return observed, plan(desired, observed, Controller(allowed_secrets=env_names, env_names=env_names), now)


def launched(observed: Observed) -> tuple[InFlight, ...]:
    """The attempts the reachable boxes show and the archive does not know, as in flight where they are: what the
    launches of a test that keeps no memory between cycles made (only launched attempts are recorded)."""
    archived = {rec.key for rec in observed.history}
    return tuple(
        sorted(
            (
                InFlight(r.run_id, r.attempt, p.instance_id, r.gpu_mask, r.started_at or 0.0)
                for p in observed.probes
                if p.reachable
                for r in p.runs
                if (r.run_id, r.attempt) not in archived
            ),
            key=lambda f: (f.run_id, f.attempt),
        )
    )
