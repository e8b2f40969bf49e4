"""``rigsync init DIR`` as a user runs it (the real console script): a fleet repository that validates, reviews and
never loses a file of the user's."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from gitutil import git as _git

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
RIGSYNC = BIN / "rigsync"


def rigsync(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(RIGSYNC), *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    return proc


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("init") / "lab-fleet"
    proc = rigsync("init", str(target))
    assert proc.returncode == 0, proc.stderr
    return target


def test_init_makes_a_committed_repository(fleet: Path) -> None:
    files = set(_git(fleet, "ls-files").splitlines())
    assert files == {
        ".github/workflows/review.yml", ".github/workflows/rigsync-run.yml", ".gitignore", ".pre-commit-config.yaml",
        "desired/bootstrap.sh", "desired/budget.yaml", "desired/fleet.yaml", "desired/sweeps/example.yaml",
        "experiments/train.py", "schemas/budget.schema.json", "schemas/fleet.schema.json", "schemas/sweep.schema.json",
    }
    assert _git(fleet, "status", "--porcelain") == ""
    assert _git(fleet, "rev-list", "--count", "HEAD") == "1"
    assert yaml.safe_load((fleet / "desired" / "fleet.yaml").read_text())["name"] == "lab-fleet"
    assert (fleet / "desired" / "bootstrap.sh").stat().st_mode & 0o111
    # the stand-in script is the one the demo runs from this repository (one copy kept in step with the other)
    assert (fleet / "experiments" / "train.py").read_bytes() == (ROOT / "experiments" / "train.py").read_bytes()


def test_init_repository_validates_and_reviews(fleet: Path) -> None:
    proc = rigsync("validate", "--repo", str(fleet))
    assert proc.returncode == 0, proc.stdout
    assert "fleet 'lab-fleet'" in proc.stdout and "2 run(s)" in proc.stdout
    review = rigsync("review", "--repo", str(fleet), "--base", "HEAD")
    assert review.returncode == 0 and review.stdout.startswith("+0 run(s), -0, 0 changed")


def test_schema_lines_find_the_schemas(fleet: Path) -> None:
    for f in sorted((fleet / "desired").rglob("*.yaml")):
        m = re.search(r"\$schema=(\S+)", f.read_text())
        assert m, f
        assert (f.parent / m.group(1)).resolve().is_file(), f
    for name in ("fleet", "budget", "sweep"):
        assert (fleet / "schemas" / f"{name}.schema.json").read_bytes() == (
            ROOT / "schemas" / f"{name}.schema.json"
        ).read_bytes()


def test_pre_commit_hook_is_published_and_used(fleet: Path) -> None:
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    hook = next(h for h in hooks if h["id"] == "rigsync-validate")
    config = yaml.safe_load((fleet / ".pre-commit-config.yaml").read_text())
    used = [h["id"] for repo in config["repos"] for h in repo["hooks"]]
    assert used == ["rigsync-validate"]
    assert config["repos"][0]["rev"].startswith("v") and "@" not in config["repos"][0]["repo"]
    assert re.search(hook["files"], "desired/sweeps/example.yaml") and not hook["pass_filenames"]
    # pre-commit runs the entry from the repository root with the hook's environment on PATH
    entry = shlex.split(hook["entry"])
    assert entry[0] == "rigsync"
    ok = subprocess.run([str(BIN / entry[0]), *entry[1:]], cwd=fleet, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout
    (fleet / "desired" / "budget.yaml").write_text("max_total_usd: lots\n")
    try:
        bad = subprocess.run([str(BIN / entry[0]), *entry[1:]], cwd=fleet, capture_output=True, text=True)
        assert bad.returncode == 1 and "desired/budget.yaml:1:" in bad.stdout
    finally:
        _git(fleet, "checkout", "--", "desired/budget.yaml")


def test_init_refuses_a_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine\n")
    proc = rigsync("init", str(tmp_path))
    assert proc.returncode == 1
    assert "not empty" in proc.stderr and "--force" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_force_adds_missing_files_and_never_overwrites(tmp_path: Path) -> None:
    (tmp_path / "desired").mkdir()
    (tmp_path / "desired" / "budget.yaml").write_text("max_total_usd: 1\n")
    (tmp_path / "notes.txt").write_text("mine\n")
    proc = rigsync("init", str(tmp_path), "--force")
    assert proc.returncode == 1
    assert proc.stderr.strip().endswith("desired/budget.yaml")
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "desired", "desired/budget.yaml", "notes.txt",
    ]  # nothing was written
    (tmp_path / "desired" / "budget.yaml").unlink()
    _git(tmp_path, "init", "-q")
    proc = rigsync("init", str(tmp_path), "--force", "--name", "mine")
    assert proc.returncode == 0, proc.stderr
    assert "review the new files and commit them" in proc.stdout  # an existing repository: no commit made
    assert (tmp_path / "notes.txt").read_text() == "mine\n"
    assert "name: mine" in (tmp_path / "desired" / "fleet.yaml").read_text()
    again = rigsync("init", str(tmp_path), "--force", "--name", "mine")
    assert again.returncode == 0 and "wrote" not in again.stdout and "kept" in again.stdout


def test_bad_name_is_refused(tmp_path: Path) -> None:
    proc = rigsync("init", str(tmp_path / "x"), "--name", "Not OK")
    assert proc.returncode == 1 and "--name 'Not OK'" in proc.stderr
    assert not (tmp_path / "x").exists()
