"""Interruptible boxes on real parts: rigsync bids, the emulator outbids the box mid-run, the run resumes elsewhere.

The real ``vastai`` SDK against the emulator: with ``interruptible: {max_bid_dph}`` the fleet rents a box with a
bid (the emulator records ``is_bid`` and bills the bid), the box is outbid while its run works (stopped, processes
killed), the plan destroys it (drift ``outbid``, never a stop), the attempt is requeued as preempted (no retry spent:
the sweep has ``retries: 0``), and the next attempt starts from the checkpoint synced home before the outbid.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from world import fleet_repo

from reconciler.cli._common import load_local_desired, open_reconciler
from reconciler.core.actions import Destroy, Launch, ReasonCode, Rent, Requeue
from reconciler.core.model import AttemptOutcome, DriftClass
from reconciler.emulator import Emulator

pytestmark = pytest.mark.integration

SWEEP = """\
name: spot
code: [experiments]
command: >-
  {{ python }} experiments/train.py --task walker-walk --lr 1e-3 --seed {{ seed }}
  --out {{ run_dir }}/metrics.jsonl --seconds 8 --evals 8
seeds: [1]
max_runtime: 5m
retries: 0
checkpoint: {path: ckpt/, every: 1s}
metrics: {file: metrics.jsonl, key: episode_reward, goal: max}
"""


def test_a_bid_box_outbid_mid_run_is_destroyed_and_its_run_resumes_from_its_checkpoint_with_no_retry_spent(
    emulator: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VAST_API_KEY", emulator.api_key)
    fleet = fleet_repo(tmp_path / "fleet")
    fleet.edit_fleet(name="itbid", max=1, interruptible={"max_bid_dph": 0.1})
    fleet.set_sweeps({"spot": SWEEP})
    repo = fleet.work
    desired = load_local_desired(repo)
    assert desired.fleet.pools[0].max_bid_dph == 0.1
    rec = open_reconciler(repo, desired, str(tmp_path / "state"), emulator.url)

    first: Rent | None = None
    box = None
    launched_at = None
    for _ in range(80):  # bounded: rent with a bid, boot, bootstrap, launch, run a few seconds (checkpoints sync)
        res = rec.cycle(desired)
        assert res.applied is not None
        if first is None:
            rents = [a for a in res.plan.actions if isinstance(a, Rent)]
            if rents:
                first, box = rents[0], res.applied.rented[0]
        if launched_at is None and any(isinstance(a, Launch) for a in res.plan.actions):
            launched_at = time.monotonic()
        if launched_at is not None and time.monotonic() - launched_at > 4:
            break
        time.sleep(0.5)
    assert first is not None and box is not None and launched_at is not None
    assert first.bid_dph is not None and 0 < first.bid_dph <= 0.1 and "interruptible: bid" in first.reason
    record = emulator.instance(box)
    assert record["is_bid"] is True
    assert float(record["dph_total"]) == pytest.approx(first.dph, abs=0.01)  # billed the bid (plus storage)

    emulator.outbid(box)
    outbid = None
    requeues: list[Requeue] = []
    for _ in range(120):  # bounded: destroy the stopped box, requeue, rent again, resume, finish
        res = rec.cycle(desired)
        hit = [a for a in res.plan.actions if isinstance(a, Destroy) and a.instance_id == box]
        requeues += [a for a in res.plan.actions if isinstance(a, Requeue)]
        if hit:
            outbid = hit[0]
            assert [d.cls for d in res.plan.drift if d.subject == f"instance/{box}"] == [DriftClass.OUTBID]
        if any(r.phase is AttemptOutcome.SUCCEEDED for r in rec.history):
            break
        time.sleep(0.5)
    assert outbid is not None and outbid.code is ReasonCode.PROVIDER_STOPPED
    assert [(a.code, a.phase) for a in requeues] == [(ReasonCode.PREEMPTED, AttemptOutcome.PREEMPTED)]
    attempts = sorted(rec.history, key=lambda r: r.attempt)
    # preempted, not lost: with retries 0 a lost attempt would have blocked the run
    assert [(r.attempt, r.phase) for r in attempts] == [(1, AttemptOutcome.PREEMPTED), (2, AttemptOutcome.SUCCEEDED)]
    assert attempts[0].instance_id == box
    assert attempts[1].resumed_from == 1  # the second attempt started from the first one's checkpoint
