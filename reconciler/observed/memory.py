"""The memory codec: ``FleetMemory`` to and from the observed files.

What one cycle hands to the next is written into the documents a human reads anyway, so nothing hidden
lives beside them: per box ``first_seen_at``/``unreachable_since`` in ``fleet.yaml`` (``memory``), the
attempts launched and not yet archived in ``runs.yaml`` (``in_flight``), and spend in ``budget.yaml``
(``spend``) as an *anchor*: at ``as_of`` spend was ``today_usd``/``total_usd`` and it grows at ``fleet_dph``
per hour from there. A new anchor is written only when the rate changes, the UTC day rolls over, or the
accounted spend drifts off the line, so a quiet fleet makes no commit while its money still adds up.

Decoding is the reverse: after a restart, ``read_fleet_memory`` rebuilds the memory from the committed files,
with spend extrapolated along the anchor to ``now`` (boxes kept billing while rigsync was down).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from reconciler.errors import ObservedInvalid
from reconciler.model import BoxMemory, FleetMemory, InFlight, Spend
from reconciler.observed.codec import BUDGET, FLEET, RUNS, expect_mapping, iso, load_yaml, money, parse_iso, utc_day
from reconciler.observed.tree import read_observed

_SPEND_TOLERANCE_USD = 0.01
_SPEND_TOLERANCE_REL = 0.005

# ------------------------------------------------------------------------------------------------ encode


def box_memory_entries(boxes: Iterable[BoxMemory]) -> list[dict[str, Any]]:
    """``fleet.yaml``'s ``memory``: per box, when it was first seen and since when it has not answered."""
    return [
        {
            "instance_id": m.instance_id,
            "first_seen_at": iso(m.first_seen_at),
            "unreachable_since": iso(m.unreachable_since),
        }
        for m in sorted(boxes, key=lambda m: m.instance_id)
    ]


def in_flight_entries(in_flight: Iterable[InFlight]) -> list[dict[str, Any]]:
    """``runs.yaml``'s ``in_flight``: attempts launched and not yet archived."""
    return [
        {
            "run_id": f.run_id,
            "attempt": f.attempt,
            "instance_id": f.instance_id,
            "gpu_mask": list(f.gpu_mask),
            "launched_at": iso(f.launched_at),
            "sweep": f.sweep,
        }
        for f in sorted(in_flight, key=lambda f: (f.run_id, f.attempt))
    ]


def spend_anchor(previous: Mapping[str, Any] | None, fleet_dph: float, spend: Spend, now: float) -> dict[str, Any]:
    """``budget.yaml``'s ``spend``: the previous anchor while ``spend`` stays on its line, else a new one at ``now``."""
    fresh: dict[str, Any] = {
        "as_of": iso(now),
        "day": utc_day(now),
        "fleet_dph": money(fleet_dph),
        "today_usd": money(spend.today_usd),
        "total_usd": money(spend.total_usd),
    }
    if not previous:
        return fresh
    try:
        at = parse_iso(previous["as_of"], "spend.as_of")
        rate = float(previous["fleet_dph"])
        today0 = float(previous["today_usd"])
        total0 = float(previous["total_usd"])
        day0 = str(previous["day"])
    except (KeyError, TypeError, ValueError, ObservedInvalid):
        return fresh
    if at is None or day0 != utc_day(now) or abs(rate - fresh["fleet_dph"]) > 1e-9:
        return fresh
    hours = max(0.0, now - at) / 3600.0
    tol_total = max(_SPEND_TOLERANCE_USD, _SPEND_TOLERANCE_REL * spend.total_usd)
    tol_today = max(_SPEND_TOLERANCE_USD, _SPEND_TOLERANCE_REL * spend.today_usd)
    if (
        abs(total0 + rate * hours - spend.total_usd) > tol_total
        or abs(today0 + rate * hours - spend.today_usd) > tol_today
    ):
        return fresh
    return dict(previous)


# ------------------------------------------------------------------------------------------------ decode


def read_fleet_memory(checkout: Path, *, now: float | None = None) -> FleetMemory:
    """The fleet's memory from the observed files in the working tree at ``checkout`` (none: empty memory)."""
    return fleet_memory_from_files(read_observed(checkout), now=now)


def fleet_memory_from_files(files: Mapping[str, str], *, now: float | None = None) -> FleetMemory:
    """The fleet's memory from observed files keyed by repository path (missing files mean empty parts).

    With ``now``, spend is extrapolated along the committed anchor to ``now`` (today's spend restarting at
    UTC midnight) and counted from ``now`` on; without it, spend is the anchor's and counting starts at the
    first cycle. A malformed entry is ``ObservedInvalid`` naming the file and the entry.
    """
    fleet = expect_mapping(load_yaml(files[FLEET], FLEET), FLEET) if FLEET in files else {}
    runs = expect_mapping(load_yaml(files[RUNS], RUNS), RUNS) if RUNS in files else {}
    budget = expect_mapping(load_yaml(files[BUDGET], BUDGET), BUDGET) if BUDGET in files else {}
    return FleetMemory(
        boxes=_boxes(fleet.get("memory") or []),
        in_flight=_in_flight(runs.get("in_flight") or []),
        spend=_spend(budget.get("spend"), now),
        spend_at=now,
    )


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
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ObservedInvalid(f"{where}: malformed in-flight attempt ({exc})") from exc
    return tuple(out)


def _spend(anchor: Any, now: float | None) -> Spend:
    if not isinstance(anchor, dict):
        return Spend()
    try:
        today = float(anchor.get("today_usd") or 0.0)
        total = float(anchor.get("total_usd") or 0.0)
        rate = float(anchor.get("fleet_dph") or 0.0)
        at = parse_iso(anchor.get("as_of"), f"{BUDGET}: spend.as_of")
    except (TypeError, ValueError) as exc:
        raise ObservedInvalid(f"{BUDGET}: spend: malformed ({exc})") from exc
    spend = Spend(today_usd=today, total_usd=total)
    if now is not None and at is not None:
        spend = spend.accrued(rate, at, now)
    return spend
