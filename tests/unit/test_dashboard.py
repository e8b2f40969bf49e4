"""`rigsync dashboard`: one self-contained page from the committed files, through the real console script."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from snapshot_repo import first_archived_run, make_snapshot_repo

from reconciler.views.dashboard import build, default_out

RIGSYNC = Path(sys.executable).parent / "rigsync"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_snapshot_repo(tmp_path_factory.mktemp("dash"))


def rigsync(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(RIGSYNC), *args], capture_output=True, text=True, timeout=120, env=env)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def test_out_writes_one_self_contained_page_without_credentials(repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "page.html"
    # no API key, no home with one: the page needs only the files
    result = rigsync("dashboard", "--repo", str(repo), "--out", str(out), env={"PATH": "/usr/bin:/bin",
                                                                               "HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"dashboard: {out.resolve()}") and "file://" in result.stdout
    page = out.read_text()
    assert page == build(repo)  # the same files, the same bytes
    # nothing is fetched: no scripts, no stylesheets, no images from anywhere; the only URL is SVG's namespace
    assert not re.search(r"<(script|link|img|iframe)\b", page)
    assert set(re.findall(r"https?://[^\s\"'<>)]+", page)) <= {"http://www.w3.org/2000/svg"}
    run = first_archived_run()
    assert str(run["run_id"]) in page  # the committed curve's run names its line
    curves = page.split('<section id="curves">')[1].split("</section>")[0]
    assert curves.count('<polyline class="series"') == 1  # one committed curve; other cells show archived scalars
    assert curves.count('class="cell-chart scalars"') == 3 and curves.count('class="cell-chart curve"') == 1
    assert '<polyline class="series"' in page.split('<section id="spend">')[1].split("</section>")[0]
    assert "lr=0.001 task=walker-walk" in page and '<tr class="sweep-row"><td>tdmpc</td>' in page


def test_default_out_is_inside_git_dir_and_values_are_escaped(repo: Path, tmp_path: Path) -> None:
    result = rigsync("dashboard", "--repo", str(repo))
    assert result.returncode == 0, result.stderr
    assert default_out(repo) == repo / ".git" / "rigsync-dashboard.html" and default_out(repo).is_file()
    status = repo / "observed" / "status.yaml"
    original = status.read_text()
    try:
        status.write_text(original.replace("apply_errors: []", "apply_errors: ['<script>alert(1)</script>']"))
        page = build(repo)
    finally:
        status.write_text(original)
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_bad_arguments_are_one_line_errors(tmp_path: Path) -> None:
    missing = rigsync("dashboard", "--repo", str(tmp_path / "nope"))
    assert missing.returncode == 1 and missing.stderr == f"rigsync: error: {tmp_path / 'nope'}: not a directory\n"
    empty = rigsync("dashboard", "--repo", str(tmp_path))
    assert empty.returncode == 1 and "no desired/ and no observed/ here: not a fleet repository" in empty.stderr
    (tmp_path / "observed").mkdir()
    port = rigsync("dashboard", "--repo", str(tmp_path), "--port", "70000")
    assert port.returncode == 1 and "not a TCP port" in port.stderr


def test_port_serves_the_page_on_loopback(repo: Path) -> None:
    proc = subprocess.Popen([str(RIGSYNC), "dashboard", "--repo", str(repo), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = re.search(r"on (http://127\.0\.0\.1:\d+/) ", line)
        assert m, line + (proc.stderr.read() if proc.stderr and proc.poll() is not None else "")
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback, never through a proxy
        with direct.open(m.group(1), timeout=60) as resp:
            assert resp.status == 200 and resp.headers["Content-Type"] == "text/html; charset=utf-8"
            assert resp.read().decode() == build(repo)
        with pytest.raises(urllib.error.HTTPError) as missing:
            direct.open(m.group(1) + "secrets", timeout=60)
        assert missing.value.code == 404
    finally:
        proc.terminate()
        proc.wait(timeout=60)
