"""Each box's billed life as a lane of segments, from committed facts: the dashboard's picture of where money went.

A lane runs from the rental's start to its end (the overhead line's ``ended_at``; a box still held: the snapshot's
time). On it: boot (start -> ``reachable_at``), bootstrap (``reachable_at`` -> ``ready_at``), each attempt
(``started_at`` -> ``ended_at``, by outcome, with ``queued_at`` -> ``started_at`` as queued), the in-flight
attempts of a held box (running, or queued, to the snapshot), idle (the rest of its life after boot and bootstrap
that no attempt covered) and, for a box that ended, a destroy mark. Facts: the archive's attempt and overhead
lines, ``fleet.yaml``'s boxes and box memory, ``runs.yaml``'s ``in_flight``. Every time is taken only when finite
(``bounds.finite``) and a span only when it is not backwards; the lanes are bounded (``MAX_LANES``, newest first,
the number left out said). The drawing is ``svg.timeline_chart``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reconciler.core.bounds import finite
from reconciler.core.model import AttemptRecord, OverheadRecord
from reconciler.core.remember import running_cost
from reconciler.views.facts import mapping, time_of
from reconciler.views.opstax import LiveBox, boot_end, is_duplicate_kill

MAX_LANES = 40
MAX_ROWS = 8  # attempts that overlap on one box (its GPUs) get a row each, up to this; more share the last row
SEGMENT_KINDS = ("boot", "bootstrap", "idle", "queued", "running", "succeeded", "failed", "lost", "stopped_early",
                 "duplicate", "destroy", "preempted")


@dataclass(frozen=True)
class Segment:
    kind: str  # one of SEGMENT_KINDS
    start: float
    end: float
    label: str  # what it is, for its tooltip (a run.attempt, a reason)
    row: int = 0  # attempts: which of the lane's rows; the others span the lane


@dataclass(frozen=True)
class Lane:
    instance_id: int
    title: str  # "1x RTX 3090 $0.2000/h"
    start: float
    end: float
    held: bool  # still held at the snapshot (its end is the snapshot)
    rows: int
    segments: tuple[Segment, ...]  # in time order (a span's start, then its kind's order)


@dataclass(frozen=True)
class Timeline:
    lanes: tuple[Lane, ...]  # newest first
    left_out: int  # lanes beyond MAX_LANES, not drawn
    start: float | None
    end: float | None


def _t(v: Any) -> float | None:
    return finite(v) if isinstance(v, int | float) else time_of(v)


@dataclass(frozen=True)
class _Box:
    instance_id: int
    title: str
    start: float | None
    end: float | None
    reachable_at: float | None
    ready_at: float | None
    held: bool
    num_gpus: int
    dph: float


def _title(num_gpus: int, gpu: str, dph: float) -> str:
    return f"{num_gpus}x {gpu or '?'} ${dph:.4f}/h"


def _boxes(overheads: Iterable[OverheadRecord], fleet_doc: Mapping[str, Any], snapshot: float | None) -> list[_Box]:
    out: dict[int, _Box] = {}
    for o in overheads:
        dph = finite(o.dph) or 0.0
        out[o.instance_id] = _Box(o.instance_id, _title(o.num_gpus, o.gpu_name, dph), _t(o.started_at),
                                  _t(o.ended_at), _t(o.reachable_at), _t(o.ready_at), False, o.num_gpus, dph)
    memory = {m.get("instance_id"): m for m in fleet_doc.get("memory") or [] if isinstance(m, dict)}
    for b in fleet_doc.get("boxes") or []:
        if not isinstance(b, dict) or not isinstance(b.get("id"), int) or b["id"] in out:
            continue
        mem = mapping(memory.get(b["id"]))
        num: int = b["num_gpus"] if isinstance(b.get("num_gpus"), int) else 0
        dph = finite(b.get("dph")) or 0.0
        out[b["id"]] = _Box(
            b["id"], _title(num, str(b.get("gpu_name") or ""), dph),
            _t(b.get("started_at")) or _t(mem.get("first_seen_at")) or _t(b.get("first_seen_at")), snapshot,
            _t(mem.get("reachable_at")) or _t(b.get("reachable_at")), _t(mem.get("ready_at")) or _t(b.get("ready_at")),
            True, num, dph,
        )
    return list(out.values())


@dataclass(frozen=True)
class _Flight:
    run_id: str
    attempt: int
    instance_id: int
    gpu_mask: tuple[int, ...]
    launched_at: float | None
    queued: bool


def in_flight(runs_doc: Mapping[str, Any], fleet_doc: Mapping[str, Any]) -> list[_Flight]:
    """``runs.yaml``'s in-flight attempts; a queued one counts as running once its box shows it on a GPU."""
    on_gpu = {
        (b.get("id"), str(g.get("run")))
        for b in fleet_doc.get("boxes") or [] if isinstance(b, dict)
        for g in b.get("gpus") or [] if isinstance(g, dict) and g.get("run")
    }
    out = []
    for f in runs_doc.get("in_flight") or []:
        if not isinstance(f, dict) or not all(isinstance(f.get(k), int) for k in ("instance_id", "attempt")):
            continue
        name = f"{f.get('run_id')}.{f['attempt']}"
        mask = tuple(g for g in f.get("gpu_mask") or [] if isinstance(g, int))
        queued = f.get("queued") is True and (f["instance_id"], name) not in on_gpu
        out.append(_Flight(str(f.get("run_id")), f["attempt"], f["instance_id"], mask, _t(f.get("launched_at")),
                           queued))
    return out


