"""Learning curves small enough for git: an attempt's metric, downsampled, as one file under ``observed/curves/``.

The one home of the downsampler. A run's metrics file (JSON lines, harvested into the local store) becomes
``(step, value)`` points of the sweep's ``metrics.key`` (``step`` from the line's ``step`` field, else its index
among the lines that carry the key); at most ``MAX_POINTS`` are kept by largest-triangle-three-buckets (LTTB,
Steinarsson 2013), which keeps the shape, plus the first, the last, the lowest and the highest point. The file is
deterministic (values rounded to 6 significant digits, one point per line), written once when the attempt is
settled, so a pull request and an agent see every attempt's curve without the store.

A metrics file comes from the box, so reading it is total and bounded (``read_metrics``): at most
``bounds.METRICS_FILE_BYTES`` of it are read, a line longer than ``bounds.METRICS_LINE_BYTES`` is skipped without
being held in memory, and only steps and values that pass ``bounds.finite`` become points. What was dropped is
counted and the first problem named, so the curve file says how many points it lost and the archive record why.

Pure: no I/O beyond reading the file object the caller opened (the caller writes the text).
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO

from reconciler.core.bounds import (
    MAX_JSON_DEPTH,
    METRICS_FILE_BYTES,
    METRICS_LINE_BYTES,
    bounded_text,
    finite,
    json_depth,
)

MAX_POINTS = 200
CURVES_DIR = "observed/curves"  # documented in observed/README.md
Point = tuple[float, float]


def curve_path(sweep: str, run_id: str, attempt: int) -> str:
    """``observed/curves/<sweep>/<run_id>.<attempt>.json``."""
    return f"{CURVES_DIR}/{sweep}/{run_id}.{attempt}.json"


@dataclass(frozen=True)
class MetricsRead:
    """What a metrics file gave: its points (thinned evenly past ``MAX_READ_POINTS``, the lowest and highest
    kept), how many there were (``total``), how many lines that named the key were dropped, and the first problem
    (``line 3: number out of range``; None when nothing was dropped or cut)."""

    points: list[Point]
    total: int = 0
    dropped: int = 0
    problem: str | None = None


MAX_READ_POINTS = 1 << 15  # points held while reading; past twice this, every other one is let go
def _lines(fh: BinaryIO, max_line: int, max_file: int) -> Iterator[bytes | None]:
    """The lines of the first ``max_file`` bytes of ``fh``; None for a line longer than ``max_line``, whose bytes are
    read past in bounded pieces and never kept."""
    read = 0
    while read < max_file:
        line = fh.readline(min(max_line + 1, max_file - read))
        if not line:
            return
        read += len(line)
        if len(line) > max_line and not line.endswith(b"\n"):
            while read < max_file:
                rest = fh.readline(min(max_line + 1, max_file - read))
                read += len(rest)
                if not rest or rest.endswith(b"\n"):
                    break
            yield None
            continue
        yield line


def _thinned(points: list[Point]) -> list[Point]:
    """Every other point, the first, last, lowest and highest always among them."""
    keep = {0, len(points) - 1}
    keep.add(min(range(len(points)), key=lambda i: (points[i][1], i)))
    keep.add(max(range(len(points)), key=lambda i: (points[i][1], -i)))
    return [p for i, p in enumerate(points) if i % 2 == 0 or i in keep]


def read_metrics(
    source: bytes | BinaryIO, key: str, *, max_line: int = METRICS_LINE_BYTES, max_file: int = METRICS_FILE_BYTES
) -> MetricsRead:
    """The ``(step, value)`` points of ``key`` in a JSON-lines metrics file (bytes, or a binary file object read
    from where it stands). Never raises on the file's content, and holds at most one line of it at a time: an
    unparsable line, or one without ``key``, is not a point; a line that names ``key`` but cannot be one (too long,
    nested too deep, a value or step that is not a finite number within ``bounds.MAX_METRIC_ABS``) is dropped and
    counted. Steps come from the line's ``step`` field, else the point's index."""
    fh: BinaryIO = io.BytesIO(source) if isinstance(source, bytes | bytearray) else source
    needle = json.dumps(key)[1:-1].encode("utf-8", "replace")
    out: list[Point] = []
    total = dropped = number = 0
    problem: str | None = None
    try:
        for line in _lines(fh, max_line, max_file):
            number += 1
            why = None
            if line is None:
                why = "line too long"
            elif needle not in line:
                continue
            elif json_depth(line.decode("utf-8", "replace")) > MAX_JSON_DEPTH:
                why = "nested too deep"
            else:
                point, why = _point(line, key, total)
                if point is not None:
                    out.append(point)
                    total += 1
                    if len(out) >= 2 * MAX_READ_POINTS:
                        out = _thinned(out)
                    continue
                if why is None:
                    continue
            dropped += 1
            problem = problem or f"line {number}: {why}"
        if fh.read(1):
            problem = problem or f"only the first {max_file} bytes read"
    except (OSError, ValueError) as exc:  # the file itself failed (not its content): what was read stands
        problem = problem or bounded_text(f"line {number + 1}: unreadable ({type(exc).__name__})")
    return MetricsRead(out, total, dropped, problem)


def _point(line: bytes, key: str, index: int) -> tuple[Point | None, str | None]:
    """One line's point, or (None, why it is dropped), or (None, None) when the line is simply not a point."""
    try:
        d = json.loads(line)
    except (ValueError, RecursionError, OverflowError):
        return None, None
    if not isinstance(d, dict) or key not in d:
        return None, None
    raw = d[key]
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        return None, None
    v = finite(raw)
    if v is None:
        return None, "number out of range"
    step = d.get("step")
    if isinstance(step, bool) or not isinstance(step, int | float):
        return (float(index), v), None
    x = finite(step)
    if x is None:
        return None, "step out of range"
    return (x, v), None


