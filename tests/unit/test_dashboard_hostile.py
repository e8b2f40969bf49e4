"""The dashboard with what a hostile box could have put in the committed files (issue 20): a failed attempt whose
stderr tail carries ESC, C1, BEL and bidi characters, and learning curves with NaN, Infinity, 1e308 and garbage
points. The page shows every such character as an escape, and no SVG coordinate is anything but a finite number."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from snapshot_repo import first_archived_run, make_snapshot_repo

from reconciler.core.model import AttemptOutcome, AttemptRecord
from reconciler.observed.archive_lines import record_to_json
from reconciler.views.dashboard import build
from reconciler.views.svg import Series, line_chart

HOSTILE_STDERR = "Traceback\n\x1b[31mred\x1b[0m \x9b2J bell\x07 \u202eevil\u202c \u2066iso\u2069 <b>bold</b>\n"
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
NUMBER = r"-?\d+(?:\.\d+)?(?:e[+-]?\d+)?"


def _hostile_repo(where: Path) -> Path:
    repo = make_snapshot_repo(where)
    run = first_archived_run()
    rec = AttemptRecord(
        run_id=str(run["run_id"]),
        attempt=9,
        sweep=str(run["sweep"]),
        phase=AttemptOutcome.FAILED,
        exit_code=1,
        reason="exit code 1 \x1b]8;;http://x\x07",
        ended_at=4e9,
        stderr_tail=HOSTILE_STDERR,
    )
    shard = sorted((repo / "observed" / "runs").glob("*.jsonl"))[-1]
    with shard.open("a", encoding="utf-8") as fh:
        fh.write(record_to_json(rec) + "\n")
    curves = repo / "observed" / "curves" / str(run["sweep"])
    (curves / f"{run['run_id']}.9.json").write_text(
        '{"attempt": 9, "goal": "max", "key": "episode_reward", "points_total": 6, "resumed_from": null, '
        f'"run_id": "{run["run_id"]}", "sweep": "{run["sweep"]}", '
        '"points": [[0, 1], [1, NaN], [2, Infinity], [3, -1e308], ["x", 2], [4], null, [5, 3]]}\n'
    )
    return repo


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build(_hostile_repo(tmp_path_factory.mktemp("hostile")))


def test_the_stderr_pre_and_reason_show_escapes_not_raw_characters(page: str) -> None:
    assert RAW.search(page) is None
    failures = page.split('<section id="failures">')[1].split("</section>")[0]
    pre = failures.split("<pre>")[1].split("</pre>")[0]
    assert pre == (
        "Traceback\n\\x1b[31mred\\x1b[0m \\u009b2J bell\\x07 \\u202eevil\\u202c \\u2066iso\\u2069 "
        "&lt;b&gt;bold&lt;/b&gt;\n"
    )
    assert "exit code 1 \\x1b]8;;http://x\\x07" in failures


def test_no_svg_coordinate_is_non_finite(page: str) -> None:
    for attr in re.findall(r'\b(?:x|y|x1|x2|y1|y2|cx|cy|width|height)="([^"]*)"', page):
        assert re.fullmatch(NUMBER, attr), attr
    for points in re.findall(r'points="([^"]*)"', page):
        for pair in points.split():
            x, y = pair.split(",")
            assert re.fullmatch(NUMBER, x) and re.fullmatch(NUMBER, y), pair
    for svg in re.findall(r"<svg.*?</svg>", page, flags=re.S):
        assert "nan" not in svg.lower() and "inf" not in svg.lower()


def test_line_chart_skips_points_it_cannot_draw() -> None:
    svg = str(
        line_chart(
            [Series("a\x1b[2J", [(0.0, 1.0), (1.0, float("nan")), (2.0, float("inf")), (3.0, 1e308), (4.0, 2.0)])]
        )
    )
    assert "nan" not in svg and "inf" not in svg and "\x1b" not in svg and "a\\x1b[2J" in svg
    (points,) = re.findall(r'points="([^"]*)"', svg)
    assert len(points.split()) == 2
    assert "no data" in str(line_chart([Series("only bad", [(float("nan"), 1.0)])]))
