"""The closed set of things rigsync can do, each carrying the reason it was decided.

A plan is a value (Terraform's lesson): a tuple of these, serialisable to JSON (``schemas/plan.schema.json``)
and back, so a saved plan can be reviewed in a pull request and applied exactly. Each action carries what apply
needs to carry it out (a rent its box's onstart, a bootstrap its script and cache, the box it talks to), and the
keys of the actions it needs (``NEEDS``, the one table of the dependencies between actions): apply decides nothing.
There is deliberately no ``Stop``: a stopped box keeps billing storage, so rigsync only ever destroys.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, ClassVar, TypeAlias

from reconciler.core.model import AttemptOutcome, AttemptRecord, Drift, DriftClass, Fleet, InFlight, OverheadRecord

PLAN_FORMAT_VERSION = 2  # 2: every action and no-op carries a reason code


class Kind(enum.StrEnum):
    RENT = "rent"
    DESTROY = "destroy"
    BOOTSTRAP = "bootstrap"
    SHIP_CODE = "ship_code"
    LAUNCH = "launch"
    DRAIN = "drain"
    KILL = "kill"
    REQUEUE = "requeue"
    RECORD = "record"
    SYNC_CHECKPOINT = "sync_checkpoint"
    CLOSE_BILL = "close_bill"
    ANSWER_PRICE_INCREASE = "answer_price_increase"
    NOOP = "noop"


SIGNS: dict[Kind, str] = {
    Kind.RENT: "+",
    Kind.DESTROY: "-",
    Kind.BOOTSTRAP: "*",
    Kind.SHIP_CODE: "^",
    Kind.LAUNCH: ">",
    Kind.DRAIN: "%",
    Kind.KILL: "!",
    Kind.REQUEUE: "~",
    Kind.RECORD: "=",
    Kind.SYNC_CHECKPOINT: "<",
    Kind.CLOSE_BILL: "$",
    Kind.ANSWER_PRICE_INCREASE: "?",
    Kind.NOOP: " ",
}

# The order apply() runs them in: free money and record outcomes first, then prepare boxes, then launch; then the
# bookkeeping that reads what the rest left (checkpoints of the attempts still running, the bills of ended boxes once
# their attempts are archived).
APPLY_ORDER: dict[Kind, int] = {
    Kind.RECORD: 0,
    Kind.ANSWER_PRICE_INCREASE: 0,
    Kind.KILL: 1,
    Kind.REQUEUE: 2,
    Kind.DESTROY: 3,
    Kind.RENT: 4,
    Kind.BOOTSTRAP: 5,
    Kind.SHIP_CODE: 6,
    Kind.LAUNCH: 7,
    Kind.DRAIN: 8,
    Kind.SYNC_CHECKPOINT: 9,
    Kind.CLOSE_BILL: 10,
    Kind.NOOP: 11,
}


def apply_key(a: Action) -> tuple[int, bool, str]:
    """The order actions are applied (and listed) in: by ``APPLY_ORDER``; among launches, the ones started now before
    the ones given to a box's queue (an entry must not reach a slot before the launch it queues behind); by target.

    Money first: a destroy because the budget's headroom is gone (or ``on_exceed: halt``) goes right after the
    records of finished attempts, before the kills and requeues of live ones: each of those is a round trip or more
    to a box (a kill, a harvest), and the horizon the headroom was computed for does not wait for them. What the
    live attempts wrote is then lost with their box (their requeue says so)."""
    if a.kind is Kind.DESTROY and a.code in MONEY_FIRST:
        return (APPLY_ORDER[Kind.RECORD], True, a.target)
    return (APPLY_ORDER[a.kind], bool(getattr(a, "queued", False)), a.target)


class ReasonCode(enum.StrEnum):
    """Why an action (or a no-op) was decided, as a stable code beside the readable text (Terraform's ActionReason).

    Tests, tools and agents match on the code; the text says the same for people, with the figures.
    """

    # record, kill, requeue: attempts
    EXITED = "exited"  # an attempt finished on its box: archive it
    ARCHIVED_BUT_ALIVE = "archived_but_alive"  # archived already, its process still runs: kill it
    NOT_DESIRED = "not_desired"  # its run left the desired state (or its promotion no longer holds)
    MAX_RUNTIME = "max_runtime"  # ran longer than the sweep's max_runtime
    STALLED = "stalled"  # no metric progress, or its GPUs idle, for the sweep's stall_timeout
    DUPLICATE_ATTEMPT = "duplicate_attempt"  # another attempt of the same run is already running
    BOX_DESTROYED = "box_destroyed"  # its box is destroyed by this plan
    WRAPPER_GONE = "wrapper_gone"  # the wrapper process is gone without an exit code
    HEARTBEAT_STALE = "heartbeat_stale"  # no heartbeat for longer than heartbeat_stale
    BOX_VANISHED = "box_vanished"  # the box it was launched on is no longer listed (or no longer ours)
    LAUNCH_NEVER_HAPPENED = "launch_never_happened"  # in flight, but its box answers without a run directory
    RESULTS_UNUSABLE = "results_unusable"  # its box's report of it cannot be used: settled once, with the reason
    # sync_checkpoint, close_bill: bookkeeping
    CHECKPOINT_DUE = "checkpoint_due"  # a running attempt's checkpoint was last pulled longer ago than its `every`
    BILL_FINAL = "bill_final"  # a box is gone, its bill is final and its attempts are archived: close its overhead
    # launch, ship code, bootstrap: work
    PENDING_RUN = "pending_run"  # a run waits and a GPU slot is free
    QUEUED_AHEAD = "queued_ahead"  # queued on a busy slot predicted to free within queue_ahead (launch, queued)
    TAIL_TO_FASTEST = "tail_to_fastest"  # the last runs: the longest remaining work goes to the fastest free GPU
    DRAIN_TAIL = "drain_tail"  # no pending run will use this box: it ends once its queue is dry (drain)
    CODE_MISSING = "code_missing"  # the pinned commit is not on the box yet
    BOOTSTRAP_MISSING = "bootstrap_missing"  # the bootstrap script has not run on the box
    # rent
    RENT_FOR_PENDING = "rent_for_pending"  # runs no box can take
    RENT_FOR_MIN_INSTANCES = "rent_for_min_instances"  # the floor of min_instances
    EXPLORE_UNMEASURED = "explore_unmeasured"  # an unmeasured model DLPerf predicts cheaper, within exploration_share
    RENT_MULTI_GPU = "rent_multi_gpu"  # a multi-GPU box: cheaper per GPU, and enough pending runs fill it
    # destroy
    BUDGET_EXHAUSTED = "budget_exhausted"  # the boxes held would pass a cap before the next decision
    OVER_BUDGET_HALT = "over_budget_halt"  # the budget can start no new work and on_exceed is halt
    BUDGET_IDLE = "budget_idle"  # on_exceed drain: no new work can start, so an idle box only burns money
    PROVIDER_STOPPED = "provider_stopped"  # stopped (outbid?) boxes still bill storage
    PROVIDER_DEAD = "provider_dead"  # exited or offline: it cannot run work
    PAST_TTL = "past_ttl"
    BOOT_TIMEOUT = "boot_timeout"
    UNREACHABLE_PAST_GRACE = "unreachable_past_grace"
    PROBE_UNUSABLE = "probe_unusable"  # its probe's answer could not be used for longer than unreachable_grace
    HOST_KEY_CHANGED = "host_key_changed"  # its SSH host key is not the pinned one: untrusted, destroyed at once
    BOOTSTRAP_FAILED = "bootstrap_failed"
    BOOTSTRAP_TIMEOUT = "bootstrap_timeout"  # still bootstrapping after bootstrap_timeout
    OVER_MAX_INSTANCES = "over_max_instances"
    SPEC_DRIFTED = "spec_drifted"  # built from another image/disk/bootstrap than the fleet now says
    IDLE_TIMEOUT = "idle_timeout"
    SURPLUS = "surplus"  # no pending or running work in the fleet
    QUEUE_OVER_BUDGET = "queue_over_budget"  # a queued attempt no longer fits the budget's headroom (kill)
    DRAINED = "drained"  # draining, its queue dry, its attempts recorded: destroyed in the same plan
    # no-ops: considered and left alone
    FOREIGN = "foreign"  # not carrying this fleet's label: reported, never touched
    FOREIGN_ATTEMPT = "foreign_attempt"  # a run directory no launch of this fleet made on that box: never recorded
    UNUSABLE_WAITING = "unusable_waiting"  # its probe could not be used, within unreachable_grace
    PROMOTION_WAITING = "promotion_waiting"  # promotion seeds wait for their cell's metric
    RUNNING = "running"  # a live attempt within its limits
    UNCHECKABLE = "uncheckable"  # launched on a box that cannot be checked now
    LOST_ATTEMPT_UNVERIFIED = "lost_attempt_unverified"  # a lost attempt's box is listed and cannot be checked
    BLOCKED = "blocked"  # the run used all its attempts
    DRIFTED_BUSY = "drifted_busy"  # drifted box kept until its attempts finish
    HARVEST_PENDING = "harvest_pending"  # would be destroyed: waits for its finished attempts to be harvested
    BOOTSTRAP_RUNNING = "bootstrap_running"
    IDLE_KEPT = "idle_kept"  # idle, but within idle_timeout
    MIN_INSTANCES_KEPT = "min_instances_kept"  # would go, but min_instances holds it
    BOOTING = "booting"  # within boot_timeout
    UNREACHABLE_WAITING = "unreachable_waiting"  # within unreachable_grace
    STATUS_UNKNOWN = "status_unknown"  # a provider status rigsync does not act on
    BUSY = "busy"  # GPUs in use by rigsync's runs
    QUEUED = "queued"  # an attempt waits in its box's queue
    WAIT_FOR_BUSY_GPU = "wait_for_busy_gpu"  # a held GPU frees before a new box would be ready: not rented for
    PREDICTED_NEED = "predicted_need"  # kept: a queued or predicted run needs it within its idle timeout
    EXPLORE_CAPPED = "explore_capped"  # an unmeasured model was not rented: exploration_share is used up
    NOT_LAUNCHED = "not_launched"  # pending runs waiting for boxes (booting, rented now, no capacity)
    SECRET_MISSING = "secret_missing"  # the sweep's env references a variable the controller does not set
    EARLY_STOPPED = "early_stopped"  # below the top 1/eta of its peers at a rung of the sweep's early_terminate
    SECRET_NOT_ALLOWED = "secret_not_allowed"  # it references a variable RIGSYNC_JOB_SECRETS does not list
    BUDGET_REFUSED = "budget_refused"  # a launch or a rent would not fit what the budget leaves
    CREDIT_REFUSED = "credit_refused"  # a rent the account's credit cannot cover
    INSTANCE_COUNT_CAP = "instance_count_cap"  # max_instances reached
    INSTANCE_PRICE_CAP = "instance_price_cap"  # cheapest fitting offer above the per-box $/h cap
    FLEET_PRICE_CAP = "fleet_price_cap"  # renting would pass the fleet $/h cap
    NO_OFFER = "no_offer"  # no unused offer passes the filters
    HOST_AVOIDED = "host_avoided"  # its machine is in avoid_machines or blacklisted by the host ledger
    GHOST_OFFER = "ghost_offer"  # its rent failed recently: skipped for ghost_cooldown
    RENT_RATE_LIMITED = "rent_rate_limited"  # max_rents_per_hour reached
    RENT_BACKOFF = "rent_backoff"  # boxes failed (or rents failed) in a row: renting waits, doubling each time
    RENT_IN_FLIGHT = "rent_in_flight"  # a rent made for the pool is not listed yet: renting for it waits on that one
    RENT_UNSEEN = "rent_unseen"  # a rent's box never appeared within the bound: one more rent, that one not counted
    # a held box the provider's list does not show answered its probe: unlisted, not vanished (kept with its attempts)
    BOX_UNLISTED = "box_unlisted"
    LIST_IMPLAUSIBLE = "list_implausible"  # the list dropped most of the fleet while it answers: nothing is acted on
    SUSPENDED = "suspended"  # the fleet is suspended: the action is reported, not taken
    OWN_BOX_KEPT = "own_box_kept"  # one of the lab's own machines (provider ssh): never destroyed, whatever the reason
    OWN_POOL_FULL = "own_pool_full"  # runs of a provider ssh pool wait for its machines: rigsync never rents for it
    PREEMPTED = "preempted"  # the provider took the attempt's box (outbid): requeued as preempted, no retry spent
    PREEMPTIONS_EXHAUSTED = "preemptions_exhausted"  # the run was preempted more often than max_preemptions allows
    # contract end dates (``reconciler.core.contract``)
    CONTRACT_TOO_SHORT = "contract_too_short"  # an offer not rented: its contract ends before the work could finish
    CONTRACT_ENDS_BEFORE_RUN = "contract_ends_before_run"  # not launched or queued there: it cannot finish in time
    CONTRACT_ENDING = "contract_ending"  # checkpointed and moved (or the box let go) before its contract ends
    CONTRACT_ENDED = "contract_ended"  # the host took the box back at its contract's end: its attempts are preempted
    # price increases on live contracts
    PRICE_INCREASE_ACCEPTED = "price_increase_accepted"  # the new rate still fits the caps and the ranking
    PRICE_INCREASE_REJECTED = "price_increase_rejected"  # it does not: the box ends at its current contract end


# destroys that stop the billing before anything else is sent to a box (``apply_key``)
MONEY_FIRST = frozenset({ReasonCode.BUDGET_EXHAUSTED, ReasonCode.OVER_BUDGET_HALT})


@dataclass(frozen=True)
class Action:
    reason: str
    code: ReasonCode = field(kw_only=True)
    # the ``key``s of the actions of its plan it needs: it is not run when one of them failed or was not run
    # (``NEEDS``; the planner names them, ``with_needs``, and checks them, ``needs_problems``)
    needs: tuple[str, ...] = field(default=(), kw_only=True)
    kind: ClassVar[Kind]

    @property
    def target(self) -> str:
        raise NotImplementedError

    @property
    def key(self) -> str:
        """How the other actions of its plan name it (``needs``): its kind and its target."""
        return f"{self.kind.value} {self.target}"

    @property
    def talks_to(self) -> int | None:
        """The instance it sends commands to over SSH when applied (None: it sends none to a box)."""
        return None

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "target": self.target, **asdict(self), "code": self.code.value}


@dataclass(frozen=True)
class Rent(Action):
    offer_id: int
    label: str
    image: str
    disk_gb: float
    dph: float
    gpu_name: str
    num_gpus: int
    # the instance's onstart: its watchdog with the fleet's limits (``remote.watchdog_onstart``; it names no key)
    onstart: str
    bid_dph: float | None = None  # interruptible: the bid, $/h (``dph`` is the bid plus storage); None: on-demand
    kind: ClassVar[Kind] = Kind.RENT

    @property
    def target(self) -> str:
        return f"offer/{self.offer_id}"


@dataclass(frozen=True)
class Destroy(Action):
    instance_id: int
    dph: float = 0.0
    kind: ClassVar[Kind] = Kind.DESTROY

    @property
    def target(self) -> str:
        return f"instance/{self.instance_id}"


@dataclass(frozen=True)
class Bootstrap(Action):
    instance_id: int
    script_hash: str
    script: str = ""  # the script of the pool whose hash ``script_hash`` is ("" when no pool's is)
    # its pool's bootstrap cache on this box (``identity.box_cache_key``; None: it caches nothing), the paths cached,
    # and how long the upload URL lives (it must outlive the fleet's bootstrap_timeout)
    cache_key: str | None = None
    cache_paths: tuple[str, ...] = ()
    cache_upload_ttl_s: float = 0.0
    kind: ClassVar[Kind] = Kind.BOOTSTRAP

    @property
    def target(self) -> str:
        return f"instance/{self.instance_id}"

    @property
    def talks_to(self) -> int | None:
        return self.instance_id


@dataclass(frozen=True)
class ShipCode(Action):
    instance_id: int
    commit: str
    paths: tuple[str, ...] = (".",)  # what of the commit's tree ships (``Desired.code_paths``)
    kind: ClassVar[Kind] = Kind.SHIP_CODE

    @property
    def target(self) -> str:
        return f"instance/{self.instance_id}"

    @property
    def talks_to(self) -> int | None:
        return self.instance_id


@dataclass(frozen=True)
class Launch(Action):
    instance_id: int
    run_id: str
    attempt: int
    gpu_mask: tuple[int, ...]
    command: str
    code_commit: str | None
    sweep: str = ""
    # given to the box's queue behind the slot's current attempt instead of started now: the box starts it the
    # moment the slot frees (and refuses it if its epoch is older than the box's fence)
    queued: bool = False
    kind: ClassVar[Kind] = Kind.LAUNCH

    @property
    def target(self) -> str:
        return f"run/{self.run_id}.{self.attempt}@{self.instance_id}"

    @property
    def talks_to(self) -> int | None:
        return self.instance_id


@dataclass(frozen=True)
class Drain(Action):
    """Mark a box draining: its queue gets nothing more, and it ends itself once the queue is dry and every finished
    attempt on it is harvested (the controller destroys it first when it sees that)."""

    instance_id: int
    kind: ClassVar[Kind] = Kind.DRAIN

    @property
    def target(self) -> str:
        return f"instance/{self.instance_id}"

    @property
    def talks_to(self) -> int | None:
        return self.instance_id


@dataclass(frozen=True)
class Kill(Action):
    """Kill a running attempt (past max runtime, or its run is no longer desired); then record it."""

    instance_id: int
    run_id: str
    attempt: int
    # its process group as the launch recorded it (``InFlight.pid``/``pid_started``); None: end it without a signal
    # by pid (the box's wrapper ends its own command once the exit code is written)
    pid: int | None = None
    pid_started: int | None = None
    # what the attempt is archived as: failed (max runtime, stalled, duplicate, not desired), or stopped_early (the
    # search's early termination: settled, no retry spent, its curve kept)
    phase: AttemptOutcome = AttemptOutcome.FAILED
    keep_checkpoints: int = Fleet.keep_checkpoints  # the run's checkpoint syncs the store keeps (its harvest may sync)
    kind: ClassVar[Kind] = Kind.KILL

    @property
    def target(self) -> str:
        return f"run/{self.run_id}.{self.attempt}@{self.instance_id}"

    @property
    def talks_to(self) -> int | None:
        return self.instance_id


@dataclass(frozen=True)
class Requeue(Action):
    """An attempt was lost (box gone, heartbeat stale): archive it as lost, or as preempted when the provider took its
    box (outbid: no retry spent); the run becomes pending."""

    run_id: str
    attempt: int
    instance_id: int
    # its process group as the launch recorded it, as ``Kill`` has it: a requeue from a box that answers kills there
    pid: int | None = None
    pid_started: int | None = None
    # what the attempt is archived as: lost, or preempted (the provider took its box: no retry spent)
    phase: AttemptOutcome = AttemptOutcome.LOST
    # None: its box is listed and answered its probe, so the requeue kills the attempt there (it may still run
    # half-alive) and brings home what it wrote; else why its box is not contacted (the record says it was lost so)
    unreached: str | None = None
    keep_checkpoints: int = Fleet.keep_checkpoints  # as ``Kill``'s
    kind: ClassVar[Kind] = Kind.REQUEUE

    @property
    def target(self) -> str:
        return f"run/{self.run_id}.{self.attempt}"

    @property
    def talks_to(self) -> int | None:
        return self.instance_id if self.unreached is None else None


@dataclass(frozen=True)
class Record(Action):
    """An attempt finished on a box (exit code present): write its archive record."""

    run_id: str
    attempt: int
    instance_id: int
    phase: str
    exit_code: int | None = None
    # the harvest is not tried, and why (its box's answer was unusable, or the same harvest failed last cycle):
    # the record is written with what the probe read, so a bad box settles the attempt once instead of looping
    skip_harvest: str | None = None
    keep_checkpoints: int = Fleet.keep_checkpoints  # as ``Kill``'s
    kind: ClassVar[Kind] = Kind.RECORD

    @property
    def target(self) -> str:
        return f"run/{self.run_id}.{self.attempt}"

    @property
    def talks_to(self) -> int | None:
        return self.instance_id if self.skip_harvest is None else None


@dataclass(frozen=True)
class SyncCheckpoint(Action):
    """Pull a running attempt's checkpoint directory home (what a retry resumes from). Reads only."""

    instance_id: int
    run_id: str
    attempt: int
    path: str  # the sweep's checkpoint directory, relative to the run directory
    keep_checkpoints: int = Fleet.keep_checkpoints  # the run's syncs the store keeps (``retention.checkpoints``)
    kind: ClassVar[Kind] = Kind.SYNC_CHECKPOINT

    @property
    def target(self) -> str:
        return f"run/{self.run_id}.{self.attempt}@{self.instance_id}"

    @property
    def talks_to(self) -> int | None:
        return self.instance_id


@dataclass(frozen=True)
class CloseBill(Action):
    """A box ended and its bill is final: archive its overhead line (its bill minus the costs of its attempts)."""

    instance_id: int
    kind: ClassVar[Kind] = Kind.CLOSE_BILL

    @property
    def target(self) -> str:
        return f"instance/{self.instance_id}"


@dataclass(frozen=True)
class AnswerPriceIncrease(Action):
    """Accept or reject a host's pending price increase on one of this fleet's boxes (code says which)."""

    pending_id: int
    instance_id: int
    accept: bool
    old_dph: float
    new_dph: float
    applies_at: float
    kind: ClassVar[Kind] = Kind.ANSWER_PRICE_INCREASE

    @property
    def target(self) -> str:
        return f"instance/{self.instance_id}"


@dataclass(frozen=True)
class Noop(Action):
    """Something considered and left alone; kept so every decision has a visible reason."""

    subject: str = ""
    kind: ClassVar[Kind] = Kind.NOOP

    @property
    def target(self) -> str:
        return self.subject


# The closed set: ``apply`` matches over it, and mypy checks the match is exhaustive (``assert_never``).
AnyAction: TypeAlias = (
    Rent | Destroy | Bootstrap | ShipCode | Launch | Drain | Kill | Requeue | Record | SyncCheckpoint | CloseBill
    | AnswerPriceIncrease | Noop
)

ACTION_TYPES: dict[Kind, type[Action]] = {
    cls.kind: cls
    for cls in (
        Rent, Destroy, Bootstrap, ShipCode, Launch, Drain, Kill, Requeue, Record, SyncCheckpoint, CloseBill,
        AnswerPriceIncrease, Noop,
    )
}
# Kinds that change nothing in the world (a read the controller makes): a plan of only these has no changes.
READS_ONLY = frozenset({Kind.SYNC_CHECKPOINT})


def closed(action: Action) -> AnyAction:
    """``action`` as a member of the closed union (every Action subclass is one of ``ACTION_TYPES``)."""
    if isinstance(action, AnyAction):
        return action
    raise TypeError(f"not an action of the closed set: {type(action).__name__}")


def action_from_json(d: dict[str, Any]) -> Action:
    kind = Kind(d["kind"])
    cls = ACTION_TYPES[kind]
    # every list of an action is a tuple (gpu_mask, needs, paths)
    fields: dict[str, Any] = {
        k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k not in ("kind", "target")
    }
    fields["code"] = ReasonCode(fields["code"])
    if kind in (Kind.KILL, Kind.REQUEUE) and "phase" in fields:  # what the kill or requeue archives the attempt as
        fields["phase"] = AttemptOutcome(fields["phase"])
    return cls(**fields)


@dataclass(frozen=True)
class SweepEstimate:
    """The price of a sweep's unfinished work (``plan.estimate``): GPU-hours, a dollar range, an ETA, the budget."""

    sweep: str
    pending_runs: int
    running_runs: int
    gpu_hours: float
    runtime_h: float  # one run's expected runtime
    runtime_source: str  # archive | expected_runtime | max_runtime (the upper bound)
    runtime_samples: int  # succeeded attempts behind an archive figure
    usd_low: float | None  # cheapest place the work could run (None: no price known)
    usd_high: float | None
    eta_h: float | None  # with the fleet at its full size to itself
    fleet_gpus: int
    budget_left_low: float | None  # the tightest cap's remaining after the work at its dearest (None: no cap)
    budget_left_high: float | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> SweepEstimate:
        return SweepEstimate(**d)


@dataclass(frozen=True)
class Plan:
    """The planner's answer: what to do, what was considered and left, and where the money goes."""

    actions: tuple[Action, ...]
    noops: tuple[Noop, ...] = ()
    fleet_dph_before: float = 0.0
    fleet_dph_after: float = 0.0
    desired_commit: str | None = None
    suspended: bool = False
    warnings: tuple[str, ...] = field(default=())
    drift: tuple[Drift, ...] = ()
    estimates: tuple[SweepEstimate, ...] = ()
    # When the planner wants to decide again, if sooner than the controller's interval (a slot predicted to free
    # with nothing queued behind it, a draining box's last attempt predicted to end); None: at the interval.
    wake_at: float | None = None

    @property
    def changes(self) -> bool:
        """Something in the world or the archive changes (a checkpoint sync only reads)."""
        return any(a.kind not in READS_ONLY for a in self.actions)

    def counts(self, *, changes_only: bool = False) -> dict[str, int]:
        """Actions by kind; ``changes_only`` leaves out the reads (a checkpoint sync), so that what is committed
        about a plan does not change with them every ``checkpoint.every``."""
        out: dict[str, int] = {}
        for a in self.actions:
            if changes_only and a.kind in READS_ONLY:
                continue
            out[a.kind.value] = out.get(a.kind.value, 0) + 1
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": PLAN_FORMAT_VERSION,
            "desired_commit": self.desired_commit,
            "suspended": self.suspended,
            "fleet_dph_before": round(self.fleet_dph_before, 6),
            "fleet_dph_after": round(self.fleet_dph_after, 6),
            "counts": self.counts(),
            "actions": [a.to_json() for a in self.actions],
            "noops": [n.to_json() for n in self.noops],
            "warnings": list(self.warnings),
            "drift": [
                {"class": d.cls.value, "subject": d.subject, "detail": d.detail, "action": d.action}
                for d in self.drift
            ],
            "estimates": [e.to_json() for e in self.estimates],
            "wake_at": self.wake_at,
        }

    @staticmethod
    def from_json(d: dict[str, Any]) -> Plan:
        return Plan(
            actions=tuple(action_from_json(a) for a in d["actions"]),
            noops=tuple(
                Noop(reason=n["reason"], subject=n.get("subject", ""), code=ReasonCode(n["code"]))
                for n in d.get("noops", [])
            ),
            fleet_dph_before=float(d.get("fleet_dph_before", 0.0)),
            fleet_dph_after=float(d.get("fleet_dph_after", 0.0)),
            desired_commit=d.get("desired_commit"),
            suspended=bool(d.get("suspended", False)),
            warnings=tuple(d.get("warnings", ())),
            drift=tuple(
                Drift(cls=DriftClass(x["class"]), subject=x["subject"], detail=x["detail"], action=x["action"])
                for x in d.get("drift", [])
            ),
            estimates=tuple(SweepEstimate.from_json(e) for e in d.get("estimates", [])),
            wake_at=None if d.get("wake_at") is None else float(d["wake_at"]),
        )


