"""What every planning phase shares: the decisions it adds, caps read defensively, and how figures are written."""

from __future__ import annotations

import datetime as dt
import functools
import math
from dataclasses import dataclass, field

from reconciler.core.actions import Action, Noop, ReasonCode
from reconciler.core.model import Desired, Drift, Fleet, Pool

EPS = 1e-9  # float slack on the fleet cap sum only, so $0.1 + $0.2 fits a $0.3 cap


@dataclass
class Decisions:
    """What one phase decided: actions, no-ops (with reasons), drift and warnings. Phases return it; plan() joins.

    Mutable only while its phase builds it; phases never read another phase's Decisions, only its result value.
    """

    actions: list[Action] = field(default_factory=list)
    noops: list[Noop] = field(default_factory=list)
    drift: list[Drift] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def act(self, action: Action) -> None:
        self.actions.append(action)

    def noop(self, subject: str, code: ReasonCode, reason: str) -> None:
        self.noops.append(Noop(reason=reason, subject=subject, code=code))

    def extend(self, other: Decisions) -> None:
        self.actions.extend(other.actions)
        self.noops.extend(other.noops)
        self.drift.extend(other.drift)
        self.warnings.extend(other.warnings)


def cap(value: float | None) -> float:
    """A budget cap as a number: None means no cap; negative or NaN is treated as 0 (safe side)."""
    if value is None:
        return math.inf
    if math.isnan(value) or value < 0:
        return 0.0
    return float(value)


def count_cap(value: int | None) -> int:
    if value is None:
        return 0
    return max(0, int(value))


def box_floor(limits: Fleet | Pool) -> int:
    """How many boxes a fleet (or a pool) keeps at least: its ``min_instances``, never above its ``max_instances``."""
    return min(count_cap(limits.min_instances), count_cap(limits.max_instances))


def fleet_dph_cap(desired: Desired) -> float:
    """The whole fleet's $/h cap after defaulting (a box's own cap is its pool's: ``offers.box_cap_dph``)."""
    return cap(desired.budget.max_fleet_dph)


@functools.lru_cache(maxsize=4096)
def fmt_duration(seconds: float) -> str:
    """``3600 -> "1h"``, ``725 -> "12m5s"``, ``5400 -> "1h30m"``: the two largest non-zero units."""
    if not math.isfinite(seconds):
        return "forever"
    s = max(0, int(seconds))
    parts: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if s >= size:
            parts.append(f"{s // size}{unit}")
            s %= size
    return "".join(parts[:2]) or "0s"


def fmt_utc(t: float) -> str:
    """A moment as reasons and commit messages write it: ``2026-12-03 04:00Z`` (UTC, to the minute)."""
    if not math.isfinite(t):
        return "never"
    try:
        return dt.datetime.fromtimestamp(t, tz=dt.UTC).strftime("%Y-%m-%d %H:%MZ")
    except (ValueError, OverflowError, OSError):
        return f"t={t:.0f}"


def usd_h(x: float) -> str:
    return f"${x:.3f}/h"


def usd(x: float) -> str:
    """Dollars to the cent, and to the hundredth of a cent below a dollar (small fleets spend fractions)."""
    return f"${x:.2f}" if abs(x) >= 1 or x == 0 else f"${x:.4f}"


def gpus_text(mask: tuple[int, ...]) -> str:
    return ("GPU " if len(mask) == 1 else "GPUs ") + ",".join(str(i) for i in mask)
