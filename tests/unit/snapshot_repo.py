"""A fleet repository as a demo left it, cheaply: this repository's desired/ and observed/ (the committed end of a
`rigsync demo` run) copied into a fresh git checkout, plus one learning curve for a run of its archive."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from gitutil import git

from reconciler.core.curves import curve_path, render_curve

ROOT = Path(__file__).resolve().parents[2]


def first_archived_run() -> dict[str, object]:
    shard = sorted((ROOT / "observed" / "runs").glob("*.jsonl"))[0]
    line: dict[str, object] = json.loads(shard.read_text().splitlines()[0])
    return line


def make_snapshot_repo(where: Path, *, curve: bool = True) -> Path:
    """``where``/fleet: desired/, experiments/ and observed/ from this repository, committed; with ``curve`` the
    first archived run's curve under observed/curves/ too."""
    repo = where / "fleet"
    for part in ("desired", "experiments", "observed"):
        shutil.copytree(ROOT / part, repo / part, ignore=shutil.ignore_patterns("__pycache__"))
    if curve:
        run = first_archived_run()
        points = [(float(step), 600.0 * (1 - math.exp(-step / 4000))) for step in range(0, 20001, 500)]
        path = repo / curve_path(str(run["sweep"]), str(run["run_id"]), 1)
        path.parent.mkdir(parents=True)
        path.write_text(render_curve(sweep=str(run["sweep"]), run_id=str(run["run_id"]), attempt=1,
                                     key="episode_reward", goal="max", points=points))
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a demo's end")
    return repo
