"""The host reliability ledger's update rule: what one applied cycle teaches rigsync about the machines it rents.

The market does not say which hosts are bad; rigsync learns it from its own boxes and keeps it in git
(``observed/hosts.yaml``), so a host whose boxes hang or fail to boot is ranked lower and then avoided, and an
offer that fails to rent (a "ghost") is skipped for a while instead of being picked first again every cycle. The
rules that *read* the ledger live in ``reconciler.core.offers`` (ranking, blacklist, ghosts) and
``reconciler.plan.renting`` (the rent rate); this module only writes it, as a pure function of the cycle's plan
outcomes, so it is tested without a provider.

What counts, per machine:

* a rent: a ``Rent`` that succeeded on one of its offers; a rent failure (and a ghost): one that failed;
* a host fault (``HostRecord.faults``): a ``Destroy`` that succeeded for a box of it that did not boot in time
  (``boot_timeout``), whose bootstrap failed or timed out, that stopped answering past ``unreachable_grace``
  (a hang) or answered with nothing usable for as long (``unusable``), that the provider reports
  exited/offline, or that left the provider's list without rigsync destroying it (both a vanish; the latter
  only while this controller watched without a gap longer than ``orphan_timeout``, since after one its own
  watchdog may have destroyed it as designed);
* an outbid: a ``Destroy`` of a box the provider stopped;
* attempts: each archived attempt by its ``machine_id`` (succeeded, failed, lost).

``last_seen`` is the time of a machine's last event, not of the last cycle that listed its box: the file changes
only when something happened, so a quiet fleet makes no commit.

The fleet-wide rent rate (``rents_at``, the last hour's successful rents) and the run of failures since a box last
worked (``failures_in_a_row``: boxes that never came up, for a boot timeout or a failed or timed-out bootstrap, and
failed rents; reset by a launch that succeeded) feed the rent
limiter in ``reconciler.plan.renting``.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import replace

from reconciler.core.actions import Action, Destroy, Launch, ReasonCode, Rent
from reconciler.core.model import (
    AttemptOutcome,
    AttemptRecord,
    Fleet,
    GhostOffer,
    HostLedger,
    HostRecord,
    Observed,
    owns,
)

RENT_WINDOW_S = 3600.0  # the rent rate is counted over this window (max_rents_per_hour)

# A box destroyed for one of these reasons marks its machine: the counter it adds to.
FAULT_COUNTERS: dict[ReasonCode, str] = {
    ReasonCode.BOOT_TIMEOUT: "boot_timeouts",
    ReasonCode.BOOTSTRAP_FAILED: "bootstrap_failures",
    ReasonCode.BOOTSTRAP_TIMEOUT: "bootstrap_failures",
    ReasonCode.UNREACHABLE_PAST_GRACE: "hangs",
    ReasonCode.PROBE_UNUSABLE: "unusable",
    ReasonCode.PROVIDER_DEAD: "vanishes",
}
OUTBID_CODES = frozenset({ReasonCode.PROVIDER_STOPPED})
# The destroys of boxes the provider took back (outbid, or reclaimed by its host at the contract's end): their
# attempts are preempted, not lost (``BoxTable.preempted``). Only an outbid marks the machine; an ended contract is no
# fault of its host (it ends when the offer said it would).
PREEMPTION_CODES = OUTBID_CODES | frozenset({ReasonCode.CONTRACT_ENDED})
# The boxes whose end counts towards the rent backoff: they never became ready, so renting again the same way is how
# a rent storm starts. Boxes that worked and then vanished or hung are the market's noise: their runs are requeued and
# rented for at once.
NEVER_CAME_UP = frozenset({ReasonCode.BOOT_TIMEOUT, ReasonCode.BOOTSTRAP_FAILED, ReasonCode.BOOTSTRAP_TIMEOUT})

_ATTEMPT_COUNTERS = {
    AttemptOutcome.SUCCEEDED: "attempts_succeeded",
    AttemptOutcome.FAILED: "attempts_failed",
    AttemptOutcome.LOST: "attempts_lost",
}

Outcome = tuple[Action, bool, str]  # (the action, whether it succeeded, its detail); skipped actions left out


class _Book:
    """The ledger while one cycle's events are added (mutable only inside ``note_cycle``)."""

    def __init__(self, ledger: HostLedger, now: float) -> None:
        self.hosts = {h.machine_id: h for h in ledger.hosts}
        self.now = now

    def add(self, machine_id: int, counter: str | None = None, **fields: object) -> None:
        if machine_id <= 0:  # the provider did not say: nothing to learn about
            return
        old = self.hosts.get(machine_id) or HostRecord(machine_id=machine_id, first_seen=self.now, last_seen=self.now)
        changes: dict[str, object] = dict(fields)
        if counter is not None:
            changes[counter] = getattr(old, counter) + 1
            changes["last_seen"] = self.now
        self.hosts[machine_id] = replace(old, **changes)  # type: ignore[arg-type]


