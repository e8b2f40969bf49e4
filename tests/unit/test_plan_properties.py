"""Properties of ``plan()`` over generated worlds (hypothesis): the safety rules hold for any input.

The generated worlds are deliberately messy (foreign boxes, stopped and unreachable boxes, crashed and
finished attempts, bad caps); the steady-state property uses a tidier world so "applied" is well defined.
"""

from __future__ import annotations

import dataclasses
import math

from fakes import (  # tests/unit is on sys.path (not a package)
    FakeArchive,
    FakeClock,
    FakeWorld,
    code_tar,
    flat_run_spec,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from profiles import examples

from reconciler.apply import ApplyContext, apply
from reconciler.core.actions import Bootstrap, Destroy, Kill, Launch, Plan, Record, Rent, Requeue, apply_key
from reconciler.core.model import (
    DEFAULT_POOL,
    AttemptOutcome,
    AttemptRecord,
    BoxMemory,
    BoxProbe,
    Budget,
    Controller,
    Desired,
    Endpoint,
    Fleet,
    FleetMemory,
    GpuState,
    InFlight,
    Instance,
    InstanceStatus,
    MetricGoal,
    Observed,
    Offer,
    OnExceed,
    Ownership,
    Pool,
    RunDirState,
    RunSpec,
    Spend,
)
from reconciler.core.offers import box_cap_dph
from reconciler.core.remember import next_in_flight
from reconciler.observe import observe
from reconciler.plan import fleet_dph_cap, fleet_spec_hash, plan

NOW = 1_000_000.0
FLEET = "lab"
CAP_VALUES = st.one_of(st.none(), st.sampled_from([-1.0, 0.0, 0.05, 0.15, 0.3, 0.6, 1.0, 2.5, math.nan]))

World = tuple[Desired, Observed]


def _run(i: int, gpus: int, ram: int, retries: int, threshold: float | None, cell: str) -> RunSpec:
    return flat_run_spec(
        id=f"r{i}",
        sweep="s" if i % 2 else "t",
        cell=cell,
        params=(("i", i),),
        seed=i,
        command=f"python t.py {i}",
        priority=i % 3,
        sweep_order=i % 2,
        gpus=gpus,
        min_gpu_ram_mib=ram,
        max_runtime_s=3600.0,
        retries=retries,
        metrics_file="metrics.jsonl",
        metric_key="reward",
        metric_goal=MetricGoal.MAX,
        promotion_threshold=threshold,
    )


@st.composite
def offers(draw: st.DrawFn) -> tuple[Offer, ...]:
    n = draw(st.integers(0, 6))
    out = []
    for i in range(n):
        dph = draw(st.sampled_from([0.0, 0.04, 0.1, 0.2, 0.35, 0.8, 1.5, -0.1, math.inf]))
        out.append(
            Offer(
                id=500 + i,
                machine_id=i,
                gpu_name=draw(st.sampled_from(["RTX 3090", "RTX 4090", "A100"])),
                num_gpus=draw(st.sampled_from([1, 2, 4])),
                gpu_ram_mib=draw(st.sampled_from([12000, 24576, 81920])),
                dph_total=dph,
                dlperf=draw(st.floats(1, 100)),
                dlperf_per_dph=draw(st.floats(1, 500)),
                reliability=draw(st.floats(0.9, 1.0)),
                inet_down_mbps=500.0,
                cuda=12.2,
                verified=True,
                geolocation="SE",
                disk_space_gb=100.0,
            )
        )
    return tuple(out)


@st.composite
def worlds(draw: st.DrawFn, steady: bool = False) -> World:
    bootstrap = "" if steady else draw(st.sampled_from(["", "bh01"]))
    least, most = draw(st.integers(-1, 2)), draw(st.integers(-1, 4))
    fleet = Fleet(
        name=FLEET,
        min_instances=least,
        max_instances=most,
        ttl_s=None if steady else draw(st.sampled_from([None, 3000.0])),
        suspend=False if steady else draw(st.integers(0, 9)) == 0,
        pools=(Pool(name=DEFAULT_POOL, min_instances=least, max_instances=most, bootstrap_hash=bootstrap),),
    )
    on_exceed = draw(st.sampled_from(list(OnExceed)))
    budget = Budget(
        max_instance_dph=draw(CAP_VALUES),
        max_fleet_dph=draw(CAP_VALUES),
        daily_usd=None if steady else draw(st.sampled_from([None, -1.0, 5.0, 50.0])),
        total_usd=None,
        on_exceed=on_exceed,
    )
    n_runs = draw(st.integers(0, 8))
    runs = []
    for i in range(n_runs):
        gpus = 1 if steady else draw(st.sampled_from([1, 1, 2]))
        ram = 0 if steady else draw(st.sampled_from([0, 0, 30000]))
        threshold = None if steady or i < 2 else draw(st.sampled_from([None, None, 0.5]))
        runs.append(_run(i, gpus, ram, draw(st.integers(-1, 2)), threshold, f"c{i % 2}"))
    spec = fleet_spec_hash(fleet)
    instances: list[Instance] = []
    probes: list[BoxProbe] = []
    memory: list[BoxMemory] = []
    in_flight: list[InFlight] = []
    history: list[AttemptRecord] = []
    used_attempts: set[str] = set()
    n_boxes = draw(st.integers(0, 4))
    for b in range(n_boxes):
        iid = 10 + b
        foreign = not steady and draw(st.integers(0, 4)) == 0
        if foreign:
            label = draw(st.sampled_from(["", "notebook", f"rigsync:other:{spec}-{iid}", "rigsync:lab"]))
        else:
            old = not steady and draw(st.integers(0, 5)) == 0
            label = Ownership(FLEET, f"{'0ldspec0' if old else spec}-{iid}").label()
        status = (
            InstanceStatus.RUNNING
            if steady
            else draw(st.sampled_from(list(InstanceStatus) + [InstanceStatus.RUNNING] * 12))
        )
        n_gpus = draw(st.sampled_from([1, 2, 4]))
        inst = Instance(
            id=iid,
            label=label,
            status=status,
            gpu_name="RTX 3090",
            num_gpus=n_gpus,
            gpu_ram_mib=24576,
            dph_total=draw(st.sampled_from([0.05, 0.1, 0.2, 0.4])),
            start_date=NOW - draw(st.sampled_from([60.0, 600.0, 4000.0])),
            direct=Endpoint(f"10.0.{iid}.1", 22) if status is InstanceStatus.RUNNING else None,
        )
        instances.append(inst)
        reachable = steady or draw(st.integers(0, 4)) > 0
        if not reachable:
            memory.append(BoxMemory(iid, NOW - 5000, unreachable_since=NOW - draw(st.sampled_from([10.0, 500.0]))))
            probes.append(BoxProbe(iid, False, error="timeout"))
            if runs and draw(st.booleans()):
                r = draw(st.sampled_from(runs))
                if r.id not in used_attempts:
                    used_attempts.add(r.id)
                    in_flight.append(InFlight(r.id, 1, iid, (0,), NOW - 100))
            continue
        rundirs: list[RunDirState] = []
        busy: set[int] = set()
        for g in range(n_gpus):
            if not runs or not draw(st.booleans()):
                continue
            r = draw(st.sampled_from(runs))
            if r.id in used_attempts or r.sweep.gpus_per_run != 1:
                continue
            used_attempts.add(r.id)
            if steady:
                kind = "live"
            else:
                kind = draw(st.sampled_from(["live", "live", "done0", "done1", "dead", "stale", "old"]))
            exit_code = {"done0": 0, "done1": 1}.get(kind)
            rundirs.append(
                RunDirState(
                    run_id=r.id,
                    attempt=1,
                    gpu_mask=(g,),
                    pid_alive=kind in ("live", "stale", "old"),
                    started_at=NOW - (9000.0 if kind == "old" else 300.0),
                    heartbeat_age_s=500.0 if kind == "stale" else 3.0,
                    exit_code=exit_code,
                    best_metric=draw(st.sampled_from([None, 0.2, 0.9])) if exit_code == 0 else None,
                )
            )
            if exit_code is None and kind != "dead":
                busy.add(g)
            in_flight.append(InFlight(r.id, 1, iid, (g,), NOW - 300))
        gpus = tuple(
            GpuState(g, 3000 if g in busy or (not steady and draw(st.integers(0, 3)) == 0) else 0, 24576)
            for g in range(n_gpus)
        )
        probes.append(
            BoxProbe(
                iid,
                True,
                gpus=gpus,
                bootstrap_hashes=(bootstrap,) if bootstrap and draw(st.integers(0, 3)) > 0 else (),
                runs=tuple(rundirs),
                last_activity_at=NOW - draw(st.sampled_from([30.0, 900.0])),
            )
        )
    if not steady:
        for r in runs:
            if r.id not in used_attempts and draw(st.integers(0, 3)) == 0:
                phase = draw(st.sampled_from([AttemptOutcome.SUCCEEDED, AttemptOutcome.FAILED, AttemptOutcome.LOST]))
                history.append(AttemptRecord(r.id, 1, r.sweep.name, phase, best_metric=0.9))
    if not steady and runs and draw(st.booleans()):
        # an in-flight attempt on a box that is not listed at all
        in_flight.append(InFlight(draw(st.sampled_from(runs)).id, 7, 99, (0,), NOW - 50))
    spend = Spend(today_usd=draw(st.sampled_from([0.0, 10.0])), total_usd=10.0)
    desired = Desired(
        fleet=fleet, budget=budget, sweeps=(), runs=tuple(runs), code_commit=draw(st.sampled_from([None, "c0ffee"]))
    )
    observed = Observed(
        instances=tuple(instances),
        probes=tuple(probes),
        offers=draw(offers()),
        history=tuple(history),
        memory=FleetMemory(boxes=tuple(memory), spend=spend, in_flight=tuple(in_flight)),
        fleet_name=FLEET,
    )
    return desired, observed


SETTINGS = settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _owned_ids(observed: Observed) -> set[int]:
    out = set()
    for i in observed.instances:
        own = Ownership.parse(i.label)
        if own is not None and own.fleet == FLEET:
            out.add(i.id)
    return out


@SETTINGS
@given(worlds())
def test_plan_is_deterministic_and_ordered(world: World) -> None:
    desired, observed = world
    a = plan(desired, observed, Controller(), NOW)
    b = plan(desired, observed, Controller(), NOW)
    assert a == b
    assert a.to_json() == b.to_json()
    keys = [apply_key(x) for x in a.actions]
    assert keys == sorted(keys)
    assert all(x.reason for x in a.actions) and all(n.reason for n in a.noops)


@SETTINGS
@given(worlds())
def test_never_rents_above_caps(world: World) -> None:
    desired, observed = world
    p = plan(desired, observed, Controller(), NOW)
    rents = [a for a in p.actions if isinstance(a, Rent)]
    if not rents:
        return
    instance_cap = max(box_cap_dph(pool, desired.budget) for pool in desired.fleet.pools)
    fleet_cap = fleet_dph_cap(desired)
    owned = {i.id: i for i in observed.instances if i.id in _owned_ids(observed)}
    destroyed = {a.instance_id for a in p.actions if isinstance(a, Destroy)}
    alive = [i for iid, i in owned.items() if iid not in destroyed]
    assert len(alive) + len(rents) <= max(0, desired.fleet.max_instances)
    assert all(0 <= r.dph <= instance_cap for r in rents)
    assert sum(i.dph_total for i in alive) + sum(r.dph for r in rents) <= fleet_cap + 1e-9
    assert len({r.offer_id for r in rents}) == len(rents)
    offer_ids = {o.id for o in observed.offers}
    assert all(r.offer_id in offer_ids for r in rents)
    spend, budget = observed.memory.spend, desired.budget
    assert budget.daily_usd is None or spend.today_usd < max(0.0, budget.daily_usd)


@SETTINGS
@given(worlds())
def test_never_acts_on_foreign_instances(world: World) -> None:
    desired, observed = world
    p = plan(desired, observed, Controller(), NOW)
    owned = _owned_ids(observed)
    foreign = {i.id for i in observed.instances} - owned
    for a in p.actions:
        iid = getattr(a, "instance_id", None)
        if isinstance(a, (Requeue, Record)):
            continue  # bookkeeping about our own attempts, never a call to the box
        assert iid not in foreign, a


@SETTINGS
@given(worlds())
def test_never_launches_a_run_twice_nor_a_gpu_twice(world: World) -> None:
    desired, observed = world
    p = plan(desired, observed, Controller(), NOW)
    launches = [a for a in p.actions if isinstance(a, Launch)]
    assert len({a.run_id for a in launches}) == len(launches)
    stopped = {(a.run_id, a.attempt) for a in p.actions if isinstance(a, (Kill, Requeue))}
    probes = observed.probes_by_id()
    live_runs = set()
    taken: dict[int, set[int]] = {}
    for pr in observed.probes:
        if not pr.reachable:
            continue
        for rd in pr.runs:
            if rd.exit_code is None and rd.pid_alive:
                taken.setdefault(pr.instance_id, set()).update(rd.gpu_mask)
                if (rd.run_id, rd.attempt) not in stopped:
                    live_runs.add(rd.run_id)
    waiting = {(f.instance_id, g) for f in observed.memory.in_flight if f.queued for g in f.gpu_mask}
    for a in sorted(launches, key=lambda a: a.queued):
        assert a.run_id not in live_runs, a
        pr = probes[a.instance_id]
        gpus = {g.index: g for g in pr.gpus}
        box_taken = taken.setdefault(a.instance_id, set())
        if a.queued:  # behind a busy slot: one a live attempt, this plan's launch or an earlier entry holds
            assert all(g in box_taken or (a.instance_id, g) in waiting for g in a.gpu_mask), a
            continue
        for g in a.gpu_mask:
            assert g not in box_taken, a
            assert gpus[g].memory_used_mib <= 100
            box_taken.add(g)
        spec = desired.run(a.run_id)
        assert spec is not None and len(a.gpu_mask) == spec.sweep.gpus_per_run
    if desired.fleet.suspend:
        assert all(isinstance(a, Record) for a in p.actions)


def _apply(desired: Desired, observed: Observed, p: Plan) -> Observed:
    """The world after the real ``apply()`` of ``p`` at the same instant, as the real ``observe()`` then sees it.

    The world is the in-memory fake of the ports (``tests/unit/fakes.py``) built to look exactly like
    ``observed``; apply talks to it through the same ``Provider`` and ``BoxControl`` ports as in production.
    """
    clock = FakeClock(NOW)
    world = FakeWorld.from_observed(observed, clock)
    archive = FakeArchive(observed.history)
    ctx = ApplyContext(
        provider=world.provider,
        boxes=world.box_control,
        desired=desired,
        observed=observed,
        archive=archive,
        code_tar=code_tar,
        now=clock.now,
    )
    result = apply(p, ctx)
    assert not result.failures, result.failure_lines()
    memory = FleetMemory(
        boxes=observed.memory.boxes,
        in_flight=next_in_flight(observed.memory.in_flight, observed, result, 0.0),
        spend=observed.memory.spend,
        spend_at=NOW,
    )
    applied, _ = observe(desired, world.provider, world.box_control, tuple(archive.records()), memory, NOW)
    return applied


@SETTINGS
@given(worlds(steady=True))
def test_the_fake_world_is_observed_as_generated(world: World) -> None:
    """The fakes are honest: ``observe()`` of a fake world built from a snapshot plans like the snapshot itself."""
    desired, observed = world
    fake = FakeWorld.from_observed(observed, FakeClock(NOW))
    mem = observed.memory
    memory = FleetMemory(boxes=mem.boxes, in_flight=mem.in_flight, spend=mem.spend, spend_at=NOW)
    seen, _ = observe(desired, fake.provider, fake.box_control, observed.history, memory, NOW)
    assert seen.probes == tuple(  # a real probe lists run directories sorted by (run id, attempt)
        dataclasses.replace(p, runs=tuple(sorted(p.runs, key=lambda r: (r.run_id, r.attempt))))
        for p in observed.probes
    )
    assert plan(desired, seen, Controller(), NOW).actions == plan(desired, observed, Controller(), NOW).actions


@SETTINGS
@given(worlds(steady=True))
def test_second_plan_on_applied_world_is_noop_only(world: World) -> None:
    desired, observed = world
    first = plan(desired, observed, Controller(), NOW)
    applied = _apply(desired, observed, first)
    second = plan(desired, applied, Controller(), NOW)
    assert second.actions == (), [f"{a.kind.value} {a.target}: {a.reason}" for a in second.actions]


@SETTINGS
@given(worlds())
def test_a_spent_cap_starts_nothing_and_ends_every_box(world: World) -> None:
    """Caps hold before the fact: once the daily cap is spent, nothing new starts and every owned box goes now."""
    desired, observed = world
    cap = desired.budget.daily_usd
    if cap is None or observed.memory.spend.today_usd < max(0.0, cap) or desired.fleet.suspend:
        return
    p = plan(desired, observed, Controller(), NOW)
    assert not [a for a in p.actions if isinstance(a, Launch | Rent | Bootstrap)]
    destroyed = {a.instance_id for a in p.actions if isinstance(a, Destroy)}
    assert _owned_ids(observed) <= destroyed
    assert any(d.cls.value == "over_budget" for d in p.drift)
