"""observe(): one snapshot of the world per cycle. Reads only; never changes anything.

The provider says which boxes exist; one SSH round trip per running owned box says what is on it. A box that
does not answer in time is an "unreachable" observation for that box alone: the rest of the fleet is still
observed and planned. Cross-cycle memory (when a box first went dark, which attempts are in flight) is passed
in and carried forward, so the snapshot after a crash is rebuilt from the provider, the boxes and the files
committed under observed/, never from process memory alone.
"""

from __future__ import annotations

from dataclasses import replace

from reconciler.errors import ProviderError
from reconciler.model import (
    AttemptRecord,
    BoxMemory,
    BoxProbe,
    Desired,
    FleetMemory,
    Instance,
    InstanceStatus,
    Observed,
    Offer,
    Spend,
    split_owned,
)
from reconciler.ports import BoxControl, Provider

PROBE_TIMEOUT_S = 10.0


def probe_boxes(boxes: BoxControl, instances: list[Instance], timeout: float = PROBE_TIMEOUT_S) -> list[BoxProbe]:
    """One parallel round trip to every running box; a box that does not answer is an unreachable probe."""
    running = sorted((i for i in instances if i.status is InstanceStatus.RUNNING), key=lambda i: i.id)
    if not running:
        return []
    return sorted(boxes.probe_many(running, timeout=timeout), key=lambda p: p.instance_id)


def update_box_memory(
    previous: tuple[BoxMemory, ...], instances: list[Instance], probes: list[BoxProbe], now: float
) -> tuple[BoxMemory, ...]:
    prev = {m.instance_id: m for m in previous}
    reach = {p.instance_id: p.reachable for p in probes}
    out = []
    for inst in sorted(instances, key=lambda i: i.id):
        old = prev.get(inst.id)
        first = old.first_seen_at if old else now
        if reach.get(inst.id) is False:
            since = old.unreachable_since if old and old.unreachable_since is not None else now
        else:
            since = None
        out.append(BoxMemory(instance_id=inst.id, first_seen_at=first, unreachable_since=since))
    return tuple(out)


def accrue_spend(memory: FleetMemory, instances: list[Instance], now: float) -> tuple[Spend, float]:
    """Bring the spend up to ``now`` at the fleet's current $/h (boxes bill whether or not we watch)."""
    if memory.spend_at is None:
        return memory.spend, now
    return memory.spend.accrued(sum(i.dph_total for i in instances), memory.spend_at, now), now


def observe(
    desired: Desired,
    provider: Provider,
    box_control: BoxControl,
    history: tuple[AttemptRecord, ...],
    memory: FleetMemory,
    now: float,
) -> tuple[Observed, FleetMemory]:
    """Snapshot the world. Provider errors propagate (the cycle cannot plan without the instance list)."""
    fleet = desired.fleet
    instances = provider.list_instances()
    mine, _foreign = split_owned(instances, fleet.name)
    offers: list[Offer] = []
    if not fleet.suspend:
        try:
            offers = provider.search_offers(fleet.filters, fleet.disk_gb)
        except ProviderError:
            offers = []  # no offers this cycle: the plan rents nothing, everything else proceeds
    probes = probe_boxes(box_control, mine)
    boxes = update_box_memory(memory.boxes, mine, probes, now)
    spend, spend_at = accrue_spend(memory, mine, now)
    observed = Observed(
        instances=tuple(sorted(instances, key=lambda i: i.id)),
        probes=tuple(probes),
        offers=tuple(offers),
        history=history,
        memory=boxes,
        spend=spend,
        fleet_name=fleet.name,
        in_flight=memory.in_flight,
    )
    return observed, replace(memory, boxes=boxes, spend=spend, spend_at=spend_at)
