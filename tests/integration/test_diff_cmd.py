"""``rigsync diff`` on a committed fixture repository: the real CLI, a real git checkout, no provider."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from gitutil import git

from reconciler.adapters.git import GitRepo
from reconciler.core.actions import Destroy, Plan, ReasonCode
from reconciler.core.model import (
    AttemptOutcome,
    AttemptRecord,
    BoxProbe,
    Drift,
    DriftClass,
    FleetMemory,
    InFlight,
    Instance,
    InstanceStatus,
    Observed,
    RunDirState,
)
from reconciler.desired import load_desired_from_dir
from reconciler.observed.documents import ReconcilerStatus, render_observed
from reconciler.observed.observed_tree import read_observed
from reconciler.observed.summary import describe_change

pytestmark = pytest.mark.integration

ROOT = Path(__file__).parents[2]
T0 = dt.datetime(2026, 11, 3, 12, 0, tzinfo=dt.UTC).timestamp()
ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "Human",
    "GIT_AUTHOR_EMAIL": "human@example.test",
    "GIT_COMMITTER_NAME": "Human",
    "GIT_COMMITTER_EMAIL": "human@example.test",
    "VAST_API_KEY": "",
}


def rigsync(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reconciler", *args], env=ENV, capture_output=True, text=True, check=False
    )


@pytest.fixture()
def fleet_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "fleet"
    repo.mkdir()
    git(repo, "init", "--quiet", "--initial-branch=main")
    shutil.copytree(ROOT / "desired", repo / "desired")
    # The sweep ships code: [experiments]; the loader checks that path exists in the commit.
    shutil.copytree(ROOT / "experiments", repo / "experiments", ignore=shutil.ignore_patterns("__pycache__"))
    git(repo, "add", ".")
    git(repo, "commit", "--quiet", "-m", "desired: demo fleet")
    head = git(repo, "rev-parse", "HEAD")
    desired = replace(load_desired_from_dir(repo), commit=head)
    base = [r for r in desired.runs if r.promotion_threshold is None]
    observed = Observed(
        instances=(
            Instance(11, "rigsync:demo:a1", InstanceStatus.RUNNING, "RTX 3060", 1, 12288, 0.1, T0 - 3600),
            Instance(12, "rigsync:demo:a2", InstanceStatus.STOPPED, "RTX 3060", 1, 12288, 0.11, T0 - 3600),
            Instance(99, "someone-else", InstanceStatus.RUNNING, "RTX 4090", 1, 24564, 0.4, T0 - 60),
        ),
        probes=(
            BoxProbe(
                11,
                True,
                runs=(RunDirState(base[1].id, 1, (0,), True, T0 - 60, 1.0, None),),
            ),
        ),
        history=(
            AttemptRecord(base[0].id, 1, "tdmpc", AttemptOutcome.SUCCEEDED, best_metric=100.0, ended_at=T0 - 10),
            *(
                AttemptRecord(base[2].id, a, "tdmpc", AttemptOutcome.FAILED, exit_code=1, ended_at=T0 - 5)
                for a in (1, 2, 3)
            ),
        ),
        # the attempt the box shows running is this fleet's launch (only launched attempts count)
        memory=FleetMemory(in_flight=(InFlight(base[1].id, 1, 11, (0,), T0 - 60, sweep="tdmpc"),)),
        fleet_name="demo",
    )
    plan = Plan(
        actions=(Destroy(reason="outbid", code=ReasonCode.PROVIDER_STOPPED, instance_id=12),),
        drift=(
            Drift(DriftClass.OUTBID, "instance/12", "provider stopped the box", "destroy instance/12"),
            Drift(DriftClass.FOREIGN, "instance/99", "no rigsync label for fleet demo", "none"),
        ),
    )
    files = render_observed(
        desired=desired,
        observed=observed,
        plan=plan,
        status=ReconcilerStatus(desired_commit_applied=head, last_valid_desired_commit=head, holder="h"),
        now=T0,
    )
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "add", "observed")
    git(repo, "commit", "--quiet", "-m", "observe: fixture")
    return repo


def test_diff_json_on_a_committed_repo(fleet_repo: Path) -> None:
    proc = rigsync("diff", "--repo", str(fleet_repo), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    first = git(fleet_repo, "rev-parse", "HEAD~1")  # HEAD is the observe commit
    assert set(doc) == {
        "desired_commit", "observed_desired_commit", "sweeps", "fleet", "drift", "price", "budget_warnings",
        "blocked",
    }
    assert doc["desired_commit"] == first and doc["observed_desired_commit"] == first
    # 12 base runs (4 cells x 3 seeds): 1 done, 1 running, 1 failed (3 attempts > 2 retries), 9 pending.
    # Promotion seeds are not wanted yet.
    assert doc["sweeps"] == {"tdmpc": {"pending": 9, "running": 1, "done": 1, "failed": 1, "total": 12}}
    assert doc["fleet"] == {"wanted_max": 3, "wanted_min": 0, "held": 2, "dph": 0.21}
    assert doc["drift"] == [
        {
            "class": "outbid",
            "subject": "instance/12",
            "detail": "provider stopped the box",
            "action": "destroy instance/12",
        },
        {"class": "foreign", "subject": "instance/99", "detail": "no rigsync label for fleet demo", "action": "none"},
    ]


def test_diff_text(fleet_repo: Path) -> None:
    proc = rigsync("diff", "--repo", str(fleet_repo))
    assert proc.returncode == 0, proc.stderr
    assert "fleet: 2 held, wanted 0..3" in proc.stdout
    assert "sweep tdmpc: 1/12 done, 1 running, 9 pending, 1 failed" in proc.stdout
    assert "outbid" in proc.stdout and "destroy instance/12" in proc.stdout


def test_diff_reads_commits_not_the_working_tree(fleet_repo: Path) -> None:
    (fleet_repo / "desired" / "fleet.yaml").write_text("this: [is not valid\n")
    (fleet_repo / "observed" / "drift.yaml").write_text("garbage: [\n")
    proc = rigsync("diff", "--repo", str(fleet_repo), "--json")
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["drift"]) == 2


def test_invalid_desired_commit_exits_1_with_file_and_line(fleet_repo: Path) -> None:
    text = (fleet_repo / "desired" / "fleet.yaml").read_text().replace("  max: 3", "  max: lots")
    (fleet_repo / "desired" / "fleet.yaml").write_text(text)
    git(fleet_repo, "commit", "--quiet", "-am", "desired: typo")
    proc = rigsync("diff", "--repo", str(fleet_repo), "--json")
    assert proc.returncode == 1
    assert "desired/fleet.yaml:" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_missing_or_malformed_observed_exits_1(fleet_repo: Path) -> None:
    (fleet_repo / "observed" / "runs.yaml").write_text("format_version: 1\nsweeps: 3\n")
    git(fleet_repo, "commit", "--quiet", "-am", "break runs.yaml")
    proc = rigsync("diff", "--repo", str(fleet_repo))
    assert proc.returncode == 1
    assert "observed/runs.yaml: /" in proc.stderr and "Traceback" not in proc.stderr
    git(fleet_repo, "rm", "--quiet", "-r", "observed")
    git(fleet_repo, "commit", "--quiet", "-m", "drop observed")
    proc = rigsync("diff", "--repo", str(fleet_repo))
    assert proc.returncode == 1
    assert "not committed" in proc.stderr and "Traceback" not in proc.stderr


def test_rigsyncs_own_commits_after_the_desired_one_are_not_a_new_desired_revision(fleet_repo: Path) -> None:
    """As in any repository `rigsync run` works in: observe commits on top of the desired commit."""
    desired_sha = git(fleet_repo, "rev-parse", "HEAD~1")
    g = GitRepo(fleet_repo)
    assert g.commit_observed({"observed/drift.yaml": "drift: []\n"}, {}, "drift: none") is not None
    previous = read_observed(fleet_repo)
    status = ReconcilerStatus(desired_commit_applied=desired_sha, last_valid_desired_commit=desired_sha, holder="h")
    quiet = render_observed(
        desired=replace(load_desired_from_dir(fleet_repo), commit=desired_sha),
        observed=Observed(fleet_name="demo"),
        plan=Plan(actions=()),
        status=status,
        now=T0 + 60,
        previous=previous,
    )
    assert g.commit_observed(quiet, {}, describe_change(previous, quiet) or "first observation") is not None
    assert git(fleet_repo, "log", "-2", "--format=%an") == "rigsync\nrigsync"
    assert git(fleet_repo, "rev-parse", "HEAD") != desired_sha

    text = rigsync("diff", "--repo", str(fleet_repo))
    assert text.returncode == 0, text.stderr
    assert f"desired  {desired_sha}" in text.stdout
    assert "observed before the newest desired commit" not in text.stdout, text.stdout
    doc = json.loads(rigsync("diff", "--repo", str(fleet_repo), "--json").stdout)
    assert doc["desired_commit"] == desired_sha == doc["observed_desired_commit"]
    assert doc["fleet"]["held"] == 0 and doc["drift"] == []

    # A human's new desired commit on top: now observed is behind, and diff says so.
    sweep = fleet_repo / "desired" / "sweeps" / "tdmpc.yaml"
    sweep.write_text(sweep.read_text().replace("retries: 2", "retries: 3"))
    git(fleet_repo, "commit", "--quiet", "-am", "desired: one more retry")
    newest = git(fleet_repo, "rev-parse", "HEAD")
    doc = json.loads(rigsync("diff", "--repo", str(fleet_repo), "--json").stdout)
    assert doc["desired_commit"] == newest and doc["observed_desired_commit"] == desired_sha
    assert "observed before the newest desired commit" in rigsync("diff", "--repo", str(fleet_repo)).stdout
