"""The ops tax: the billed money that bought no succeeded work, and where it went. One pure function, every view.

Cheap GPUs only win on work per dollar when what is paid around the work (boots, bootstraps, gaps between runs,
lost and doubled work) is near zero; this module says how near, from committed facts alone. The bill is the
archive's: every attempt line's cost plus every overhead line's (which add up to what the provider billed for the
boxes that ended, ``OverheadRecord``), plus, for the boxes still held, their $/h up to the snapshot. It is split:

- ``useful``: the cost of each run's first succeeded attempt (the work that was wanted), not tax;
- ``running``: the cost so far of attempts still in flight (not yet settled either way), not tax;
- ``boot``: a box's rental start to ``reachable_at`` (a box with neither ``reachable_at`` nor ``ready_at``, e.g.
  one archived before they were recorded: to its first attempt's start, or its whole life when none ran);
- ``bootstrap``: ``reachable_at`` to ``ready_at``;
- ``idle``: the rest of a box's money that no attempt ran on (gaps between runs, GPUs no run held, the tail);
- ``lost``: attempts that failed or were lost (their whole cost);
- ``stopped_early``: attempts the search's early termination stopped at a rung (the price of the search's losers:
  not a failure, but no succeeded work either);
- ``duplicate``: a run's succeeded attempts beyond its first success, and attempts killed as duplicates.

Boot and bootstrap are priced at the box's $/h over their spans and never exceed the box's overhead (the overhead
line is what was billed: boot first, then bootstrap, the rest is idle). ``useful`` is what remains of the bill, so
the parts always add up to it; an overhead the archive says is negative (an attempt's run time overestimated) makes
no part negative.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from reconciler.core.bounds import finite
from reconciler.core.model import AttemptOutcome, AttemptRecord, OverheadRecord

# The reason the planner gives a kill of a second live attempt of one run (plan/attempts.py, DUPLICATE_ATTEMPT):
# the archive line of that attempt carries it as its reason.
DUPLICATE_KILL_PREFIX = "duplicate:"
PARTS = ("boot", "bootstrap", "idle", "lost", "stopped_early", "duplicate")  # the tax, in the order a bill is paid


@dataclass(frozen=True)
class LiveBox:
    """A box still held at the snapshot (fleet.yaml), billed from its start to ``until`` at ``dph``."""

    instance_id: int
    dph: float
    started_at: float | None
    until: float | None  # the snapshot's time
    reachable_at: float | None = None
    ready_at: float | None = None
    running_usd: float = 0.0  # what its in-flight attempts have cost so far (run time x GPU share x $/h)
    first_launch_at: float | None = None  # its earliest in-flight attempt's launch


@dataclass(frozen=True)
class OpsTax:
    billed_usd: float = 0.0
    useful_usd: float = 0.0
    running_usd: float = 0.0
    boot_usd: float = 0.0
    bootstrap_usd: float = 0.0
    idle_usd: float = 0.0
    lost_usd: float = 0.0
    stopped_early_usd: float = 0.0
    duplicate_usd: float = 0.0
    boxes: int = 0  # boxes whose money is in the bill (ended and held)
    held: int = 0  # of which still held (their figures run to the snapshot)
    parts: tuple[tuple[str, float], ...] = field(default=())  # (part, $) in PARTS order

    @property
    def tax_usd(self) -> float:
        return sum(usd for _, usd in self.parts)

    def share(self, usd: float) -> float:
        """``usd`` as a fraction of the bill (0 when nothing was billed)."""
        return usd / self.billed_usd if self.billed_usd > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "billed_usd": round(self.billed_usd, 6),
            "useful_usd": round(self.useful_usd, 6),
            "running_usd": round(self.running_usd, 6),
            "tax_usd": round(self.tax_usd, 6),
            "tax_share": round(self.share(self.tax_usd), 4),
            "parts": {p: {"usd": round(usd, 6), "share": round(self.share(usd), 4)} for p, usd in self.parts},
            "boxes": self.boxes,
            "held": self.held,
        }


def _usd(v: float | None) -> float:
    return finite(v) or 0.0


def _span_usd(dph: float, a: float | None, b: float | None) -> float:
    """``dph`` over ``a``..``b`` (0 when either end is unknown or the span is backwards)."""
    if a is None or b is None or finite(a) is None or finite(b) is None:
        return 0.0
    return max(0.0, b - a) / 3600.0 * max(0.0, dph)


def boot_end(reachable: float | None, ready: float | None, first_work: float | None, end: float | None) -> float | None:
    """Where a box's boot ends: ``reachable_at``, else ``ready_at``, else (neither recorded) its first attempt's
    start, else its end (it never ran anything). The timeline draws the same span."""
    for t in (reachable, ready, first_work, end):
        if t is not None:
            return t
    return None


def _box_overhead(overhead: float, dph: float, start: float | None, reachable: float | None,
                  ready: float | None, first_work: float | None, end: float | None) -> tuple[float, float, float]:
    """(boot, bootstrap, idle) of one box's ``overhead`` $: boot first, then bootstrap, capped by what is left."""
    left = max(0.0, overhead)
    boot = min(left, _span_usd(dph, start, boot_end(reachable, ready, first_work, end)))
    left -= boot
    bootstrap = min(left, _span_usd(dph, reachable, ready)) if reachable is not None else 0.0
    return boot, bootstrap, left - bootstrap


