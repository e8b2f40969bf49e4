"""Every GitHub workflow validates against the GitHub workflow schema offline; CI runs the README commands; the
review workflow's `run:` steps do what they say against a fixture repository with a base and a head commit."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from gitutil import git as _git

from reconciler.plan.review import MARKER

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
# what `rigsync init` writes into a new fleet repository (``dot-`` stands for ``.`` in the package data)
TEMPLATE_WORKFLOWS = sorted((ROOT / "reconciler" / "example" / "fleet" / "dot-github" / "workflows").glob("*.yml"))


def test_there_are_workflows() -> None:
    assert {p.name for p in WORKFLOWS} >= {"ci.yml", "review.yml"}


def test_init_writes_both_workflows() -> None:
    assert {p.name for p in TEMPLATE_WORKFLOWS} == {"review.yml", "rigsync-run.yml"}


@functools.cache
def _check_workflows() -> subprocess.CompletedProcess[str]:
    """One run of check-jsonschema over every workflow (its start-up is most of its cost)."""
    exe = Path(sys.executable).parent / "check-jsonschema"
    return subprocess.run(
        [str(exe), "--builtin-schema", "vendor.github-workflows", *map(str, WORKFLOWS + TEMPLATE_WORKFLOWS)],
        capture_output=True, text=True,
    )


@pytest.mark.parametrize("path", WORKFLOWS + TEMPLATE_WORKFLOWS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_workflow_validates_offline(path: Path) -> None:
    proc = _check_workflows()
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _readme_block(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    m = re.search(rf"^{title}\b[^\n]*\n(?:[^\n]+\n)*\n((?:    .*\n)+)", text, re.M)
    assert m, f"README has no indented {title} block"
    return m.group(1).strip()


def test_ci_runs_exactly_the_readme_commands() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert _readme_block("Setup") in ci
    assert _readme_block("Test") in ci


# The review workflow as this repository runs it, and as `rigsync init` writes it into a new fleet repository.
REVIEW_WORKFLOWS = [
    ROOT / ".github" / "workflows" / "review.yml",
    ROOT / "reconciler" / "example" / "fleet" / "dot-github" / "workflows" / "review.yml",
]
RIGSYNC = Path(sys.executable).parent / "rigsync"


def _fixture(tmp_path: Path, edit: str) -> tuple[Path, str]:
    """A fleet repository: base = this repository's example fleet and observed/, head = base with ``edit``."""
    repo = tmp_path / "fleet"
    repo.mkdir()
    for d in ("desired", "experiments", "observed", "schemas"):
        shutil.copytree(ROOT / d, repo / d, ignore=shutil.ignore_patterns("__pycache__"))
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    base = _git(repo, "rev-parse", "HEAD")
    sweep = repo / "desired" / "sweeps" / "tdmpc.yaml"
    text = sweep.read_text()
    if edit == "add-lr":
        text = text.replace("lr: [3.0e-4, 1.0e-3]", "lr: [3.0e-4, 1.0e-3, 3.0e-3]")
    else:
        text = text.replace("seeds: [1, 2, 3]", "seeds: [1, 2, x]")
    assert text != sweep.read_text()
    sweep.write_text(text)
    _git(repo, "commit", "-qam", "head")
    return repo, base


def _allowed(step: dict[str, Any], failed: bool, outcomes: dict[str, str]) -> bool:
    """The `if:` forms the review workflow uses: `!cancelled()` (run after a failure too) and
    `steps.X.outcome == 'success'`; without `if:`, a step runs only while nothing failed (GitHub's success())."""
    cond = str(step.get("if", "")).removeprefix("${{").removesuffix("}}").strip()
    if not cond:
        return not failed
    for part in (p.strip() for p in cond.split("&&")):
        m = re.fullmatch(r"steps\.(\w+)\.outcome == 'success'", part)
        if m:
            if outcomes.get(m.group(1)) != "success":
                return False
        elif part == "!cancelled()":
            continue
        elif part.startswith("github."):
            return False  # needs the GitHub context (the comment step): not run here
        else:
            raise AssertionError(f"unknown condition {part!r} in the workflow")
    return True


