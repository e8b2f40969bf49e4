"""`rigsync logs --stderr --tail 5` on a 2 GiB log (issue 20): its last 5 lines, on a real sshd box of the emulator.

The run's job makes its stderr.log a sparse 2 GiB file (``truncate -s``, no disk spent) and appends known lines. The
harvest leaves the log behind (over its cap) and says so in the record's note; `logs` then reads the log's tail on
the box (the box reads at most a bounded window of it) instead of printing the empty store copy, and once the box
is gone it says in one line that the log was not harvested and why, exiting 1.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from world import emulator_env, fleet_repo, rigsync

from reconciler.core.model import RunSpec
from reconciler.desired import load_desired_from_dir
from reconciler.emulator import Emulator

FLEET = "itbiglog"
MAX_APPLIES = 40

pytestmark = pytest.mark.integration

SWEEP = """\
name: tdmpc
code: [experiments]
command: >-
  echo first >&2; truncate -s 2G {{ run_dir }}/stderr.log;
  for i in 1 2 3 4 5 6 7; do echo "tail line $i" >> {{ run_dir }}/stderr.log; done; echo done {{ task }}
grid:
  task: [walker-walk]
seeds: [1]
max_runtime: 5m
"""
TIMEOUTS = {"min": 1, "idle_timeout": "30m", "unreachable_grace": "3s", "heartbeat_stale": "8s", "boot_timeout": "1m"}


@dataclass(frozen=True)
class Finished:
    """A fleet of one run whose sweep is ``SWEEP``-like, applied until the run succeeded on an emulator's box."""

    repo: Path
    run: RunSpec
    env: dict[str, str]
    box: int


def run_to_success(emulator: Emulator, tmp_path: Path, fleet_name: str, sweep: str) -> Finished:
    """A one-run fleet of ``sweep`` (with ``TIMEOUTS``), applied with `rigsync apply` until its run succeeded."""
    fleet = fleet_repo(tmp_path / "fleet")
    fleet.edit_fleet(name=fleet_name, **TIMEOUTS)
    fleet.write("desired/sweeps/tdmpc.yaml", sweep)
    fleet.commit(f"test: {fleet_name}", push=False)
    repo = fleet.work
    (run,) = load_desired_from_dir(repo).runs
    env = emulator_env(emulator, state_dir=tmp_path / "state", data_dir=tmp_path / "data")

    def entry() -> dict[str, object]:
        path = repo / "observed" / "runs.yaml"
        if not path.is_file():
            return {}
        got: dict[str, object] = yaml.safe_load(path.read_text())["sweeps"].get("tdmpc", {}).get(run.id, {})
        return got

    for _ in range(MAX_APPLIES):
        applied = rigsync(env, "apply", "--repo", str(repo), "--yes")
        assert applied.returncode == 0, applied.stdout + applied.stderr
        if entry().get("phase") == "succeeded":
            return Finished(repo, run, env, int(str(entry()["instance"])))
        time.sleep(0.3)
    pytest.fail(f"the run never succeeded: {entry()}")


def test_the_tail_of_a_2_gib_log_the_harvest_left_behind(emulator: Emulator, tmp_path: Path) -> None:
    done = run_to_success(emulator, tmp_path, FLEET, SWEEP)
    repo, run, env, box = done.repo, done.run, done.env, done.box
    data = tmp_path / "data"

    (shard,) = sorted((repo / "observed" / "runs").glob("*.jsonl"))
    (line,) = [json.loads(x) for x in shard.read_text().splitlines() if json.loads(x).get("run_id") == run.id]
    assert "stderr.log (2.0 GiB, over the size cap)" in line["harvest"], line["harvest"]
    assert str(data) not in shard.read_text() and str(tmp_path) not in shard.read_text()

    started = time.monotonic()
    tail = rigsync(env, "logs", run.id, "--stderr", "--tail", "5", "--repo", str(repo))
    assert tail.returncode == 0, tail.stderr
    assert tail.stdout == "".join(f"tail line {i}\n" for i in range(3, 8)), tail.stdout[:500]
    assert time.monotonic() - started < 60
    as_json = rigsync(env, "logs", run.id, "--stderr", "--json", "--repo", str(repo))
    assert as_json.returncode == 0, as_json.stderr
    doc = json.loads(as_json.stdout)
    size = (2 << 30) + sum(len(f"tail line {i}\n") for i in range(1, 8))
    assert doc["source"] == "box" and doc["omitted_bytes"] == size - (1 << 20)
    assert len(doc["text"].encode()) <= 4 << 20 and doc["text"].endswith("tail line 6\ntail line 7\n")
    out = rigsync(env, "logs", run.id, "--repo", str(repo))  # stdout came home: read from the store
    assert (out.returncode, out.stdout) == (0, "done walker-walk\n"), out.stderr

    emulator.destroy_instance(box)
    gone = rigsync(env, "logs", run.id, "--stderr", "--tail", "5", "--repo", str(repo))
    assert gone.returncode == 1 and gone.stdout == ""
    assert gone.stderr.startswith(
        f"rigsync: error: attempt {run.id}.1's stderr.log was not harvested (over the size cap, "
    ), gone.stderr