def points_from_metrics(text: bytes | BinaryIO, key: str) -> list[Point]:
    """The ``(step, value)`` points of ``key`` in a JSON-lines metrics file (``read_metrics``, without the counts)."""
    return read_metrics(text, key).points


def downsample(points: Sequence[Point], limit: int = MAX_POINTS) -> list[Point]:
    """At most ``limit`` points (>= 4): LTTB for the shape, always with the first, last, lowest and highest."""
    pts = list(points)
    if len(pts) <= limit:
        return pts
    keep = {0, len(pts) - 1}
    keep.add(min(range(len(pts)), key=lambda i: (pts[i][1], i)))
    keep.add(max(range(len(pts)), key=lambda i: (pts[i][1], -i)))
    chosen = set(_lttb(pts, max(3, limit - (len(keep) - 2)))) | keep
    while len(chosen) > limit:  # only when the extremes fell on points LTTB also picked near them: drop inner ones
        inner = sorted(chosen - keep)
        chosen.discard(inner[len(inner) // 2])
    return [pts[i] for i in sorted(chosen)]


def _lttb(pts: Sequence[Point], n: int) -> list[int]:
    """Indexes of ``n`` points chosen by largest-triangle-three-buckets (first and last included)."""
    size = len(pts)
    every = (size - 2) / (n - 2)
    out = [0]
    a = 0
    for i in range(n - 2):
        start = math.floor(i * every) + 1
        end = min(math.floor((i + 1) * every) + 1, size - 1)
        nxt_start, nxt_end = end, min(math.floor((i + 2) * every) + 1, size)
        nxt = pts[nxt_start:nxt_end] or [pts[-1]]
        avg_x = sum(p[0] for p in nxt) / len(nxt)
        avg_y = sum(p[1] for p in nxt) / len(nxt)
        ax, ay = pts[a]
        best, best_area = start, -1.0
        for j in range(start, max(end, start + 1)):
            bx, by = pts[j]
            area = abs((ax - avg_x) * (by - ay) - (ax - bx) * (avg_y - ay))
            if area > best_area:
                best, best_area = j, area
        out.append(best)
        a = best
    out.append(size - 1)
    return out


def _num(v: float) -> float | int:
    r = float(f"{v:.6g}")
    return int(r) if r.is_integer() and abs(r) < 1e15 else r


def render_curve(
    *, sweep: str, run_id: str, attempt: int, key: str, goal: str, points: Sequence[Point],
    resumed_from: int | None = None, dropped: int = 0, points_total: int | None = None,
) -> str:
    """The curve file's text: a small header, then ``points`` ([step, value], downsampled) one per line.

    Strict JSON: a point that is not finite is left out; it and ``dropped`` (the lines the reader dropped, as
    ``MetricsRead.dropped``) are counted in ``points_dropped``, written only when some were. ``points_total`` is the
    count of points read when ``points`` were already thinned (``MetricsRead.total``)."""
    finite_points = [(x, y) for x, y in points if math.isfinite(x) and math.isfinite(y)]
    kept = downsample(finite_points)
    head = {
        "attempt": attempt,
        "goal": goal,
        "key": key,
        "points_total": max(len(finite_points), (points_total or 0) - (len(points) - len(finite_points))),
        "resumed_from": resumed_from,
        "run_id": run_id,
        "sweep": sweep,
    }
    lost = max(0, dropped) + len(points) - len(finite_points)
    if lost:
        head["points_dropped"] = lost
    lines = [json.dumps([_num(x), _num(y)], allow_nan=False) for x, y in kept]
    body = ",\n".join("  " + ln for ln in lines)
    header = json.dumps(head, sort_keys=True, ensure_ascii=True, allow_nan=False)[1:-1]
    return "{" + header + ',\n "points": [\n' + body + ("\n" if lines else "") + " ]\n}\n"
