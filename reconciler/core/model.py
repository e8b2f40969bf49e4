"""The vocabulary of rigsync: frozen values for desired state, observed state and runs.

Everything here is plain data with no I/O, so the pure planner, the adapters and the tests all speak the
same types. Times are POSIX seconds (float), money is US dollars (float, $/h or $), memory is MiB, and
durations are seconds. Mappings inside frozen dataclasses are stored as tuples of pairs (hashable, ordered).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

Scalar = str | int | float | bool

OWNER_LABEL_PREFIX = "rigsync"
FREE_GPU_MEMORY_MIB = 100
# How often the controller decides unless told otherwise (`rigsync run --interval`): the one default of the interval.
CONTROLLER_INTERVAL_S = 30.0


# --------------------------------------------------------------------------------------------- desired


class Ranking(enum.StrEnum):
    """How offers that pass the filters are ordered; the first is rented."""

    DLPERF_PER_DPH = "dlperf_per_dph"
    # predicted work per $: the sweep's progress rate measured on that machine or GPU model (``throughput``), else
    # the nearest measured model scaled by DLPerf, else DLPerf itself (then it orders as dlperf_per_dph)
    WORK_PER_DPH = "work_per_dph"
    PRICE = "price"
    DLPERF = "dlperf"
    RELIABILITY = "reliability"


class NotifyEvent(enum.StrEnum):
    """What a fleet can ask to be told about (``notify.events``; ``core.notify`` decides when each happens)."""

    SWEEP_FINISHED = "sweep_finished"
    CAP_REACHED = "cap_reached"
    RUNS_BLOCKED = "runs_blocked"
    BOX_LOST = "box_lost"
    BOX_PREEMPTED = "box_preempted"
    HOST_KEY_CHANGED = "host_key_changed"
    LEASE_LOST = "lease_lost"
    BUDGET_FORECAST_OVER = "budget_forecast_over"


class OnExceed(enum.StrEnum):
    """What to do when a budget cap is reached."""

    DRAIN = "drain"  # rent nothing new, let running work finish
    HALT = "halt"  # destroy every owned box now


class MetricGoal(enum.StrEnum):
    MAX = "max"
    MIN = "min"


@dataclass(frozen=True)
class OfferFilters:
    """Which market offers are acceptable. ``None`` means "no constraint"."""

    gpu_names: tuple[str, ...] = ()
    num_gpus_min: int = 1
    num_gpus_max: int | None = None
    gpu_ram_mib_min: int | None = None
    reliability_min: float | None = None
    inet_down_mbps_min: float | None = None
    dph_max: float | None = None
    dlperf_per_dph_min: float | None = None
    cuda_min: float | None = None
    verified: bool = True
    geolocations: tuple[str, ...] = ()  # countries (ISO alpha-2 code or English name, e.g. "SE", "Germany"); see offers


DEFAULT_POOL = "default"  # the one pool of a fleet.yaml without ``pools:`` (today's single filter set)


OWN_PROVIDER = "ssh"  # a pool of the lab's own machines, reached over SSH: never rented, never destroyed


@dataclass(frozen=True)
class OwnHost:
    """One of the lab's own machines in a ``provider: ssh`` pool: where to reach it and what it has."""

    address: str
    port: int = 22
    user: str = "root"
    gpus: int = 1
    gpu_name: str = "own"


@dataclass(frozen=True)
class Pool:
    """One kind of box a fleet holds: which offers, how many, built how. A fleet without ``pools:`` has one, made
    of its top-level keys and named ``DEFAULT_POOL``; budget caps and the fleet's max stay per fleet."""

    name: str
    min_instances: int = 0
    max_instances: int = 1
    filters: OfferFilters = field(default_factory=OfferFilters)
    ranking: Ranking = Ranking.WORK_PER_DPH
    image: str = "pytorch/pytorch:latest"
    disk_gb: float = 20.0
    bootstrap_path: str | None = None
    bootstrap_script: str = ""
    bootstrap_hash: str = ""
    # what the bootstrap builds (absolute paths on the box): packed into the store's bootstrap cache after a
    # success, restored on a new box with the same (script hash, image, CUDA major) instead of running the script
    bootstrap_cache: tuple[str, ...] = ()
    provider: str = "vast"  # "vast": rented from the market; OWN_PROVIDER: the ``hosts`` below, never rented
    hosts: tuple[OwnHost, ...] = ()
    max_bid_dph: float | None = None  # interruptible boxes allowed: bid up to this $/h (None: on-demand only)

    @property
    def own(self) -> bool:
        """Its boxes are the lab's own machines: rigsync never rents for it and never destroys one of them."""
        return self.provider == OWN_PROVIDER


@dataclass(frozen=True)
class Fleet:
    """What is fleet-wide: its name, the bounds on all its boxes together, the timeouts and the host ledger's rules.

    Each kind of box is a ``Pool`` (filters, ranking, image, disk, bootstrap, bids); ``pools`` is never empty: a
    fleet.yaml without ``pools:`` has one, named ``DEFAULT_POOL``, made of its top-level keys.
    """

    name: str
    provider: str = "vast"
    # the whole fleet's bounds (each pool has its own too)
    min_instances: int = 0
    max_instances: int = 1
    idle_timeout_s: float = 600.0
    ttl_s: float | None = None
    boot_timeout_s: float = 900.0
    unreachable_grace_s: float = 120.0
    heartbeat_stale_s: float = 60.0
    suspend: bool = False
    orphan_timeout_s: float = 1800.0  # the box's own watchdog destroys it when no controller touched it this long
    # the host reliability ledger's rules (reconciler.core.offers, "host reliability"): machines never rented (by hand),
    # host faults after which a machine is avoided automatically, how long an offer that failed to rent is skipped
    avoid_machines: tuple[int, ...] = ()
    blacklist_after: int = 3
    ghost_cooldown_s: float = 3600.0
    # bounded bootstrap and renting (reconciler.plan.boxes, reconciler.plan.renting): a box still bootstrapping this
    # long after its bootstrap was first seen missing is destroyed (a fault of its host); at most this many rents
    # per hour (None: ten times max_instances, at least 10); after RENT_BACKOFF_AFTER failures in a row, rents wait
    # rent_backoff, doubling
    bootstrap_timeout_s: float = 1800.0
    # the result store's retention (``ResultStore``): complete checkpoint syncs kept per run (the newest), and how
    # long an attempt's harvest is kept (None: for ever)
    keep_checkpoints: int = 2
    keep_harvests_s: float | None = None
    max_rents_per_hour: int | None = None
    rent_backoff_s: float = 60.0
    # The box-side queue: each GPU slot is given its next attempts ahead of time, as many as are predicted to start
    # within this long (at least one behind a running attempt; 0: no queue, a slot waits for the next cycle).
    queue_ahead_s: float = 300.0
    # At most this share of the boxes held (rounded up, at least one box) may be on a GPU model the sweep has not
    # measured, rented because DLPerf predicts it cheaper per unit of work (0: never explore).
    exploration_share: float = 0.25
    # the pools, in fleet.yaml order; the first is the pool of a sweep that names none
    pools: tuple[Pool, ...] = (Pool(name=DEFAULT_POOL),)
    # the events told to the controller's destinations (RIGSYNC_NOTIFY_URLS, never in desired/); (): none
    notify_events: tuple[NotifyEvent, ...] = ()
    # contract end dates (``reconciler.core.contract``): work is planned to finish, and a live attempt is checkpointed
    # and moved, at least this long before its box's contract ends
    contract_margin_s: float = 1800.0

    def __post_init__(self) -> None:
        if not self.pools:
            raise ValueError("a fleet has at least one pool")

    @property
    def named_pools(self) -> bool:
        """Its fleet.yaml names its pools (``pools:``), so boxes' labels and reasons say the pool; False for the one
        implicit pool of a fleet without ``pools:``."""
        return not (len(self.pools) == 1 and self.pools[0].name == DEFAULT_POOL)

    def pool(self, name: str) -> Pool | None:
        """The pool called ``name``; ``""`` is the first (a sweep that names none)."""
        if not name:
            return self.pools[0]
        return next((p for p in self.pools if p.name == name), None)