def live_boxes(overheads: Iterable[OverheadRecord], fleet_doc: Mapping[str, Any], runs_doc: Mapping[str, Any],
               snapshot: float | None) -> list[LiveBox]:
    """The held boxes as the ops tax bills them: to the snapshot, with their running attempts' cost so far."""
    flights = in_flight(runs_doc, fleet_doc)
    out = []
    for box in _boxes(overheads, fleet_doc, snapshot):
        if not box.held:
            continue
        running = 0.0 if snapshot is None else running_cost(box.instance_id, box.dph, box.num_gpus, flights, snapshot)
        launches = [f.launched_at for f in flights if f.instance_id == box.instance_id and f.launched_at is not None]
        out.append(LiveBox(box.instance_id, box.dph, box.start, snapshot, box.reachable_at, box.ready_at, running,
                           min(launches, default=None)))
    return out


def _span(kind: str, a: float | None, b: float | None, label: str, row: int = 0) -> list[Segment]:
    return [Segment(kind, a, b, label, row)] if a is not None and b is not None and b >= a else []


def _lane(box: _Box, attempts: Sequence[AttemptRecord], flights: Sequence[_Flight]) -> Lane | None:
    spans: list[tuple[str, float | None, float | None, str, float | None]] = []  # kind, start, end, label, queued
    for r in attempts:
        kind = "duplicate" if is_duplicate_kill(r) else r.phase.value
        spans.append((kind, _t(r.started_at), _t(r.ended_at), f"{r.run_id}.{r.attempt} {r.phase.value}: {r.reason}",
                      _t(r.queued_at)))
    for f in flights:
        kind = "queued" if f.queued else "running"
        spans.append((kind, f.launched_at, box.end, f"{f.run_id}.{f.attempt} {kind}", None))
    known = [t for s in spans for t in (s[1], s[2], s[4]) if t is not None]
    start = box.start if box.start is not None else min(known, default=None)
    end = box.end if box.end is not None else max(known, default=None)
    if start is None or end is None or end < start:
        return None
    segs: list[Segment] = []
    reachable = box.reachable_at if box.reachable_at is not None and start <= box.reachable_at <= end else None
    ready = box.ready_at if box.ready_at is not None and start <= box.ready_at <= end else None
    began = [t for kind, a, _, _, q in spans for t in (q if q is not None else a,) if t is not None and t >= start]
    booted = boot_end(reachable, ready, min(began, default=None), end)
    booted = end if booted is None else min(end, booted)
    segs += _span("boot", start, booted, "boot" if reachable is not None or ready is not None or began
                  else "boot: never reachable (or never used)")
    work_from = booted
    if reachable is not None:
        segs += _span("bootstrap", reachable, ready if ready is not None else end, "bootstrap")
        work_from = ready if ready is not None else end  # still bootstrapping (or never ready): none of it is idle
    rows_end: list[float] = []
    busy: list[tuple[float, float]] = []
    for kind, a, b, label, queued_at in sorted(spans, key=lambda s: (s[1] if s[1] is not None else end, s[3])):
        a = max(start, a) if a is not None else None
        b = min(end, b) if b is not None else None
        if a is None or b is None or b < a:
            continue
        row = next((i for i, e in enumerate(rows_end) if e <= a), None)
        if row is None:
            row = min(len(rows_end), MAX_ROWS - 1)
            if row == len(rows_end):
                rows_end.append(b)
        rows_end[row] = max(rows_end[row], b)
        if queued_at is not None:
            segs += _span("queued", max(start, queued_at), a, f"{label} (queued)", row)
        segs += _span(kind, a, b, label, row)
        if kind != "queued":
            busy.append((a, b))
    cursor = work_from
    for a, b in sorted(busy):
        if a > cursor:
            segs += _span("idle", cursor, a, "idle")
        cursor = max(cursor, b)
    if end > cursor:
        segs += _span("idle", cursor, end, "idle")
    if not box.held:
        segs.append(Segment("destroy", end, end, "destroyed (its bill closed)"))
    order = {k: i for i, k in enumerate(SEGMENT_KINDS)}
    segs.sort(key=lambda s: (s.start, s.end, order[s.kind], s.row))
    return Lane(box.instance_id, box.title, start, end, box.held, max(1, len(rows_end)), tuple(segs))


def build_timeline(attempts: Iterable[AttemptRecord], overheads: Iterable[OverheadRecord],
                   fleet_doc: Mapping[str, Any], runs_doc: Mapping[str, Any], snapshot: float | None,
                   *, max_lanes: int = MAX_LANES) -> Timeline:
    """One lane per box that the facts know (ended: an overhead line; held: fleet.yaml), newest first."""
    by_box: dict[int, list[AttemptRecord]] = {}
    for r in attempts:
        by_box.setdefault(r.instance_id, []).append(r)
    flights: dict[int, list[_Flight]] = {}
    for f in in_flight(runs_doc, fleet_doc):
        flights.setdefault(f.instance_id, []).append(f)
    boxes = _boxes(overheads, fleet_doc, snapshot)
    held = {b.instance_id for b in boxes if b.held}
    lanes = [
        lane for b in boxes
        if (lane := _lane(b, by_box.get(b.instance_id, []), flights.get(b.instance_id, []) if b.instance_id in held
                          else [])) is not None
    ]
    lanes.sort(key=lambda ln: (-ln.start, -ln.instance_id))
    shown = lanes[:max(0, max_lanes)]
    return Timeline(
        lanes=tuple(shown), left_out=len(lanes) - len(shown),
        start=min((ln.start for ln in shown), default=None), end=max((ln.end for ln in shown), default=None),
    )
