"""The adversary corpus's own checks can fail: each is shown a bad case and a good one (tests/adversary/checks.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from adversary import checks
from gitutil import git


def _remote_with(tmp: Path, files: dict[str, str]) -> Path:
    work, remote = tmp / "w", tmp / "r.git"
    git(tmp, "init", "-q", "--bare", "-b", "main", str(remote))
    git(tmp, "init", "-q", "-b", "main", str(work))
    for rel, text in files.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@x",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@x",
    }
    subprocess.run(["git", "add", "-A"], cwd=work, check=True)
    subprocess.run(["git", "commit", "-qm", "x"], cwd=work, check=True, env=env)
    subprocess.run(["git", "push", "-q", str(remote), "main"], cwd=work, check=True)
    return remote


def test_strict_observed_passes_strict_text(tmp_path: Path) -> None:
    remote = _remote_with(
        tmp_path,
        {
            "observed/status.yaml": "a: 1.5\nb: [x, y]\n",
            "observed/curves/a.json": '{"points": [[1, 2.0]]}',
            "observed/runs/2026-01.jsonl": '{"best_metric": 3}\n',
            "observed/STATUS.md": "# ok\n\tfine\n",
        },
    )
    assert checks.strict_observed(remote, ["/nowhere/data"]) == []


def test_strict_observed_names_every_kind_of_problem(tmp_path: Path) -> None:
    remote = _remote_with(
        tmp_path,
        {
            "observed/curves/a.json": '{"points": [[1, NaN]]}',
            "observed/runs/2026-01.jsonl": '{"best_metric": Infinity}\n',
            "observed/fleet.yaml": "x: .nan\ny: -.inf\n",
            "observed/STATUS.md": "red \x1b[31m and \u202e\n",
            "observed/hosts.yaml": "note: harvest failed under /srv/data/fleet\n",
            "observed/big.yaml": "x: " + "a" * (checks.MAX_OBSERVED_BYTES + 1) + "\n",
        },
    )
    problems = "\n".join(checks.strict_observed(remote, ["/srv/data"]))
    for name in ("curves/a.json", "runs/2026-01.jsonl", "fleet.yaml", "STATUS.md", "hosts.yaml", "big.yaml"):
        assert f"observed/{name}" in problems, problems
    assert "U+001B" in problems and "controller path /srv/data" in problems, problems


def test_repeated_failures_are_those_of_two_cycles_running() -> None:
    log = "\n".join(
        [
            "WARNING rigsync.apply: requeue run/a.1 failed: exit -1: ",
            "cycle: desired x; 1 requeue; 1 failed; no commit; 1.0s",
            "WARNING rigsync.apply: requeue run/a.1 failed: exit -1: ",
            "WARNING rigsync.apply: rent offer/1 failed: 404",
            "cycle: desired x; 1 requeue; 1 failed; no commit; 1.0s",
            "WARNING rigsync.apply: rent offer/2 failed: 404",
            "cycle: desired x; no changes; no commit; 1.0s",
        ]
    )
    assert checks.repeated_failures(log) == ["requeue run/a.1 failed: exit -1: "]
    assert len(checks.cycles(log)) == 3


def test_data_dir_problems_finds_escapes_and_special_files(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "run").mkdir(parents=True)
    (data / "run" / "ok.txt").write_text("x")
    os.symlink("ok.txt", data / "run" / "inside")
    assert checks.data_dir_problems(data) == []
    os.symlink("/etc/passwd", data / "run" / "out")
    os.mkfifo(data / "run" / "fifo")
    problems = "\n".join(checks.data_dir_problems(data))
    assert "symlink out of the data dir" in problems and "special file" in problems, problems


def test_page_problems_finds_nan_coordinates_raw_characters_and_paths() -> None:
    good = '<svg><path d="M 1 2 L 3.5 4"/><circle cx="1" cy="2"/></svg><pre>&#27;[31m</pre>'
    assert checks.page_problems(good, ["/srv/data"]) == []
    for bad in (
        '<circle cx="NaN" cy="2"/>',
        '<path d="M 1 2 L NaN 4"/>',
        "<pre>\x1b[31m</pre>",
        "<p>\u202e</p>",
        "<p>/srv/data/x</p>",
    ):
        assert checks.page_problems(bad, ["/srv/data"]), bad
