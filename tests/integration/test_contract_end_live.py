"""A box's contract ending mid-run, on real parts: the emulator, real SSH boxes, the real ``vastai`` SDK, a real
git fleet repository and store, and ``Reconciler`` cycles.

A box runs an attempt of a sweep with a checkpoint; its contract is then set to end within ``contract_margin``.
The next cycle pulls the attempt's checkpoint home (``contract_ending``), the one after requeues it as preempted
(no retry spent: the sweep has ``retries: 0``), a box with a long contract is rented, the attempt resumes there from
the checkpoint and succeeds; nothing is launched on the ending box (``contract_ends_before_run``), which is let go
(``contract_ending``) before its host takes it back.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from world import fleet_repo

from reconciler.cli._common import load_local_desired, open_reconciler
from reconciler.core.actions import Destroy, Launch, ReasonCode, Rent, Requeue, SyncCheckpoint
from reconciler.core.model import AttemptOutcome
from reconciler.emulator import Emulator

pytestmark = pytest.mark.integration

MARGIN_S = 60.0
SWEEP = """\
name: ends
code: [experiments]
command: >-
  {{ python }} experiments/train.py --task walker-walk --lr 1e-3 --seed {{ seed }}
  --out {{ run_dir }}/metrics.jsonl --seconds 16 --evals 8
