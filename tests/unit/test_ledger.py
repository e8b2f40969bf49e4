"""The host reliability ledger's update rule (reconciler/core/ledger.py): what one applied cycle adds to it."""

from __future__ import annotations

from dataclasses import replace

from reconciler.core.actions import Destroy, Launch, ReasonCode, Rent
from reconciler.core.ledger import note_cycle, throughput_vs_dlperf
from reconciler.core.model import (
    AttemptOutcome,
    AttemptRecord,
    Fleet,
    GhostOffer,
    HostLedger,
    HostRecord,
    Instance,
    InstanceStatus,
    Observed,
    Offer,
)
from reconciler.core.offers import host_penalty, offer_skipped
from reconciler.observed.hosts_file import hosts_document

NOW = 1_000_000.0
FLEET = Fleet(name="lab", ghost_cooldown_s=3600.0, blacklist_after=2)


def offer(oid: int, machine: int) -> Offer:
    return Offer(oid, machine, "RTX 3090", 1, 24576, 0.2, 20.0, 100.0, 0.99, 500.0, 12.2, True, "Sweden, SE", 100.0)


def box(iid: int, machine: int, status: InstanceStatus = InstanceStatus.RUNNING) -> Instance:
    return Instance(iid, f"rigsync:lab:abc-{iid}", status, "RTX 3090", 1, 24576, 0.2, NOW - 600, machine_id=machine)


def rent(oid: int) -> Rent:
    return Rent(reason="r", code=ReasonCode.RENT_FOR_PENDING, offer_id=oid, label="rigsync:lab:abc-1",
                image="img", disk_gb=20.0, dph=0.2, gpu_name="RTX 3090", num_gpus=1, onstart="")


def destroy(iid: int, code: ReasonCode) -> Destroy:
    return Destroy(reason="d", code=code, instance_id=iid, dph=0.2)


def test_rents_ghosts_and_their_cooldown() -> None:
    observed = Observed(offers=(offer(101, 5), offer(102, 6)))
    ledger = note_cycle(HostLedger(), FLEET, observed, [(rent(101), True, "instance 1"),
                                                        (rent(102), False, "offer 102 no longer available")], [], NOW)
    five, six = ledger.host(5), ledger.host(6)
    assert five is not None and (five.rents, five.offers, five.dlperf, five.last_seen) == (1, (101,), 20.0, NOW)
    assert six is not None and (six.rents, six.rent_failures) == (0, 1)
    assert ledger.ghosts == (GhostOffer(102, 6, NOW, "offer 102 no longer available"),)
    assert ledger.rents_at == (NOW,) and ledger.failures_in_a_row == 1 and ledger.last_failure_at == NOW
    # the ghost is skipped for ghost_cooldown, then forgotten; the rent leaves the hour's window
    assert offer_skipped(offer(102, 6), FLEET, ledger, NOW + 60) == (
        "ghost", "its rent failed 60s ago (offer 102 no longer available); skipped 3540s more")
    # a quiet cycle past both windows rewrites nothing (the clock alone makes no commit): the expired entries stay,
    # and the planner reads them through their windows
    quiet = note_cycle(ledger, FLEET, Observed(), [], [], NOW + 3600)
    assert quiet.ghosts == ledger.ghosts and quiet.rents_at == ledger.rents_at
    assert offer_skipped(offer(102, 6), FLEET, quiet, NOW + 3600) is None
    # the next cycle in which something happens drops them
    later = note_cycle(quiet, FLEET, observed, [(rent(101), True, "instance 2")], [], NOW + 3700)
    assert later.ghosts == () and later.rents_at == (NOW + 3700,)


def test_host_faults_outbids_and_attempts_mark_the_machine_and_lead_to_the_blacklist() -> None:
    boxes = (box(1, 5, InstanceStatus.LOADING), box(2, 5), box(3, 6, InstanceStatus.STOPPED), box(4, 7))
    observed = Observed(instances=boxes)
    done = [
        (destroy(1, ReasonCode.BOOT_TIMEOUT), True, "destroyed"),
        (destroy(2, ReasonCode.UNREACHABLE_PAST_GRACE), True, "destroyed"),
        (destroy(3, ReasonCode.PROVIDER_STOPPED), True, "destroyed"),
        (destroy(4, ReasonCode.SURPLUS), False, "API error"),  # not destroyed: nothing learned, still a box
    ]
    archived = [
        AttemptRecord("r1", 1, "s", AttemptOutcome.SUCCEEDED, machine_id=7),
        AttemptRecord("r2", 1, "s", AttemptOutcome.LOST, machine_id=5),
        AttemptRecord("r3", 1, "s", AttemptOutcome.FAILED, machine_id=7),
    ]
    ledger = note_cycle(HostLedger(), FLEET, observed, done, archived, NOW)
    five, six, seven = ledger.host(5), ledger.host(6), ledger.host(7)
    assert five is not None and (five.boot_timeouts, five.hangs, five.faults, five.attempts_lost) == (1, 1, 2, 1)
    assert six is not None and (six.outbids, six.faults) == (1, 0)
    assert seven is not None and (seven.attempts_succeeded, seven.attempts_failed, seven.faults) == (1, 1, 0)
    assert ledger.boxes == ((4, 7),) and ledger.failures_in_a_row == 1  # the hang worked before: no backoff
    assert host_penalty(five) == 0.25 and host_penalty(seven) == 1.0 and host_penalty(None) == 1.0
    skipped = offer_skipped(offer(111, 5), FLEET, ledger, NOW)
    assert skipped is not None and skipped[0] == "host" and "2 host fault(s) >= blacklist_after 2" in skipped[1]
    assert offer_skipped(offer(111, 5), Fleet(name="lab", blacklist_after=0), ledger, NOW) is None  # 0: never


