"""Every GitHub workflow validates against the GitHub workflow schema offline; CI runs the README commands."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def test_there_are_workflows() -> None:
    assert {p.name for p in WORKFLOWS} >= {"ci.yml", "plan.yml"}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_validates_offline(path: Path) -> None:
    exe = Path(sys.executable).parent / "check-jsonschema"
    proc = subprocess.run(
        [str(exe), "--builtin-schema", "vendor.github-workflows", str(path)], capture_output=True, text=True
    )
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
