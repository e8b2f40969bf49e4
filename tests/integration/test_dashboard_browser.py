"""The dashboard in a real browser: Debian's headless Chromium (installed by the README's setup command).

The page is made by the console script from a demo's committed files (``snapshot_repo``), then loaded by
``chromium --headless``: its DOM after load must show the demo's runs and a learning curve, its console must stay
silent (the page has no scripts: any console line is an error, e.g. a resource it tried to fetch), and a
screenshot is written to the test's tmp_path (its path is printed: ``pytest -s`` shows it).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from snapshot_repo import first_archived_run, make_snapshot_repo

pytestmark = pytest.mark.integration

RIGSYNC = Path(sys.executable).parent / "rigsync"


def chromium(profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("chromium")
    assert binary, "chromium is not installed: run the README's setup command (apt-get install chromium)"
    return subprocess.run(
        [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", f"--user-data-dir={profile}",
         "--enable-logging=stderr", "--v=0", *args],
        capture_output=True, text=True, timeout=120,
    )


def console_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def dashboard_dom(repo: Path, tmp_path: Path) -> tuple[Path, str]:
    """The page ``rigsync dashboard`` makes of ``repo`` (in ``tmp_path``) and its DOM after load in headless
    Chromium, whose console stayed silent (the page has no scripts: any console line is an error)."""
    page = tmp_path / "dashboard.html"
    made = subprocess.run([str(RIGSYNC), "dashboard", "--repo", str(repo), "--out", str(page)],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    loaded = chromium(tmp_path / "profile", "--dump-dom", page.as_uri())
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert console_lines(loaded.stderr) == []
    return page, loaded.stdout


def screenshot(page: Path, tmp_path: Path, name: str, height: int) -> Path:
    """A 1280-wide PNG of ``page`` in ``tmp_path`` (its console silent too); its path is printed (``pytest -s``)."""
    shot = tmp_path / f"{name}.png"
    taken = chromium(tmp_path / "profile", f"--screenshot={shot}", f"--window-size=1280,{height}", page.as_uri())
    assert taken.returncode == 0, taken.stderr[-2000:]
    assert console_lines(taken.stderr) == []
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"\n{name} screenshot: {shot}")
    return shot


def test_the_page_loads_clean_and_shows_the_runs_and_a_curve(tmp_path: Path) -> None:
    page, dom = dashboard_dom(make_snapshot_repo(tmp_path), tmp_path)
    assert '<h1>Fleet <span id="fleet-name">demo</span></h1>' in dom
    assert "<td>tdmpc</td>" in dom and "20</td>" in dom  # the demo's 20 runs, by phase
    curves = dom.split('<section id="curves">')[1].split("</section>")[0]
    assert 'class="cell-chart curve"' in curves and "<polyline" in curves
    assert str(first_archived_run()["run_id"]) in curves

    assert screenshot(page, tmp_path, "dashboard", 2400).stat().st_size > 20_000


def test_a_console_error_would_be_seen(tmp_path: Path) -> None:
    """The check above can fail: the same browser run on a page that logs an error reports it."""
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><body><p>x</p><script>console.error('broken page')</script></body></html>")
    loaded = chromium(tmp_path / "profile", "--dump-dom", bad.as_uri())
    assert any("broken page" in line for line in console_lines(loaded.stderr)), loaded.stderr[-2000:]


def test_a_hostile_stderr_and_a_nan_curve_load_clean_and_show_escapes(tmp_path: Path) -> None:
    """The page of a repository holding a failed attempt's stderr with ESC, C1, BEL and bidi characters and a curve
    with NaN/Infinity points (``test_dashboard_hostile``): it loads with a silent console, the browser's DOM shows
    the escapes in the stderr block, and the curve's polyline has finite coordinates only."""
    from test_dashboard_hostile import _hostile_repo

    _, dom = dashboard_dom(_hostile_repo(tmp_path), tmp_path)
    pre = dom.split('<section id="failures">')[1].split("<pre>")[1].split("</pre>")[0]
    assert "\\x1b[31mred" in pre and "\\u202eevil" in pre and "\\x07" in pre and "&lt;b&gt;bold" in pre
    assert "\x1b" not in dom and "\u202e" not in dom and "\x07" not in dom
    curves = dom.split('<section id="curves">')[1].split("</section>")[0]
    assert "<polyline" in curves and "NaN" not in curves and "Infinity" not in curves
