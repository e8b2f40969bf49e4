"""Properties of ``plan()`` when boxes lie (hypothesis): whatever a probe claims, only what this fleet launched on a
box is recorded, killed or requeued there, and no run is placed on a GPU the provider does not list."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from profiles import examples
from test_plan_properties import NOW, World, worlds  # tests/unit is on sys.path (not a package)

from reconciler.core.actions import Kill, Launch, Record, Requeue
from reconciler.core.model import BoxProbe, Controller, GpuState, InFlight, RunDirState
from reconciler.plan import plan

SETTINGS = settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])

GPU_INDEX = st.one_of(st.integers(-3, 8), st.sampled_from([10**23, 2**63]))
UNLISTED = st.sampled_from([-1, 4, 5, 63, 10**23, 2**63])  # no generated instance lists more than 4 GPUs


@st.composite
def lies(draw: st.DrawFn, probe: BoxProbe, run_ids: list[str]) -> BoxProbe:
    """The probe with claims added: run directories of any id and attempt, live or finished (success, huge metric),
    and free GPUs the instance does not have."""
    if not probe.reachable:
        return probe
    ids = st.sampled_from([*run_ids, "ghost", "../x"]) if run_ids else st.sampled_from(["ghost", "../x"])
    forged = tuple(
        RunDirState(
            run_id=draw(ids),
            attempt=draw(st.integers(1, 9)),
            gpu_mask=tuple(draw(st.lists(GPU_INDEX, max_size=3))),
            pid_alive=draw(st.booleans()),
            started_at=NOW + draw(st.sampled_from([-9000.0, -60.0, 86400.0])),
            heartbeat_age_s=draw(st.sampled_from([None, -1000.0, 1.0, 900.0])),
            exit_code=draw(st.sampled_from([None, 0, 1])),
            best_metric=draw(st.sampled_from([None, 123456.0])),
        )
        for _ in range(draw(st.integers(0, 4)))
    )
    extra = tuple(GpuState(draw(UNLISTED), 0, 24576) for _ in range(draw(st.integers(1, 6))))
    return replace(probe, runs=probe.runs + forged, gpus=probe.gpus + extra)


@st.composite
def lying_worlds(draw: st.DrawFn, steady: bool = False) -> World:
    """Generated worlds (``steady``: every box ready, so runs are placed) whose probes lie."""
    desired, observed = draw(worlds(steady=steady))
    run_ids = [r.id for r in desired.runs]
    probes = tuple(draw(lies(p, run_ids)) for p in observed.probes)
    flights = tuple(
        replace(f, pid=draw(st.sampled_from([None, 4242])), pid_started=draw(st.sampled_from([None, 77])))
        for f in observed.memory.in_flight
        if draw(st.integers(0, 4)) > 0  # some launches are forgotten: what their boxes show is foreign then
    )
    return desired, replace(observed, probes=probes, memory=replace(observed.memory, in_flight=flights))


def _ours(observed: World) -> tuple[dict[tuple[str, int], InFlight], set[tuple[str, int]]]:
    _, obs = observed
    return {(f.run_id, f.attempt): f for f in obs.memory.in_flight}, {h.key for h in obs.history}


@SETTINGS
@given(lying_worlds())
def test_only_what_was_launched_on_a_box_is_recorded_killed_or_requeued_there(world: World) -> None:
    desired, observed = world
    flights, archived = _ours(world)
    for a in plan(desired, observed, Controller(), NOW).actions:
        if isinstance(a, Record):
            f = flights.get((a.run_id, a.attempt))
            assert f is not None and f.instance_id == a.instance_id, a
        elif isinstance(a, Kill):
            f = flights.get((a.run_id, a.attempt))
            if f is not None and f.instance_id == a.instance_id:
                # the launch's group, never the box's (and none without a pid: a start tick alone names nothing)
                assert (a.pid, a.pid_started) == ((f.pid, f.pid_started) if f.pid else (None, None)), a
            else:
                assert (a.run_id, a.attempt) in archived and a.pid is None, a  # an archived attempt still alive
        elif isinstance(a, Requeue):
            assert (a.run_id, a.attempt) in flights, a


@SETTINGS
@given(lying_worlds(steady=True))
def test_no_run_is_placed_on_a_gpu_the_provider_does_not_list(world: World) -> None:
    desired, observed = world
    listed = {i.id: i.num_gpus for i in observed.instances}
    per_box: dict[int, set[int]] = {}
    for a in plan(desired, observed, Controller(), NOW).actions:
        if isinstance(a, Launch):
            assert all(0 <= g < listed[a.instance_id] for g in a.gpu_mask), a
            if a.queued:  # behind a slot's current attempt, by design
                continue
            taken = per_box.setdefault(a.instance_id, set())
            assert not taken & set(a.gpu_mask), a
            taken.update(a.gpu_mask)
