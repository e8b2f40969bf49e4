"""remember.py: the one updater of what a cycle hands to the next, as pure functions of their inputs."""

from __future__ import annotations

import copy

import pytest

from reconciler.core.actions import ApplyResult, CloseBill, Launch, Outcome, ReasonCode, Record, Rent
from reconciler.core.model import (
    AttemptOutcome,
    AttemptRecord,
    BoxMemory,
    BoxProbe,
    BoxSpend,
    CheckpointPull,
    Fleet,
    FleetMemory,
    GpuQuiet,
    GpuState,
    InFlight,
    Instance,
    InstanceStatus,
    Observed,
    RunDirState,
    Spend,
)
from reconciler.core.remember import (
    Applied,
    Observation,
    attempt_cost,
    capped_to_bill,
    note_checkpoint_pulls,
    overhead_record,
    remember,
    world_after_apply,
)

try:
    from .plan_case_io import build_desired
except ImportError:  # run as a top-level module
    from plan_case_io import build_desired  # type: ignore[no-redef]

NOW = 1_000_000.0
FLEET = Fleet(name="lab")


def box(iid: int, dph: float = 0.2, status: InstanceStatus = InstanceStatus.RUNNING) -> Instance:
    return Instance(iid, f"rigsync:lab:abc-{iid}", status, "RTX 3090", 2, 24576, dph, NOW - 600, machine_id=100 + iid)


def running(run_id: str, attempt: int = 1, gpus: tuple[int, ...] = (0,)) -> RunDirState:
    return RunDirState(run_id, attempt, gpus, pid_alive=True, started_at=NOW - 60, heartbeat_age_s=2.0, exit_code=None)


def flight(run_id: str, instance_id: int, attempt: int = 1) -> InFlight:
    return InFlight(run_id, attempt, instance_id, (0,), NOW - 60)


def test_remember_carries_in_flight_forward_closes_bills_and_learns_hosts() -> None:
    gone = BoxSpend(7, usd=0.3, at=NOW - 5, gone_at=NOW - 700)
    kept = BoxSpend(1, usd=0.1, at=NOW - 5)
    memory = FleetMemory(
        boxes=(BoxMemory(1, first_seen_at=NOW - 600),),
        in_flight=(flight("done", 1), flight("still", 1)),
        spend=Spend(today_usd=0.4, total_usd=0.4, boxes=(kept, gone)),
        checkpoint_pulls=(CheckpointPull("still", 1, NOW - 300), CheckpointPull("done", 1, NOW - 300)),
    )
    observed = Observed(
        instances=(box(1),),
        probes=(BoxProbe(1, reachable=True, runs=(running("still"), running("seen", gpus=(1,)))),),
        memory=memory,
        fleet_name="lab",
    )
    launched = InFlight("new", 1, 1, (1,), NOW)
    rent = Rent(reason="r", code=ReasonCode.RENT_FOR_PENDING, offer_id=55, label="rigsync:lab:abc-9", image="img",
                disk_gb=20.0, dph=0.2, gpu_name="RTX 3090", num_gpus=1, onstart="")
    record = Record(reason="exited", code=ReasonCode.EXITED, run_id="done", attempt=1, instance_id=1, phase="succeeded")
    close = CloseBill(reason="box ended", code=ReasonCode.BILL_FINAL, instance_id=7)
    launch = Launch(reason="p", code=ReasonCode.PENDING_RUN, instance_id=1, run_id="new", attempt=1, gpu_mask=(1,),
                    command="c", code_commit=None)
    applied = ApplyResult(
        outcomes=[Outcome(record, True), Outcome(close, True), Outcome(rent, True, "instance 9"),
                  Outcome(launch, True)],
        archived=[AttemptRecord("done", 1, "s", AttemptOutcome.SUCCEEDED, instance_id=1, machine_id=101)],
        overheads=[overhead_record(gone, ())],
        launched=[launched],
        settled={("done", 1)},
        checkpoint_pulls={("still", 1): NOW - 1},
    )
    before = copy.deepcopy((memory, observed, applied))

    after = remember(memory, Applied(observed, applied, FLEET, NOW))

    # in flight: what was, plus the launches, minus what settled; what a box shows running that no launch made
    # ("seen") is foreign and never becomes ours (issue 20: only what rigsync launched can be recorded)
    assert [(f.run_id, f.attempt) for f in after.in_flight] == [("new", 1), ("still", 1)]
    # the closed bill is gone from the memory (its money stays in the totals); the other box's stays
    assert after.spend.boxes == (kept,) and after.spend.total_usd == 0.4
    # the host ledger learned the cycle: the rent, and the archived attempt on machine 101
    assert NOW in after.hosts.rents_at
    assert {h.machine_id: h.attempts_succeeded for h in after.hosts.hosts}.get(101) == 1
    # checkpoint pulls: this apply's over the earlier ones, only for attempts still in flight
    assert after.checkpoint_pulls == (CheckpointPull("still", 1, NOW - 1),)
    # what the observation remembered is carried as it was
    assert after.boxes == memory.boxes and after.gpu_quiet == memory.gpu_quiet
    # pure: equal inputs give equal answers, and nothing passed in was changed
    assert remember(memory, Applied(observed, applied, FLEET, NOW)) == after
    assert (memory, observed, applied) == before


def test_remember_of_an_empty_apply_changes_nothing_but_the_ledger_clock() -> None:
    memory = FleetMemory(in_flight=(flight("r", 1),))
    observed = Observed(instances=(box(1),), probes=(BoxProbe(1, reachable=True, runs=(running("r"),)),),
                        memory=memory, fleet_name="lab")
    after = remember(memory, Applied(observed, ApplyResult(), FLEET, NOW))
    assert after.in_flight == memory.in_flight and after.spend == memory.spend
    assert after.hosts.noted_at == NOW and after.hosts.hosts[0].machine_id == 101  # the box's host is known now