def is_duplicate_kill(rec: AttemptRecord) -> bool:
    return rec.phase is not AttemptOutcome.SUCCEEDED and rec.reason.startswith(DUPLICATE_KILL_PREFIX)


def ops_tax(attempts: Iterable[AttemptRecord], overheads: Iterable[OverheadRecord],
            live: Iterable[LiveBox] = ()) -> OpsTax:
    """The bill of the archive's attempts and ended boxes, and of the ``live`` boxes to the snapshot, split."""
    records = list(attempts)
    ended = {o.instance_id: o for o in overheads}
    held = [b for b in live if b.instance_id not in ended]
    first_success: dict[str, tuple[float, int]] = {}
    for r in records:
        if r.phase is AttemptOutcome.SUCCEEDED:
            key = (r.ended_at if r.ended_at is not None else float("inf"), r.attempt)
            if r.run_id not in first_success or key < first_success[r.run_id]:
                first_success[r.run_id] = key
    attempts_usd = lost = stopped = duplicate = 0.0
    on_box: dict[int, float] = {}
    first_work: dict[int, float] = {}
    for r in records:
        cost = _usd(r.cost_usd)
        attempts_usd += cost
        on_box[r.instance_id] = on_box.get(r.instance_id, 0.0) + cost
        began = finite(r.queued_at) or finite(r.started_at)
        if began is not None:
            first_work[r.instance_id] = min(began, first_work.get(r.instance_id, began))
        if r.phase is AttemptOutcome.SUCCEEDED:
            key = (r.ended_at if r.ended_at is not None else float("inf"), r.attempt)
            if first_success[r.run_id] != key:
                duplicate += cost  # the first success is the work wanted; useful is what the tax leaves of the bill
        elif is_duplicate_kill(r):
            duplicate += cost
        elif r.phase is AttemptOutcome.STOPPED_EARLY:
            stopped += cost
        else:
            lost += cost
    boot = bootstrap = idle = running = 0.0
    billed = attempts_usd
    for o in ended.values():
        overhead = _usd(o.cost_usd)
        billed += overhead
        b, s, i = _box_overhead(overhead, _usd(o.dph), o.started_at, o.reachable_at, o.ready_at,
                                first_work.get(o.instance_id), o.ended_at)
        boot, bootstrap, idle = boot + b, bootstrap + s, idle + i
    for box in held:
        so_far = _span_usd(_usd(box.dph), box.started_at, box.until)
        box_running = max(0.0, _usd(box.running_usd))
        settled = on_box.get(box.instance_id, 0.0)
        overhead = max(0.0, so_far - settled - box_running)
        billed += overhead + box_running
        running += box_running
        starts = [t for t in (first_work.get(box.instance_id), box.first_launch_at) if t is not None]
        b, s, i = _box_overhead(overhead, _usd(box.dph), box.started_at, box.reachable_at, box.ready_at,
                                min(starts, default=None), box.until)
        boot, bootstrap, idle = boot + b, bootstrap + s, idle + i
    parts = (("boot", boot), ("bootstrap", bootstrap), ("idle", idle), ("lost", lost), ("stopped_early", stopped),
             ("duplicate", duplicate))
    useful = billed - running - sum(usd for _, usd in parts)
    return OpsTax(
        billed_usd=billed, useful_usd=useful, running_usd=running, boot_usd=boot, bootstrap_usd=bootstrap,
        idle_usd=idle, lost_usd=lost, stopped_early_usd=stopped, duplicate_usd=duplicate, boxes=len(ended) + len(held),
        held=len(held),
        parts=parts,
    )


def tax_lines(tax: OpsTax) -> list[str]:
    """The ops tax as text lines (``rigsync status`` prints them; STATUS.md and the dashboard lay out the same
    figures in a table)."""
    if tax.billed_usd <= 0:
        return ["ops tax: nothing billed yet"]
    head = (f"ops tax: ${tax.tax_usd:.4f} of ${tax.billed_usd:.4f} billed ({tax.share(tax.tax_usd):.1%}) bought no "
            f"succeeded work; succeeded work ${tax.useful_usd:.4f}")
    if tax.running_usd > 0:
        head += f", still running ${tax.running_usd:.4f}"
    parts = ", ".join(f"{p} ${usd:.4f} ({tax.share(usd):.1%})" for p, usd in tax.parts)
    return [head, f"  {parts}"]
