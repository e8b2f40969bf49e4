"""A queued attempt in flight: its phase (``runphase``), what ``remember`` records of it once the box started it,
and how runs.yaml shows it. Pure functions over small values."""

from __future__ import annotations

from dataclasses import replace

from fakes import desired_state

from reconciler.core.actions import ApplyResult
from reconciler.core.model import BoxProbe, FleetMemory, InFlight, Observed, QueuedEntry, RunDirState, RunPhase
from reconciler.core.remember import next_in_flight
from reconciler.core.runphase import is_queued, live_attempts, run_phases
from reconciler.observed.documents import _render_runs
from reconciler.observed.memory import _in_flight, in_flight_entries

QUEUED = InFlight("r1", 1, 7, (0,), 100.0, sweep="s", queued=True)
RUNNING = InFlight("r0", 1, 7, (0,), 50.0, sweep="s")


def _started(pid: int | None, tick: int | None) -> RunDirState:
    return RunDirState("r1", 1, (0,), True, 200.0, 1.0, None, pid=pid, pid_started=tick)


def _world(*, queued: tuple[QueuedEntry, ...] = (), runs: tuple[RunDirState, ...] = (), reachable: bool = True,
           flights: tuple[InFlight, ...] = (QUEUED, RUNNING)) -> Observed:
    probe = BoxProbe(7, reachable, queued=queued, runs=runs) if reachable else BoxProbe(7, False, error="down")
    return Observed(probes=(probe,), memory=FleetMemory(in_flight=flights))


def test_a_queued_attempt_is_queued_while_its_box_lists_it_or_cannot_be_checked() -> None:
    entry = QueuedEntry("r1", 1, (0,))
    assert is_queued(QUEUED, _world(queued=(entry,)).probes[0])
    assert is_queued(QUEUED, _world(reachable=False).probes[0])
    assert not is_queued(QUEUED, _world().probes[0])  # neither listed nor started: its launch never happened
    assert not is_queued(QUEUED, _world(queued=(entry,), runs=(_started(None, None),)).probes[0])  # it started
    assert not is_queued(RUNNING, _world(queued=(QueuedEntry("r0", 1, (0,)),)).probes[0])  # never given to a queue


def test_a_queued_attempt_is_live_and_its_run_queued() -> None:
    desired = desired_state(2)
    observed = _world(queued=(QueuedEntry("r1", 1, (0,)),), runs=(RunDirState("r0", 1, (0,), True, 50.0, 1.0, None),))
    live = live_attempts(observed)
    assert live["r1"].queued and not live["r0"].queued
    assert run_phases(desired.runs, observed) == {"r0": RunPhase.RUNNING, "r1": RunPhase.QUEUED}
    doc = _render_runs(desired, observed)
    assert doc["sweeps"]["s"]["r1"]["phase"] == "queued"
    assert doc["counts"]["s"]["queued"] == 1 and doc["counts"]["s"]["running"] == 1
    assert [(e["run_id"], e["queued"]) for e in doc["in_flight"]] == [("r0", False), ("r1", True)]


def test_runs_yaml_in_flight_queued_reads_back() -> None:
    entries = in_flight_entries((QUEUED, RUNNING))
    assert [e["queued"] for e in entries] == [False, True]
    back = _in_flight(entries)
    assert {(f.run_id, f.queued) for f in back} == {("r0", False), ("r1", True)}
    assert not _in_flight([{**entries[1], "queued": "yes"}])[0].queued  # only a real true says queued


def test_remember_records_a_started_queued_attempts_process_group_once() -> None:
    observed = _world(runs=(_started(4242, 9000),))
    flights = next_in_flight((QUEUED, RUNNING), observed, ApplyResult(), 500.0)
    (f, _) = sorted(flights, key=lambda f: f.run_id, reverse=True)
    assert (f.run_id, f.pid, f.pid_started, f.seen_started_at) == ("r1", 4242, 9000, 500.0)
    later = _world(runs=(_started(31337, 1),), flights=(f, RUNNING))  # a box that says another pid later
    kept = {x.run_id: x for x in next_in_flight((f, RUNNING), later, ApplyResult(), 900.0)}
    assert (kept["r1"].pid, kept["r1"].pid_started, kept["r1"].seen_started_at) == (4242, 9000, 500.0)
    for pid, tick in ((None, None), (1, 5), (4242, None)):  # nothing usable: nothing recorded
        seen = _world(runs=(_started(pid, tick),))
        got = {x.run_id: x for x in next_in_flight((QUEUED,), seen, ApplyResult(), 500.0)}
        assert got["r1"].pid is None and got["r1"].pid_started is None
        assert got["r1"].seen_started_at == 500.0  # seen started all the same: its runtime counts from here at most
    elsewhere = replace(QUEUED, instance_id=8)  # the run dir is on another box than the one it was queued on
    got = {x.run_id: x for x in next_in_flight((elsewhere,), observed, ApplyResult(), 500.0)}
    assert got["r1"].pid is None and got["r1"].seen_started_at is None