@dataclass(frozen=True)
class Budget:
    max_instance_dph: float | None = None
    max_fleet_dph: float | None = None
    daily_usd: float | None = None
    total_usd: float | None = None
    on_exceed: OnExceed = OnExceed.DRAIN


@dataclass(frozen=True)
class PromotionRule:
    """If a cell's best metric reaches ``threshold`` (per the sweep's goal), run ``add_seeds`` more seeds."""

    threshold: float
    add_seeds: int


class SearchMethod(enum.StrEnum):
    """How a ``search:`` block picks configurations (the W&B Sweeps convention)."""

    GRID = "grid"  # every combination of the parameters' ``values``, up to run_cap
    RANDOM = "random"  # run_cap configurations drawn from the distributions (Optuna's RandomSampler, seeded)
    BAYES = "bayes"  # TPE (Optuna's TPESampler, ask-and-tell) in batches, each from the archive's finished trials


class Distribution(enum.StrEnum):
    """A search parameter's distribution (W&B's names); ``q_*`` variants round to multiples of ``q``."""

    CATEGORICAL = "categorical"  # one of ``values``
    UNIFORM = "uniform"  # a float in [min, max]
    LOG_UNIFORM = "log_uniform"  # a float in [min, max], uniform in log space (min > 0)
    INT_UNIFORM = "int_uniform"  # an integer in [min, max]
    Q_UNIFORM = "q_uniform"
    Q_LOG_UNIFORM = "q_log_uniform"


@dataclass(frozen=True)
class SearchParam:
    """One searched parameter: ``values`` (categorical, and what grid enumerates) or a range."""

    name: str
    distribution: Distribution
    values: tuple[Scalar, ...] = ()
    min: float | None = None
    max: float | None = None
    q: float | None = None


@dataclass(frozen=True)
class Search:
    """A sweep's ``search:`` block: configurations beyond a grid, each run with every seed of the sweep.

    ``metric`` is the objective (its key in the metrics file and its goal); ``run_cap`` bounds the configurations;
    ``batch`` is how many a bayes search suggests at a time (its first batch is known up front, like grid and
    random, so review prices it; the next ones follow the archive). ``seed`` makes the suggestions reproducible."""

    method: SearchMethod
    metric_key: str
    metric_goal: MetricGoal
    parameters: tuple[SearchParam, ...]
    run_cap: int
    batch: int = 4
    seed: int = 0


class EarlyTerminateType(enum.StrEnum):
    ASHA = "asha"
    HYPERBAND = "hyperband"


@dataclass(frozen=True)
class EarlyTerminate:
    """Stop losing runs early (``early_terminate:``): rungs at ``min_iter`` × ``eta``^k up to ``max_iter``, in the
    sweep's ``progress`` units; at each rung a run below the top 1/``eta`` of its peers there is stopped."""

    type: EarlyTerminateType
    min_iter: float
    eta: float = 3.0
    max_iter: float | None = None

    def levels(self, total: float | None) -> tuple[float, ...]:
        """Every rung's resource, ``min_iter`` × ``eta``^k, up to ``max_iter`` (else below ``total``, the sweep's
        ``progress.total``: a run there has finished, nothing is left to save). A Hyperband bracket s uses the
        levels from the s-th on, so these are the rungs of every bracket; () when the figures make none."""
        return tuple(level for level in self._ladder(total) if total is None or level < total)

    def brackets(self, total: float | None) -> int:
        """How many Hyperband brackets (s = 0..s_max, s_max = floor(log_eta(max / min_iter))); ASHA has one."""
        if self.type is EarlyTerminateType.ASHA:
            return 1
        return max(1, len(self._ladder(total)))

    def _ladder(self, total: float | None) -> tuple[float, ...]:
        """``min_iter`` × ``eta``^k for k = 0, 1, ... while at most ``max_iter`` (else ``total``)."""
        top = self.max_iter if self.max_iter is not None else total
        if top is None or not (self.min_iter > 0 and self.eta > 1) or not math.isfinite(top):
            return ()
        out: list[float] = []
        for k in range(_MAX_RUNGS):
            try:
                level = self.min_iter * self.eta**k
            except OverflowError:
                break
            if level > top:
                break
            out.append(level)
        return tuple(out)


_MAX_RUNGS = 64  # min_iter * eta**64 is past any step count (a bound: the figures come from desired/)


