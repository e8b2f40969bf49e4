"""The memory codec: ``FleetMemory`` to and from the observed files.

What one cycle hands to the next is written into the documents a human reads anyway, so nothing hidden
lives beside them: per box ``first_seen_at``/``unreachable_since`` in ``fleet.yaml`` (``memory``), the
attempts launched and not yet archived in ``runs.yaml`` (``in_flight``), and billed spend in ``budget.yaml``
(``spend``) as an *anchor*: a snapshot at ``as_of`` of today's and the total spend, the account's credit and
every owned box's bill so far (``boxes``), each growing along a straight line from there (the boxes at their
``rate``, the totals at ``fleet_dph``, the credit falling at ``account_dph``). A new anchor is written only when
something other than those lines moved: a box came, went, changed rate or turned estimated, the credit became
(un)known, the UTC day rolled over, or a figure left its line by more than a read's jitter (``JITTER_S`` of its
rate). So a quiet fleet makes no commit while its money still adds up, and a fleet whose last box ended shows the
exact final figures.

Decoding is the reverse: after a restart, ``read_restored`` reads what the committed files keep as the snapshot at
``as_of`` (a ``remember.Restored``), and ``remember`` makes the memory of it (``read_fleet_memory`` does both); the
first cycle's billed read then adds what each box was billed since (an estimate along its line when the provider
cannot say).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from reconciler.core.bounds import finite
from reconciler.core.model import BoxMemory, BoxSpend, FleetMemory, InFlight, PriceIncrease, RungValue, Spend
from reconciler.core.remember import NO_MEMORY, Restored, remember
from reconciler.errors import ObservedInvalid
from reconciler.observed.codec import BUDGET, FLEET, RUNS, expect_mapping, iso, load_yaml, money, parse_iso, utc_day
from reconciler.observed.hosts_file import read_hosts
from reconciler.observed.observed_tree import read_observed
from reconciler.remote.launched import valid_pid, valid_start

JITTER_S = 10.0  # how far apart in time two reads of the same line may be taken (list, bills, clock)
_EPS_USD = 1e-6  # the rounding of money() and float noise
_CREDIT_TOLERANCE_USD = 0.01  # the credit also moves by storage and foreign boxes, off any line rigsync can draw

# ------------------------------------------------------------------------------------------------ encode


def box_memory_entries(boxes: Iterable[BoxMemory]) -> list[dict[str, Any]]:
    """``fleet.yaml``'s ``memory``: per box, when it was first seen, since when it has not answered, when it first
    answered and was first ready for work, and its pool (a box gone from the list stays while its bill is open)."""
    return [
        {
            "instance_id": m.instance_id,
            "first_seen_at": iso(m.first_seen_at),
            "unreachable_since": iso(m.unreachable_since),
            **({"bootstrap_since": iso(m.bootstrap_since)} if m.bootstrap_since is not None else {}),
            **({"reachable_at": iso(m.reachable_at)} if m.reachable_at is not None else {}),
            **({"ready_at": iso(m.ready_at)} if m.ready_at is not None else {}),
            **({"pool": m.pool} if m.pool else {}),
        }
        for m in sorted(boxes, key=lambda m: m.instance_id)
    ]


def accepted_increase_entries(accepted: Iterable[PriceIncrease]) -> list[dict[str, Any]]:
    """``fleet.yaml``'s ``accepted_price_increases``: the increases this fleet accepted, by id."""
    return [
        {
            "id": p.id,
            "instance_id": p.instance_id,
            "old_dph": money(p.old_dph),
            "new_dph": money(p.new_dph),
            "applies_at": iso(p.applies_at),
            "new_end": iso(p.new_end),
            "created_at": iso(p.created_at),
        }
        for p in sorted(accepted, key=lambda p: p.id)
    ]


