"""Billed spend: observe() reads what the provider billed each owned box, keeps each box's last figure between
reads, and adds only what is new; apply() closes every ended box with one overhead line in the archive.

The world is the in-memory fake (``tests/unit/fakes.py``): every rental bills its listed $/h per second from
create until it is destroyed or vanishes, its charges outlive it, and the account's credit is what is left.
The accrual rules checked here: a gone box's money stays in the total; "today" restarts at UTC midnight and an
increase read across midnight is split pro rata; when the provider cannot say (an API error, no charge for a
box) the box is estimated at its listed $/h and marked so; spend never goes down; and the archive's attempt
costs plus its overhead lines add up to the ledger.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import pytest
from fakes import (
    FakeArchive,
    FakeClock,
    FakeWorld,
    Work,
    desired_state,
    fake_reconciler,
    offer,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from profiles import examples

from reconciler.core.model import (
    AttemptOutcome,
    BoxSpend,
    Desired,
    FleetMemory,
    InFlight,
    Instance,
    InstanceStatus,
    Observed,
    Spend,
)
from reconciler.core.remember import accrue_billed
from reconciler.errors import ProviderTransient
from reconciler.observe import observe

DAY = 86400.0
MIDNIGHT = 20 * DAY  # a UTC midnight
FLEET = "lab"


def _rent(world: FakeWorld, offer_id: int, slot: str = "s") -> int:
    return world.provider.create_instance(
        offer_id, image="img", disk_gb=20, label=f"rigsync:{FLEET}:{slot}{offer_id}", onstart="", env={}
    )


def _observe(world: FakeWorld, desired: Desired, memory: FleetMemory) -> tuple[Observed, FleetMemory]:
    return observe(desired, world.provider, world.box_control, (), memory, world.clock.now())


def test_spend_is_what_the_provider_billed_and_a_gone_box_keeps_its_money() -> None:
    desired = desired_state(0)
    world = FakeWorld([offer(1, dph=0.3), offer(2, dph=0.5)], clock=FakeClock(MIDNIGHT + 3600))
    a, b = _rent(world, 1), _rent(world, 2)
    world.clock.advance(600)
    obs, mem = _observe(world, desired, FleetMemory())
    assert obs.memory.spend.total_usd == pytest.approx(world.ledger_usd()) == pytest.approx(0.8 * 600 / 3600)
    assert obs.memory.spend.today_usd == pytest.approx(obs.memory.spend.total_usd)
    assert obs.credit_usd == pytest.approx(1000.0 - world.ledger_usd())
    assert {i.id: i.cost_usd for i in obs.instances} == {a: pytest.approx(0.05), b: pytest.approx(0.5 / 6)}
    assert not obs.memory.spend.estimated and [x.instance_id for x in obs.memory.spend.boxes] == [a, b]

    world.provider.destroy_instance(a)  # destroyed between two reads: the bill up to the destroy still counts
    world.clock.advance(300)
    obs, mem = _observe(world, desired, mem)
    assert obs.memory.spend.total_usd == pytest.approx(world.ledger_usd())
    gone = obs.memory.spend.box(a)
    assert gone is not None and gone.gone_at == world.clock.now() and gone.usd == pytest.approx(0.3 * 600 / 3600)
    assert gone.gpu_name == "RTX 3090" and gone.dph == 0.3  # what its overhead line will name

    world.clock.advance(300)
    obs, mem = _observe(world, desired, mem)  # its overhead line was due last cycle: dropped, money kept
    assert obs.memory.spend.box(a) is None and obs.memory.spend.total_usd == pytest.approx(world.ledger_usd())
    assert mem.spend == obs.memory.spend and mem.spend_at == world.clock.now()


def test_a_gone_box_with_an_attempt_in_flight_stays_until_the_attempt_is_settled() -> None:
    desired = desired_state(1)
    world = FakeWorld([offer(1)], clock=FakeClock(MIDNIGHT + 60))
    iid = _rent(world, 1)
    world.clock.advance(120)
    _, mem = _observe(world, desired, FleetMemory())
    world.vanish(iid)
    flight = InFlight("r0", 1, iid, (0,), launched_at=MIDNIGHT + 100)
    for _ in range(3):
        world.clock.advance(60)
        obs, mem = _observe(world, desired, replace(mem, in_flight=(flight,)))
        assert obs.memory.spend.box(iid) is not None, "kept until its attempt is requeued and archived"
    world.clock.advance(60)
    obs, mem = _observe(world, desired, replace(mem, in_flight=()))
    assert obs.memory.spend.box(iid) is None and obs.memory.spend.total_usd == pytest.approx(world.ledger_usd())


def test_when_the_provider_cannot_say_the_box_is_estimated_and_spend_never_goes_down() -> None:
    desired = desired_state(0)
    world = FakeWorld([offer(1, dph=0.36)], clock=FakeClock(MIDNIGHT + 3600))
    iid = _rent(world, 1)
    world.clock.advance(100)
    obs, mem = _observe(world, desired, FleetMemory())
    first = obs.memory.spend.total_usd
    # The box bills less than its listed price from now on (say storage only): the estimate overshoots.
    world.bill(iid, 0.036)
    world.fail_next("billed_costs", ProviderTransient("show charges: HTTP 429"))
    world.fail_next("account_credit", ProviderTransient("show user: HTTP 503"))
    world.clock.advance(1000)
    obs, mem = _observe(world, desired, mem)
    assert obs.memory.spend.estimated and obs.memory.spend.box(iid).estimated  # type: ignore[union-attr]
    assert obs.memory.spend.total_usd == pytest.approx(first + 0.36 * 1000 / 3600)
    assert obs.credit_usd is None
    assert obs.instances[0].cost_usd is None  # the provider did not say
    # The bill, read again, is below the estimate: the estimate stands (still marked) until the bill passes it.
    world.clock.advance(100)
    obs2, mem = _observe(world, desired, mem)
    assert world.ledger_usd() < obs.memory.spend.total_usd
    assert obs2.memory.spend.total_usd == obs.memory.spend.total_usd and obs2.memory.spend.box(iid).estimated  # type: ignore[union-attr]
    world.bill(iid, 36.0)
    world.clock.advance(100)
    obs3, mem = _observe(world, desired, mem)
    assert obs3.memory.spend.total_usd == pytest.approx(world.ledger_usd()) and not obs3.memory.spend.estimated


def test_a_box_the_provider_has_no_charge_for_is_estimated_at_its_price() -> None:
    desired = desired_state(0)
    world = FakeWorld([offer(1, dph=0.72)], clock=FakeClock(MIDNIGHT + 3600))
    iid = _rent(world, 1)
    world.unbilled.add(iid)
    world.clock.advance(50)
    obs, _ = _observe(world, desired, FleetMemory())
    box = obs.memory.spend.box(iid)
    assert box is not None and box.estimated and box.usd == pytest.approx(0.72 * 50 / 3600)
    assert obs.memory.spend.estimated


def test_today_restarts_at_utc_midnight_and_an_increase_across_it_is_split_pro_rata() -> None:
    desired = desired_state(0)
    world = FakeWorld([offer(1, dph=1.0)], clock=FakeClock(MIDNIGHT - 3600))
    _rent(world, 1)
    world.clock.advance(1800)  # 23:30
    obs, mem = _observe(world, desired, FleetMemory())
    assert obs.memory.spend.today_usd == pytest.approx(0.5) and obs.memory.spend.total_usd == pytest.approx(0.5)
    world.clock.advance(3600)  # 00:30 the next day: $1 more, half of it today
    obs, mem = _observe(world, desired, mem)
    assert obs.memory.spend.total_usd == pytest.approx(1.5) and obs.memory.spend.today_usd == pytest.approx(0.5)
    world.clock.advance(DAY)  # a whole day later, nothing was read in between: today is since midnight only
    obs, mem = _observe(world, desired, mem)
    assert obs.memory.spend.total_usd == pytest.approx(25.5) and obs.memory.spend.today_usd == pytest.approx(0.5)


def test_a_box_first_seen_long_after_its_start_counts_its_whole_bill_pro_rata() -> None:
    """A restarted rigsync with no memory of a box: its whole bill counts, today only the part after midnight."""
    world = FakeWorld([offer(1, dph=2.0)], clock=FakeClock(MIDNIGHT - 3 * 3600))
    _rent(world, 1)
    world.clock.advance(4 * 3600)
    obs, _ = _observe(world, desired_state(0), FleetMemory())
    assert obs.memory.spend.total_usd == pytest.approx(8.0) and obs.memory.spend.today_usd == pytest.approx(2.0)


def _inst(iid: int, dph: float) -> Instance:
    return Instance(iid, f"rigsync:{FLEET}:x", InstanceStatus.RUNNING, "RTX 3090", 1, 24576, dph, MIDNIGHT)


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0, 7200),  # seconds until the read
            st.sampled_from(["ok", "low", "error", "missing", "gone"]),
            st.floats(0, 3),  # what the provider says, relative to the truth
        ),
        min_size=1,
        max_size=12,
    )
)
def test_spend_never_goes_down_whatever_the_provider_says(reads: list[tuple[float, str, float]]) -> None:
    spend, at, now, truth = Spend(), None, MIDNIGHT - 5000.0, 0.0
    listed = [_inst(1, 0.5), _inst(2, 1.5)]
    for dt, kind, factor in reads:
        now += dt
        truth += 2.0 * dt / 3600
        if kind == "gone":
            listed = listed[:1]
        billed = None if kind == "error" else {} if kind == "missing" else {
            1: truth * factor * (0.1 if kind == "low" else 1.0), 2: truth * factor}
        new = accrue_billed(spend, at, listed, billed, (), now)
        assert new.total_usd >= spend.total_usd - 1e-12
        for box in spend.boxes:
            after = new.box(box.instance_id)
            assert after is None or after.usd >= box.usd - 1e-12
        assert 0 <= new.today_usd <= new.total_usd + 1e-9
        if math.floor(now / DAY) == math.floor((at if at is not None else now) / DAY):
            assert new.today_usd >= spend.today_usd - 1e-12  # only midnight brings today down
        spend, at = new, now



def test_every_billed_second_is_attributed_to_a_run_or_to_its_box_overhead() -> None:
    """Run time to the runs (their GPU share), boot/bootstrap/idle and idle GPUs to each box's overhead line:
    the archive adds up to the ledger, through a vanished box whose attempts are requeued."""
    desired = desired_state(5, max_instances=2, bootstrap="pip install -r requirements.txt")
    world = FakeWorld([offer(i, gpus=2, dph=0.2 + i / 100) for i in range(1, 6)], clock=FakeClock(MIDNIGHT + 60),
                      boot_s=45.0, bootstrap_s=25.0, work=lambda job: Work(seconds=300.0))
    archive = FakeArchive()
    rec = fake_reconciler(world, archive)
    vanished: list[int] = []
    spends = []
    for _ in range(200):
        res = rec.cycle(desired)
        spends.append(res.observed.memory.spend.total_usd)
        if not vanished and world.live_runs():
            vanished.append(world.live_runs()[0][0])
            world.vanish(vanished[0])
        done = {r.run_id for r in archive.records() if r.phase is AttemptOutcome.SUCCEEDED}
        if done == {r.id for r in desired.runs} and not world.rentals and not res.observed.memory.spend.boxes:
            break
        world.clock.advance(20.0)
    assert not world.rentals and spends == sorted(spends), "converged, and spend never went down"
    attempts, overheads = list(archive.records()), list(archive.overheads())
    assert any(r.phase is AttemptOutcome.LOST and r.instance_id == vanished[0] for r in attempts)
    rented = {r.instance_id for r in attempts} | set(vanished)
    assert Counter(o.instance_id for o in overheads) == Counter(dict.fromkeys(rented, 1)), "one line per box"
    ledger = world.ledger_usd()
    assert res.observed.memory.spend.total_usd == pytest.approx(ledger, abs=1e-9)
    assert sum(r.cost_usd for r in attempts) + sum(o.cost_usd for o in overheads) == pytest.approx(ledger, abs=1e-5)
    for o in overheads:
        on_box = [r for r in attempts if r.instance_id == o.instance_id]
        assert o.billed_usd == pytest.approx(world.billed(o.instance_id), abs=1e-6)
        assert o.attempts == len(on_box) and o.cost_usd == pytest.approx(o.billed_usd - o.attempts_usd, abs=1e-6)
        assert o.cost_usd > 0 and not o.estimated, "boot and bootstrap time is the box's, never a run's"
        assert o.num_gpus == 2 and o.ended_at is not None
    # A one-GPU run on a two-GPU box pays half the box's rate over its run time.
    ok = next(r for r in attempts if r.phase is AttemptOutcome.SUCCEEDED)
    assert ok.started_at is not None and ok.ended_at is not None
    assert ok.cost_usd == pytest.approx(ok.dph / 2 * (ok.ended_at - ok.started_at) / 3600, abs=1e-6)


def test_box_spend_is_final_once_gone_and_said_or_after_the_settle_time() -> None:
    box = BoxSpend(1, usd=1.0, at=MIDNIGHT)
    assert not box.bill_final(MIDNIGHT)
    gone = replace(box, gone_at=MIDNIGHT)
    assert gone.bill_final(MIDNIGHT)
    guessed = replace(gone, estimated=True)
    assert not guessed.bill_final(MIDNIGHT + 599) and guessed.bill_final(MIDNIGHT + 600)


def test_a_lost_attempt_never_costs_more_than_its_box_was_billed() -> None:
    """A box that vanished long before anyone noticed: its lost attempts are charged at most what the box billed,
    so its overhead line never goes negative and the archive still adds up to the ledger."""
    desired = desired_state(2, max_instances=1)
    world = FakeWorld([offer(1, gpus=2, dph=0.4), offer(2, gpus=2, dph=0.4)], clock=FakeClock(MIDNIGHT + 60),
                      boot_s=30.0, bootstrap_s=0.0, work=lambda job: Work(seconds=600.0))
    archive = FakeArchive()
    rec = fake_reconciler(world, archive)
    for _ in range(20):
        rec.cycle(desired)
        world.clock.advance(20.0)
        if len(world.live_runs()) == 2:
            break
    box = world.live_runs()[0][0]
    world.vanish(box)
    world.clock.advance(7200.0)  # rigsync was away for two hours
    for _ in range(100):
        res = rec.cycle(desired)
        if not world.rentals and not res.observed.memory.spend.boxes:
            break
        world.clock.advance(20.0)
    lost = [r for r in archive.records() if r.phase is AttemptOutcome.LOST]
    assert {r.instance_id for r in lost} == {box} and len(lost) == 2
    line = next(o for o in archive.overheads() if o.instance_id == box)
    assert sum(r.cost_usd for r in lost) == pytest.approx(line.attempts_usd)
    assert line.attempts_usd <= line.billed_usd
    assert line.cost_usd >= 0 and line.billed_usd == pytest.approx(world.billed(box), abs=1e-6)
    attributed = sum(r.cost_usd for r in archive.records()) + sum(o.cost_usd for o in archive.overheads())
    assert attributed == pytest.approx(world.ledger_usd(), abs=1e-5)