seeds: [1]
max_runtime: 5m
retries: 0
checkpoint: {path: ckpt/, every: 1h}
metrics: {file: metrics.jsonl, key: episode_reward, goal: max}
"""


def test_a_run_on_a_box_whose_contract_ends_is_checkpointed_moved_as_preempted_and_finishes_elsewhere(
    emulator: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VAST_API_KEY", emulator.api_key)
    fleet = fleet_repo(tmp_path / "fleet")
    fleet.edit_fleet(name="ctend", max=2, contract_margin="1m")
    fleet.set_sweeps({"ends": SWEEP})
    repo = fleet.work
    desired = load_local_desired(repo)
    assert desired.fleet.contract_margin_s == MARGIN_S
    rec = open_reconciler(repo, desired, str(tmp_path / "state"), emulator.url)

    box = None
    launched_at = None
    for _ in range(80):  # bounded: rent, boot, bootstrap, launch, run a few seconds
        res = rec.cycle(desired)
        assert res.applied is not None
        if box is None and any(isinstance(a, Rent) for a in res.plan.actions):
            box = res.applied.rented[0]
        if launched_at is None and any(isinstance(a, Launch) for a in res.plan.actions):
            launched_at = time.monotonic()
        if launched_at is not None and time.monotonic() - launched_at > 4:
            break
        time.sleep(0.5)
    assert box is not None and launched_at is not None
    listed_end = float(emulator.instance(box)["end_date"])
    assert listed_end > time.time() + 86400  # rented with a contract of days (the market's)
    assert not any(r.phase is AttemptOutcome.SUCCEEDED for r in rec.history), "the run must still be going"

    # the host says the contract ends in 59s: inside the 1m margin, so the work must move now
    emulator.set_end_date(box, time.time() + MARGIN_S - 1)
    synced: list[SyncCheckpoint] = []
    requeued: list[Requeue] = []
    refused_on_box = []
    destroyed: list[Destroy] = []
    launches_after: list[Launch] = []
    for _ in range(120):  # bounded: pull, requeue, rent, let the ending box go, resume, finish
        res = rec.cycle(desired)
        actions = res.plan.actions
        synced += [a for a in actions if isinstance(a, SyncCheckpoint) and a.instance_id == box]
        if any(isinstance(a, Requeue) for a in actions):
            assert synced, "the checkpoint is pulled home before the attempt is moved"
        requeued += [a for a in actions if isinstance(a, Requeue)]
        destroyed += [a for a in actions if isinstance(a, Destroy) and a.instance_id == box]
        launches_after += [a for a in actions if isinstance(a, Launch)]
        refused_on_box += [
            n for n in res.plan.noops
            if n.code is ReasonCode.CONTRACT_ENDS_BEFORE_RUN and n.target == f"instance/{box}"
        ]
        if any(r.phase is AttemptOutcome.SUCCEEDED for r in rec.history):
            break
        time.sleep(0.5)
    assert [a.code for a in synced] == [ReasonCode.CONTRACT_ENDING]
    assert [(a.code, a.phase, a.instance_id) for a in requeued] == [
        (ReasonCode.CONTRACT_ENDING, AttemptOutcome.PREEMPTED, box)
    ]
    # nothing went to the ending box; it was let go before its host could take it back
    assert launches_after and all(a.instance_id != box for a in launches_after)
    assert refused_on_box, "the run was considered for the ending box and refused there"
    assert [a.code for a in destroyed] == [ReasonCode.CONTRACT_ENDING]
    assert box not in emulator.instance_ids()
    assert "contract_end" not in [e["type"] for e in emulator.ledger.events if e["instance_id"] == box]
    attempts = sorted(rec.history, key=lambda r: r.attempt)
    # preempted, not lost: with retries 0 a lost or failed attempt would have blocked the run
    assert [(r.attempt, r.phase) for r in attempts] == [(1, AttemptOutcome.PREEMPTED), (2, AttemptOutcome.SUCCEEDED)]
    assert attempts[0].instance_id == box and attempts[1].instance_id != box
    assert attempts[1].resumed_from == 1  # started from the checkpoint pulled before the move


def test_a_box_taken_back_at_its_contract_end_is_a_preemption_not_a_host_fault(
    emulator: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No margin, and the host takes the box back mid-run: listed exited past its end, the box is destroyed as
    contract_ended, its attempt is preempted (no retry spent) and resumes from the last synced checkpoint on a new
    box; its machine gets no fault in observed/hosts.yaml."""
    monkeypatch.setenv("VAST_API_KEY", emulator.api_key)
    fleet = fleet_repo(tmp_path / "fleet")
    fleet.edit_fleet(name="ctgone", max=1, contract_margin="0s")
    fleet.set_sweeps({"ends": SWEEP.replace("every: 1h", "every: 1s")})
    repo = fleet.work
    desired = load_local_desired(repo)
    rec = open_reconciler(repo, desired, str(tmp_path / "state"), emulator.url)
    box = None
    launched_at = None
    for _ in range(80):
        res = rec.cycle(desired)
        assert res.applied is not None
        if box is None and any(isinstance(a, Rent) for a in res.plan.actions):
            box = res.applied.rented[0]
        if launched_at is None and any(isinstance(a, Launch) for a in res.plan.actions):
            launched_at = time.monotonic()
        if launched_at is not None and time.monotonic() - launched_at > 5:
            break
        time.sleep(0.5)
    assert box is not None and launched_at is not None
    machine = int(emulator.instance(box)["machine_id"])

    emulator.set_end_date(box, time.time() - 1)
    deadline = time.monotonic() + 10
    while emulator.status(box) != "exited":  # the host takes it back (the next cycle sees it listed so)
        assert time.monotonic() < deadline, "the emulator did not take the box back"
        time.sleep(0.05)
    assert "contract_end" in [e["type"] for e in emulator.ledger.events if e["instance_id"] == box]
    destroyed: list[Destroy] = []
    requeued: list[Requeue] = []
    for _ in range(120):
        res = rec.cycle(desired)
        destroyed += [a for a in res.plan.actions if isinstance(a, Destroy) and a.instance_id == box]
        requeued += [a for a in res.plan.actions if isinstance(a, Requeue)]
        if any(r.phase is AttemptOutcome.SUCCEEDED for r in rec.history):
            break
        time.sleep(0.5)
    assert [a.code for a in destroyed] == [ReasonCode.CONTRACT_ENDED]
    assert [(a.code, a.phase) for a in requeued] == [(ReasonCode.PREEMPTED, AttemptOutcome.PREEMPTED)]
    attempts = sorted(rec.history, key=lambda r: r.attempt)
    assert [(r.attempt, r.phase) for r in attempts] == [(1, AttemptOutcome.PREEMPTED), (2, AttemptOutcome.SUCCEEDED)]
    assert attempts[1].resumed_from == 1
    host = rec.memory.hosts.host(machine)  # what observed/hosts.yaml records of the machine
    assert host is not None and (host.faults, host.vanishes, host.outbids) == (0, 0, 0)  # not outbid either
