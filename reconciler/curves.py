"""Learning curves small enough for git: an attempt's metric, downsampled, as one file under ``observed/curves/``.

The one home of the downsampler. A run's metrics file (JSON lines, harvested into the local store) becomes
``(step, value)`` points of the sweep's ``metrics.key`` (``step`` from the line's ``step`` field, else its index
among the lines that carry the key); at most ``MAX_POINTS`` are kept by largest-triangle-three-buckets (LTTB,
Steinarsson 2013), which keeps the shape, plus the first, the last, the lowest and the highest point. The file is
deterministic (values rounded to 6 significant digits, one point per line), written once when the attempt is
settled, so a pull request and an agent see every attempt's curve without the store.

Pure: no I/O (the caller reads the metrics file and writes the text).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

MAX_POINTS = 200
CURVES_DIR = "observed/curves"  # documented in observed/README.md
Point = tuple[float, float]


def curve_path(sweep: str, run_id: str, attempt: int) -> str:
    """``observed/curves/<sweep>/<run_id>.<attempt>.json``."""
    return f"{CURVES_DIR}/{sweep}/{run_id}.{attempt}.json"


def points_from_metrics(text: bytes, key: str) -> list[Point]:
    """The ``(step, value)`` points of ``key`` in a JSON-lines metrics file; unparsable or non-finite lines skipped."""
    out: list[Point] = []
    for line in text.decode("utf-8", "replace").splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if not isinstance(d, dict):
            continue
        v = d.get(key)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            continue
        step = d.get("step")
        x = float(step) if isinstance(step, int | float) and not isinstance(step, bool) else float(len(out))
        out.append((x, float(v)))
    return out


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
    resumed_from: int | None = None,
) -> str:
    """The curve file's text: a small header, then ``points`` ([step, value], downsampled) one per line."""
    kept = downsample(points)
    head = {
        "attempt": attempt,
        "goal": goal,
        "key": key,
        "points_total": len(points),
        "resumed_from": resumed_from,
        "run_id": run_id,
        "sweep": sweep,
    }
    lines = [json.dumps([_num(x), _num(y)]) for x, y in kept]
    body = ",\n".join("  " + ln for ln in lines)
    header = json.dumps(head, sort_keys=True, ensure_ascii=True)[1:-1]
    return "{" + header + ',\n "points": [\n' + body + ("\n" if lines else "") + " ]\n}\n"