@dataclass(frozen=True)
class Sweep:
    name: str
    command: str  # the Jinja2 template, as written
    grid: tuple[tuple[str, tuple[Scalar, ...]], ...] = ()
    seeds: tuple[int, ...] = ()
    priority: int = 0
    code_paths: tuple[str, ...] = (".",)
    gpus_per_run: int = 1
    min_gpu_ram_mib: int = 0
    max_runtime_s: float = 3600.0
    retries: int = 2
    max_preemptions: int = 10  # attempts a run may lose to preemption (``AttemptOutcome.PREEMPTED``) before it blocks
    metrics_file: str = "metrics.jsonl"
    metric_key: str | None = None
    metric_goal: MetricGoal = MetricGoal.MAX
    promotion: tuple[PromotionRule, ...] = ()
    expected_runtime_s: float | None = None  # what a run usually takes, when the archive cannot tell yet
    order: int = 0  # position among sweeps (file name order); the tie-break after priority
    # the job's environment as written: (name, literal or "${NAME}"); never a resolved secret (reconciler.core.jobenv)
    env: tuple[tuple[str, str], ...] = ()
    artifacts: tuple[str, ...] = ()  # globs in the run directory harvested with the logs when an attempt ends
    checkpoint: Checkpoint | None = None  # a directory in the run directory synced home while it runs
    # a live attempt with no metric progress, or its GPUs under stall_gpu_util_pct, for this long is stalled: killed
    # and retried (None: never)
    stall_timeout_s: float | None = None
    stall_gpu_util_pct: float = 5.0
    pool: str = ""  # the fleet pool its runs go to ("": the first)
    progress: Progress | None = None  # the metrics key counting a run's work and its total (None: not told)
    search: Search | None = None  # configurations beyond the grid (issue 23); None: grid x seeds only
    early_terminate: EarlyTerminate | None = None  # ASHA/Hyperband stops from live metrics (None: never)

    @property
    def objective(self) -> tuple[str, MetricGoal] | None:
        """The metric its runs are compared by, and its goal: the search's when it has one, else ``metric_key``."""
        if self.search is not None:
            return self.search.metric_key, self.search.metric_goal
        return (self.metric_key, self.metric_goal) if self.metric_key else None


