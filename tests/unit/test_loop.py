"""The loop over in-memory fakes of the ports: full cycles (real observe → plan → apply) until a sweep is done.

The ``Reconciler`` is the real one; only the world is fake (``tests/unit/fakes.py``): a market, boxes that boot,
run directories whose runs end after their work, a clock. Along the way a box vanishes mid-run, a run fails
its first attempt, and non-rigsync exceptions are thrown from the provider and the box side. Checked every
cycle: no GPU holds two live runs, no run has two live attempts, no run succeeds twice; at the end every run
succeeded exactly once and every box was destroyed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from fakes import (
    FakeArchive,
    FakeClock,
    FakeWorld,
    Work,
    desired_state,
    fake_reconciler,
    offer,
)

from reconciler.apply import Outcome
from reconciler.core.actions import Destroy, Launch, Rent
from reconciler.core.model import AttemptOutcome, CheckpointPull, Desired, Instance
from reconciler.loop import RECENT_CYCLES, CycleResult
from reconciler.observe import PROBE_TIMEOUT_S
from reconciler.ports import LaunchJob

try:
    from .plan_case_io import load_case
except ImportError:  # tests/unit is not a package: pytest put this directory on sys.path
    from plan_case_io import load_case  # type: ignore[no-redef]

STEP_S = 20.0
MAX_CYCLES = 150


def _work_failing_r2_once() -> Callable[[LaunchJob], Work]:
    """Each run succeeds, except r2's first attempt to reach a box, which fails (then its retry succeeds)."""
    failed: list[int] = []

    def work(job: LaunchJob) -> Work:
        if job.run_id == "r2" and not failed:
            failed.append(job.attempt)
            return Work(seconds=120.0, exit_code=1)
        return Work(seconds=200.0 + 10 * int(job.run_id[1:]), best_metric=float(job.run_id[1:]))

    return work



def _check_invariants(world: FakeWorld, archive: FakeArchive) -> None:
    for iid, box in world.boxes.items():
        held = [g for r in box.runs.values() if r.holds_gpus for g in r.gpu_mask]
        assert len(held) == len(set(held)), f"a GPU of box {iid} holds two live runs: {held}"
    live = Counter(r.run_id for _, r in world.live_runs())
    assert all(n == 1 for n in live.values()), f"a run has two live attempts: {live}"
    succeeded = Counter(r.run_id for r in archive.records() if r.phase is AttemptOutcome.SUCCEEDED)
    assert all(n == 1 for n in succeeded.values()), f"a run succeeded twice: {succeeded}"


def _failed(res: CycleResult) -> list[Outcome]:
    return res.applied.failures if res.applied else []


def _drive(desired: Desired, world: FakeWorld, archive: FakeArchive, on_cycle=None) -> list[CycleResult]:  # type: ignore[no-untyped-def]
    rec = fake_reconciler(world, archive)
    results = []
    for _ in range(MAX_CYCLES):
        res = rec.cycle(desired)
        results.append(res)
        _check_invariants(world, archive)
        if on_cycle is not None:
            on_cycle(res)
        done = {r.run_id for r in archive.records() if r.phase is AttemptOutcome.SUCCEEDED}
        if done == {r.id for r in desired.runs} and not world.rentals and not res.plan.actions:
            break
        world.clock.advance(STEP_S)
    return results


def test_cycles_converge_through_a_vanished_box_a_failed_run_and_library_exceptions() -> None:
    desired = desired_state(6, max_instances=2, bootstrap="pip install -r requirements.txt")
    world = FakeWorld([offer(i, gpus=2, dph=0.2 + i / 100) for i in range(1, 7)], clock=FakeClock(),
                      boot_s=45.0, bootstrap_s=25.0, work=_work_failing_r2_once())
    archive = FakeArchive()
    world.fail_next("create_instance", KeyError("new_contract"))  # the SDK indexing a reply that lacks the field
    vanished: list[int] = []
    injected: list[str] = []

    def faults(res: CycleResult) -> None:
        if not vanished:  # the first box to hold a live run vanishes, with its runs
            for iid, _ in world.live_runs():
                vanished.append(iid)
                world.vanish(iid)
                break
        elif not injected and world.live_runs():
            world.fail_next("launch", OSError("Socket is closed"))  # paramiko, next time a run is launched
            injected.append("launch")

    results = _drive(desired, world, archive, faults)
    last = results[-1]
    assert len(results) < MAX_CYCLES, f"did not converge: {[f'{a.kind.value} {a.target}' for a in last.plan.actions]}"

    records = list(archive.records())
    succeeded = Counter(r.run_id for r in records if r.phase is AttemptOutcome.SUCCEEDED)
    assert succeeded == Counter({r.id: 1 for r in desired.runs})
    lost = [r for r in records if r.phase is AttemptOutcome.LOST]
    # The launch that failed may have reached its box (a dropped connection): its attempt stays in flight, and the
    # next cycle, finding no run directory, fences it off and requeues it as lost, so it can never start late.
    (failed_launch,) = [o.action for res in results for o in _failed(res) if isinstance(o.action, Launch)]
    never = [r for r in lost if r.reason.startswith("launch never happened")]
    assert [(r.run_id, r.attempt, r.instance_id) for r in never] == [
        (failed_launch.run_id, failed_launch.attempt, failed_launch.instance_id)
    ]
    assert lost and {r.instance_id for r in lost if r not in never} == set(vanished)
    # r2's first attempt that ran (one queued on the box that vanished was lost there, never started)
    first_r2 = min(r.attempt for r in records if r.run_id == "r2" and r.phase is not AttemptOutcome.LOST)
    assert [(r.run_id, r.attempt, r.exit_code) for r in records if r.phase is AttemptOutcome.FAILED] == [
        ("r2", first_r2, 1)
    ]
    assert all(r.code_commit == "c0ffee" and r.desired_commit == "d35173d" for r in records if r.phase
               is AttemptOutcome.SUCCEEDED)
    assert not world.rentals and not world.boxes, "every box is destroyed once the work is done"

    failures = [(res, o) for res in results for o in _failed(res)]
    assert [(type(o.action), o.detail) for _, o in failures] == [
        (Rent, "KeyError: 'new_contract'"),
        (Launch, "OSError: Socket is closed"),
    ]
    for res, o in failures:  # the rest of that cycle's plan still ran
        assert res.applied is not None and any(x.ok for x in res.applied.outcomes if x is not o)
    assert injected and vanished


