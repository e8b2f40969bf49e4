"""The dashboard: one self-contained HTML page of a fleet, built from the committed files of a checkout.

It reads the working tree of a clone (observed/*.yaml, the run archive's shards, observed/curves/, desired/)
and nothing else: no provider, no box, no credentials, no network. The page inlines its stylesheet (shipped in
``reconciler/views/assets``) and draws its charts as SVG (``svg``), so ``--out`` writes one file that opens
anywhere. Sections: the fleet, runs by phase, spend over time against the caps, the ops tax (``opstax``), one lane
per box over time (``timeline``), learning curves per cell (the committed curves; a cell without any shows its
attempts' archived metrics as dots): one band per cell, the mean and the min-max spread across its seeds, the
searches (``search``: per sweep with a search or several cells, its configurations by objective, mean ± std over
seeds, the runs stopped early and their rung, the objective against each searched parameter), and the cells by
metric.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from markupsafe import Markup

from reconciler.core.bounds import finite
from reconciler.core.curves import CURVES_DIR
from reconciler.core.model import AttemptRecord, Desired, OverheadRecord
from reconciler.desired import load_desired_from_dir
from reconciler.errors import DesiredStateInvalid
from reconciler.observed.archive_lines import entry_from_json
from reconciler.observed.codec import BUDGET, FLEET, RUNS, RUNS_DIR, load_mapping_quietly
from reconciler.observed.observed_tree import read_observed
from reconciler.views.facts import PHASES, FleetView, build_view, document, mapping, time_of
from reconciler.views.search_results import Params, band, cell_of
from reconciler.views.status_md import environment, params_text
from reconciler.views.svg import BandSeries, Series, band_chart, line_chart, stacked_bar, timeline_chart
from reconciler.views.timeline import build_timeline

MAX_CELL_CHARTS = 60  # a page stays readable (and small) for a large sweep: the best cells get a chart


@dataclass(frozen=True)
class RepoFacts:
    """What a checkout has committed that the page shows."""

    files: Mapping[str, str]
    attempts: Sequence[AttemptRecord]
    overheads: Sequence[OverheadRecord]
    curves: Sequence[Mapping[str, Any]]
    desired: Desired | None


def read_repo(repo: Path) -> RepoFacts:
    """The committed facts of the checkout at ``repo`` (its working tree; an unreadable line or curve is skipped)."""
    attempts: list[AttemptRecord] = []
    overheads: list[OverheadRecord] = []
    for shard in sorted((repo / RUNS_DIR).glob("*.jsonl")):
        for line in shard.read_bytes().splitlines():
            try:
                entry = entry_from_json(line)
            except (ValueError, RecursionError):  # a line nobody could have written as it stands is not shown
                continue
            (overheads if isinstance(entry, OverheadRecord) else attempts).append(entry)  # type: ignore[arg-type]
    curves: list[dict[str, Any]] = []
    for f in sorted((repo / CURVES_DIR).glob("*/*.json")):
        try:
            doc = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("points"), list):
            curves.append(doc)
    try:
        desired: Desired | None = load_desired_from_dir(repo)
    except (DesiredStateInvalid, OSError):
        desired = None
    return RepoFacts(read_observed(repo), attempts, overheads, curves, desired)


def _spend_chart(facts: RepoFacts, view: FleetView) -> Markup:
    """Cumulative billed money over time (the archive's attempt and overhead lines), against the total cap."""
    events: list[tuple[float, float]] = []
    for a in facts.attempts:
        if a.ended_at is not None:
            events.append((a.ended_at, a.cost_usd))
    for o in facts.overheads:
        if o.ended_at is not None:
            events.append((o.ended_at, o.cost_usd))
    events.sort()
    t0 = events[0][0] if events else 0.0
    total, points = 0.0, []
    for t, usd in events:
        total += usd
        points.append(((t - t0) / 60.0, total))
    cap = next((c.cap for c in view.caps if c.name == "spent in total"), None)
    top = max((p[1] for p in points), default=0.0)
    # a cap far above the spend would flatten the line to the axis: then the legend says how far instead
    far = cap is not None and cap > 0 and top < cap / 10
    label = f"archived spend ($): {top / cap:.2%} of the ${cap:g} total cap" if far and cap else "archived spend ($)"
    series = [Series(label, points)]
    budget = load_mapping_quietly(facts.files.get(BUDGET))
    spend = mapping(budget.get("spend"))
    as_of = time_of(spend.get("as_of"))
    billed = spend.get("total_usd")
    if as_of is not None and isinstance(billed, int | float) and events:
        series.append(Series("billed total at the snapshot ($)", [((as_of - t0) / 60.0, float(billed))], dots=True))
    if cap is not None and points and not far:
        xs = [p[0] for s in series for p in s.points]
        series.append(Series(f"total cap ${cap:g}", [(min(xs), cap), (max(xs), cap)], dashed=True))
    return line_chart(series, x_label="minutes since the first archived attempt ended", y_label="$")


def _curve_charts(facts: RepoFacts, view: FleetView) -> list[dict[str, Any]]:
    """Per sweep and cell (best first): its seeds' curves as one band (mean, and min to max across seeds, each
    run's latest committed attempt), or a chart of its attempts' archived metrics when no curve is committed."""
    cell_of_run = {a.run_id: cell_of(a.params) for a in facts.attempts}
    if facts.desired is not None:
        cell_of_run.update({r.id: cell_of(r.params) for r in facts.desired.runs})
    latest: dict[tuple[str, str], tuple[int, Mapping[str, Any]]] = {}
    for c in facts.curves:
        run = (str(c.get("sweep")), str(c.get("run_id")))
        attempt = n if isinstance(n := c.get("attempt"), int) else 0
        if run not in latest or attempt >= latest[run][0]:
            latest[run] = (attempt, c)
    curves_by_cell: dict[tuple[str, Params], list[Mapping[str, Any]]] = {}
    for (sweep, run_id), (_, c) in sorted(latest.items(), key=lambda kv: kv[0]):
        curves_by_cell.setdefault((sweep, cell_of_run.get(run_id, ())), []).append(c)
    attempts_by_cell: dict[tuple[str, Params], list[AttemptRecord]] = {}
    for a in facts.attempts:
        attempts_by_cell.setdefault((a.sweep, cell_of(a.params)), []).append(a)
    charts = []
    for s in view.sweeps:
        for cell in s.cells[:MAX_CELL_CHARTS]:
            key: tuple[str, Params] = (s.name, cell.params)
            label = params_text(cell.params)
            curves = curves_by_cell.get(key, [])
            b = band([_points(c["points"]) for c in curves])
            if b is not None:
                runs = [str(c.get("run_id")) for c in curves]
                spread = "min to max" if b.curves > 1 else "one seed"
                series = BandSeries(f"mean of {b.curves} seed(s), {spread}",
                                    list(zip(b.steps, b.mean, b.low, b.high, strict=True)))
                charts.append({"sweep": s.name, "cell": label, "kind": "curve", "runs": runs, "svg": band_chart(
                    [series], x_label="step", y_label=str(curves[0].get("key") or s.metric_key or "metric"))})
                continue
            recs = sorted(attempts_by_cell.get(key, []), key=lambda a: (a.started_at or 0.0, a.run_id, a.attempt))
            pts = [(float(i + 1), a.final_metric if a.final_metric is not None else a.best_metric)
                   for i, a in enumerate(recs)]
            scalars = [(x, v) for x, y in pts if (v := finite(y)) is not None]
            if scalars:
                charts.append({"sweep": s.name, "cell": label, "kind": "scalars", "runs": [], "svg": line_chart(
                    [Series("final metric per attempt (no curve committed)", scalars, dots=True)],
                    x_label="attempt", y_label=s.metric_key or "metric")})
    return charts


def _param_charts(view: FleetView) -> dict[str, list[dict[str, Any]]]:
    """Per sweep with a search: one scatter per searched parameter, each configuration's objective against it."""
    out: dict[str, list[dict[str, Any]]] = {}
    for sv in view.searches:
        out[sv.name] = [{"param": p.name, "log": p.log, "svg": line_chart(
            [Series(f"objective (mean over seeds) of {len(p.points)} configuration(s)", p.points, dots=True),
             *([Series(f"{len(p.stopped)} run(s) stopped early: metric at the stop", p.stopped, dots=True)]
               if p.stopped else [])],
            x_label=f"{p.name}{' (log axis)' if p.log else ''}", y_label=sv.metric_key or "metric",
            log_x=p.log, x_ticks=p.categories, css_class="chart scatter")} for p in sv.plots]
    return out


def _points(raw: Any) -> list[tuple[float, float]]:
    """A committed curve's ``[step, value]`` pairs that are finite numbers in range (a hand-edited or older curve may
    hold anything: the rest is skipped, never drawn)."""
    out: list[tuple[float, float]] = []
    for p in raw if isinstance(raw, list) else ():
        if isinstance(p, list) and len(p) == 2 and (x := finite(p[0])) is not None and (y := finite(p[1])) is not None:
            out.append((x, y))
    return out


def render_dashboard(facts: RepoFacts) -> str:
    """The page's HTML (one self-contained document)."""
    view = build_view(facts.files, facts.attempts, facts.desired, facts.overheads)
    timeline = build_timeline(facts.attempts, facts.overheads, document(facts.files.get(FLEET)),
                              document(facts.files.get(RUNS)), view.snapshot_at)
    css = resources.files("reconciler.views").joinpath("assets/dashboard.css").read_text(encoding="utf-8")
    env = environment(html=True)
    bars = {s.name: stacked_bar([(p, s.counts.get(p, 0)) for p in PHASES]) for s in view.sweeps}
    return env.get_template("dashboard.html.j2").render(
        v=view, css=Markup(css), bars=bars, phases=PHASES, spend_chart=_spend_chart(facts, view),
        charts=_curve_charts(facts, view), param_charts=_param_charts(view), attempts=len(facts.attempts),
        curves=len(facts.curves),
        timeline=timeline, timeline_svg=timeline_chart(timeline),
    )


def build(repo: Path) -> str:
    """The dashboard of the checkout at ``repo``."""
    return render_dashboard(read_repo(repo))


def default_out(repo: Path) -> Path:
    """Where ``rigsync dashboard`` and the demo write the page when not told: inside the checkout's .git/ (never
    committed, never in the working tree), else ``rigsync-dashboard.html`` in the directory itself."""
    git_dir = repo / ".git"
    return (git_dir / "rigsync-dashboard.html") if git_dir.is_dir() else (repo / "rigsync-dashboard.html")


def open_hint(path: Path) -> str:
    """The line that says where the page is and how to open it (`rigsync dashboard` and the demo print it)."""
    return f"dashboard: {path}  (open it in a browser: xdg-open {path}, or file://{path})"


def write(repo: Path, out: Path | None = None) -> Path:
    """Write the page of ``repo`` to ``out`` (default ``default_out``); returns the path written."""
    target = out if out is not None else default_out(repo)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(build(repo), encoding="utf-8")
    return target.resolve()