@dataclass(frozen=True)
class Progress:
    """What counts a run's work: the metrics key that grows as it works (``step``) and its value when done."""

    key: str
    total: float

    def fraction(self, metrics: Mapping[str, Scalar]) -> float | None:
        """How much of its work a run has done, 0.0 to 1.0, from its last metrics line; None when that line has no
        usable number under ``key`` (a box's metrics are untrusted: a bool, a string, NaN or inf says nothing)."""
        value = metrics.get(self.key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        try:
            done = float(value) / self.total
        except OverflowError:  # an integer past a float's range (JSON allows 10**400)
            return None
        return min(1.0, max(0.0, done)) if math.isfinite(done) else None


@dataclass(frozen=True)
class Checkpoint:
    """A sweep's checkpoint: the directory (relative to the run directory) synced home every ``every_s``."""

    path: str
    every_s: float


@dataclass(frozen=True)
class RunSpec:
    """One run the desired state asks for: a cell of its sweep's grid with one seed.

    What every run of a sweep shares (resources, runtime, retries, metrics, env, pool, ...) is read from its
    ``sweep``; a run holds only what is its own. ``promotion_threshold`` is None for base seeds. Promotion seeds
    are expanded ahead of time (the pure planner cannot render templates) and become wanted only when the cell's
    best base metric reaches it.
    """

    id: str
    sweep: Sweep
    cell: str  # stable id of the grid cell (sweep + params), shared by all its seeds
    params: tuple[tuple[str, Scalar], ...]
    seed: int
    command: str  # rendered, every substituted value shell-quoted
    promotion_threshold: float | None = None
    trial: int | None = None  # a search's configuration number (0, 1, ...; None: a grid cell); its order of suggestion

    @property
    def params_dict(self) -> dict[str, Scalar]:
        return dict(self.params)


@dataclass(frozen=True)
class Desired:
    fleet: Fleet
    budget: Budget
    sweeps: tuple[Sweep, ...]
    runs: tuple[RunSpec, ...]
    commit: str | None = None  # the desired/ revision these came from, when read from git
    code_commit: str | None = None  # the commit whose tree is shipped to boxes

    def code_paths(self) -> tuple[str, ...]:
        """What ships to the boxes: the union of the sweeps' code paths, in order (the whole tree if none)."""
        paths: list[str] = []
        for sweep in self.sweeps:
            for p in sweep.code_paths:
                if p not in paths:
                    paths.append(p)
        return tuple(paths) or (".",)

    def run(self, run_id: str) -> RunSpec | None:
        for r in self.runs:
            if r.id == run_id:
                return r
        return None

    def sweep(self, name: str) -> Sweep | None:
        for s in self.sweeps:
            if s.name == name:
                return s
        return None


# -------------------------------------------------------------------------------------------- observed


class InstanceStatus(enum.StrEnum):
    """The provider's ``actual_status``, folded to what the planner needs."""

    CREATED = "created"
    LOADING = "loading"
    RUNNING = "running"
    STOPPED = "stopped"
    EXITED = "exited"
    OFFLINE = "offline"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Offer:
    id: int
    machine_id: int
    gpu_name: str
    num_gpus: int
    gpu_ram_mib: int
    dph_total: float
    dlperf: float
    dlperf_per_dph: float
    reliability: float
    inet_down_mbps: float
    cuda: float
    verified: bool
    geolocation: str
    disk_space_gb: float
    min_bid: float | None = None  # the lowest bid for an interruptible box on it, $/h (None: not offered)
    storage_dph: float = 0.0  # the disk part of dph_total, paid on a bid too
    bid_dph: float | None = None  # set by the planner on an offer priced as a bid (``offers.as_interruptible``)
    # when a contract rented on it now would end (the offer's ``end_date``: the host takes the box back then); None:
    # not said (no end is assumed, as for the lab's own machines)
    end_date: float | None = None


@dataclass(frozen=True)
class HostRecord:
    """What rigsync learned about one machine of the market (``machine_id``), kept in observed/hosts.yaml.

    Counts only grow. ``faults`` are the events that say the machine itself is bad (it did not boot in time, its
    bootstrap failed, its box vanished, hung or answered with nothing usable); they rank it lower and, past the
    fleet's ``blacklist_after``, keep it from being rented again (``reconciler.core.offers``). Outbids and failed
    attempts are recorded, not held against the host: the first is the market, the second usually the job.
    """

    machine_id: int
    gpu_name: str = ""
    rents: int = 0
    rent_failures: int = 0  # create calls that failed on one of its offers (a "ghost" offer)
    boot_timeouts: int = 0
    bootstrap_failures: int = 0
    vanishes: int = 0  # an owned box on it left the provider's list without rigsync destroying it
    hangs: int = 0  # an owned box on it stopped answering for longer than unreachable_grace
    unusable: int = 0  # an owned box on it answered with nothing usable (its probe, or a kill) past unreachable_grace
    outbids: int = 0
    attempts_succeeded: int = 0
    attempts_failed: int = 0
    attempts_lost: int = 0
    dlperf: float | None = None  # the DLPerf its offer listed when last rented
    first_seen: float | None = None
    last_seen: float | None = None
    offers: tuple[int, ...] = ()  # offer ids rented (or tried) on it, ascending

    @property
    def faults(self) -> int:
        return self.boot_timeouts + self.bootstrap_failures + self.vanishes + self.hangs + self.unusable


@dataclass(frozen=True)
class GhostOffer:
    """An offer whose rent failed at ``failed_at``: skipped until the fleet's ``ghost_cooldown`` has passed."""

    offer_id: int
    machine_id: int
    failed_at: float
    detail: str = ""


@dataclass(frozen=True)
class HostLedger:
    """The host reliability ledger: per machine, per ghost offer, and the fleet's recent rents (for the rent rate)."""

    hosts: tuple[HostRecord, ...] = ()  # ascending machine_id
    ghosts: tuple[GhostOffer, ...] = ()  # ascending offer_id
    rents_at: tuple[float, ...] = ()  # when the fleet's recent rents happened (the last hour's), ascending
    failures_in_a_row: int = 0  # boxes that ended in a host fault or rents that failed since the last box came up
    last_failure_at: float | None = None
    boxes: tuple[tuple[int, int], ...] = ()  # (instance_id, machine_id) of the owned boxes last listed
    # when this process last noted a cycle (never written to hosts.yaml, where it would change every cycle): a box
    # gone since is a vanish only when that was recent, not after the controller was down and watchdogs acted
    noted_at: float | None = None

    def host(self, machine_id: int) -> HostRecord | None:
        for h in self.hosts:
            if h.machine_id == machine_id:
                return h
        return None

    def ghost(self, offer_id: int) -> GhostOffer | None:
        for g in self.ghosts:
            if g.offer_id == offer_id:
                return g
        return None


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    user: str = ""  # who to log in as ("": rigsync's box user, root); set for the lab's own machines
    # The name the box's SSH host key is pinned under ("": the address). A rented box's is its instance (one pin
    # for its direct and proxy addresses; boxes behind one proxy host, or a box's successor at a reused port, never
    # share one); OpenSSH's HostKeyAlias.
    host_key_alias: str = ""


@dataclass(frozen=True)
class Instance:
    """One box as the provider lists it."""

    id: int
    label: str
    status: InstanceStatus
    gpu_name: str
    num_gpus: int
    gpu_ram_mib: int
    dph_total: float
    start_date: float
    machine_id: int = 0
    image: str = ""
    is_bid: bool = False
    direct: Endpoint | None = None
    proxy: Endpoint | None = None
    cost_usd: float | None = None  # billed so far for this instance, as the provider reports it (None: unknown)
    cuda: float | None = None  # the highest CUDA version its driver supports (None: unknown); the bootstrap cache key
    # when its contract ends and the host takes the box back (the provider's ``end_date``); None: not said, no end
    # (the lab's own machines). An accepted price increase moves it (``reconciler.core.contract.box_end``).
    end_date: float | None = None
    dlperf: float | None = None  # the box's DLPerf as the provider lists it (None: not said); ranks it among offers

    @property
    def ssh(self) -> Endpoint | None:
        """The direct address when there is one, else the proxy."""
        return self.direct or self.proxy


@dataclass(frozen=True)
class PriceIncrease:
    """A host's pending price increase on a live contract (``GET /api/v0/instances/pending-price-increases/``).

    The row's id is its identity (accept and reject name it). Accepted, the contract runs on past ``applies_at`` (its
    current end) to ``new_end`` at ``new_dph``; rejected or left unanswered, it ends at ``applies_at``.
    """

    id: int  # pending_price_increase_id
    instance_id: int  # contract_id
    old_dph: float  # the instance's $/h now
    new_dph: float  # its $/h from ``applies_at`` on, if accepted
    applies_at: float  # the contract's current end (contract_end_date)
    new_end: float | None = None  # the end of the extended contract (ask_end_date); None: not said
    created_at: float | None = None


@dataclass(frozen=True)
class Ownership:
    """Parsed ownership label ``rigsync:<fleet>:<slot>``."""

    fleet: str
    slot: str

    def label(self) -> str:
        return f"{OWNER_LABEL_PREFIX}:{self.fleet}:{self.slot}"

    @staticmethod
    def parse(label: str | None) -> Ownership | None:
        if not label:
            return None
        parts = label.split(":")
        if len(parts) != 3 or parts[0] != OWNER_LABEL_PREFIX or not parts[1] or not parts[2]:
            return None
        return Ownership(fleet=parts[1], slot=parts[2])


def owned_by(fleet: str, label: str | None) -> Ownership | None:
    """The parsed label when a box with this provider label belongs to ``fleet``, else None.

    The one ownership test rigsync has: only boxes carrying ``rigsync:<fleet>:<slot>`` are ever acted upon;
    everything else is foreign.
    """
    own = Ownership.parse(label)
    return own if own is not None and own.fleet == fleet else None


def owns(fleet: str, label: str | None) -> bool:
    """Whether a box with this provider label belongs to ``fleet`` (``owned_by`` as a yes/no)."""
    return owned_by(fleet, label) is not None


def split_owned(instances: Iterable[Instance], fleet: str) -> tuple[list[Instance], list[Instance]]:
    """(owned by ``fleet``, foreign), each sorted by instance id."""
    mine: list[Instance] = []
    foreign: list[Instance] = []
    for inst in sorted(instances, key=lambda i: i.id):
        (mine if owns(fleet, inst.label) else foreign).append(inst)
    return mine, foreign


@dataclass(frozen=True)
class GpuState:
    index: int
    memory_used_mib: int
    memory_total_mib: int
    utilization_pct: float = 0.0

    @property
    def memory_in_use(self) -> bool:
        """Something holds memory on this GPU (more than ``FREE_GPU_MEMORY_MIB``): it is not free for a run."""
        return self.memory_used_mib > FREE_GPU_MEMORY_MIB


@dataclass(frozen=True)
class RunDirState:
    """What one attempt's directory on a box says (``~/rigsync/runs/<run_id>.<attempt>/``)."""

    run_id: str
    attempt: int
    gpu_mask: tuple[int, ...]
    pid_alive: bool
    started_at: float | None
    heartbeat_age_s: float | None
    exit_code: int | None
    ended_at: float | None = None
    code_commit: str | None = None
    desired_commit: str | None = None
    last_metrics: tuple[tuple[str, Scalar], ...] = ()
    best_metric: float | None = None
    final_metric: float | None = None
    metrics_age_s: float | None = None  # since its metrics file last grew (None: no metrics file yet)
    # The wrapper's pid and start tick as the box's own launch of it said (a queued attempt the box started): the
    # controller records them once into ``InFlight`` for a kill (kill.sh checks them again before any signal).
    pid: int | None = None
    pid_started: int | None = None
    # what of the box's report of it could not be used, naming the source and the problem ("exit_code: not an
    # integer", "metrics: best_metric out of range"); the value stays None. Set by ``remote.parse`` only.
    problem: str | None = None


@dataclass(frozen=True)
class QueuedEntry:
    """One attempt in a box's queue (``~/rigsync/queue/``): given ahead of time, started by the box when its slot
    frees, refused by the box when ``epoch`` is older than the box's fence."""

    run_id: str
    attempt: int
    gpu_mask: tuple[int, ...]
    epoch: int = 0
    position: int = 0  # its place in its slot's queue (0: next)


@dataclass(frozen=True)
class BoxProbe:
    """One SSH round trip's answer for one box. ``reachable=False`` carries only ``error``."""

    instance_id: int
    reachable: bool
    error: str | None = None
    gpus: tuple[GpuState, ...] = ()
    disk_free_gb: float | None = None
    python: str | None = None
    bootstrap_hashes: tuple[str, ...] = ()  # bootstrap script hashes that completed successfully
    bootstrap_failed: tuple[str, ...] = ()
    bootstrap_running: tuple[str, ...] = ()
    code_commits: tuple[str, ...] = ()  # commits whose tree is unpacked on the box
    runs: tuple[RunDirState, ...] = ()
    # run directories the box left out of ``runs`` (past its count or byte bound): an attempt missing from ``runs``
    # is then not known to be missing, so "launch never happened" is not concluded from this answer
    runs_omitted: int = 0
    last_activity_at: float | None = None  # the box's own answer (box.boxlib.box_activity), its watchdog's rule too
    box_now: float | None = None  # the box's own clock when it answered
    answered_at: float | None = None  # the controller's clock when that answer was in (None: not known)
    # The box answered with another SSH host key than the one pinned on first contact (``HostKeyMismatch``): it is
    # not reachable, and not trusted either (someone may be impersonating it). Its drift class is
    # ``host_key_changed``: destroyed at once, never sent another command.
    host_key_changed: bool = False
    # The box answered, but what it sent cannot be used (over its byte bound, not a document, out of range): the
    # reason names the source and the problem. ``reachable`` is False with it, so nothing is sent to the box on
    # the strength of its claims; its drift class is ``unusable`` (destroyed after ``unreachable_grace``).
    unusable: str | None = None
    # what the probe claimed that was refused, each a short escaped text ("run dir '../x.1': not a run id",
    # "gpu 7: not one of the instance's 1 GPU(s)"): reported by the planner (foreign attempts), never acted on
    rejected: tuple[str, ...] = ()
    # The box-side queue: attempts given ahead of time, not started yet, in the order each slot starts them.
    queued: tuple[QueuedEntry, ...] = ()
    epoch: int | None = None  # the highest lease epoch the box was shown (its fence); None: never shown one
    draining: bool = False  # the controller marked it: it ends itself once its queue is dry and its runs harvested

    def on_clock(self, now: float, *, clamp: Callable[[float, float], float]) -> BoxProbe:
        """This probe with the box's timestamps moved onto the controller's clock.

        A box's clock may be off, and the planner compares run start times with its own ``now``: read raw, a
        box five minutes fast would make every run look five minutes older. Durations (heartbeat age) need no
        change. Every time moved is then kept near ``now`` by ``clamp(t, now)`` (``bounds.clamp_time``, passed in:
        this vocabulary imports nothing of rigsync's). A ``box_now`` that ``clamp`` would move (a clock days off,
        year 33658) says nothing about the skew: the times are only clamped then, as without ``box_now``.

        The skew is the box's ``box_now`` (stamped as the probe ends) against ``answered_at``, the controller's clock
        when that answer was in; ``now`` (the cycle's start) only when the shell did not say. Against the cycle's
        start, every second the cycle spent before this answer (an offer search waiting out a rate limit, a slow
        box) would move the box's times that far into the past: an attempt's archived start before it was queued.
        """
        sane = self.box_now is not None and math.isfinite(self.box_now) and clamp(self.box_now, now) == self.box_now
        answered = self.answered_at if self.answered_at is not None and math.isfinite(self.answered_at) else now
        skew = answered - self.box_now if sane and self.box_now is not None else 0.0

        def moved(t: float | None) -> float | None:
            return None if t is None or not math.isfinite(t) else clamp(t + skew, now)

        runs = tuple(replace(r, started_at=moved(r.started_at), ended_at=moved(r.ended_at)) for r in self.runs)
        box_now = None if self.box_now is None else answered
        return replace(self, runs=runs, last_activity_at=moved(self.last_activity_at), box_now=box_now)


class AttemptOutcome(enum.StrEnum):
    """How one attempt of a run ended, as the run archive records it."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"  # exited non-zero, or was killed (past max_runtime, duplicate, no longer desired)
    LOST = "lost"  # its box vanished or its heartbeat went stale
    STOPPED_EARLY = "stopped_early"  # the search's early termination stopped it at a rung: not a failure, settled
    PREEMPTED = "preempted"  # the provider took its box (an interruptible box outbid): no retry spent, resumed

    @property
    def uses_a_retry(self) -> bool:
        """Failed and lost attempts both count against the run's ``retries``; a run stopped early is settled, and a
        preempted attempt counts against ``max_preemptions`` instead."""
        return self not in (AttemptOutcome.SUCCEEDED, AttemptOutcome.STOPPED_EARLY, AttemptOutcome.PREEMPTED)

    @property
    def launches_again(self) -> bool:
        """The run is launched again after such an attempt (failed, lost, preempted), from its checkpoint if any."""
        return self not in (AttemptOutcome.SUCCEEDED, AttemptOutcome.STOPPED_EARLY)


class RunPhase(enum.StrEnum):
    """Where one run (a seed of a grid cell) stands. Derived, never stored as input: ``runphase.run_phase``."""

    PENDING = "pending"  # never attempted
    RUNNING = "running"  # an attempt is alive on a box, or launched on a box that cannot be checked now
    SUCCEEDED = "succeeded"
    RETRYING = "retrying"  # the last attempt failed or was lost; retries remain, so it is launched again
    BLOCKED = "blocked"  # as many attempts failed or were lost as ``retries`` allows: no more launches
    QUEUED = "queued"  # an attempt waits in its box's queue behind the slot's current one (in flight, not started)
    STOPPED_EARLY = "stopped_early"  # the search's early termination stopped it at a rung: settled, never relaunched

    @property
    def launchable(self) -> bool:
        return self in _LAUNCHABLE

    @property
    def finished(self) -> bool:
        return self in _FINISHED


_LAUNCHABLE = frozenset({RunPhase.PENDING, RunPhase.RETRYING})
_FINISHED = frozenset({RunPhase.SUCCEEDED, RunPhase.BLOCKED, RunPhase.STOPPED_EARLY})
LAUNCHABLE_PHASES = _LAUNCHABLE  # for hot loops: ``phase in LAUNCHABLE_PHASES`` is ``phase.launchable``


@dataclass(frozen=True)
class AttemptRecord:
    """One finished attempt, as written to the run archive (one JSON line)."""

    run_id: str
    attempt: int
    sweep: str
    phase: AttemptOutcome
    params: tuple[tuple[str, Scalar], ...] = ()
    seed: int = 0
    exit_code: int | None = None
    code_commit: str | None = None
    desired_commit: str | None = None
    image: str = ""
    instance_id: int = 0
    machine_id: int = 0
    gpu_name: str = ""
    dph: float = 0.0
    started_at: float | None = None
    ended_at: float | None = None
    cost_usd: float = 0.0
    best_metric: float | None = None
    final_metric: float | None = None
    reason: str = ""
    # what came home to the local store before the run directory or its box went (``apply``): "ok: ...",
    # "partial: ... skipped", "lost: box unreachable"; None when rigsync ran without a store
    harvest: str | None = None
    stderr_tail: str | None = None  # a failed attempt's last lines of stderr (at most STDERR_TAIL_BYTES)
    resumed_from: int | None = None  # the attempt whose checkpoint this one started from
    queued_at: float | None = None  # given to its box's queue at (None: launched at once)
    progress: float | None = None  # the sweep's progress key's last value (its work done), when it has one

    @property
    def key(self) -> tuple[str, int]:
        return (self.run_id, self.attempt)


@dataclass(frozen=True)
class BoxMemory:
    """What the reconciler remembers about a box between cycles (persisted under observed/)."""

    instance_id: int
    first_seen_at: float
    unreachable_since: float | None = None
    bootstrap_since: float | None = None  # since when the fleet's bootstrap has not been done on it (it answers)
    # When it first answered a probe, and when it was first ready for work (answering with the pool's bootstrap
    # done): boot is first_seen_at..reachable_at, bootstrap reachable_at..ready_at (the timeline, and the
    # pool's measured time to a ready box)
    reachable_at: float | None = None
    ready_at: float | None = None
    pool: str = ""


@dataclass(frozen=True)
class InFlight:
    """An attempt rigsync launched and has not yet archived; remembered across cycles under observed/.

    It is how a run on a box that vanished (and took its run directory with it) is noticed and requeued.
    """

    run_id: str
    attempt: int
    instance_id: int
    gpu_mask: tuple[int, ...]
    launched_at: float
    sweep: str = ""
    resumed_from: int | None = None  # launched from the checkpoint synced from this attempt
    # The attempt's process group as its launch recorded it: the wrapper's pid (a session leader, so its group id)
    # and that process's start time in clock ticks since the box booted (/proc/<pid>/stat field 22). A kill
    # targets this group only, and only while that pid still has that start time; None: the launch did not say.
    pid: int | None = None
    pid_started: int | None = None
    epoch: int = 0  # the lease epoch of the controller that launched it (0: no lease)
    queued: bool = False  # given to the box's queue (``Launch.queued``), started by the box when its slot frees
    # a queued attempt: when this controller first saw its run directory (its own clock). The box's reported start
    # counts only up to it: a box whose clock runs ahead cannot keep its attempt young for ever
    seen_started_at: float | None = None

    def group_on(self, box_id: int, reported: RunDirState | None = None) -> tuple[int | None, int | None]:
        """The process group a kill of this attempt on ``box_id`` may signal, as (pid, start tick); (None, None)
        when there is none, or it names every process or init (pid <= 1). The one the launch recorded; for a queued
        attempt the box started itself (no launch of ours could say it), the one the box's own launch of it reported
        (``reported``: its run directory), a pid > 1 with its start tick only. kill.sh checks either again before a
        signal: alive, started at that tick, its command line naming this attempt's wrapper."""
        if self.instance_id != box_id:
            return None, None
        if self.pid is not None:
            return (self.pid, self.pid_started) if self.pid > 1 else (None, None)
        if (
            self.queued
            and reported is not None
            and (reported.run_id, reported.attempt) == (self.run_id, self.attempt)
            and reported.pid is not None
            and reported.pid > 1
            and reported.pid_started is not None
        ):
            return reported.pid, reported.pid_started
        return None, None


class DriftClass(enum.StrEnum):
    OUTBID = "outbid"  # provider stopped the box (interruptible outbid, or stopped by someone)
    UNREACHABLE = "unreachable"
    # its SSH host key no longer matches the pinned one: destroyed at once (never reused, never sent a command),
    # its attempts requeued as lost (they count against retries, like those of a vanished box)
    HOST_KEY_CHANGED = "host_key_changed"
    BOOT_TIMEOUT = "boot_timeout"
    JOB_CRASHED = "job_crashed"  # wrapper gone without an exit code, or heartbeat stale
    DESTROYED_BY_HAND = "destroyed_by_hand"  # an owned box we remembered is no longer listed
    FOREIGN = "foreign"  # an instance without our ownership label: reported, never touched
    OVER_BUDGET = "over_budget"
    STALLED = "stalled"  # alive, but no metric progress or GPU under its threshold for stall_timeout: killed, retried
    UNUSABLE = "unusable"  # the box answered with a probe that cannot be used: destroyed after unreachable_grace
    # a run directory on an owned box that no launch of this fleet made there: reported, never recorded or trusted
    FOREIGN_ATTEMPT = "foreign_attempt"


@dataclass(frozen=True)
class Drift:
    """One way the world differs from desired, with what the plan does about it."""

    cls: DriftClass
    subject: str  # "instance/123" or "run/<id>.<attempt>"
    detail: str
    action: str  # the planned action's kind and target, or "none"


@dataclass(frozen=True)
class OverheadRecord:
    """A box's billed money that no attempt ran on (boot, bootstrap, idle time, GPUs no run held): one archive line.

    Appended once per box, when the box ended (destroyed by rigsync, by its watchdog or by hand, or vanished from
    the provider's list) and the attempts that ran on it are archived: ``cost_usd`` is the box's bill minus those
    attempts' costs, so the archive's attempt costs plus its overhead lines add up to what the provider billed.
    It is not an attempt: readers of attempts never see it (``RunArchive.records`` yields attempts only).
    """

    instance_id: int
    billed_usd: float  # the box's whole bill, as the provider last said it (or the estimate, see ``estimated``)
    attempts_usd: float  # the costs of the archived attempts that ran on it
    attempts: int = 0  # how many they are
    cost_usd: float = 0.0  # billed_usd - attempts_usd (negative only if an attempt's run time was overestimated)
    machine_id: int = 0
    gpu_name: str = ""
    num_gpus: int = 0
    dph: float = 0.0
    started_at: float | None = None  # the rental's start
    ended_at: float | None = None  # when rigsync first saw it gone from the provider's list
    reachable_at: float | None = None  # ``BoxMemory.reachable_at``/``ready_at``, kept for the timeline
    ready_at: float | None = None
    pool: str = ""
    estimated: bool = False  # the provider could not say the final bill: billed_usd is rigsync's estimate
    reason: str = ""

    @property
    def key(self) -> tuple[str, int]:
        """Its archive key: one overhead line per box (run ids are hex digests, never this word)."""
        return (OVERHEAD_KEY, self.instance_id)


OVERHEAD_KEY = "overhead"


@dataclass(frozen=True)
class BoxSpend:
    """What one owned box has been billed so far, as last read from the provider (or estimated when it could not say).

    Kept between cycles (``Spend.boxes``) so each read adds only what is new, and a box that is gone keeps its
    money in the total: its last figure is final once the provider's list no longer has it.
    """

    instance_id: int
    usd: float  # billed so far; never decreases
    at: float  # when ``usd`` was read
    dph: float = 0.0  # its listed $/h (what the estimate bills it at while the provider cannot say)
    estimated: bool = False  # ``usd`` is not the provider's figure: it could not say, or said less than an estimate
    gone_at: float | None = None  # when it was first missing from the provider's list (None: still listed)
    started_at: float | None = None  # the rental's start, as listed
    machine_id: int = 0
    gpu_name: str = ""
    num_gpus: int = 0

    @property
    def estimate_note(self) -> str:
        """What a reason adds about this bill: that it is rigsync's estimate, when it is."""
        return " (estimated: the provider did not say its final bill)" if self.estimated else ""

    def bill_final(self, now: float) -> bool:
        """The box is gone and its bill is final: the provider said it after the box left the list (or it could
        not say for ``BILL_SETTLE_S``, and the estimate stands)."""
        return self.gone_at is not None and (not self.estimated or now - self.gone_at >= BILL_SETTLE_S)


BILL_SETTLE_S = 600.0  # a gone box whose final bill the provider cannot say is closed with its estimate after this


@dataclass(frozen=True)
class Spend:
    """Money already spent, as the reconciler accounts it: billed by the provider, per box (``boxes``) and summed.

    ``total_usd`` never decreases; ``today_usd`` restarts at UTC midnight (an increase read across midnight is
    split pro rata over the time it covers). ``boxes`` are the owned boxes still billing, and the ones gone whose
    overhead is not yet archived.
    """

    today_usd: float = 0.0
    total_usd: float = 0.0
    boxes: tuple[BoxSpend, ...] = ()

    @property
    def estimated(self) -> bool:
        """Some box's figure is rigsync's estimate, not the provider's bill."""
        return any(b.estimated for b in self.boxes)

    def box(self, instance_id: int) -> BoxSpend | None:
        for b in self.boxes:
            if b.instance_id == instance_id:
                return b
        return None

    def rolled(self, since: float, now: float) -> Spend:
        """The spend at ``now`` if it was this at ``since`` and nothing more was billed: today restarts at midnight."""
        midnight = now - (now % 86400.0)
        return self if since >= midnight else Spend(today_usd=0.0, total_usd=self.total_usd, boxes=self.boxes)

    def plus(self, usd: float, since: float, now: float) -> Spend:
        """``usd`` more, billed evenly over ``[since, now]``: today gets its part after UTC midnight (roll first)."""
        if usd <= 0:
            return self
        midnight = now - (now % 86400.0)
        today = usd if since >= midnight or now <= since else usd * (now - midnight) / (now - since)
        return Spend(today_usd=self.today_usd + today, total_usd=self.total_usd + usd, boxes=self.boxes)

    def accrued(self, dph: float, since: float, now: float) -> Spend:
        """Spend at ``now`` after billing ``dph`` $/h since ``since``; "today" restarts at UTC midnight."""
        if now <= since:
            return self
        return self.rolled(since, now).plus(dph * (now - since) / 3600.0, since, now)


@dataclass(frozen=True)
class RungValue:
    """A run's metric (its sweep's objective) when it first reached a rung: ``level`` in its ``progress`` units."""

    run_id: str
    level: float
    value: float


@dataclass(frozen=True, order=True)
class AttemptNote:
    """What the controller keeps about one attempt between cycles, by run id and attempt number (its ``key``)."""

    run_id: str
    attempt: int

    @property
    def key(self) -> tuple[str, int]:
        return (self.run_id, self.attempt)


@dataclass(frozen=True, order=True)
class GpuQuiet(AttemptNote):
    """Since when a live attempt's GPUs have been under its sweep's ``stall_gpu_util_pct``
    (``FleetMemory.gpu_quiet``)."""

    since: float


@dataclass(frozen=True, order=True)
class CheckpointPull(AttemptNote):
    """When a running attempt's checkpoint was last pulled home, complete or not (``FleetMemory.checkpoint_pulls``)."""

    at: float


@dataclass(frozen=True, order=True)
class HeartbeatClock(AttemptNote):
    """An attempt in flight's heartbeat on the controller's clock (``FleetMemory.heartbeats``): ``implied`` is when the
    box last wrote it as this clock sees it (``now - heartbeat_age_s``), ``since`` when it last moved forward by more
    than a second."""

    implied: float
    since: float


@dataclass(frozen=True, order=True)
class FailedAction:
    """An action that failed in the last apply (``FleetMemory.failed_actions``): its kind, target and error."""

    kind: str
    target: str
    error: str


@dataclass(frozen=True, order=True)
class DistrustedBox:
    """A box the controller no longer trusts to answer for its attempts although it answers, since when and why
    (``FleetMemory.distrusted``), e.g. a kill sent to it failed."""

    instance_id: int
    since: float
    why: str


@dataclass(frozen=True, order=True)
class RentMade:
    """A rent this fleet made (``FleetMemory.rents``): the instance it created, when, for which pool, and whether its
    box has been seen since (listed by the provider, or answering its probe). A rent whose box is never seen did not
    produce a box: renting for its pool waits on it for a bound (``plan.renting``), and it does not count against
    ``max_rents_per_hour`` once that bound has passed."""

    instance_id: int
    at: float
    pool: str = ""
    seen: bool = False


@dataclass(frozen=True)
class FleetMemory:
    """What one cycle hands to the next about a fleet, beyond what the world shows again on its own.

    Per box when it was first seen and since when it has not answered, the attempts launched and not yet
    archived, and the spend brought up to ``spend_at`` (with each owned box's last billed figure, so the next
    read adds only what is new). It is persisted under observed/ (fleet.yaml, runs.yaml, budget.yaml), so a
    restarted rigsync rebuilds it from the files plus the world. Only ``core.remember.remember`` makes a new one.
    """

    boxes: tuple[BoxMemory, ...] = ()
    in_flight: tuple[InFlight, ...] = ()
    spend: Spend = field(default_factory=Spend)
    spend_at: float | None = None  # when ``spend`` was last brought up to date; None: start counting now
    hosts: HostLedger = field(default_factory=HostLedger)  # observed/hosts.yaml
    # since when each live attempt's GPUs have been quiet. Kept by the controller process only (not in observed/,
    # where it would change every cycle): after a restart this clock starts again, so a stall is found at most one
    # stall_timeout later.
    gpu_quiet: tuple[GpuQuiet, ...] = ()
    # when each running attempt's checkpoint was last pulled home. Process only, like ``gpu_quiet``; after a restart
    # the store's last sync stands in for it.
    checkpoint_pulls: tuple[CheckpointPull, ...] = ()
    # Per attempt in flight, its heartbeat on the controller's clock. A box's clock cannot hold a heartbeat fresh:
    # frozen or from the future, it stales on this clock. Process only, like ``gpu_quiet``: after a restart since
    # starts again at first sight.
    heartbeats: tuple[HeartbeatClock, ...] = ()
    # The actions that failed in the last apply. The planner does not send the same action the same way again (a
    # record skips its harvest; a box whose kill failed is distrusted). Process only.
    failed_actions: tuple[FailedAction, ...] = ()
    # Boxes the controller no longer trusts to answer for their attempts although they answer. Planned as a box
    # whose probe is unusable (waits out unreachable_grace from since, then destroyed, its attempts requeued). Kept
    # while the box is listed; process only.
    distrusted: tuple[DistrustedBox, ...] = ()
    # A run's metric when it first reached each rung of its sweep's early_terminate (``RungValue``), one per (run,
    # rung), kept once the run has ended (a finished or stopped run is a peer at its rungs). In runs.yaml (``rungs``).
    rungs: tuple[RungValue, ...] = ()
    # The price increases this fleet accepted (``PriceIncrease``), kept until their box is gone: the provider lists
    # only pending ones, and budgets, estimates and the box's end read the rate that will apply from here. In
    # fleet.yaml (``accepted_price_increases``).
    accepted_increases: tuple[PriceIncrease, ...] = ()
    # The rented boxes this fleet holds, as the provider last listed them (their endpoints and labels), with those
    # still held although the list dropped them (``remember.still_held``): observe probes a held box the list does not
    # show, so a box that still answers is not taken for gone. Process only.
    held: tuple[Instance, ...] = ()
    # The rents of the last hour (``RentMade``), each marked once its box is seen. Process only.
    rents: tuple[RentMade, ...] = ()

    def vetted(self, probe: BoxProbe) -> BoxProbe:
        """The probe as the planner and apply take it: a box this controller distrusts is not reachable (nothing is
        sent to it), its answer unusable for that reason."""
        for d in self.distrusted:
            if d.instance_id == probe.instance_id and probe.reachable:
                return replace(probe, reachable=False, unusable=f"distrusted: {d.why}")
        return probe


@dataclass(frozen=True)
class Controller:
    """The settings of the controller that plans: not observations and never desired/'s, but inputs of ``plan()`` all
    the same (``plan(desired, observed, controller, now)``), and saved with a plan, so a saved plan is a complete
    value. Built by the loop from its flags and environment (``Reconciler.controller``)."""

    # until the controller decides again: its interval, plus its slowest recent cycle and a destroy's latency (the
    # budget's horizon)
    cycle_s: float = CONTROLLER_INTERVAL_S
    # the names the operator allows sweeps to reference (``RIGSYNC_JOB_SECRETS``, ``jobenv.allowed_secrets``)
    allowed_secrets: frozenset[str] = frozenset()
    # names (never values) of the controller's environment variables the sweeps reference that are allowed and set
    env_names: frozenset[str] = frozenset()
    harvesting: bool = False  # a result store is configured: it takes the harvests (and the sweeps' checkpoints)


@dataclass(frozen=True)
class Observed:
    """One snapshot of the world. Built by observe(); read by plan()."""

    instances: tuple[Instance, ...] = ()
    probes: tuple[BoxProbe, ...] = ()
    offers: tuple[Offer, ...] = ()
    history: tuple[AttemptRecord, ...] = ()
    # what the cycles before remembered, brought up to this observation (boxes, in flight, spend, hosts, GPU quiet)
    memory: FleetMemory = field(default_factory=FleetMemory)
    fleet_name: str = ""
    credit_usd: float | None = None  # what the account can still spend, as the provider says (None: unknown)
    # the hosts' pending price increases on this account's contracts, as the provider lists them this cycle
    price_increases: tuple[PriceIncrease, ...] = ()
    # the boxes this fleet held (``FleetMemory.held``) that the provider's list does not show this cycle, as last
    # listed; observe probed them (their probes are among ``probes``), and the planner keeps those that are still held
    # (``remember.still_held``: answering, or silent within unreachable_grace)
    unlisted: tuple[Instance, ...] = ()

    def probe(self, instance_id: int) -> BoxProbe | None:
        for p in self.probes:
            if p.instance_id == instance_id:
                return p
        return None

    def memory_of(self, instance_id: int) -> BoxMemory | None:
        for m in self.memory.boxes:
            if m.instance_id == instance_id:
                return m
        return None

    def probes_by_id(self) -> Mapping[int, BoxProbe]:
        return {p.instance_id: p for p in self.probes}


def run_dir_name(run_id: str, attempt: int) -> str:
    """The directory of one attempt under ``~/rigsync/runs/``; its atomic mkdir is the launch lock."""
    return f"{run_id}.{attempt}"