@dataclass(frozen=True)
class Outcome:
    """What became of one action in apply."""

    action: Action
    ok: bool
    detail: str = ""
    # not attempted (shutting down, the lease lost, an action it needs did not succeed, its box stopped answering):
    # the next cycle plans it again
    skipped: bool = False


@dataclass
class ApplyResult:
    """What one apply did: each action's outcome and what it made (kept here, beside the actions, so the pure
    ``remember`` reads it without importing apply)."""

    outcomes: list[Outcome] = field(default_factory=list)
    archived: list[AttemptRecord] = field(default_factory=list)
    overheads: list[OverheadRecord] = field(default_factory=list)  # boxes that ended, closed in the archive
    launched: list[InFlight] = field(default_factory=list)
    # launches whose command failed after it was written down: it may still have reached the box (a timeout,
    # a dropped connection), so the attempt stays in flight and its number stays used; the next cycle sees its
    # run directory or fences it off as "launch never happened" (kill.sh's tombstone)
    in_doubt: list[InFlight] = field(default_factory=list)
    settled: set[tuple[str, int]] = field(default_factory=set)  # attempts recorded/requeued/killed this cycle
    curves: dict[str, str] = field(default_factory=dict)  # observed/curves/... files of the attempts settled
    rented: list[int] = field(default_factory=list)
    rented_as: dict[int, Rent] = field(default_factory=dict)  # each new instance id with the rent that made it
    destroyed: list[int] = field(default_factory=list)
    checkpoint_pulls: dict[tuple[str, int], float] = field(default_factory=dict)  # (run id, attempt) -> when pulled
    lease_lost: str | None = None  # why the fence stopped this apply (the rest was skipped); None: it did not

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.ok and not o.skipped]

    def failure_lines(self) -> tuple[str, ...]:
        return tuple(f"{o.action.kind.value} {o.action.target}: {o.detail}" for o in self.failures)


