"""`rigsync demo` end to end, as a user runs it: the real command, the emulator, real sshd boxes, a real git remote.

The demo is the README's main job; these tests hold it to its contract: exit 0 only when every run succeeded
exactly once and nothing is left alive, a JSON summary with the promised fields, a kept repository whose history
a reviewer can read, and no secret anywhere in that history. And the money adds up: the spend rigsync commits in
``observed/budget.yaml`` is what the emulator's ledger billed, and every billed second is in the run archive (the
attempts' costs plus one overhead line per box).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
import yaml
from gitutil import git as _git

from reconciler.adapters.archive import ShardedRunArchive
from reconciler.observed.archive_lines import overhead_to_json, record_to_json

ROOT = Path(__file__).resolve().parents[2]
RIGSYNC = str(Path(sys.executable).parent / "rigsync")
SUMMARY_FIELDS = {
    "runs_total", "runs_succeeded", "runs_failed", "attempts", "instances_rented", "instances_alive", "cost_usd",
    "wall_s",
}


class Demo:
    """``rigsync demo --runs 2 --json --keep DIR`` started now in the background (its output to files, so it never
    waits on a pipe); ``result()`` waits for it."""

    def __init__(self, tmp_path: Path, *extra: str) -> None:
        self.tmp_path = tmp_path
        self.keep = tmp_path / "fleet"
        self.out, self.err = tmp_path / "demo.out", tmp_path / "demo.err"
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(
                [RIGSYNC, "demo", "--runs", "2", "--json", "--keep", str(self.keep), "--timeout", "240", *extra],
                stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                env={**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg-data")},  # the kept harvests, not the user's
            )

    def result(self) -> tuple[dict[str, object], Path, subprocess.CompletedProcess[str]]:
        code = self.proc.wait(timeout=400)
        proc = subprocess.CompletedProcess(self.proc.args, code, self.out.read_text(), self.err.read_text())
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
        assert len(lines) == 1, f"--json prints exactly one JSON object on stdout, got: {proc.stdout[-2000:]}"
        return json.loads(lines[0]), self.keep, proc

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # the demo destroys what it rented on its way out
            self.proc.wait(timeout=120)


@pytest.fixture(scope="module")
def demos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Demo]]:
    """Both demos of this module, started together: each is a process of its own (its own emulator, boxes and
    repository) that spends most of its time waiting on its runs, so they share the machine's time."""
    started = {
        "plain": Demo(tmp_path_factory.mktemp("demo")),
        "chaos": Demo(tmp_path_factory.mktemp("demo-chaos"), "--chaos"),
    }
    yield started
    for demo in started.values():
        demo.stop()


def _assert_the_money_adds_up(summary: dict[str, object], keep: Path) -> None:
    """budget.yaml's billed total and the archive (attempts + overhead lines) both match the emulator's ledger."""
    ledger = float(summary["cost_usd"])  # type: ignore[arg-type]
    tolerance = 0.01 * ledger + 0.0001
    spend = yaml.safe_load((keep / "observed" / "budget.yaml").read_text())["spend"]
    assert spend["source"] == "billed" and spend["fleet_dph"] == 0.0
    assert abs(spend["total_usd"] - ledger) <= tolerance, (spend, ledger)
    assert spend["credit_usd"] == pytest.approx(1000.0 - ledger, abs=0.01)
    archive = ShardedRunArchive(keep)
    attempts, overheads = list(archive.records()), list(archive.overheads())
    attributed = sum(r.cost_usd for r in attempts) + sum(o.cost_usd for o in overheads)
    assert abs(attributed - ledger) <= tolerance, (attributed, ledger)
    assert len(overheads) == summary["instances_rented"] == len({o.instance_id for o in overheads})
    schema = json.loads((ROOT / "schemas" / "archive-record.schema.json").read_text())
    for o in overheads:
        assert not o.estimated and o.billed_usd > 0
        jsonschema.validate(json.loads(overhead_to_json(o)), schema)