def in_flight_entries(in_flight: Iterable[InFlight]) -> list[dict[str, Any]]:
    """``runs.yaml``'s ``in_flight``: attempts launched and not yet archived."""
    out: list[dict[str, Any]] = []
    for f in sorted(in_flight, key=lambda f: (f.run_id, f.attempt)):
        entry: dict[str, Any] = {
            "run_id": f.run_id,
            "attempt": f.attempt,
            "instance_id": f.instance_id,
            "gpu_mask": list(f.gpu_mask),
            "launched_at": iso(f.launched_at),
            "sweep": f.sweep,
        }
        if f.resumed_from is not None:  # only when it resumed: other entries stay as they were
            entry["resumed_from"] = f.resumed_from
        if f.pid is not None and f.pid_started is not None:  # the process group its launch recorded
            entry["pid"] = f.pid
            entry["pid_started"] = f.pid_started
        if f.epoch:
            entry["epoch"] = f.epoch
        entry["queued"] = f.queued  # given to its box's queue (started by the box when its slot frees)
        if f.seen_started_at is not None:
            entry["seen_started_at"] = iso(f.seen_started_at)
        out.append(entry)
    return out


def rung_entries(rungs: Iterable[RungValue]) -> list[dict[str, Any]]:
    """``runs.yaml``'s ``rungs``: each run's metric when it first reached a rung of its sweep's early_terminate."""
    return [
        {"run_id": r.run_id, "rung": r.level, "value": r.value}
        for r in sorted(rungs, key=lambda r: (r.run_id, r.level))
    ]


def _box_entry(box: BoxSpend, rate: float) -> dict[str, Any]:
    return {
        "instance_id": box.instance_id,
        "usd": money(box.usd),
        "rate": money(rate),
        "dph": money(box.dph),
        "estimated": box.estimated,
        "gone_at": iso(box.gone_at),
        "started_at": iso(box.started_at),
        "machine_id": box.machine_id,
        "gpu_name": box.gpu_name,
        "num_gpus": box.num_gpus,
    }


def spend_anchor(
    previous: Mapping[str, Any] | None,
    spend: Spend,
    rates: Mapping[int, float],
    credit: float | None,
    account_dph: float,
    now: float,
) -> dict[str, Any]:
    """``budget.yaml``'s ``spend``: the previous anchor while every figure stays on its line, else a new one at ``now``.

    ``rates`` is what each owned box bills per hour from now on (its listed $/h while it runs, 0 once it is gone
    or stopped: storage is left to the tolerance), ``account_dph`` the same for every instance of the account.
    """
    boxes = [_box_entry(b, rates.get(b.instance_id, 0.0)) for b in sorted(spend.boxes, key=lambda b: b.instance_id)]
    fleet_dph = money(sum(e["rate"] for e in boxes))
    fresh: dict[str, Any] = {
        "source": "estimated" if spend.estimated else "billed",
        "as_of": iso(now),
        "day": utc_day(now),
        "fleet_dph": fleet_dph,
        "today_usd": money(spend.today_usd),
        "total_usd": money(spend.total_usd),
        "credit_usd": None if credit is None else money(credit),
        "account_dph": money(account_dph),
        "boxes": boxes,
    }
    if not previous or _moved_off(previous, fresh, now):
        return fresh
    return dict(previous)


def _moved_off(previous: Mapping[str, Any], fresh: Mapping[str, Any], now: float) -> bool:
    """Whether ``fresh`` says something the previous anchor's lines do not (beyond a read's jitter)."""
    try:
        at = parse_iso(previous["as_of"], "spend.as_of")
        same = all(previous[k] == fresh[k] for k in ("source", "day", "fleet_dph", "account_dph"))
        old_boxes = list(previous["boxes"])
        credit0 = previous["credit_usd"]
        if at is None or not same or len(old_boxes) != len(fresh["boxes"]) or (credit0 is None) != (
            fresh["credit_usd"] is None
        ):
            return True
        hours = max(0.0, now - at) / 3600.0

        def off(value0: Any, rate: float, value: float, slack: float = _EPS_USD) -> bool:
            return abs(float(value0) + rate * hours - value) > slack + abs(rate) * JITTER_S / 3600.0

        for old, new in zip(old_boxes, fresh["boxes"], strict=True):
            if {k: v for k, v in old.items() if k != "usd"} != {k: v for k, v in new.items() if k != "usd"}:
                return True
            if off(old["usd"], float(new["rate"]), new["usd"]):
                return True
        rate = float(fresh["fleet_dph"])
        if off(previous["total_usd"], rate, fresh["total_usd"]) or off(previous["today_usd"], rate, fresh["today_usd"]):
            return True
        return credit0 is not None and off(
            credit0, -float(fresh["account_dph"]), fresh["credit_usd"], _CREDIT_TOLERANCE_USD
        )
    except (KeyError, TypeError, ValueError, ObservedInvalid):
        return True