# ------------------------------------------------------------------------------------- needs between actions


@dataclass(frozen=True)
class Need:
    """One row of the table of the needs between actions: an action of kind ``dependent`` needs every action of its
    plan of a ``prerequisites`` kind that ``on`` ties to it (the same value on both; None ties nothing), and is not
    run when one of them failed or was not run; ``unmet`` says why, from that action's key and its outcome (None:
    it was not applied, as a suspended plan withholds it)."""

    dependent: Kind
    prerequisites: frozenset[Kind]
    on: Callable[[Action], object]
    unmet: Callable[[str, Outcome | None], str]


def _run_of(a: Action) -> str | None:
    return a.run_id if isinstance(a, Launch | Kill | Requeue) else None


def _box_settled(a: Action) -> int | None:
    return a.instance_id if isinstance(a, CloseBill | Kill | Requeue | Record) else None


def _drained_box(a: Action) -> int | None:
    if isinstance(a, Destroy):
        return a.instance_id if a.code is ReasonCode.DRAINED else None
    return a.instance_id if isinstance(a, Record) else None


def _target(key: str) -> str:
    """The target of the action ``key`` names (``Action.key``: its kind, a space, its target)."""
    return key.partition(" ")[2]


def _may_still_run(key: str, got: Outcome | None) -> str:
    p = got.action if got is not None else None
    if got is None or not isinstance(p, Kill | Requeue):
        return f"{key} was not applied (its attempt may still run)"
    return f"{p.kind.value} of attempt {p.attempt} {'was not run' if got.skipped else 'failed'} ({got.detail[:120]})"