def test_a_box_that_leaves_the_list_unbidden_is_a_vanish_and_a_launch_ends_the_run_of_failures() -> None:
    """A vanish marks the host but does not hold renting back; a box that never came up does, until a launch."""
    ledger = note_cycle(HostLedger(), FLEET, Observed(instances=(box(1, 5), box(2, 6))), [], [], NOW)
    assert ledger.boxes == ((1, 5), (2, 6))
    quiet = note_cycle(ledger, FLEET, Observed(instances=(box(1, 5), box(2, 6))), [], [], NOW + 60)
    # nothing happened: the file does not change (no commit); only the in-process noted_at moves
    assert replace(quiet, noted_at=None) == replace(ledger, noted_at=None) and quiet.noted_at == NOW + 60
    assert hosts_document(quiet, FLEET) == hosts_document(ledger, FLEET)
    # after a restart (the ledger read from hosts.yaml has no noted_at) a box gone meanwhile may have been ended by
    # its own watchdog as designed: not a vanish
    restarted = note_cycle(replace(ledger, noted_at=None), FLEET, Observed(instances=(box(2, 6),)), [], [], NOW + 90)
    five_after_restart = restarted.host(5)
    assert five_after_restart is not None and five_after_restart.vanishes == 0
    gone = note_cycle(ledger, FLEET, Observed(instances=(box(2, 6),)), [], [], NOW + 120)
    five = gone.host(5)
    assert five is not None and five.vanishes == 1 and gone.boxes == ((2, 6),) and gone.failures_in_a_row == 0
    booted_never = note_cycle(gone, FLEET, Observed(instances=(box(2, 6),)),
                              [(destroy(2, ReasonCode.BOOTSTRAP_TIMEOUT), True, "destroyed")], [], NOW + 150)
    assert booted_never.failures_in_a_row == 1 and booted_never.last_failure_at == NOW + 150
    launch = Launch(reason="l", code=ReasonCode.PENDING_RUN, run_id="r1", attempt=1, instance_id=2, gpu_mask=(0,),
                    command="true", code_commit=None, sweep="s")
    after = note_cycle(booted_never, FLEET, Observed(), [(launch, True, "launched")], [], NOW + 180)
    assert after.failures_in_a_row == 0 and after.host(5) == five


def _done(run: str, machine: int, seconds: float, sweep: str = "s", **kw: object) -> AttemptRecord:
    return AttemptRecord(run, 1, sweep, AttemptOutcome.SUCCEEDED, machine_id=machine, started_at=NOW,
                         ended_at=NOW + seconds, **kw)  # type: ignore[arg-type]


def test_throughput_against_dlperf_compares_a_sweeps_attempts_across_machines() -> None:
    """Machine 2 promises twice machine 1's DLPerf and delivers it; machine 3 promises as much but runs at half."""
    hosts = [HostRecord(1, dlperf=10.0), HostRecord(2, dlperf=20.0), HostRecord(3, dlperf=20.0), HostRecord(4)]
    history = [
        _done("a", 1, 100.0), _done("b", 1, 100.0),  # 1000 DLPerf-seconds a run
        _done("c", 2, 50.0),  # 1000: as promised
        _done("d", 3, 100.0),  # 2000: half as fast as its DLPerf says
        _done("e", 4, 10.0),  # no DLPerf known: not measured
        _done("f", 3, 10.0, resumed_from=1),  # resumed: did less than a run's work
        replace(_done("g", 3, 10.0), phase=AttemptOutcome.FAILED),
        _done("h", 1, 5.0, sweep="alone"),  # a sweep with one measured attempt compares with nothing
    ]
    assert throughput_vs_dlperf(hosts, history) == {1: (1.0, 2), 2: (1.0, 1), 3: (0.5, 1)}
    doc = hosts_document(HostLedger(hosts=tuple(hosts)), FLEET, history)
    assert [(h["machine_id"], h["throughput_vs_dlperf"], h["throughput_attempts"]) for h in doc["hosts"]] == [
        (1, 1.0, 2), (2, 1.0, 1), (3, 0.5, 1), (4, None, 0)
    ]


def test_a_box_destroyed_as_unusable_is_a_host_fault_of_its_own_kind() -> None:
    observed = Observed(instances=(box(1, 5),))
    ledger = note_cycle(HostLedger(), FLEET, observed, [(destroy(1, ReasonCode.PROBE_UNUSABLE), True, "gone")], [], NOW)
    five = ledger.host(5)
    assert five is not None and (five.unusable, five.hangs, five.faults) == (1, 0, 1)
    assert ledger.failures_in_a_row == 0  # it came up and worked: no rent backoff
    assert hosts_document(ledger, FLEET)["hosts"][0]["unusable"] == 1
    skipped = offer_skipped(offer(111, 5), replace(FLEET, blacklist_after=1), ledger, NOW)
    assert skipped is not None and "1 unusable box" in skipped[1]
