"""Hand-made SVG charts for the dashboard: a line chart and a stacked bar, as markup strings, nothing else.

Why hand-made: the page must be one self-contained file with no network (a charting library would be a few
hundred KiB of JavaScript inlined into every page); these charts need only polylines, rectangles and labels. Every
label goes through ``textsafe.visible`` and ``markupsafe.escape``; every coordinate is a number this module formats,
and a point that is not finite or beyond ``bounds.MAX_METRIC_ABS`` is skipped (an SVG with a NaN coordinate draws
nothing, or garbage).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup
from markupsafe import escape as _html_escape

from reconciler.core.bounds import finite
from reconciler.core.textsafe import visible
from reconciler.views.timeline import Timeline

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")
PHASE_COLOURS = {
    "succeeded": "#59a14f", "running": "#4e79a7", "pending": "#bab0ac", "retrying": "#edc948", "blocked": "#e15759",
    "queued": "#76b7b2", "stopped_early": "#b07aa1",
}


@dataclass(frozen=True)
class Series:
    label: str
    points: Sequence[tuple[float, float]]
    dots: bool = False  # markers only (scalars), no line
    dashed: bool = False


def escape(text: str) -> Markup:
    """A label for the SVG: control and bidi characters shown as escapes, then HTML-escaped."""
    return _html_escape(visible(str(text)))


def _drawable(series: Sequence[Series]) -> list[Series]:
    """``series`` with only the points that can be drawn: both coordinates finite and within range."""
    return [
        Series(s.label, [(x, y) for x, y in s.points if finite(x) is not None and finite(y) is not None], s.dots,
               s.dashed)
        for s in series
    ]


def _fmt(v: float) -> str:
    return f"{v:.6g}"


@dataclass(frozen=True)
class _Frame:
    """A chart's plot area over the data's range, with its axes, min/max ticks and axis labels drawn; ``log_x``
    places x by its log10 (ticks still show the values); ``x_ticks`` names categories at their x."""

    x0: float
    x1: float
    y0: float
    y1: float
    left: int
    top: int
    pw: float
    ph: float
    log_x: bool

    def sx(self, x: float) -> float:
        v = math.log10(x) if self.log_x else x
        return self.left + (v - self.x0) / (self.x1 - self.x0) * self.pw

    def sy(self, y: float) -> float:
        return self.top + self.ph - (y - self.y0) / (self.y1 - self.y0) * self.ph


def _open(width: int, h: int, css_class: str) -> list[str]:
    return [f'<svg class="{css_class}" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {h}" '
            f'width="{width}" height="{h}" role="img">']


def _no_data(out: list[str], width: int, height: int) -> Markup:
    out.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" class="muted">no data</text></svg>')
    return Markup("".join(out))


def _frame(out: list[str], pts: Sequence[tuple[float, float]], width: int, height: int, x_label: str,
           y_label: str, *, log_x: bool = False, x_ticks: Sequence[str] = ()) -> _Frame:
    """Draw the axes of a chart over ``pts`` (not empty; with ``log_x`` every x > 0) into ``out``."""
    left, right, top = 56, 10, 10
    xs = [math.log10(p[0]) if log_x else p[0] for p in pts]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        y0, y1 = y0 - 1, y1 + 1
    f = _Frame(x0, x1, y0, y1, left, top, width - left - right, height - top - 40, log_x)
    pw, axis_y = f.pw, top + f.ph
    out.append(f'<line x1="{left}" y1="{axis_y}" x2="{left + pw}" y2="{axis_y}" class="axis"/>')
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{axis_y}" class="axis"/>')
    out.append(f'<text x="{left - 4}" y="{top + 4}" text-anchor="end" class="tick">{_fmt(y1)}</text>')
    out.append(f'<text x="{left - 4}" y="{axis_y}" text-anchor="end" class="tick">{_fmt(y0)}</text>')
    if x_ticks:
        for i, name in enumerate(x_ticks):
            out.append(f'<text x="{f.sx(float(i)):.1f}" y="{axis_y + 14}" text-anchor="middle" class="tick">'
                       f"{escape(name)}</text>")
    else:
        lo, hi = (10**x0, 10**x1) if log_x else (x0, x1)
        out.append(f'<text x="{left}" y="{axis_y + 14}" class="tick">{_fmt(lo)}</text>')
        out.append(f'<text x="{left + pw}" y="{axis_y + 14}" text-anchor="end" class="tick">{_fmt(hi)}</text>')
    if x_label:
        out.append(f'<text x="{left + pw / 2}" y="{axis_y + 28}" text-anchor="middle" class="tick">'
                   f"{escape(x_label)}</text>")
    if y_label:
        out.append(f'<text x="12" y="{top + f.ph / 2}" transform="rotate(-90 12 {top + f.ph / 2})" '
                   f'text-anchor="middle" class="tick">{escape(y_label)}</text>')
    return f


def _legend(out: list[str], i: int, label: str, colour: str, height: int) -> None:
    ly = height + 14 * i + 4
    out.append(f'<rect x="56" y="{ly - 8}" width="10" height="10" fill="{colour}"/>'
               f'<text x="70" y="{ly + 1}" class="legend">{escape(label)}</text>')


def line_chart(series: Sequence[Series], *, width: int = 420, height: int = 220, x_label: str = "",
               y_label: str = "", css_class: str = "chart", log_x: bool = False,
               x_ticks: Sequence[str] = ()) -> Markup:
    """A line chart of ``series`` with axes, min/max ticks and a legend; an empty chart says "no data". ``log_x``:
    a logarithmic x axis (points with x <= 0 are not drawn); ``x_ticks``: category names at x = 0, 1, ..."""
    series = [Series(s.label, [p for p in s.points if not log_x or p[0] > 0], s.dots, s.dashed)
              for s in _drawable(series)]
    pts = [p for s in series for p in s.points]
    out = _open(width, height + 14 * len(series), css_class)
    if not pts:
        return _no_data(out, width, height)
    f = _frame(out, pts, width, height, x_label, y_label, log_x=log_x, x_ticks=x_ticks)
    for i, s in enumerate(series):
        colour = PALETTE[i % len(PALETTE)]
        coords = " ".join(f"{f.sx(x):.1f},{f.sy(y):.1f}" for x, y in s.points)
        if s.dots or len(s.points) == 1:
            for x, y in s.points:
                out.append(f'<circle cx="{f.sx(x):.1f}" cy="{f.sy(y):.1f}" r="3" fill="{colour}">'
                           f"<title>{escape(s.label)}: {_fmt(x)}, {_fmt(y)}</title></circle>")
        else:
            dash = ' stroke-dasharray="5 4"' if s.dashed else ""
            out.append(f'<polyline class="series" fill="none" stroke="{colour}" stroke-width="1.5"{dash} '
                       f'points="{coords}"><title>{escape(s.label)}</title></polyline>')
        _legend(out, i, s.label, colour, height)
    out.append("</svg>")
    return Markup("".join(out))


@dataclass(frozen=True)
class BandSeries:
    """A mean line with a shaded spread: ``points`` are (x, mean, low, high)."""

    label: str
    points: Sequence[tuple[float, float, float, float]]


def band_chart(bands: Sequence[BandSeries], *, width: int = 420, height: int = 220, x_label: str = "",
               y_label: str = "") -> Markup:
    """Each band as a translucent polygon from its low to its high edge, and its mean as a line over it."""
    clean = [BandSeries(b.label, [p for p in b.points if all(finite(v) is not None for v in p)]) for b in bands]
    pts = [(x, y) for b in clean for x, _, lo, hi in b.points for y in (lo, hi)]
    out = _open(width, height + 14 * len(clean), "chart band")
    if not pts:
        return _no_data(out, width, height)
    f = _frame(out, pts, width, height, x_label, y_label)
    for i, b in enumerate(clean):
        colour = PALETTE[i % len(PALETTE)]
        edge = [(x, hi) for x, _, _, hi in b.points] + [(x, lo) for x, _, lo, _ in reversed(b.points)]
        poly = " ".join(f"{f.sx(x):.1f},{f.sy(y):.1f}" for x, y in edge)
        out.append(f'<polygon class="spread" fill="{colour}" fill-opacity="0.25" stroke="none" points="{poly}">'
                   f"<title>{escape(b.label)}: min to max</title></polygon>")
        line = " ".join(f"{f.sx(x):.1f},{f.sy(m):.1f}" for x, m, _, _ in b.points)
        out.append(f'<polyline class="series" fill="none" stroke="{colour}" stroke-width="1.5" '
                   f'points="{line}"><title>{escape(b.label)}</title></polyline>')
        _legend(out, i, b.label, colour, height)
    out.append("</svg>")
    return Markup("".join(out))


def stacked_bar(counts: Sequence[tuple[str, int]], *, width: int = 420, height: int = 22) -> Markup:
    """One horizontal bar split by phase (``PHASE_COLOURS``), each part titled with its count."""
    total = sum(n for _, n in counts)
    out = [f'<svg class="bar" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
           f'width="{width}" height="{height}" role="img">']
    x = 0.0
    for phase, n in counts:
        if n <= 0 or total == 0:
            continue
        w = n / total * width
        out.append(f'<rect x="{x:.1f}" y="0" width="{w:.1f}" height="{height}" '
                   f'fill="{PHASE_COLOURS.get(phase, "#999")}"><title>{escape(phase)}: {n}</title></rect>')
        x += w
    if total == 0:
        out.append(f'<rect x="0" y="0" width="{width}" height="{height}" fill="#eee"/>')
    out.append("</svg>")
    return Markup("".join(out))


SEGMENT_COLOURS = {
    "boot": "#9c755f", "bootstrap": "#b07aa1", "idle": "#e8e2dc", "queued": "#76b7b2", "running": "#4e79a7",
    "succeeded": "#59a14f", "failed": "#e15759", "lost": "#ff9da7", "stopped_early": "#d4a6c8", "duplicate": "#f28e2b",
    "destroy": "#333333", "preempted": "#edc948",
}


LANE_LABEL_CHARS = 38  # a lane's label stops before the time axis (its whole text is its tooltip)


def _clock(t: float) -> str:
    try:
        return dt.datetime.fromtimestamp(round(t), tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    except (ValueError, OverflowError, OSError):
        return "-"


def timeline_chart(timeline: Timeline, *, width: int = 960, row_h: int = 10) -> Markup:
    """One lane per box (``timeline.Timeline``): its label on the left, its segments on a shared time axis; each
    segment a rect titled with what it was and how long; a legend of the segment kinds below."""
    left, right, top, gap = 230, 10, 18, 6
    pw = width - left - right
    heights = [ln.rows * row_h + 4 for ln in timeline.lanes]
    legend_y = top + sum(h + gap for h in heights) + 14
    h = legend_y + 16
    out = [f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {h}" '
           f'width="{width}" height="{h}" role="img">']
    t0, t1 = timeline.start, timeline.end
    if t0 is None or t1 is None or not timeline.lanes:
        out.append(f'<text x="{width / 2}" y="20" text-anchor="middle" class="muted">no boxes yet</text></svg>')
        return Markup("".join(out))
    span = t1 - t0 if t1 > t0 else 1.0

    def sx(t: float) -> float:
        return left + (t - t0) / span * pw

    out.append(f'<text x="{left}" y="12" class="tick">{_clock(t0)}</text>')
    out.append(f'<text x="{left + pw}" y="12" text-anchor="end" class="tick">{_fmt(span / 60)} min</text>')
    y = float(top)
    for lane, lh in zip(timeline.lanes, heights, strict=True):
        state = "held" if lane.held else "ended"
        out.append(f'<g class="lane lane-{state}" data-box="{lane.instance_id}">')
        name = f"box {lane.instance_id} {visible(lane.title)}"
        shown = name if len(name) <= LANE_LABEL_CHARS else name[: LANE_LABEL_CHARS - 1] + "\u2026"
        out.append(f'<text x="4" y="{y + min(lh, 14) - 3:.1f}" class="legend">{_html_escape(shown)}'
                   f"<title>{_html_escape(name)}</title></text>")
        for s in lane.segments:
            sy: float
            sh: float
            x = sx(s.start)
            w = max(sx(s.end) - x, 1.0)
            if s.kind == "destroy":
                sy, sh, w = y, lh, 3.0
            elif s.kind in ("boot", "bootstrap", "idle"):
                sy, sh = y, lh
            elif s.kind == "queued":
                sy, sh = y + 2 + s.row * row_h, 3.0
            else:
                sy, sh = y + 2 + s.row * row_h, row_h - 2.0
            secs = max(0.0, s.end - s.start)
            out.append(f'<rect class="seg seg-{s.kind}" x="{x:.1f}" y="{sy:.1f}" width="{w:.1f}" height="{sh:.1f}" '
                       f'fill="{SEGMENT_COLOURS[s.kind]}"><title>{escape(s.kind)} {_fmt(secs)} s: '
                       f"{escape(s.label)}</title></rect>")
        out.append("</g>")
        y += lh + gap
    x = float(left)
    for kind, colour in SEGMENT_COLOURS.items():
        out.append(f'<rect x="{x:.1f}" y="{legend_y - 9}" width="10" height="10" fill="{colour}"/>'
                   f'<text x="{x + 13:.1f}" y="{legend_y}" class="legend">{kind}</text>')
        x += 13 + 7.5 * len(kind) + 10
    out.append("</svg>")
    return Markup("".join(out))