def _run_workflow(workflow: Path, repo: Path, base: str, tmp_path: Path) -> tuple[dict[str, Any], str]:
    job = next(iter(yaml.safe_load(workflow.read_text())["jobs"].values()))
    summary = tmp_path / "summary.md"
    summary.write_text("")
    env = {**os.environ, **{k: str(v) for k, v in job.get("env", {}).items()}}
    env.update(BASE_SHA=base, RIGSYNC=str(RIGSYNC), GITHUB_STEP_SUMMARY=str(summary), GITHUB_WORKSPACE=str(repo))
    outcomes: dict[str, str] = {"install": "success"}  # the console script of this environment stands for it
    results: dict[str, Any] = {}
    failed = False
    for n, step in enumerate(job["steps"]):
        sid = step.get("id", f"step{n}")
        if sid == "install" or not _allowed(step, failed, outcomes):
            continue
        if "run" not in step:
            continue
        proc = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
            cwd=repo, env=env, capture_output=True, text=True, timeout=120,
        )
        assert "Traceback" not in proc.stderr, proc.stderr
        outcomes[sid] = "success" if proc.returncode == 0 else "failure"
        failed = failed or proc.returncode != 0
        results[sid] = proc
    return results, summary.read_text()


def test_init_template_runs_the_same_review_steps() -> None:
    """The steps after installing rigsync are the same in both, so running this repository's covers both."""
    jobs = [next(iter(yaml.safe_load(w.read_text())["jobs"].values())) for w in REVIEW_WORKFLOWS]
    ours, template = ([s for s in job["steps"] if s.get("id") != "install"] for job in jobs)
    assert ours == template
    assert "pip install" in next(s for s in jobs[1]["steps"] if s.get("id") == "install")["run"]


def test_review_workflow_on_a_valid_change(tmp_path: Path) -> None:
    workflow = REVIEW_WORKFLOWS[0]
    repo, base = _fixture(tmp_path, "add-lr")
    steps, summary = _run_workflow(workflow, repo, base, tmp_path)
    assert steps["validate"].returncode == 0, steps["validate"].stdout
    assert "::error" not in steps["validate"].stdout
    assert steps["review"].returncode == 0, steps["review"].stderr
    assert summary.startswith(MARKER)
    assert "+6 run\\(s\\)" in summary  # the headline, markdown-escaped
    assert "fits" in summary and "tdmpc-" in summary
    assert (repo / "rigsync-review.md").read_text() == summary


def test_review_workflow_on_an_invalid_change(tmp_path: Path) -> None:
    workflow = REVIEW_WORKFLOWS[0]
    repo, base = _fixture(tmp_path, "bad-seed")
    steps, summary = _run_workflow(workflow, repo, base, tmp_path)
    assert steps["validate"].returncode == 1
    line = next(i for i, t in enumerate((repo / "desired/sweeps/tdmpc.yaml").read_text().splitlines(), 1) if "x]" in t)
    assert f"::error file=desired/sweeps/tdmpc.yaml,line={line},col=" in steps["validate"].stdout
    assert "'x' is not of type 'integer'" in steps["validate"].stdout
    assert steps["review"].returncode == 0  # ran after the failure, and wrote the summary all the same
    assert summary.startswith(MARKER)
    assert "Validation failed" in summary and "is not of type" in summary


@pytest.mark.parametrize("workflow", REVIEW_WORKFLOWS, ids=["this-repo", "init-template"])
def test_review_workflow_comments_once_and_never_fails_on_a_fork(workflow: Path) -> None:
    job = next(iter(yaml.safe_load(workflow.read_text())["jobs"].values()))
    comment = next(s for s in job["steps"] if "github-script" in str(s.get("uses", "")))
    assert "github.event.pull_request.head.repo.full_name == github.repository" in comment["if"]
    assert comment["continue-on-error"] is True
    script = comment["with"]["script"]
    assert MARKER in script and "updateComment" in script and "createComment" in script
