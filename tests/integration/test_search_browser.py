"""A search on the dashboard in a real browser (Debian's headless Chromium, as ``test_dashboard_browser``).

The page is made by the console script from a hand-made checkout of a searched sweep
(``test_views_search.search_repo``: a random search in desired/, lr log_uniform; configurations with two seeds, a
failed attempt whose metric must not count, two runs stopped early at their rungs, one committed curve per run),
then loaded by ``chromium --headless``: its DOM after load ranks the configurations by the mean of their seeds with
their spread, lists the runs stopped early with their rung, draws one scatter per parameter (lr on a log axis) and
one band (not one line per seed) per configuration's curves, and its console stays silent.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from test_dashboard_browser import dashboard_dom, screenshot
from test_views_search import search_repo

pytestmark = pytest.mark.integration


def test_the_search_shows_configurations_by_objective_stopped_runs_scatters_and_bands(tmp_path: Path) -> None:
    page, dom = dashboard_dom(search_repo(tmp_path, desired=True), tmp_path)

    search = dom.split('<section id="search">')[1].split("</section>")[0]
    assert '<div class="search" data-sweep="tune">' in search
    rows = re.findall(r'<tr class="config"><td class="num">(\d+)</td><td>([^<]*)</td><td class="num mean">([^<]*)'
                      r'</td>\s*<td class="num std">([^<]*)</td><td class="num">([^<]*)</td>', search)
    assert [(cfg, mean, std, seeds) for _, cfg, mean, std, seeds in rows[:3]] == [
        ("lr=0.001 opt=adam", "650", "50", "2 / 2"),
        ("lr=0.01 opt=adam", "410", "10", "2 / 2"),  # the failed attempt's 900 is not a seed's metric
        ("lr=0.0001 opt=sgd", "300", "0", "1 / 1"),
    ]
    stopped = re.findall(r'<tr class="stopped-run" data-rung="([^"]*)"><td>([^<]*)</td>', search)
    assert stopped == [("3", "c1.1"), ("9", "c2.1")]
    scatters = re.findall(r'<figure class="param-chart" data-param="([^"]*)" data-log="(yes|no)">(.*?)</figure>',
                          search, re.S)
    assert [(p, log) for p, log, _ in scatters] == [("lr", "yes"), ("opt", "no")]  # lr is log_uniform
    # the three configurations with an objective, and apart from them the two runs stopped early at their stop
    assert all(body.count("<circle") == 5 and "2 run(s) stopped early: metric at the stop" in body
               for _, _, body in scatters)
    assert ">adam<" in scatters[1][2] and ">sgd<" in scatters[1][2]  # categories named on their axis

    curves = dom.split('<section id="curves">')[1].split("</section>")[0]
    bands = re.findall(r'<figure class="cell-chart curve"[^>]*>(.*?)</figure>', curves, re.S)
    assert len(bands) == 4
    assert all(b.count('<polygon class="spread"') == 1 and b.count("<polyline") == 1 for b in bands)
    assert "NaN" not in dom and "Infinity" not in dom
    failures = dom.split('<section id="failures">')[1].split("</section>")[0]
    assert "b2 attempt 1" in failures and "c1 attempt" not in failures  # stopped early is not a failure

    screenshot(page, tmp_path, "search", 3200)
