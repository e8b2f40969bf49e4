"""The per-box timeline and the ops tax in a real browser (Debian's headless Chromium, as ``test_dashboard_browser``).

The page is made by the console script from a hand-made observed/ tree (``test_timeline.timeline_repo``: one ended
box with a hostile GPU name, one held box with its readiness times, attempts of every outcome, one running and one
queued attempt in flight), then loaded by ``chromium --headless``: its DOM after load has one lane per box, newest
first, each lane's segments in time order, the hostile name shown escaped, and its console stays silent.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from test_dashboard_browser import dashboard_dom, screenshot
from test_timeline import timeline_repo

pytestmark = pytest.mark.integration


def test_the_timeline_shows_each_box_its_segments_in_order_and_escapes_names(tmp_path: Path) -> None:
    page, dom = dashboard_dom(timeline_repo(tmp_path), tmp_path)
    timeline = dom.split('<section id="timeline">')[1].split("</section>")[0]
    lanes = re.findall(r'<g class="lane lane-(held|ended)" data-box="(\d+)">(.*?)</g>', timeline, re.S)
    assert [(state, box) for state, box, _ in lanes] == [("held", "9"), ("ended", "5")]
    kinds = {box: re.findall(r'<rect class="seg seg-([a-z]+)" x="([0-9.]+)"', body) for _, box, body in lanes}
    assert [k for k, _ in kinds["9"]] == ["boot", "bootstrap", "idle", "succeeded", "lost", "idle", "running",
                                          "queued"]
    assert [k for k, _ in kinds["5"]] == ["boot", "succeeded", "failed", "idle", "destroy"]
    for segs in kinds.values():
        xs = [float(x) for _, x in segs]
        assert xs == sorted(xs)  # left to right: the order they happened in
    # the hostile GPU name of the ended box: escaped by the page, shown as text, never a script or a bidi override
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in timeline and "\\u202eevil" in timeline
    assert "<script>" not in dom and "\u202e" not in dom
    assert "NaN" not in timeline and "Infinity" not in timeline
    tax = dom.split('<section id="opstax">')[1].split("</section>")[0]
    assert "$0.7600 of $1.5000 (50.7%)" in tax and '<tr class="tax-boot">' in tax

    screenshot(page, tmp_path, "timeline", 1600)