def _events(keep: Path, commit: str) -> list[str]:
    """What ``commit`` changed in the fleet's record, read from its diff: boxes in or out of fleet.yaml, attempts
    entering runs.yaml's in_flight, lines appended to the archive (finished attempts, closed box bills)."""
    def at(rev: str, path: str) -> dict[str, object]:
        proc = subprocess.run(["git", "-C", str(keep), "show", f"{rev}:{path}"], capture_output=True, text=True)
        return (yaml.safe_load(proc.stdout) or {}) if proc.returncode == 0 else {}

    events: list[str] = []
    boxes = [{b["id"] for b in at(rev, "observed/fleet.yaml").get("boxes") or []} for rev in (f"{commit}~1", commit)]  # type: ignore[attr-defined]
    events += [f"rented {i}" for i in boxes[1] - boxes[0]] + [f"ended {i}" for i in boxes[0] - boxes[1]]
    flights = [{(f["run_id"], f["attempt"]) for f in at(rev, "observed/runs.yaml").get("in_flight") or []}  # type: ignore[attr-defined]
               for rev in (f"{commit}~1", commit)]
    events += [f"launched {r}.{a}" for r, a in flights[1] - flights[0]]
    diff = _git(keep, "show", "--format=", "--unified=0", commit, "--", "observed/runs/")
    events += [f"archived {line[1:80]}" for line in diff.splitlines() if line.startswith("+{")]
    return events


def _assert_one_commit_per_change(keep: Path, summary: dict[str, object]) -> None:
    """The history reads like a lab notebook: no lease commits on main, every rigsync commit records a rent, a
    destroy, a launch or a finish (and its message names it), and there is at most one per cycle that did so."""
    commits = _git(keep, "log", "--format=%H|%an|%s", "main").splitlines()
    ours = [(sha, subject) for sha, author, subject in (c.split("|", 2) for c in commits) if author == "rigsync"]
    assert ours and not [s for _, s in ours if s.startswith("lease")], ours
    for sha, subject in ours:
        events = _events(keep, sha)
        assert events, f"commit {sha[:10]} {subject!r} records no rent, destroy, launch or finish"
        assert re.search(r"rented|destroyed|gone|launched|succeeded|failed|lost|closed", subject), subject
    assert len(ours) == summary["commits"]
    assert len(ours) <= int(summary["acting_cycles"]) < int(summary["cycles"]), summary  # type: ignore[call-overload]
    lease = _git(keep.parent / "fleet.remote.git", "for-each-ref", "--format=%(refname)", "refs/heads/rigsync/")
    assert lease.strip() == "", f"the demo releases its lease (a ref of its own, never on main): {lease}"