# ------------------------------------------------------------------------------------------------ decode


def read_fleet_memory(checkout: Path, *, now: float | None = None) -> FleetMemory:
    """The fleet's memory from the observed files in the working tree at ``checkout`` (none: empty memory)."""
    return remember(NO_MEMORY, read_restored(checkout, now=now))


def read_restored(checkout: Path, *, now: float | None = None) -> Restored:
    """What the observed files in the working tree at ``checkout`` keep of the memory (``restored_from_files``)."""
    return restored_from_files(read_observed(checkout), now=now)


def fleet_memory_from_files(files: Mapping[str, str], *, now: float | None = None) -> FleetMemory:
    """The fleet's memory from observed files keyed by repository path (``restored_from_files``)."""
    return remember(NO_MEMORY, restored_from_files(files, now=now))


def restored_from_files(files: Mapping[str, str], *, now: float | None = None) -> Restored:
    """What observed files keyed by repository path keep of the memory (missing files mean empty parts).

    Spend is the committed anchor as it was at its ``as_of``, with every owned box's bill then: the first cycle
    reads the bills again and adds what is new since, so nothing billed while rigsync was down is lost. An
    anchor of the older estimate format (no ``boxes``) is extrapolated along its line to ``now`` (when given)
    and counted from there. A malformed entry is ``ObservedInvalid`` naming the file and the entry.
    """
    fleet = expect_mapping(load_yaml(files[FLEET], FLEET), FLEET) if FLEET in files else {}
    runs = expect_mapping(load_yaml(files[RUNS], RUNS), RUNS) if RUNS in files else {}
    budget = expect_mapping(load_yaml(files[BUDGET], BUDGET), BUDGET) if BUDGET in files else {}
    spend, spend_at = _spend(budget.get("spend"), now)
    return Restored(
        boxes=_boxes(fleet.get("memory") or []),
        in_flight=_in_flight(runs.get("in_flight") or []),
        rungs=_rungs(runs.get("rungs") or []),
        spend=spend,
        spend_at=spend_at,
        hosts=read_hosts(files),
        accepted_increases=_accepted(fleet.get("accepted_price_increases") or []),
    )


