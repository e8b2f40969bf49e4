"""observe(): one snapshot of the world per cycle. Reads only; never changes anything.

The provider says which boxes exist; one SSH round trip per running owned box says what is on it. A box that
does not answer in time is an "unreachable" observation for that box alone: the rest of the fleet is still
observed and planned. Cross-cycle memory (when a box first went dark, which attempts are in flight) is passed
in and carried forward, so the snapshot after a crash is rebuilt from the provider, the boxes and the files
committed under observed/, never from process memory alone.

Spend is what the provider billed (``read_billing``, ``accrue_billed``): each cycle reads every owned box's bill
so far and the account's credit; each box's last figure is kept in the memory, so a read adds only what is new
and a box that is gone (destroyed, vanished) keeps its money in the total. When the provider cannot say (an API
error, no charge for a box), that box is estimated at its listed $/h since its last figure, and marked so.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import replace

from reconciler.errors import ProviderError
from reconciler.identity import own_boxes, slot_pool
from reconciler.model import (
    AttemptRecord,
    BoxMemory,
    BoxProbe,
    BoxSpend,
    Desired,
    FleetMemory,
    InFlight,
    Instance,
    InstanceStatus,
    Observed,
    Offer,
    Spend,
    owned_by,
    split_owned,
)
from reconciler.ports import BoxControl, Provider

PROBE_TIMEOUT_S = 10.0
_FLOAT_SLACK_USD = 1e-9

log = logging.getLogger("rigsync.observe")


def probe_boxes(boxes: BoxControl, instances: list[Instance], timeout: float = PROBE_TIMEOUT_S) -> list[BoxProbe]:
    """One parallel round trip to every running box; a box that does not answer is an unreachable probe."""
    running = sorted((i for i in instances if i.status is InstanceStatus.RUNNING), key=lambda i: i.id)
    if not running:
        return []
    return sorted(boxes.probe_many(running, timeout=timeout), key=lambda p: p.instance_id)


def update_box_memory(
    previous: tuple[BoxMemory, ...], instances: list[Instance], probes: list[BoxProbe], now: float,
    bootstrap_hash: str | Mapping[int, str] = "",
) -> tuple[BoxMemory, ...]:
    """Per box: first seen, unreachable since, and since when it answers without its bootstrap done (the clock of
    ``bootstrap_timeout``; the box's own clock cannot say, and its uptime is its host's). ``bootstrap_hash`` is the
    fleet's, or per instance id the one of its pool."""
    prev = {m.instance_id: m for m in previous}
    reach = {p.instance_id: p.reachable for p in probes}

    def wanted(iid: int) -> str:
        return bootstrap_hash if isinstance(bootstrap_hash, str) else bootstrap_hash.get(iid, "")

    unbooted = {
        p.instance_id
        for p in probes
        if p.reachable and wanted(p.instance_id) and wanted(p.instance_id) not in p.bootstrap_hashes
    }
    out = []
    for inst in sorted(instances, key=lambda i: i.id):
        old = prev.get(inst.id)
        first = old.first_seen_at if old else now
        if reach.get(inst.id) is False:
            since = old.unreachable_since if old and old.unreachable_since is not None else now
        else:
            since = None
        booting: float | None
        if inst.id in unbooted:
            booting = old.bootstrap_since if old and old.bootstrap_since is not None else now
        elif reach.get(inst.id) is False and old is not None:
            booting = old.bootstrap_since  # not known this cycle: the clock keeps running
        else:
            booting = None
        out.append(BoxMemory(inst.id, first_seen_at=first, unreachable_since=since, bootstrap_since=booting))
    return tuple(out)


def track_gpu_quiet(
    previous: tuple[tuple[str, int, float], ...], desired: Desired, probes: list[BoxProbe], now: float
) -> tuple[tuple[str, int, float], ...]:
    """Since when each live attempt of a sweep with ``stall_timeout`` has kept its GPUs under ``stall_gpu_util``.

    A reading is one probe's ``utilization.gpu``: the most of the attempt's GPUs. An attempt at or above the threshold,
    finished, or on a box that did not answer this cycle is dropped (its clock starts again when it is next quiet).
    """
    since = {(r, a): t for r, a, t in previous}
    out: list[tuple[str, int, float]] = []
    for p in probes:
        if not p.reachable:
            continue
        util = {g.index: g.utilization_pct for g in p.gpus}
        for rd in p.runs:
            spec = desired.run(rd.run_id)
            if rd.exit_code is not None or not rd.pid_alive or spec is None or spec.sweep.stall_timeout_s is None:
                continue
            seen = [util[i] for i in rd.gpu_mask if i in util]
            if seen and max(seen) < spec.sweep.stall_gpu_util_pct:
                out.append((rd.run_id, rd.attempt, since.get((rd.run_id, rd.attempt), now)))
    return tuple(sorted(out))


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