@pytest.mark.integration
def test_demo_runs_the_sweep_to_completion_and_leaves_a_readable_history(demos: dict[str, Demo]) -> None:
    summary, keep, proc = demos["plain"].result()
    tmp_path = demos["plain"].tmp_path
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary.keys() >= SUMMARY_FIELDS
    assert summary["ok"] is True
    assert summary["runs_total"] == summary["runs_succeeded"] and int(summary["runs_total"]) >= 4  # type: ignore[call-overload]
    assert summary["runs_failed"] == 0
    assert summary["instances_alive"] == 0
    assert float(summary["cost_usd"]) > 0  # type: ignore[arg-type]

    archive = list(ShardedRunArchive(keep).records())
    succeeded = [r.run_id for r in archive if r.phase.value == "succeeded"]
    assert len(succeeded) == len(set(succeeded)) == summary["runs_succeeded"]
    assert all(r.code_commit and r.desired_commit for r in archive), "every attempt pins its commits"

    schema = json.loads((ROOT / "schemas" / "archive-record.schema.json").read_text())
    for rec in archive:
        jsonschema.validate(json.loads(record_to_json(rec)), schema)

    log = _git(keep, "log", "--format=%an|%s")
    authors = {line.split("|", 1)[0] for line in log.splitlines()}
    assert "rigsync" in authors and "demo researcher" in authors
    assert re.search(r"^rigsync\|tdmpc: \d+ launched on \d+ box", log, re.M), log
    assert re.search(r"^rigsync\|rented \d+ .+ \$\d+\.\d\d/h.*: \d+ runs? pending", log, re.M), log
    assert re.search(r"^rigsync\|.*destroyed \d+: ", log, re.M), log
    _assert_one_commit_per_change(keep, summary)
    assert (keep.parent / "fleet.remote.git").is_dir(), "the bare remote is kept beside the repo"
    assert _git(keep, "status", "--porcelain") == ""
    _assert_the_money_adds_up(summary, keep)

    # What the demo says to try next works: a finished run's output, from the harvested store, by the console script.
    command = summary["logs_command"]
    assert isinstance(command, str) and command.startswith("rigsync logs "), summary
    logs = subprocess.run([RIGSYNC, *shlex.split(command)[1:]], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg-data")})
    assert logs.returncode == 0, logs.stderr
    assert "training " in logs.stdout and "episode_reward" in logs.stdout, logs.stdout[-2000:]
    curves = list((keep / "observed" / "curves").rglob("*.json"))
    assert len(curves) >= int(summary["runs_succeeded"]), "a learning curve per finished attempt is in observed/"  # type: ignore[call-overload]
    # STATUS.md was committed with the observed files, and the demo ends with its dashboard page
    status_md = (keep / "observed" / "STATUS.md").read_text()
    assert "## Queue" in status_md and f"| tdmpc | 0 | 0 | {summary['runs_succeeded']} |" in status_md
    page = Path(str(summary["dashboard"]))
    assert page == keep / ".git" / "rigsync-dashboard.html" and 'class="cell-chart curve"' in page.read_text()
    assert f"dashboard: {page}" in proc.stderr  # --json: the summary on stdout, what to open on stderr

    history = _git(keep, "log", "-p", "--all")
    assert "PRIVATE KEY" not in history
    assert not re.search(r"\b[0-9a-f]{64}\b", history), "something shaped like the emulator's API key was committed"


@pytest.mark.integration
def test_demo_chaos_still_finishes_every_run_exactly_once(demos: dict[str, Demo]) -> None:
    summary, keep, proc = demos["chaos"].result()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary["ok"] is True
    chaos = summary["chaos"]
    assert isinstance(chaos, list) and any("vanished" in c for c in chaos) and any("hung" in c for c in chaos)
    assert summary["duplicate_successes"] == 0
    assert summary["instances_alive"] == 0
    assert int(summary["runs_resumed"]) >= 1, "the vanished run resumed from its checkpoint"  # type: ignore[call-overload]
    archive = list(ShardedRunArchive(keep).records())
    resumed = [r for r in archive if r.resumed_from is not None and r.phase.value == "succeeded"]
    assert resumed and all(any(x.run_id == r.run_id and x.attempt == r.resumed_from for x in archive) for r in resumed)
    for r in resumed:  # its curve, committed under observed/curves/, says so and starts past step 1000
        path = keep / "observed" / "curves" / r.sweep / f"{r.run_id}.{r.attempt}.json"
        assert path.is_file(), f"no curve for resumed attempt {r.run_id}.{r.attempt} (harvest {r.harvest})"
        curve = json.loads(path.read_text())
        assert curve["resumed_from"] == r.resumed_from and curve["points"][0][0] > 1000
    lost = [r for r in archive if r.phase.value == "lost"]
    assert lost, "the vanished box's run was archived as lost"
    for rec in lost:
        later = [r for r in archive if r.run_id == rec.run_id and r.phase.value == "succeeded"]
        assert len(later) == 1 and later[0].attempt > rec.attempt and later[0].instance_id != rec.instance_id
    _assert_the_money_adds_up(summary, keep)
