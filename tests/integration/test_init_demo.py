"""``rigsync init DIR`` then ``rigsync demo --repo DIR``: the new fleet repository runs as it is, end to end, on the
emulator (real sshd boxes, a real bare remote), and comes back reviewable: the kept copy's committed observed/
prices the next pull request from the archive."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gitutil import git as _git

pytestmark = pytest.mark.integration

RIGSYNC = str(Path(sys.executable).parent / "rigsync")


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([RIGSYNC, *args], capture_output=True, text=True, timeout=400, env=env)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc


def test_init_then_demo_then_review(tmp_path: Path) -> None:
    fleet = tmp_path / "lab"
    assert _run("init", str(fleet)).returncode == 0
    head = _git(fleet, "rev-parse", "HEAD")
    keep = tmp_path / "kept"
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg-data")}
    proc = _run("demo", "--repo", str(fleet), "--keep", str(keep), "--json", "--timeout", "240", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["runs_total"] == 2 and summary["runs_succeeded"] == 2 and summary["instances_alive"] == 0
    assert _git(fleet, "rev-parse", "HEAD") == head and _git(fleet, "status", "--porcelain") == ""  # untouched

    # a pull request on the kept repository adding a learning rate: priced from what the demo archived
    sweep = keep / "desired" / "sweeps" / "example.yaml"
    sweep.write_text(sweep.read_text().replace("lr: [3.0e-4, 1.0e-3]", "lr: [3.0e-4, 1.0e-3, 3.0e-3]"))
    _git(keep, "commit", "-qam", "one more learning rate")
    review = _run("review", "--repo", str(keep), "--base", "HEAD~1", "--json")
    assert review.returncode == 0, review.stderr
    doc = json.loads(review.stdout)
    assert doc["totals"]["added"] == 1
    est = doc["estimate"]
    # the example sweep counts its work (progress: step): its runtime is its learned rate, from the 2 attempts
    assert est["sweeps"][0]["runtime_source"] == "learned_rate" and est["sweeps"][0]["runtime_samples"] == 2
    assert est["price_source"] == "2 archived attempt(s)" and est["budget"]["fits"] == "yes"
