"""A held box the provider's list drops is probed at its remembered endpoints: one that answers is unlisted, not
vanished (``remember.still_held``); one that is silent has vanished, as before. Rents are remembered until their box
is seen. The planner's side is stated by the plan cases (``unlisted_*``, ``list_drops_most_of_fleet``, ``rent_*``)."""

from __future__ import annotations

from dataclasses import replace

from fakes import FakeClock, FakeProvider, FakeShell, FakeWorld, desired_state, fake_reconciler, offer

from reconciler.core.actions import ApplyResult, ReasonCode, Rent
from reconciler.core.ledger import note_cycle
from reconciler.core.model import (
    BoxProbe,
    Desired,
    Fleet,
    FleetMemory,
    HostLedger,
    HostRecord,
    Instance,
    InstanceStatus,
    Observed,
    RentMade,
)
from reconciler.core.remember import Applied, Observation, remember, still_held
from reconciler.observe import observe
from reconciler.plan import plan
from reconciler.plan.world import PLANNING_ALONE

NOW = 1_000_000.0
FLEET = "lab"


class HidingProvider(FakeProvider):
    """The fake provider with a list that leaves some instances out (``hidden``) while they run on."""

    def __init__(self, world: FakeWorld, hidden: set[int]) -> None:
        super().__init__(world)
        self.hidden = hidden

    def list_instances(self) -> list[Instance]:
        return [i for i in super().list_instances() if i.id not in self.hidden]


def _rent(world: FakeWorld, offer_id: int) -> int:
    return world.provider.create_instance(
        offer_id, image="img", disk_gb=20, label=f"rigsync:{FLEET}:s{offer_id}", onstart="", env={}
    )


def _observe(
    world: FakeWorld, provider: FakeProvider, desired: Desired, memory: FleetMemory
) -> tuple[Observed, FleetMemory]:
    return observe(desired, provider, world.box_control, (), memory, world.clock.now())


def _two_boxes() -> tuple[FakeWorld, HidingProvider, tuple[int, int]]:
    """A world with two boxes rented and up for 10 minutes, and its provider with a list that may hide them."""
    world = FakeWorld([offer(1, dph=0.3), offer(2, dph=0.5)], clock=FakeClock(NOW))
    boxes = _rent(world, 1), _rent(world, 2)
    world.clock.advance(600)
    return world, HidingProvider(world, set()), boxes


def test_a_held_box_the_list_drops_is_probed_and_kept_while_it_answers_and_vanishes_when_silent() -> None:
    world, hiding, (a, b) = _two_boxes()
    desired = desired_state(0)
    obs, mem = _observe(world, hiding, desired, FleetMemory())
    assert [i.id for i in mem.held] == [a, b] and obs.unlisted == ()

    hiding.hidden.add(a)  # the list leaves it out; the box answers on
    world.clock.advance(60)
    obs, mem = _observe(world, hiding, desired, mem)
    assert [i.id for i in obs.unlisted] == [a] and a not in {i.id for i in obs.instances}
    probe = obs.probe(a)
    assert probe is not None and probe.reachable, "probed at its remembered endpoint"
    assert [i.id for i in mem.held] == [a, b]
    spend = mem.spend.box(a)
    assert spend is not None and spend.gone_at is None, "its bill stays open"
    assert a in {m.instance_id for m in mem.boxes}
    truthful = replace(obs, instances=tuple(sorted((*obs.instances, *obs.unlisted), key=lambda i: i.id)), unlisted=())
    now = world.clock.now()
    assert plan(desired, obs, PLANNING_ALONE, now).actions == plan(desired, truthful, PLANNING_ALONE, now).actions

    world.vanish(a)  # now it is gone for good: missing and silent
    world.clock.advance(60)
    obs, mem = _observe(world, hiding, desired, mem)
    assert [i.id for i in mem.held] == [b]
    spend = mem.spend.box(a)
    assert spend is not None and spend.gone_at == world.clock.now(), "vanished, as before"

    world.clock.advance(60)
    obs, mem = _observe(world, hiding, desired, mem)
    assert obs.unlisted == (), "a box no longer held is not probed again"