def note_cycle(
    ledger: HostLedger,
    fleet: Fleet,
    observed: Observed,
    outcomes: Iterable[Outcome],
    archived: Iterable[AttemptRecord],
    now: float,
) -> HostLedger:
    """The ledger after a cycle that observed ``observed`` and applied ``outcomes`` (archiving ``archived``)."""
    now = float(round(now))  # whole seconds, as observed/hosts.yaml writes them: the file reads back equal
    book = _Book(ledger, now)
    # the boxes held: listed, or dropped by the list while they answer (``FleetMemory.held``): neither is a vanish
    listed_ids = {i.id for i in observed.instances}
    held = (*observed.instances, *(i for i in observed.memory.held if i.id not in listed_ids))
    mine = [i for i in held if owns(fleet.name, i.label)]
    machine_of = {i.id: i.machine_id for i in mine}
    machine_of.update({iid: mid for iid, mid in ledger.boxes if iid not in machine_of})
    offers = {o.id: o for o in observed.offers}
    for inst in mine:  # a box rented before the ledger knew its host (last_seen moves only with events: no churn)
        if inst.machine_id not in book.hosts:
            book.add(inst.machine_id, gpu_name=inst.gpu_name)
    failures = ledger.failures_in_a_row
    last_failure = ledger.last_failure_at
    rents_at = list(ledger.rents_at)  # expired ones are dropped below, only in a cycle that changes the ledger
    ghosts = {g.offer_id: g for g in ledger.ghosts}
    destroyed: set[int] = set()
    # A box remembered from the last cycle and no longer listed, which rigsync did not destroy, vanished.
    listed = {i.id for i in held}
    # Only while this controller watched without a gap: after a restart, or a pause past orphan_timeout, a box may
    # be gone because its own watchdog destroyed it as designed, which says nothing about its host.
    watched = ledger.noted_at is not None and now - ledger.noted_at < fleet.orphan_timeout_s
    for iid, mid in ledger.boxes if watched else ():
        if iid not in listed:
            # a host fault, but not a rent failure: a box that worked and vanished is requeued at once, no backoff
            book.add(mid, "vanishes")
    for action, ok, detail in outcomes:
        if isinstance(action, Rent):
            offer = offers.get(action.offer_id)
            mid = offer.machine_id if offer is not None else 0
            if ok:
                rents_at.append(now)
                known = book.hosts.get(mid)
                ids = tuple(sorted({*(known.offers if known else ()), action.offer_id}))
                book.add(mid, "rents", gpu_name=action.gpu_name, offers=ids,
                         dlperf=offer.dlperf if offer is not None else None)
                ghosts.pop(action.offer_id, None)
            else:
                book.add(mid, "rent_failures")
                ghosts[action.offer_id] = GhostOffer(action.offer_id, mid, now, detail[:200])
                failures, last_failure = failures + 1, now
        elif isinstance(action, Destroy) and ok:
            destroyed.add(action.instance_id)
            mid = machine_of.get(action.instance_id, 0)
            counter = FAULT_COUNTERS.get(action.code)
            if counter is not None:
                book.add(mid, counter)
                if action.code in NEVER_CAME_UP:
                    failures, last_failure = failures + 1, now
            elif action.code in OUTBID_CODES:
                book.add(mid, "outbids")
        elif isinstance(action, Launch) and ok:
            failures = 0  # a box took work: the run of failures is over
    for rec in archived:
        counter = _ATTEMPT_COUNTERS.get(rec.phase)
        if counter is not None:  # an attempt stopped early by its sweep's search says nothing of its host
            book.add(rec.machine_id, counter)
    after = HostLedger(
        hosts=tuple(book.hosts[m] for m in sorted(book.hosts)),
        ghosts=tuple(ghosts[o] for o in sorted(ghosts)),
        rents_at=tuple(sorted(rents_at)),
        failures_in_a_row=failures,
        last_failure_at=last_failure,
        # the lab's own machines (negative ids) are not the market's: nothing to learn, never a vanish
        boxes=tuple(sorted((i.id, i.machine_id) for i in mine if i.id not in destroyed and i.id > 0)),
        noted_at=now,
    )
    if replace(after, noted_at=None, boxes=()) == replace(ledger, noted_at=None, boxes=()):
        return after  # nothing happened: the clock alone does not rewrite observed/hosts.yaml (no commit on noise)
    # Something happened: the rents past the rate's window and the ghosts past their cooldown go with it (the
    # planner reads both through those windows, so keeping them until now changed nothing it decided).
    return replace(
        after,
        rents_at=tuple(t for t in after.rents_at if now - t < RENT_WINDOW_S),
        ghosts=tuple(g for g in after.ghosts if now - g.failed_at < fleet.ghost_cooldown_s),
    )


def throughput_vs_dlperf(hosts: Iterable[HostRecord], history: Iterable[AttemptRecord]) -> dict[int, tuple[float, int]]:
    """Per machine: how fast its attempts ran against what its DLPerf promises (the median ratio over its succeeded
    attempts), and how many attempts that is.

    There is no unit of work to divide by, so the attempts of one sweep are compared with each other: an attempt's
    DLPerf-seconds (its runtime times its machine's DLPerf) would be the same on every machine if DLPerf told the
    truth. The sweep's median is the reference and an attempt's ratio is the reference over its own: 1.0 runs as its
    DLPerf says, 0.5 half as fast. Attempts resumed from a checkpoint did less than a run's work and are left out,
    as are sweeps with fewer than two measured attempts.
    """
    dlperf = {h.machine_id: h.dlperf for h in hosts if h.dlperf is not None and h.dlperf > 0}
    by_sweep: dict[str, list[tuple[int, float]]] = {}
    for rec in history:
        if rec.phase is not AttemptOutcome.SUCCEEDED or rec.resumed_from is not None:
            continue
        dl = dlperf.get(rec.machine_id)
        if dl is None or rec.started_at is None or rec.ended_at is None or rec.ended_at <= rec.started_at:
            continue
        by_sweep.setdefault(rec.sweep, []).append((rec.machine_id, (rec.ended_at - rec.started_at) * dl))
    ratios: dict[int, list[float]] = {}
    for measured in by_sweep.values():
        if len(measured) < 2:
            continue
        reference = statistics.median(work for _, work in measured)
        for machine_id, work in measured:
            ratios.setdefault(machine_id, []).append(reference / work)
    return {m: (round(statistics.median(r), 3), len(r)) for m, r in sorted(ratios.items())}