def test_a_hung_box_is_waited_for_then_replaced() -> None:
    """A box that stops answering keeps its runs in flight through the grace period, then is destroyed and its
    attempts requeued elsewhere."""
    desired = desired_state(2, max_instances=1)
    world = FakeWorld([offer(1, gpus=2), offer(2, gpus=2)], clock=FakeClock(), boot_s=30.0,
                      work=lambda job: Work(seconds=600.0))
    archive = FakeArchive()
    hung: list[int] = []
    hung_at: list[float] = []

    def hang(res: CycleResult) -> None:
        if not hung and len(world.live_runs()) == 2:
            iid = world.live_runs()[0][0]
            world.hang(iid)
            hung.append(iid)
            hung_at.append(world.clock.now())

    results = _drive(desired, world, archive, hang)
    assert len(results) < MAX_CYCLES
    records = list(archive.records())
    assert Counter(r.run_id for r in records if r.phase is AttemptOutcome.SUCCEEDED) == Counter({"r0": 1, "r1": 1})
    assert {(r.run_id, r.attempt, r.instance_id) for r in records if r.phase is AttemptOutcome.LOST} == {
        ("r0", 1, hung[0]),
        ("r1", 1, hung[0]),
    }
    assert f"destroy_instance {hung[0]}" in world.calls
    destroyed_at = next(
        res.started_at
        for res in results
        if any(isinstance(a, Destroy) and a.instance_id == hung[0] for a in res.plan.actions)
    )
    assert destroyed_at - hung_at[0] > desired.fleet.unreachable_grace_s
    assert hung[0] in world.forgotten  # its connections and pinned host key are dropped


class _SlowListing:
    """The provider, with ``list_instances`` taking ``delay_s`` of the world's clock while ``slow`` is set."""

    def __init__(self, world: FakeWorld, delay_s: float) -> None:
        self._world, self.delay_s, self.slow = world, delay_s, False

    def list_instances(self) -> list[Instance]:
        if self.slow:
            self._world.clock.advance(self.delay_s)
        return self._world.provider.list_instances()

    def __getattr__(self, name: str) -> object:
        return getattr(self._world.provider, name)


def test_the_budget_horizon_covers_the_slowest_recent_cycle_and_never_less_than_the_probe_deadline() -> None:
    """What a held box costs until the next decision is priced over the interval plus the slowest recent cycle
    (a hung box or a slow API makes one cycle much longer than the last), never less than the probe deadline."""
    desired = desired_state(1, max_instances=1)
    world = FakeWorld([offer(1)], clock=FakeClock(), work=lambda job: Work(seconds=1e6))
    slow = _SlowListing(world, delay_s=40.0)
    rec = replace(fake_reconciler(world, FakeArchive()), provider=slow, cycle_s=5.0, destroy_latency_s=2.0)
    assert rec.cycle(desired).controller.cycle_s == 5.0 + PROBE_TIMEOUT_S + 2.0
    slow.slow = True
    rec.cycle(desired)  # takes 40 s
    slow.slow = False
    horizons = [rec.cycle(desired).controller.cycle_s for _ in range(RECENT_CYCLES + 1)]
    assert horizons[:RECENT_CYCLES - 1] == [5.0 + 40.0 + 2.0] * (RECENT_CYCLES - 1)
    assert horizons[-1] == 5.0 + PROBE_TIMEOUT_S + 2.0  # the slow cycle is no longer recent


class _SyncedStore:
    """A result store that says only when each run's checkpoint was last synced, and from which attempt."""

    def __init__(self, synced: dict[str, tuple[int, float]]) -> None:
        self.synced = synced
        self.presigner = None

    def checkpoint_synced(self, run_id: str) -> tuple[int, float] | None:
        return self.synced.get(run_id)


def test_the_stores_last_sync_stands_in_only_for_an_attempt_this_fleet_launched_on_its_box() -> None:
    """After a restart the store says when each running attempt's checkpoint was last synced; a run directory a box
    shows that no launch of ours made there (r1.2 on instance/2: forged) takes nothing from it."""
    case = load_case(Path(__file__).parent / "plan_cases" / "checkpoint_forged_never_pulled.json")
    world = FakeWorld.from_observed(case.observed, FakeClock(case.now))
    for synced, pulls in (
        ((2, case.now - 30.0), ()),  # the forged attempt's: never ours
        ((1, case.now - 30.0), (CheckpointPull("r1", 1, case.now - 30.0),)),  # ours, on the box it was launched on
    ):
        store = _SyncedStore({"r1": synced})
        rec = fake_reconciler(world, memory=case.observed.memory, store=store)
        observed, _, _ = rec.observe_and_plan(case.desired)
        assert observed.memory.checkpoint_pulls == pulls