def _inst(iid: int) -> Instance:
    return Instance(iid, f"rigsync:lab:abc-{iid}", InstanceStatus.RUNNING, "RTX 3090", 1, 24576, 0.2, NOW - 600)


def test_still_held_keeps_only_what_answers_with_this_fleets_key() -> None:
    boxes = [_inst(1), _inst(2), _inst(3), _inst(4)]
    probes = [
        BoxProbe(1, True),
        BoxProbe(2, False, error="timed out"),
        BoxProbe(3, False, host_key_changed=True, error="host key changed"),
    ]  # 4 was not probed (it was not running when last listed)
    assert [i.id for i in still_held(boxes, probes)] == [1], "another key: the address may be another rental's"


def _rent_action(iid: int) -> Rent:
    return Rent(
        reason="r", code=ReasonCode.RENT_FOR_PENDING, offer_id=iid, label=f"rigsync:lab:abc-{iid}", image="img",
        disk_gb=20, dph=0.1, gpu_name="RTX 3090", num_gpus=1, onstart="",
    )


def test_rents_are_remembered_until_their_box_is_seen_and_a_destroyed_box_is_no_longer_held() -> None:
    desired = desired_state(0)
    fleet = Fleet(name="lab")
    memory = FleetMemory(held=(_inst(1),))
    result = ApplyResult(rented_as={55: _rent_action(55), 56: _rent_action(56)}, destroyed=[1])
    memory = remember(memory, Applied(Observed(fleet_name="lab"), result, fleet, NOW))
    assert memory.rents == (RentMade(55, NOW, "default"), RentMade(56, NOW, "default"))
    assert memory.held == (), "destroyed by this fleet: not probed again"

    seen = Observation(desired, (_inst(55),), (_inst(55),), (BoxProbe(55, True),), None, NOW + 5)
    memory = remember(memory, seen)
    assert memory.rents == (RentMade(55, NOW, "default", seen=True), RentMade(56, NOW, "default"))
    later = Observation(desired, (), (), (), None, NOW + 3600)
    assert remember(memory, later).rents == (), "only the last hour's rents are kept"


def test_a_box_the_list_drops_while_it_answers_is_no_vanish_in_the_host_ledger() -> None:
    fleet = Fleet(name="lab")
    inst = replace(_inst(7), machine_id=107)
    ledger = HostLedger(hosts=(HostRecord(machine_id=107),), boxes=((7, 107),), noted_at=NOW - 5)

    def vanishes(observed: Observed) -> int:
        after = note_cycle(ledger, fleet, observed, (), (), NOW)
        return next(h.vanishes for h in after.hosts if h.machine_id == 107)

    assert vanishes(Observed(memory=FleetMemory(held=(inst,)))) == 0, "unlisted, still held"
    assert vanishes(Observed(memory=FleetMemory())) == 1, "gone and silent: a vanish, as before"


def test_the_controller_keeps_the_pins_of_a_box_held_while_the_list_drops_it() -> None:
    world, hiding, (a, _) = _two_boxes()
    desired = desired_state(0)
    rec = fake_reconciler(world)
    rec.provider = hiding
    shell = rec.shell
    assert isinstance(shell, FakeShell)

    def observe_once() -> None:  # as a cycle would, handing its memory on
        world.clock.advance(60)
        observed, _, _ = rec.observe_and_plan(desired)
        rec.memory = observed.memory

    observe_once()
    endpoint = next(i.direct for i in world.provider.list_instances() if i.id == a)
    assert endpoint is not None
    hiding.hidden.add(a)
    observe_once()
    assert shell.forgotten == [], "held while it answers: its next probe must show the pinned key"
    world.vanish(a)
    observe_once()
    assert shell.forgotten == [endpoint], "gone: its connection and pin go"
