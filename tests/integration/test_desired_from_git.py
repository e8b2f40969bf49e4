"""desired/ read from a commit of a real repository on disk: what the git tree can hold that a loader must refuse.

A blob over the loader's limit is refused from its object header without being read (peak memory is measured in
a child process, against reading the same blob); symlinks inside desired/ and desired/ itself as a symlink (git
mode 120000) are refused; a sweep's ``code`` paths are checked against the commit's tree.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from gitutil import git

from reconciler.adapters.git import GitRepo
from reconciler.desired import MAX_FILE_BYTES, errors_of, load_desired, read_desired_files
from reconciler.errors import DesiredStateInvalid

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BIG = 50 * 1024 * 1024


def fleet_repo(path: Path) -> Path:
    """A repository holding the example desired/ and experiments/, committed once."""
    git(path.parent, "init", "--quiet", "--initial-branch=main", str(path))
    for rel, data in read_desired_files(REPO).items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_bytes(data)
    (path / "experiments").mkdir()
    (path / "experiments" / "train.py").write_text("print('train')\n")
    git(path, "add", ".")
    git(path, "commit", "--quiet", "-m", "desired: example fleet")
    return path


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "--all", ".")
    git(repo, "commit", "--quiet", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def load_errors(repo: Path, commit: str) -> list[str]:
    with pytest.raises(DesiredStateInvalid) as info:
        load_desired(GitRepo(repo).desired_files(commit))
    return [str(e) for e in errors_of(info.value)]


def test_the_example_loads_from_a_commit(tmp_path: Path) -> None:
    repo = fleet_repo(tmp_path / "fleet")
    desired = load_desired(GitRepo(repo).desired_files("HEAD"))
    assert desired.sweeps[0].code_paths == ("experiments",)


_PEAK = textwrap.dedent(
    """
    import json, sys
    from reconciler.adapters.git import GitRepo
    g = GitRepo(sys.argv[1])
    if sys.argv[2] == "desired_files":
        files = g.desired_files("HEAD")
        result = {"refused": files.refused}
    else:
        blob = g._repo.commit("HEAD").tree / "desired/sweeps/big.yaml"
        result = {"read": len(blob.data_stream.read())}
    status = open("/proc/self/status").read().splitlines()
    result["peak_kib"] = int(next(line for line in status if line.startswith("VmHWM:")).split()[1])
    print(json.dumps(result))
    """
)


def _peak(repo: Path, how: str) -> dict[str, object]:
    """Run one read in a fresh process; its peak is VmHWM, not ru_maxrss, which Linux carries over exec from the
    (large) pytest process that started it."""
    out = subprocess.run(
        [sys.executable, "-c", _PEAK, str(repo), how], check=True, capture_output=True, text=True, timeout=300
    ).stdout
    result: dict[str, object] = json.loads(out)
    return result


def test_an_oversized_blob_is_refused_from_its_header_without_being_read(tmp_path: Path) -> None:
    repo = fleet_repo(tmp_path / "fleet")
    (repo / "desired" / "sweeps" / "big.yaml").write_bytes(b"# " + b"x" * (BIG - 3) + b"\n")
    commit = commit_all(repo, "desired: a 50 MB sweep")

    assert load_errors(repo, commit) == [
        f"desired/sweeps/big.yaml: /: file is {BIG} bytes; the limit is {MAX_FILE_BYTES} bytes (256 KiB)"
    ]
    refused = _peak(repo, "desired_files")
    read = _peak(repo, "read")
    assert refused["refused"] == {
        "desired/sweeps/big.yaml": f"file is {BIG} bytes; the limit is {MAX_FILE_BYTES} bytes (256 KiB)"
    }
    assert read["read"] == BIG
    peak_refused, peak_read = int(str(refused["peak_kib"])), int(str(read["peak_kib"]))
    print(f"\npeak RSS: desired_files with a 50 MiB blob {peak_refused} KiB; reading that blob {peak_read} KiB")
    # Reading the blob costs at least its size; refusing it from the header costs none of it.
    assert peak_read - peak_refused > BIG // 1024 // 2


def test_symlinks_in_desired_and_desired_as_a_symlink_are_refused(tmp_path: Path) -> None:
    repo = fleet_repo(tmp_path / "fleet")
    (repo / "desired" / "sweeps" / "linked.yaml").symlink_to("../../experiments/train.py")
    commit = commit_all(repo, "desired: a symlinked sweep")
    assert load_errors(repo, commit) == ["desired/sweeps/linked.yaml: /: symlinks are not allowed in desired/"]

    real = repo / "elsewhere"
    git(repo, "mv", "desired", "elsewhere")
    (repo / "desired").symlink_to("elsewhere")
    commit = commit_all(repo, "desired: now a symlink")
    assert git(repo, "ls-tree", "HEAD", "desired").split()[0] == "120000"
    errors = load_errors(repo, commit)
    assert errors[0] == "desired: /: desired/ is a symlink; it must be a folder in the repository"
    # The working-tree reader refuses it too.
    assert real.is_dir()
    with pytest.raises(DesiredStateInvalid) as info:
        read_desired_files(repo)
    assert [str(e) for e in errors_of(info.value)] == [
        "desired: /: desired/ is a symlink; it must be a folder in the repository"
    ]


def test_code_paths_are_checked_against_the_commit_tree(tmp_path: Path) -> None:
    repo = fleet_repo(tmp_path / "fleet")
    sweep = repo / "desired" / "sweeps" / "tdmpc.yaml"
    sweep.write_text(sweep.read_text().replace("code: [experiments]", "code: [experiments/train.py, ., nope]"))
    commit = commit_all(repo, "desired: ship a folder that is not there")
    assert load_errors(repo, commit) == [
        "desired/sweeps/tdmpc.yaml:6:33: /code/2: code path 'nope' is not in the repository: there is no such file "
        "or folder"
    ]
    # What counts is the commit, not the working tree.
    (repo / "nope").mkdir()
    (repo / "nope" / "x.py").write_text("")
    assert len(load_errors(repo, commit)) == 1
    load_desired(GitRepo(repo).desired_files(commit_all(repo, "add nope/")))


def test_deep_and_crowded_desired_trees_are_refused_from_git_as_from_disk(tmp_path: Path) -> None:
    repo = fleet_repo(tmp_path / "fleet")
    deep = repo / "desired" / "sweeps"
    for _ in range(30):
        deep = deep / "d"
    deep.mkdir(parents=True)
    (deep / "x.yaml").write_text("name: x\n")
    commit = commit_all(repo, "desired: a deep folder")
    with pytest.raises(DesiredStateInvalid) as info:
        read_desired_files(repo)
    from_disk = [str(e) for e in errors_of(info.value)]
    assert from_disk == ["desired/sweeps/d/d/d/d/d/d/d: /: folders nested deeper than 8 levels in desired/"]
    assert load_errors(repo, commit) == from_disk

    git(repo, "rm", "-r", "--quiet", "desired/sweeps/d")
    crowd = repo / "desired" / "crowd"
    crowd.mkdir()
    for i in range(2001):
        (crowd / f"{i}.txt").write_text("")
    commit = commit_all(repo, "desired: 2001 files")
    errors = load_errors(repo, commit)
    assert "desired: /: desired/ holds more than 2000 entries" in errors, errors[:3]


def test_files_at_reads_only_what_is_asked_and_nothing_past_the_limit(tmp_path: Path) -> None:
    """What `rigsync diff` relies on for observed/: only the named snapshots are read, none past its limit."""
    repo = fleet_repo(tmp_path / "fleet")
    (repo / "observed" / "runs").mkdir(parents=True)
    (repo / "observed" / "status.yaml").write_text("x" * 100)
    (repo / "observed" / "fleet.yaml").write_text("small\n")
    (repo / "observed" / "runs" / "2026-12.jsonl").write_text("{}\n" * 1000)
    commit = commit_all(repo, "observe")
    files = GitRepo(repo).files_at(
        commit, "observed/", max_bytes=50, only={"observed/status.yaml", "observed/fleet.yaml"}
    )
    assert dict(files) == {"observed/fleet.yaml": b"small\n"}
    assert files.refused == {"observed/status.yaml": "file is 100 bytes; the limit is 50 bytes (0 KiB)"}
