"""A cycle whose instance list lies decides nothing (issue 33), on real parts: the emulator's boxes are sshd hosts,
the provider is the real vastai 1.9.1 SDK behind ``VastProvider``, the shell is paramiko, the fleet a real git repo.

The list lies before any work (the first cycles) and again while both runs of the sweep are running on their boxes,
in each way the emulator can make it lie (``success: false`` with HTTP 200, no list, pages cut short, a page token
that never ends). Every such cycle raises ``ObservationFailed`` out of ``Reconciler.cycle`` and, in the emulator's
own books and on the boxes' disks, rents nothing, launches nothing, requeues (kills) nothing and destroys nothing.
When the list tells the truth again the sweep finishes with each run succeeding once, on the boxes rented before.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_reconcile import fleet_repo, owned_alive

from reconciler.cli._common import load_local_desired, open_reconciler
from reconciler.core.model import AttemptOutcome, Desired
from reconciler.emulator import Emulator
from reconciler.errors import ObservationFailed
from reconciler.loop import CycleResult, Reconciler

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

FLEET = "itlies"
MAX_WALL_S = 150.0
PAUSE_S = 0.3
# each fault the emulator's list can show, and the reason the adapter refuses it with
LIES = {"success_false": "success_false", "no_list": "no_list", "cut_short": "cut_short",
        "endless_token": "endless_pages"}
CYCLES_PER_LIE = 2
RUN_S = 15.0  # how long each run of the sweep trains

ACTING = {"create", "destroy", "stop", "start", "label"}  # ledger events a controller's action leaves


def owned(emu: Emulator) -> list[int]:
    return owned_alive(emu, FLEET)


def box_marks(emu: Emulator) -> dict[int, set[str]]:
    """Per owned box, the attempts launched on it and the kill marks written there (what a launch or a requeue
    leaves on a box's disk)."""
    marks: dict[int, set[str]] = {}
    for iid in owned(emu):
        runs = emu.host_root(iid) / "rigsync" / "runs"
        found = set()
        for attempt in sorted(runs.iterdir()) if runs.is_dir() else []:
            found.add(attempt.name)
            found.update(f"{attempt.name}/{m}" for m in ("killed_reason", "tombstone") if (attempt / m).exists())
        marks[iid] = found
    return marks


def lying_cycles(rec: Reconciler, desired: Desired, emu: Emulator, lie: str) -> list[str]:
    """``CYCLES_PER_LIE`` cycles under ``lie``: each must fail as an observation failure. The reasons seen."""
    emu.set_list_fault(lie)
    reasons = []
    try:
        for _ in range(CYCLES_PER_LIE):
            with pytest.raises(ObservationFailed) as info:
                rec.cycle(desired)
            reasons.append(info.value.reason)
    finally:
        emu.set_list_fault(None)
    return reasons


def drive_until(rec: Reconciler, desired: Desired, done: Callable[[CycleResult], bool], what: str) -> CycleResult:
    """Cycle on the truth until ``done``, within ``MAX_WALL_S``."""
    deadline = time.monotonic() + MAX_WALL_S
    seen: list[str] = []
    while time.monotonic() < deadline:
        res = rec.cycle(desired)
        failed = [f"{o.action.kind.value} {o.action.target}: {o.detail[:120]}" for o in res.applied.failures
                  ] if res.applied else []
        seen.append(f"{res.plan.counts()} {failed}")
        if done(res):
            return res
        time.sleep(PAUSE_S)
    history = [(h.run_id, h.attempt, h.phase.value, h.reason) for h in rec.history]
    pytest.fail(f"{what}: not reached in {MAX_WALL_S:.0f}s; in flight {rec.memory.in_flight}; history {history}; "
                f"cycles {seen[:12]}")


@pytest.fixture
def fleet(emulator: Emulator, tmp_path: Path) -> Iterator[tuple[Reconciler, Desired]]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VAST_API_KEY", emulator.api_key)
        repo = fleet_repo(tmp_path, emulator, FLEET, seconds=RUN_S)
        desired = load_local_desired(repo)
        rec = open_reconciler(repo, desired, str(tmp_path / "state"), emulator.url)
        try:
            yield rec, desired
        finally:
            emulator.set_list_fault(None)
            rec.shell.close()
            for iid in owned(emulator):
                emulator.destroy_instance(iid)


def test_a_lying_list_rents_launches_requeues_and_destroys_nothing(
    emulator: Emulator, fleet: tuple[Reconciler, Desired]
) -> None:
    rec, desired = fleet
    wanted = {r.id for r in desired.runs}
    assert len(wanted) == 2

    # Before any work: the very first cycles meet the lie, and rent nothing.
    events = len(emulator.ledger.events)
    assert lying_cycles(rec, desired, emulator, "success_false") == ["success_false"] * CYCLES_PER_LIE
    assert owned(emulator) == [] and not rec.memory.in_flight
    assert not [e for e in emulator.ledger.events[events:] if e["type"] in ACTING]

    # Work starts: both runs launched (in flight, not archived) on the boxes rented for them.
    drive_until(rec, desired, lambda res: {f.run_id for f in rec.memory.in_flight} == wanted, "both runs launched")
    boxes, marks, flights = owned(emulator), box_marks(emulator), rec.memory.in_flight
    history, memory_spend = list(rec.history), rec.memory.spend
    assert boxes and len(flights) == 2 and history == []
    launched = {f"{f.run_id}.{f.attempt}" for f in flights}
    assert set().union(*marks.values()) <= launched  # (an attempt given to a box's queue starts there on its own)

    # The list lies, every way, while the work runs.
    events = len(emulator.ledger.events)
    for lie, reason in LIES.items():
        assert lying_cycles(rec, desired, emulator, lie) == [reason] * CYCLES_PER_LIE, lie
    acted = [e for e in emulator.ledger.events[events:] if e["type"] in ACTING]
    assert acted == [], "a cycle on a lying list acted"
    assert owned(emulator) == boxes  # nothing rented, nothing destroyed
    for iid, found in box_marks(emulator).items():
        new = found - marks[iid]
        assert new <= launched, f"instance {iid}: {sorted(new)} launched or killed while the list lied"
    assert rec.memory.in_flight == flights and list(rec.history) == history  # nothing requeued, nothing archived
    assert rec.memory.spend == memory_spend
    lied = [e for e in emulator.ledger.events[events:] if e["type"] == "list_lied"]
    assert {e["fault"] for e in lied} == set(LIES)

    # The truth again: the sweep finishes on the boxes it had, each run once.
    def finished(res: CycleResult) -> bool:
        done = {h.run_id for h in rec.history if h.phase is AttemptOutcome.SUCCEEDED}
        return wanted <= done and not rec.memory.in_flight and not owned(emulator)

    drive_until(rec, desired, finished, "the sweep finished")
    records = list(rec.history)
    assert sorted(r.run_id for r in records) == sorted(wanted)  # one attempt each: none requeued, none lost
    assert all(r.phase is AttemptOutcome.SUCCEEDED and r.attempt == 1 for r in records)
    created = [e["instance_id"] for e in emulator.ledger.events[events:] if e["type"] == "create"]
    assert created == [], "the lie cost a rent after the truth came back"
    assert {r.instance_id for r in records} <= set(boxes)