def test_an_observation_starts_the_box_clocks_the_gpu_quiet_clock_and_the_spend() -> None:
    desired = build_desired({"runs": [{"id": "q", "stall_timeout_s": 600.0}]})
    quiet = BoxProbe(1, reachable=True, gpus=(GpuState(0, 2000, 24576, 1.0),), runs=(running("q"),))
    dark = BoxProbe(2, reachable=False, error="timeout")
    memory = FleetMemory(spend_at=NOW - 60, in_flight=(flight("q", 1),))
    boxes = (box(1), box(2))
    after = remember(memory, Observation(desired, boxes, boxes, (quiet, dark), None, NOW))
    assert [(m.instance_id, m.first_seen_at, m.unreachable_since) for m in after.boxes] == [
        (1, NOW, None),
        (2, NOW, NOW),
    ]
    assert after.gpu_quiet == (GpuQuiet("q", 1, NOW),)
    assert after.spend_at == NOW
    # the provider could not say (billed None): both boxes estimated at their $/h since their start
    assert after.spend.estimated and after.spend.total_usd == pytest.approx(2 * 0.2 * 600 / 3600)
    later = remember(after, Observation(desired, boxes, boxes, (quiet, dark), None, NOW + 60))
    # the clocks keep running
    assert later.gpu_quiet == (GpuQuiet("q", 1, NOW),) and later.boxes[1].unreachable_since == NOW


def test_world_after_apply_lists_the_rented_and_drops_the_destroyed() -> None:
    rent = Rent(reason="r", code=ReasonCode.RENT_FOR_PENDING, offer_id=55, label="rigsync:lab:abc-9", image="img",
                disk_gb=20.0, dph=0.3, gpu_name="RTX 4090", num_gpus=1, onstart="")
    observed = Observed(instances=(box(1), box(2)), memory=FleetMemory(gpu_quiet=(GpuQuiet("q", 1, NOW - 5),)))
    applied = ApplyResult(destroyed=[2], rented=[9], rented_as={9: rent})
    memory = FleetMemory(in_flight=(flight("r", 1),))
    history = (AttemptRecord("done", 1, "s", AttemptOutcome.SUCCEEDED),)
    after = world_after_apply(observed, memory, applied, history, NOW)
    assert [(i.id, i.status) for i in after.instances] == [(1, InstanceStatus.RUNNING), (9, InstanceStatus.CREATED)]
    assert after.instances[1].dph_total == 0.3 and after.instances[1].start_date == NOW
    assert after.history == history and after.memory.in_flight == memory.in_flight
    assert after.memory is memory  # this cycle's memory, as remember left it: no other writer touches it
    assert world_after_apply(observed, memory, None, history, NOW).instances == observed.instances


def test_an_attempt_costs_its_share_of_the_box_capped_to_what_the_box_was_billed() -> None:
    assert attempt_cost(0.4, 2, (0,), NOW - 3600, NOW) == pytest.approx(0.2)  # one GPU of two for an hour
    assert attempt_cost(0.4, 2, (), NOW - 3600, NOW) == pytest.approx(0.4)  # mask unknown: the whole box
    assert attempt_cost(0.4, 2, (0,), None, NOW) == 0.0  # never started
    rec = AttemptRecord("r", 2, "s", AttemptOutcome.LOST, instance_id=7, cost_usd=0.5)
    billed = BoxSpend(7, usd=0.3, at=NOW - 100, gone_at=NOW - 50)
    prior = [AttemptRecord("r", 1, "s", AttemptOutcome.FAILED, instance_id=7, cost_usd=0.1)]
    assert capped_to_bill(rec, billed, None, prior, NOW).cost_usd == pytest.approx(0.2)  # gone: its bill is all
    listed = box(7, dph=0.36)  # still listed and billing: its price since the bill was read counts too
    assert capped_to_bill(rec, billed, listed, prior, NOW).cost_usd == pytest.approx(0.21)
    assert capped_to_bill(rec, None, None, prior, NOW) == rec  # no bill known: nothing to cap to


def test_overhead_is_the_bill_minus_the_attempts_on_that_box() -> None:
    billed = BoxSpend(7, usd=1.0, at=NOW, gone_at=NOW - 700, estimated=True, machine_id=107, num_gpus=2)
    ran = [
        AttemptRecord("a", 1, "s", AttemptOutcome.SUCCEEDED, instance_id=7, cost_usd=0.25),
        AttemptRecord("b", 1, "s", AttemptOutcome.FAILED, instance_id=7, cost_usd=0.5),
        AttemptRecord("c", 1, "s", AttemptOutcome.SUCCEEDED, instance_id=8, cost_usd=9.0),
    ]
    rec = overhead_record(billed, ran)
    assert (rec.billed_usd, rec.attempts_usd, rec.attempts, rec.cost_usd) == (1.0, 0.75, 2, 0.25)
    assert rec.estimated and rec.ended_at == NOW - 700 and rec.machine_id == 107
    assert "estimated" in rec.reason


def test_checkpoint_pulls_are_kept_only_for_attempts_in_flight() -> None:
    previous = (CheckpointPull("a", 1, 10.0), CheckpointPull("b", 1, 20.0))
    pulled = (CheckpointPull("b", 1, 30.0), CheckpointPull("c", 2, 40.0))
    got = note_checkpoint_pulls(previous, pulled, [flight("b", 1), flight("c", 1, 2)])
    assert got == pulled
