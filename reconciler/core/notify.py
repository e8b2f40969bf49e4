"""Which events a cycle produces for people (``notify.events`` in fleet.yaml), each with a stable dedup key.

Pure: from the plan, the observed state and the archive (``Observed.history``). The keys say what happened to
what (a sweep, a run, a box, a cap at a desired revision), never when it was seen, so the same fact seen again next
cycle, or by a restarted controller, has the same key and is sent once (``reconciler.adapters.notifier`` keeps the
keys sent). Where events go is the controller's (RIGSYNC_NOTIFY_URLS), never decided here.

Once across a takeover: a controller claims an event before it sends it (``to_claim``), and the claim, naming the
lease's holder and epoch, is committed and pushed with the cycle's commit (which lands only while the lease is its
own); it sends only what its holder claimed (``may_send``). Another controller that takes the fleet over sees the
claim in git and never sends that event: a claim whose sender stopped before delivering it is not sent at all (at
most once across a takeover), where a delivery recorded only after sending was sent twice. The same holder (its
checkout, restarted) still sends its own claims: what it delivered is in its own ``notified.txt``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass

from reconciler.core.actions import Destroy, Noop, Plan, ReasonCode, Requeue
from reconciler.core.model import Desired, NotifyEvent, Observed, RunPhase
from reconciler.core.runphase import run_phases

# what each decision of the planner means to a person, by its reason code
_CAPS = frozenset(
    {
        ReasonCode.INSTANCE_COUNT_CAP,
        ReasonCode.INSTANCE_PRICE_CAP,
        ReasonCode.FLEET_PRICE_CAP,
        ReasonCode.BUDGET_REFUSED,
        ReasonCode.BUDGET_EXHAUSTED,
        ReasonCode.OVER_BUDGET_HALT,
    }
)
_LOST = frozenset({ReasonCode.PROVIDER_DEAD, ReasonCode.UNREACHABLE_PAST_GRACE, ReasonCode.PROBE_UNUSABLE})


@dataclass(frozen=True)
class Event:
    """One thing to tell: its kind, the key it is sent once by, a title and a one-paragraph body."""

    kind: NotifyEvent
    key: str
    title: str
    body: str


def cycle_events(desired: Desired, observed: Observed, plan: Plan) -> tuple[Event, ...]:
    """The events of one cycle that the fleet asks for, sorted by key, one per key."""
    wanted = frozenset(desired.fleet.notify_events)
    if not wanted:
        return ()
    fleet = desired.fleet.name
    found = [*_sweeps_finished(desired, observed), *_plan_events(fleet, plan, desired.commit)]
    out = {e.key: e for e in found if e.kind in wanted}
    return tuple(out[k] for k in sorted(out))


@dataclass(frozen=True)
class Claim:
    """Who claimed an event: the lease's holder (a controller's checkout) and the epoch of its holding then."""

    holder: str
    epoch: int


def to_claim(events: Iterable[Event], delivered: Set[str], claims: Mapping[str, Claim]) -> tuple[str, ...]:
    """The keys of ``events`` no controller delivered or claimed yet, in order, once each: this one claims them."""
    out: dict[str, None] = {}
    for e in events:
        if e.key not in delivered and e.key not in claims:
            out[e.key] = None
    return tuple(out)


def may_send(key: str, delivered: Set[str], claims: Mapping[str, Claim], holder: str) -> bool:
    """Whether the lease's ``holder`` sends ``key``: not delivered yet, and claimed by that holder."""
    claim = claims.get(key)
    return key not in delivered and claim is not None and claim.holder == holder


def lease_lost_events(desired: Desired, holder: str, epoch: int, why: object) -> tuple[Event, ...]:
    """The lease this controller held (``epoch``) is someone else's now: it stopped acting (if the fleet asks)."""
    if NotifyEvent.LEASE_LOST not in desired.fleet.notify_events:
        return ()
    fleet = desired.fleet.name
    return (
        Event(
            NotifyEvent.LEASE_LOST,
            f"lease_lost:{fleet}:{holder}:{epoch}",
            f"rigsync {fleet}: lease lost",
            f"{holder} stopped acting on fleet {fleet}: {why}",
        ),
    )


def _sweeps_finished(desired: Desired, observed: Observed) -> Iterable[Event]:
    """A sweep whose every wanted run is settled (succeeded, blocked or stopped early), by the archive."""
    phases = run_phases(desired.runs, observed)
    by_sweep: dict[str, list[RunPhase]] = {}
    for spec in desired.runs:
        if spec.id in phases:
            by_sweep.setdefault(spec.sweep.name, []).append(phases[spec.id])
    for sweep, done in sorted(by_sweep.items()):
        if not all(p.finished for p in done):
            continue
        what = ", ".join(f"{done.count(p)} {p.value}" for p in RunPhase if p in done)
        yield Event(
            NotifyEvent.SWEEP_FINISHED,
            f"sweep_finished:{desired.fleet.name}:{sweep}:{len(done)}",
            f"rigsync {desired.fleet.name}: sweep {sweep} finished",
            f"sweep {sweep} finished: {what}",
        )


def _plan_events(fleet: str, plan: Plan, commit: str | None) -> Iterable[Event]:
    for a in (*plan.actions, *plan.noops):
        if isinstance(a, Noop) and a.code is ReasonCode.BLOCKED:
            yield Event(
                NotifyEvent.RUNS_BLOCKED, f"runs_blocked:{fleet}:{a.subject}", f"rigsync {fleet}: {a.subject} blocked",
                f"{a.subject}: {a.reason}",
            )
        elif a.code in _CAPS:
            yield Event(
                NotifyEvent.CAP_REACHED, f"cap_reached:{fleet}:{a.code.value}:{commit or '-'}",
                f"rigsync {fleet}: {a.code.value}", f"{a.target}: {a.reason}",
            )
        if isinstance(a, Destroy) and a.code is ReasonCode.HOST_KEY_CHANGED:
            kind = NotifyEvent.HOST_KEY_CHANGED
        elif isinstance(a, Destroy) and a.code is ReasonCode.PROVIDER_STOPPED:
            kind = NotifyEvent.BOX_PREEMPTED
        elif (isinstance(a, Destroy) and a.code in _LOST) or (
            isinstance(a, Requeue) and a.code is ReasonCode.BOX_VANISHED
        ):
            kind = NotifyEvent.BOX_LOST
        else:
            continue
        box = a.instance_id if isinstance(a, Destroy | Requeue) else 0
        yield Event(kind, f"{kind.value}:{fleet}:{box}", f"rigsync {fleet}: instance {box} {kind.value}", a.reason)
    for est in plan.estimates:
        if est.budget_left_high is not None and est.budget_left_high < 0:
            yield Event(
                NotifyEvent.BUDGET_FORECAST_OVER,
                f"budget_forecast_over:{fleet}:{est.sweep}:{commit or '-'}",
                f"rigsync {fleet}: sweep {est.sweep} will not fit the budget",
                f"sweep {est.sweep} needs at least ${est.usd_low or 0.0:.2f} for its {est.pending_runs} pending and "
                f"{est.running_runs} running run(s): ${-est.budget_left_high:.2f} more than the budget leaves",
            )