def accrue_billed(
    spend: Spend,
    spend_at: float | None,
    mine: list[Instance],
    billed: dict[int, float] | None,
    in_flight: Iterable[InFlight],
    now: float,
) -> Spend:
    """The spend at ``now``: per owned box, what the provider billed since its last figure, added to the totals.

    - A box's figure never decreases (a bill below an earlier estimate keeps the estimate, marked estimated).
    - An increase is spread evenly over the time since the box's last figure (its start for a new box), so the
      part after UTC midnight goes to today and the rest only to the total.
    - When the provider cannot say (``billed`` is None, or has no charge for the box), a listed box is estimated
      at its listed $/h since its last figure; a gone box adds nothing more.
    - A box missing from the list is kept (``gone_at``) until apply could archive its overhead line (its bill
      was final at the previous read and no attempt on it is in flight), then dropped: its money stays in the total.
    """
    busy = {f.instance_id for f in in_flight}
    out = spend.rolled(spend_at, now) if spend_at is not None else spend
    listed = {i.id: i for i in mine}
    previous = {b.instance_id: b for b in spend.boxes}
    boxes: list[BoxSpend] = []
    for iid in sorted(set(previous) | set(listed)):
        old, inst = previous.get(iid), listed.get(iid)
        if inst is None and old is not None and old.bill_final(old.at) and iid not in busy:
            continue  # its overhead line was due last cycle; its money is in the total
        since = old.at if old is not None else min(inst.start_date if inst and inst.start_date > 0 else now, now)
        last = old.usd if old is not None else 0.0
        figure = billed.get(iid) if billed is not None else None
        if figure is not None:
            usd = max(last, figure)
            estimated = figure + _FLOAT_SLACK_USD < last
        else:
            rate = inst.dph_total if inst is not None else 0.0
            usd = last + rate * max(0.0, now - since) / 3600.0
            estimated = True
        out = out.plus(usd - last, since, now)
        boxes.append(
            BoxSpend(
                instance_id=iid,
                usd=usd,
                at=now,
                dph=inst.dph_total if inst is not None else (old.dph if old else 0.0),
                estimated=estimated,
                gone_at=None if inst is not None else (old.gone_at if old and old.gone_at is not None else now),
                started_at=inst.start_date if inst is not None else (old.started_at if old else None),
                machine_id=inst.machine_id if inst is not None else (old.machine_id if old else 0),
                gpu_name=inst.gpu_name if inst is not None else (old.gpu_name if old else ""),
                num_gpus=inst.num_gpus if inst is not None else (old.num_gpus if old else 0),
            )
        )
    return Spend(today_usd=out.today_usd, total_usd=out.total_usd, boxes=tuple(boxes))


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
    billed, credit = read_billing(provider, mine, memory.spend, now)  # right after the list: the same moment
    if billed:
        instances = [replace(i, cost_usd=billed[i.id]) if i.id in billed else i for i in instances]
        mine, _foreign = split_owned(instances, fleet.name)
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
    probes = [p.on_clock(now) for p in probe_boxes(box_control, mine_and_own)]  # box clocks may be off
    hashes = {p.name: p.bootstrap_hash for p in fleet.pools}
    pool_hash = {
        i.id: hashes.get(slot_pool(fleet, o.slot), "") for i in mine_and_own if (o := owned_by(fleet.name, i.label))
    }
    boxes = update_box_memory(memory.boxes, mine_and_own, probes, now, pool_hash)
    spend = accrue_billed(memory.spend, memory.spend_at, mine, billed, memory.in_flight, now)
    gpu_quiet = track_gpu_quiet(memory.gpu_quiet, desired, probes, now)
    observed = Observed(
        instances=tuple(sorted(instances, key=lambda i: i.id)),
        probes=tuple(probes),
        offers=tuple(offers),
        history=history,
        memory=boxes,
        spend=spend,
        fleet_name=fleet.name,
        in_flight=memory.in_flight,
        credit_usd=credit,
        hosts=memory.hosts,
        gpu_quiet=gpu_quiet,
    )
    return observed, replace(memory, boxes=boxes, spend=spend, spend_at=now, gpu_quiet=gpu_quiet)