NEEDS: tuple[Need, ...] = (
    # A run is launched again only once its live attempt is made safe: after a failed kill or requeue that attempt
    # may still run (the next cycle sees the world again). A requeue from a box that cannot be checked is held back
    # by the planner (``plan.attempts.unverified_lost``); this covers a box that stopped answering since its probe.
    Need(Kind.LAUNCH, frozenset({Kind.KILL, Kind.REQUEUE}), _run_of, _may_still_run),
    # A drained box goes with its results home, not before: the next cycle destroys it.
    Need(Kind.DESTROY, frozenset({Kind.RECORD}), _drained_box, lambda key, got: f"{_target(key)} was not harvested"),
    # A box's bill closes once its attempts are archived: its overhead is the bill minus their costs, so an attempt
    # whose record or requeue failed (or a suspended plan holds back) keeps the bill open until a cycle settles it.
    Need(
        Kind.CLOSE_BILL, frozenset({Kind.KILL, Kind.REQUEUE, Kind.RECORD}), _box_settled,
        lambda key, got: f"{_target(key).partition('@')[0]} is not archived",  # the attempt (a kill's is @ its box)
    ),
)


def _declared(actions: Sequence[Action]) -> list[tuple[str, ...]]:
    """For each of ``actions``, the keys of those of them it needs by ``NEEDS``, sorted."""
    found: list[set[str]] = [set() for _ in actions]
    for row in NEEDS:
        keys: dict[object, list[str]] = {}
        for p in actions:
            if p.kind in row.prerequisites and (tie := row.on(p)) is not None:
                keys.setdefault(tie, []).append(p.key)
        for i, a in enumerate(actions):
            if a.kind is row.dependent and (tie := row.on(a)) is not None:
                found[i].update(keys.get(tie, ()))
    return [tuple(sorted(f)) for f in found]


