"""remember.update_box_memory: the per-box clocks the planner reads (unreachable_since, bootstrap_since)."""

from __future__ import annotations

from reconciler.core.model import BoxMemory, BoxProbe, Instance, InstanceStatus
from reconciler.core.remember import update_box_memory

T = 1_000_000.0
BOX = Instance(1, "rigsync:lab:abc-1", InstanceStatus.RUNNING, "RTX 3090", 1, 24576, 0.2, T - 600)


def test_bootstrap_since_starts_when_the_box_answers_without_it_and_ends_when_it_is_done() -> None:
    missing = BoxProbe(1, reachable=True, bootstrap_running=("h1",))
    first = update_box_memory((), [BOX], [missing], T, "h1")
    assert first == (BoxMemory(1, first_seen_at=T, bootstrap_since=T, reachable_at=T),)
    # still missing: the clock keeps its start; unreachable for a cycle: it keeps running too
    assert update_box_memory(first, [BOX], [missing], T + 60, "h1")[0].bootstrap_since == T
    dark = update_box_memory(first, [BOX], [BoxProbe(1, reachable=False)], T + 90, "h1")[0]
    assert (dark.bootstrap_since, dark.unreachable_since) == (T, T + 90)
    done = update_box_memory(first, [BOX], [BoxProbe(1, reachable=True, bootstrap_hashes=("h1",))], T + 120, "h1")
    assert done[0].bootstrap_since is None
    # a fleet without a bootstrap never starts the clock
    assert update_box_memory((), [BOX], [missing], T, "")[0].bootstrap_since is None


def test_gpu_quiet_clock_per_live_attempt_of_a_sweep_with_stall_timeout() -> None:
    from dataclasses import replace

    from reconciler.core.model import Budget, Desired, Fleet, GpuQuiet, GpuState, InFlight, RunDirState, RunSpec, Sweep
    from reconciler.core.remember import track_gpu_quiet

    def spec(rid: str, stall: float | None) -> RunSpec:
        return RunSpec(rid, Sweep("s", "true", stall_timeout_s=stall, stall_gpu_util_pct=5.0), rid, (), 0, "true")

    desired = Desired(Fleet(name="lab"), Budget(), (), (spec("r1", 600.0), spec("r2", None), spec("r3", 600.0)))
    live = RunDirState("r1", 1, (0,), pid_alive=True, started_at=T - 60, heartbeat_age_s=1.0, exit_code=None)
    other = replace(live, run_id="r2", gpu_mask=(1,))
    foreign = replace(live, run_id="r3", gpu_mask=(2,))  # no launch of ours: no clock, however quiet
    gpus = tuple(GpuState(i, 500, 24576, utilization_pct=0.0) for i in range(3))
    quiet = BoxProbe(1, reachable=True, gpus=gpus, runs=(live, other, foreign))
    flying = [InFlight("r1", 1, 1, (0,), T - 60), InFlight("r2", 1, 1, (1,), T - 60)]
    first = track_gpu_quiet((), desired, flying, [quiet], T)
    assert first == (GpuQuiet("r1", 1, T),)  # r2's sweep has no stall_timeout: no clock
    assert track_gpu_quiet(first, desired, flying, [quiet], T + 60) == first
    busy = replace(quiet, gpus=(replace(gpus[0], utilization_pct=97.0), *gpus[1:]))
    assert track_gpu_quiet(first, desired, flying, [busy], T + 120) == ()  # working again: the clock stops
    assert track_gpu_quiet(first, desired, flying, [BoxProbe(1, reachable=False)], T + 120) == ()