def _accepted(entries: list[Any]) -> tuple[PriceIncrease, ...]:
    out: list[PriceIncrease] = []
    for n, e in enumerate(entries):
        where = f"{FLEET}: accepted_price_increases[{n}]"
        try:
            applies = parse_iso(e["applies_at"], where + ".applies_at")
            old, new = finite(e["old_dph"]), finite(e["new_dph"])
            if applies is None or old is None or new is None or old < 0 or new < 0:
                raise ValueError("applies_at, old_dph and new_dph must be a time and finite non-negative $/h")
            out.append(
                PriceIncrease(
                    id=int(e["id"]),
                    instance_id=int(e["instance_id"]),
                    old_dph=old,
                    new_dph=new,
                    applies_at=applies,
                    new_end=parse_iso(e.get("new_end"), where + ".new_end"),
                    created_at=parse_iso(e.get("created_at"), where + ".created_at"),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ObservedInvalid(f"{where}: malformed accepted price increase ({exc})") from exc
    return tuple(out)


def _boxes(entries: list[Any]) -> tuple[BoxMemory, ...]:
    out: list[BoxMemory] = []
    for n, m in enumerate(entries):
        where = f"{FLEET}: memory[{n}]"
        try:
            first = parse_iso(m["first_seen_at"], where + ".first_seen_at")
            out.append(
                BoxMemory(
                    instance_id=int(m["instance_id"]),
                    first_seen_at=first if first is not None else 0.0,
                    unreachable_since=parse_iso(m.get("unreachable_since"), where + ".unreachable_since"),
                    bootstrap_since=parse_iso(m.get("bootstrap_since"), where + ".bootstrap_since"),
                    reachable_at=parse_iso(m.get("reachable_at"), where + ".reachable_at"),
                    ready_at=parse_iso(m.get("ready_at"), where + ".ready_at"),
                    pool=str(m.get("pool") or ""),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ObservedInvalid(f"{where}: malformed box memory ({exc})") from exc
    return tuple(out)


def _in_flight(entries: list[Any]) -> tuple[InFlight, ...]:
    out: list[InFlight] = []
    for n, f in enumerate(entries):
        where = f"{RUNS}: in_flight[{n}]"
        try:
            launched = parse_iso(f["launched_at"], where + ".launched_at")
            out.append(
                InFlight(
                    run_id=str(f["run_id"]),
                    attempt=int(f["attempt"]),
                    instance_id=int(f["instance_id"]),
                    gpu_mask=tuple(int(g) for g in f.get("gpu_mask") or ()),
                    launched_at=launched if launched is not None else 0.0,
                    sweep=str(f.get("sweep") or ""),
                    resumed_from=None if f.get("resumed_from") is None else int(f["resumed_from"]),
                    pid=valid_pid(f.get("pid")),
                    pid_started=valid_start(f.get("pid_started")),
                    epoch=int(f.get("epoch") or 0),
                    queued=f.get("queued") is True,
                    seen_started_at=parse_iso(f.get("seen_started_at"), where + ".seen_started_at"),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ObservedInvalid(f"{where}: malformed in-flight attempt ({exc})") from exc
    return tuple(out)


def _rungs(entries: list[Any]) -> tuple[RungValue, ...]:
    out: list[RungValue] = []
    for n, r in enumerate(entries):
        where = f"{RUNS}: rungs[{n}]"
        try:
            level, value = finite(r["rung"], limit=float("inf")), finite(r["value"])
            if level is None or value is None:
                raise ValueError("rung and value must be finite numbers")
            out.append(RungValue(run_id=str(r["run_id"]), level=level, value=value))
        except (KeyError, TypeError, ValueError) as exc:
            raise ObservedInvalid(f"{where}: malformed rung value ({exc})") from exc
    return tuple(out)


def _spend(anchor: Any, now: float | None) -> tuple[Spend, float | None]:
    """(the spend, when it was so): the anchor's snapshot at ``as_of``."""
    if not isinstance(anchor, dict):
        return Spend(), now
    try:
        today = float(anchor.get("today_usd") or 0.0)
        total = float(anchor.get("total_usd") or 0.0)
        rate = float(anchor.get("fleet_dph") or 0.0)
        at = parse_iso(anchor.get("as_of"), f"{BUDGET}: spend.as_of")
    except (TypeError, ValueError) as exc:
        raise ObservedInvalid(f"{BUDGET}: spend: malformed ({exc})") from exc
    if "boxes" not in anchor:  # the older estimate anchor: extrapolate its line, count from now on
        spend = Spend(today_usd=today, total_usd=total)
        if now is not None and at is not None:
            spend = spend.accrued(rate, at, now)
        return spend, now
    boxes: list[BoxSpend] = []
    for n, b in enumerate(anchor.get("boxes") or []):
        where = f"{BUDGET}: spend.boxes[{n}]"
        try:
            boxes.append(
                BoxSpend(
                    instance_id=int(b["instance_id"]),
                    usd=float(b["usd"]),
                    at=at if at is not None else (now or 0.0),
                    dph=float(b.get("dph") or 0.0),
                    estimated=bool(b.get("estimated", False)),
                    gone_at=parse_iso(b.get("gone_at"), where + ".gone_at"),
                    started_at=parse_iso(b.get("started_at"), where + ".started_at"),
                    machine_id=int(b.get("machine_id") or 0),
                    gpu_name=str(b.get("gpu_name") or ""),
                    num_gpus=int(b.get("num_gpus") or 0),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ObservedInvalid(f"{where}: malformed box spend ({exc})") from exc
    return Spend(today_usd=today, total_usd=total, boxes=tuple(boxes)), at if at is not None else now