def with_needs(actions: Sequence[Action]) -> list[Action]:
    """``actions`` (one plan's), each naming the others it needs by ``NEEDS`` (``Action.needs``)."""
    declared = _declared(actions)
    return [a if a.needs == keys else replace(a, needs=keys) for a, keys in zip(actions, declared, strict=True)]


def needs_problems(actions: Sequence[Action], *, suspended: bool = False) -> list[str]:
    """What in ``actions`` (one plan's) breaks ``NEEDS``, each said once (empty: nothing): an action that does not
    name an action of the plan it needs, or names one that the plan holds more than once or applies after it. A need
    the plan does not hold is one only a suspended plan has (it withholds that action, and so what needs it is not
    run)."""
    by_key: dict[str, list[Action]] = {}
    for a in actions:
        by_key.setdefault(a.key, []).append(a)
    problems: list[str] = []
    for a, declared in zip(actions, _declared(actions), strict=True):
        problems += [f"{a.key} does not name {key}, which it needs" for key in declared if key not in a.needs]
        for key in a.needs:
            held = by_key.get(key, [])
            if len(held) > 1:
                problems.append(f"{a.key} needs {key}, which the plan holds {len(held)} times")
            elif held and apply_key(held[0]) >= apply_key(a):
                problems.append(f"{a.key} needs {key}, which is applied after it")
            elif not held and not suspended:
                problems.append(f"{a.key} needs {key}, which the plan does not hold")
    return sorted(set(problems))


def unmet_need(action: Action, done: Mapping[str, Outcome]) -> str | None:
    """Why ``action`` is not run, by the table's one rule: an action it needs failed or was not applied (``done``:
    the outcomes of its plan so far, by key). None: every one it needs succeeded."""
    for key in action.needs:
        got = done.get(key)
        if got is None or not got.ok:
            kind = key.partition(" ")[0]
            row = next((r for r in NEEDS if r.dependent is action.kind and kind in r.prerequisites), None)
            if row is not None:
                return row.unmet(key, got)
            return f"{key} {'was not applied' if got is None else 'did not succeed'}"
    return None
