"""The per-box timeline from hand-made committed facts: a lane per box (ended and held), its segments in time order
(boot, bootstrap, queued, attempts by outcome, idle, destroy), bounded, drawn as escaped SVG with finite numbers; and
the ops tax and ``queued`` in STATUS.md and the dashboard from the same tree (``timeline_repo``, which the browser
test loads too)."""

from __future__ import annotations

import datetime as dt
import math
import re
from dataclasses import replace
from pathlib import Path

import yaml

from reconciler.core.model import AttemptOutcome, AttemptRecord, InFlight, OverheadRecord
from reconciler.core.remember import running_cost
from reconciler.observed.archive_lines import entry_to_json
from reconciler.views.dashboard import build, read_repo
from reconciler.views.status_md import render_status_md
from reconciler.views.svg import timeline_chart
from reconciler.views.timeline import build_timeline, in_flight

T0 = dt.datetime(2026, 11, 3, 12, 0, tzinfo=dt.UTC).timestamp()
HOSTILE_GPU = "RTX <script>alert(1)</script>\u202eevil"
DPH = 3.6


def iso(s: float) -> str:
    return dt.datetime.fromtimestamp(T0 + s, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _attempt(run: str, n: int, phase: AttemptOutcome, a: float, b: float, box: int, reason: str = "",
             queued: float | None = None) -> AttemptRecord:
    return AttemptRecord(run_id=run, attempt=n, sweep="s", phase=phase, instance_id=box, dph=DPH, gpu_name="RTX 3060",
                         started_at=T0 + a, ended_at=T0 + b, cost_usd=round((b - a) * DPH / 3600, 6), reason=reason,
                         queued_at=None if queued is None else T0 + queued)


S, F, L = AttemptOutcome.SUCCEEDED, AttemptOutcome.FAILED, AttemptOutcome.LOST
# box 5 ended (0..600 s); box 9 is held (started at 300, snapshot at 1200)
ATTEMPTS = [
    _attempt("s-aaa", 1, S, 60, 200, 5),
    _attempt("s-bbb", 1, F, 200, 260, 5, reason="exited with code 1 <b>bold</b>"),
    _attempt("s-ccc", 1, S, 400, 700, 9),
    _attempt("s-ddd", 1, L, 700, 760, 9),
]
OVERHEADS = [
    OverheadRecord(instance_id=5, billed_usd=0.6, attempts_usd=0.2, cost_usd=0.4, dph=DPH, num_gpus=1,
                   gpu_name=HOSTILE_GPU, started_at=T0, ended_at=T0 + 600),
]
SNAPSHOT = 1200.0
FLEET_DOC = {
    "boxes": [{"id": 9, "dph": DPH, "gpu_name": "RTX 4090", "num_gpus": 1, "status": "running", "reachable": True,
               "started_at": iso(300), "first_seen_at": iso(310),
               "gpus": [{"index": 0, "busy": True, "run": "s-eee.1"}]}],
    "memory": [{"instance_id": 9, "first_seen_at": iso(310), "reachable_at": iso(330), "ready_at": iso(380)}],
    "dph": DPH, "fleet": "tl", "held": 1,
}
RUNS_DOC = {
    "counts": {"s": {"pending": 1, "queued": 1, "running": 1, "succeeded": 2, "retrying": 1, "blocked": 0,
                     "total": 6}},
    "in_flight": [
        {"run_id": "s-eee", "attempt": 1, "instance_id": 9, "gpu_mask": [0], "launched_at": iso(900), "sweep": "s"},
        {"run_id": "s-fff", "attempt": 1, "instance_id": 9, "gpu_mask": [0], "launched_at": iso(1000), "sweep": "s",
         "queued": True},
    ],
    "sweeps": {"s": {}},
}


def timeline_repo(where: Path) -> Path:
    """A fleet checkout's observed/ by hand: one ended box (an overhead line, a hostile GPU name), one held box with
    its readiness times, archived attempts of every outcome, one running and one queued attempt in flight."""
    repo = where / "tl"
    (repo / "observed" / "runs").mkdir(parents=True)
    (repo / "observed" / "fleet.yaml").write_text(yaml.safe_dump(FLEET_DOC))
    (repo / "observed" / "runs.yaml").write_text(yaml.safe_dump(RUNS_DOC))
    (repo / "observed" / "status.yaml").write_text(yaml.safe_dump({"last_change_at": iso(SNAPSHOT)}))
    lines = [entry_to_json(r) for r in [*ATTEMPTS, *OVERHEADS]]
    (repo / "observed" / "runs" / "2026-11.jsonl").write_text("\n".join(lines) + "\n")
    return repo


def test_one_lane_per_box_newest_first_with_its_segments_in_order() -> None:
    given_early = [*ATTEMPTS[:2], replace(ATTEMPTS[2], queued_at=T0 + 380), ATTEMPTS[3]]  # in its box's queue at 380
    tl = build_timeline(given_early, OVERHEADS, FLEET_DOC, RUNS_DOC, T0 + SNAPSHOT)
    assert [ln.instance_id for ln in tl.lanes] == [9, 5] and tl.left_out == 0
    held, ended = tl.lanes
    assert held.held and not ended.held and tl.start == T0 and tl.end == T0 + SNAPSHOT
    # the ended box: no readiness times, so boot until its first attempt; idle after the last; destroyed at its end
    assert [(s.kind, s.start - T0, s.end - T0) for s in ended.segments] == [
        ("boot", 0, 60), ("succeeded", 60, 200), ("failed", 200, 260), ("idle", 260, 600), ("destroy", 600, 600)]
    assert [(s.kind, s.start - T0, s.end - T0) for s in held.segments] == [
        ("boot", 300, 330), ("bootstrap", 330, 380), ("idle", 380, 400), ("queued", 380, 400), ("succeeded", 400, 700),
        ("lost", 700, 760), ("idle", 760, 900), ("running", 900, 1200), ("queued", 1000, 1200)]
    starts = [s.start for ln in tl.lanes for s in ln.segments]
    assert all(isinstance(t, float) and math.isfinite(t) for t in starts)


def test_lanes_are_bounded_and_the_rest_counted() -> None:
    many = [OverheadRecord(instance_id=i, billed_usd=0.1, attempts_usd=0.0, cost_usd=0.1, dph=DPH,
                           started_at=T0 + i, ended_at=T0 + i + 100) for i in range(1, 13)]
    tl = build_timeline([], many, {}, {}, None, max_lanes=5)
    assert [ln.instance_id for ln in tl.lanes] == [12, 11, 10, 9, 8] and tl.left_out == 7
    assert "no boxes yet" in timeline_chart(build_timeline([], [], {}, {}, None))


def test_non_finite_or_backwards_times_are_never_drawn() -> None:
    bad = [
        OverheadRecord(instance_id=1, billed_usd=0.1, attempts_usd=0.0, cost_usd=0.1, dph=math.inf,
                       started_at=math.nan, ended_at=T0 + 10, reachable_at=math.inf, ready_at=-math.inf),
        OverheadRecord(instance_id=2, billed_usd=0.1, attempts_usd=0.0, cost_usd=0.1, started_at=T0 + 50,
                       ended_at=T0 + 10),
    ]
    weird = [_attempt("x", 1, S, 5, 1, 1), AttemptRecord(run_id="y", attempt=1, sweep="s", phase=F, instance_id=1,
                                                          started_at=math.nan, ended_at=math.inf)]
    fleet = {"boxes": [{"id": 3, "started_at": "yesterday", "dph": "lots"}, {"id": "4"}, "junk"], "memory": ["x"]}
    runs = {"in_flight": [{"run_id": "z", "attempt": 1, "instance_id": 3, "launched_at": float("nan")}, None]}
    tl = build_timeline(weird, bad, fleet, runs, T0 + 100)
    svg = str(timeline_chart(tl))
    assert "nan" not in svg.lower() and "inf" not in svg.lower()
    for n in re.findall(r'\s(?:x|y|width|height)="([^"]+)"', svg):
        assert math.isfinite(float(n)), n


def test_the_svg_escapes_what_the_boxes_and_attempts_said() -> None:
    svg = str(timeline_chart(build_timeline(ATTEMPTS, OVERHEADS, FLEET_DOC, RUNS_DOC, T0 + SNAPSHOT)))
    assert "<script>" not in svg and "&lt;script&gt;alert(1)&lt;/script&gt;" in svg
    assert "\u202e" not in svg and "\\u202e" in svg
    assert "<b>" not in svg and "&lt;b&gt;bold" in svg
    assert svg.count('<g class="lane') == 2 and 'data-box="9"' in svg


def test_status_md_and_the_dashboard_show_queued_and_the_ops_tax(tmp_path: Path) -> None:
    repo = timeline_repo(tmp_path)
    facts = read_repo(repo)
    assert len(facts.attempts) == 4 and len(facts.overheads) == 1
    text = render_status_md(facts.files, facts.attempts, None, facts.overheads)
    assert "| 9 | 1x RTX 4090 | 3.6000 | running | 15m | - | s\\-eee\\.1 | s\\-fff\\.1 | 0 |" in text
    assert "| s | 1 | 1 | 2 | 1 | 0 | 1 | 0 | 6 |" in text  # pending, running, succeeded, retrying, blocked, queued,
    # stopped early
    tax = text.split("## Ops tax")[1].split("##")[0]
    # billed: box 5 $0.6 (its overhead $0.4 + attempts $0.2); box 9 900 s to the snapshot $0.9, of which 300 s run
    # now; idle: box 5 after its last attempt (340 s), box 9 380..400 and 760..900 (160 s)
    assert "**$0.7600 of $1.5000 (50.7%)**" in tax and "over 2 box(es) (1 still held, counted to the snapshot)" in tax
    assert "| boot | 0.0900 | 6.0% |" in tax  # box 5 to its first attempt (60 s), box 9 30 s
    assert "| bootstrap | 0.0500 | 3.3% |" in tax and "| idle | 0.5000 | 33.3% |" in tax
    assert "| lost | 0.1200 | 8.0% |" in tax and "| duplicate | 0.0000 | 0.0% |" in tax
    assert "| succeeded work | 0.4400 | 29.3% |" in tax and "| still running | 0.3000 | 20.0% |" in tax
    page = build(repo)
    section = page.split('<section id="opstax">')[1].split("</section>")[0]
    assert '<tr class="tax-idle"><td>idle</td><td class="num">0.5000</td><td class="num">33.3%</td></tr>' in section
    assert '<td class="queued">s-fff.1</td>' in page
    runs = page.split('<section id="runs">')[1].split("</section>")[0]
    assert "<th>queued</th>" in runs
    lanes = page.split('<section id="timeline">')[1].split("</section>")[0]
    assert lanes.count('<g class="lane') == 2 and "<script>" not in page


def test_a_box_s_running_cost_is_one_rule_for_the_live_status_and_the_committed_facts() -> None:
    """`rigsync status` (``InFlight`` in memory) and the dashboard (runs.yaml's ``in_flight``) price a held box's
    running attempts with ``running_cost``: its running attempt from its launch (900 s) to the snapshot, $0.3 at
    $3.6/h; the queued one, another box's and one launched after the snapshot cost nothing yet."""
    at = T0 + SNAPSHOT
    memory = [
        InFlight("s-eee", 1, 9, (0,), T0 + 900),
        InFlight("s-fff", 1, 9, (0,), T0 + 1000, queued=True),
        InFlight("s-ggg", 1, 5, (0,), T0 + 900),
        InFlight("s-hhh", 1, 9, (0,), at + 60),
    ]
    from_memory = running_cost(9, DPH, 1, memory, at)
    assert from_memory == running_cost(9, DPH, 1, in_flight(RUNS_DOC, FLEET_DOC), at) == 0.3
    assert running_cost(9, DPH, 2, memory[:1], at) == 0.15  # its one GPU of the box's two
