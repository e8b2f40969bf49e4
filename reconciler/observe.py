"""observe(): one snapshot of the world per cycle. Reads only; never changes anything.

The provider says which boxes exist; one SSH round trip per running owned box says what is on it. A box that
does not answer in time is an "unreachable" observation for that box alone: the rest of the fleet is still
observed and planned. Cross-cycle memory (when a box first went dark, which attempts are in flight) is passed
in and brought up to this observation by ``reconciler.core.remember`` (the one place that updates it), so the
snapshot after a crash is rebuilt from the provider, the boxes and the files committed under observed/, never
from process memory alone.

Spend is what the provider billed (``read_billing`` here, ``remember.accrue_billed``): each cycle reads every
owned box's bill so far and the account's credit; each box's last figure is kept in the memory, so a read adds
only what is new and a box that is gone (destroyed, vanished) keeps its money in the total. When the provider
cannot say (an API error, no charge for a box), that box is estimated at its listed $/h since its last figure,
and marked so.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from reconciler.core.bounds import clamp_time
from reconciler.core.identity import own_boxes, slot_pool
from reconciler.core.model import (
    AttemptRecord,
    BoxProbe,
    Desired,
    FleetMemory,
    Instance,
    InstanceStatus,
    Observed,
    Offer,
    PriceIncrease,
    Spend,
    owned_by,
    split_owned,
)
from reconciler.core.remember import Observation, remember
from reconciler.errors import ProviderError
from reconciler.ports import BoxControl, Provider

PROBE_TIMEOUT_S = 10.0
_FLOAT_SLACK_USD = 1e-9

log = logging.getLogger("rigsync.observe")


def probe_boxes(
    boxes: BoxControl, instances: list[Instance], timeout: float = PROBE_TIMEOUT_S, *, epoch: int = 0
) -> list[BoxProbe]:
    """One parallel round trip to every running box; a box that does not answer is an unreachable probe. ``epoch``
    (the controller's lease epoch) raises each box's fence, so a box refuses what an older controller still sends."""
    running = sorted((i for i in instances if i.status is InstanceStatus.RUNNING), key=lambda i: i.id)
    if not running:
        return []
    return sorted(boxes.probe_many(running, timeout=timeout, epoch=epoch), key=lambda p: p.instance_id)


def read_billing(
    provider: Provider, mine: list[Instance], spend: Spend, now: float
) -> tuple[dict[int, float] | None, float | None]:
    """(what the provider billed each instance so far, the account's credit); None where it cannot say.

    Billing is not needed to plan the rest, so any failure here is logged and the spend falls back to estimates.
    The bills are read only when there is an owned box to account for (listed now, or remembered).
    """
    credit: float | None = None
    try:
        credit = provider.account_credit()
    except ProviderError as exc:
        log.warning("cannot read the account's credit: %s", exc)
    except Exception:  # an SDK surprise must not stop the cycle: the credit is just unknown this time
        log.exception("cannot read the account's credit")
    starts = [i.start_date for i in mine if i.start_date > 0]
    starts += [b.started_at if b.started_at else b.at for b in spend.boxes]
    if not starts:
        return {}, credit
    try:
        return provider.billed_costs(min(min(starts), now), now), credit
    except ProviderError as exc:
        log.warning("cannot read what the boxes were billed (estimating at their $/h): %s", exc)
    except Exception:
        log.exception("cannot read what the boxes were billed (estimating at their $/h)")
    return None, credit


def read_price_increases(provider: Provider, mine: list[Instance]) -> tuple[PriceIncrease, ...]:
    """The hosts' pending increases on this fleet's own boxes (rows on other contracts are not ours to answer).
    Not needed to plan the rest: a failure to read is logged and the cycle goes on with none. No read without an
    owned box."""
    if not mine:
        return ()
    ids = {i.id for i in mine}
    try:
        found = provider.pending_price_increases()
    except ProviderError as exc:
        log.warning("cannot read the pending price increases (none answered this cycle): %s", exc)
        return ()
    except Exception:  # an SDK surprise must not stop the cycle
        log.exception("cannot read the pending price increases (none answered this cycle)")
        return ()
    return tuple(sorted((p for p in found if p.instance_id in ids), key=lambda p: p.id))


def observe(
    desired: Desired,
    provider: Provider,
    box_control: BoxControl,
    history: tuple[AttemptRecord, ...],
    memory: FleetMemory,
    now: float,
    *,
    epoch: int = 0,
) -> tuple[Observed, FleetMemory]:
    """Snapshot the world. Provider errors propagate (the cycle cannot plan without the instance list). ``epoch``:
    this controller's lease epoch (``Reconciler.epoch``), shown to every box it probes (0: no lease)."""
    fleet = desired.fleet
    instances = provider.list_instances()
    mine, _foreign = split_owned(instances, fleet.name)
    billed, credit = read_billing(provider, mine, memory.spend, now)  # right after the list: the same moment
    if billed:
        instances = [replace(i, cost_usd=billed[i.id]) if i.id in billed else i for i in instances]
        mine, _foreign = split_owned(instances, fleet.name)
    increases = read_price_increases(provider, mine)
    offers: list[Offer] = []
    if not fleet.suspend:
        found: dict[int, Offer] = {}
        for pool in fleet.pools:  # one query per pool; an offer two pools accept is listed once
            if pool.own:
                continue  # the lab's own machines: nothing to rent
            try:
                found.update((o.id, o) for o in provider.search_offers(pool.filters, pool.disk_gb))
            except ProviderError:
                continue  # no offers for this pool this cycle: the plan rents nothing for it
        offers = [found[i] for i in sorted(found)] if len(fleet.pools) > 1 else list(found.values())
    # The lab's own machines (provider ssh pools) are probed like rented boxes, and never billed: they join the
    # instance list after the bills are read.
    own = own_boxes(fleet)
    instances = [*instances, *own]
    mine_and_own = [*mine, *own]
    # box clocks may be off: each probe's times onto ours, and none far from now; a box this controller distrusts
    # (its kill failed) is planned and applied as unusable
    # the boxes held last cycle that the list does not show are probed too, at their remembered endpoints: one that
    # still answers is not gone (``remember.still_held``)
    listed = {i.id for i in instances}
    unlisted = tuple(i for i in memory.held if i.id not in listed)
    probed = probe_boxes(box_control, [*mine_and_own, *unlisted], epoch=epoch)
    probes = [memory.vetted(p.on_clock(now, clamp=clamp_time)) for p in probed]
    hashes = {p.name: p.bootstrap_hash for p in fleet.pools}
    pool_hash = {
        i.id: hashes.get(slot_pool(fleet, o.slot), "")
        for i in (*mine_and_own, *unlisted)
        if (o := owned_by(fleet.name, i.label))
    }
    seen = Observation(desired, tuple(mine_and_own), tuple(mine), tuple(probes), billed, now, pool_hash, unlisted)
    observed = Observed(
        instances=tuple(sorted(instances, key=lambda i: i.id)),
        probes=tuple(probes),
        offers=tuple(offers),
        history=history,
        memory=remember(memory, seen),
        fleet_name=fleet.name,
        credit_usd=credit,
        price_increases=increases,
        unlisted=unlisted,
    )
    return observed, observed.memory
