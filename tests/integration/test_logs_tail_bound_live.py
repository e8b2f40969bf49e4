"""`rigsync logs --tail 5` on logs of NULs without a newline (issue 33: one printed 64 MiB), on a real sshd box of
the emulator: from the box (a 300 MB sparse stderr.log the harvest leaves behind) and from the store (a 17 MiB
stdout.log the harvest brought home). Each prints at most the log's last ``TAIL_WINDOW_BYTES``, escaped, and says
on stderr that the lines were longer.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from world import emulator_env, fleet_repo, rigsync

from reconciler.desired import load_desired_from_dir
from reconciler.emulator import Emulator
from reconciler.remote.logs import TAIL_WINDOW_BYTES

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

FLEET = "itnullog"
MAX_APPLIES = 40
SWEEP = """\
name: tdmpc
code: [experiments]
command: >-
  head -c 17M /dev/zero; truncate -s 300M {{ run_dir }}/stderr.log; echo {{ task }} >/dev/null
grid:
  task: [walker-walk]
seeds: [1]
max_runtime: 5m
"""
TIMEOUTS = {"min": 1, "idle_timeout": "30m", "unreachable_grace": "3s", "heartbeat_stale": "8s", "boot_timeout": "1m"}
CUT = f"rigsync: the last 5 line(s) are longer than {TAIL_WINDOW_BYTES >> 20} MiB: only the log's last "


def test_a_tail_of_nuls_is_bounded_in_bytes_on_the_box_and_in_the_store(emulator: Emulator, tmp_path: Path) -> None:
    fleet = fleet_repo(tmp_path / "fleet")
    fleet.edit_fleet(name=FLEET, **TIMEOUTS)
    fleet.write("desired/sweeps/tdmpc.yaml", SWEEP)
    fleet.commit("test: logs of NULs", push=False)
    repo = fleet.work
    (run,) = load_desired_from_dir(repo).runs
    env = emulator_env(emulator, state_dir=tmp_path / "state", data_dir=tmp_path / "data")

    def phase() -> object:
        path = repo / "observed" / "runs.yaml"
        doc = yaml.safe_load(path.read_text()) if path.is_file() else {}
        return doc["sweeps"].get("tdmpc", {}).get(run.id, {}).get("phase")

    for _ in range(MAX_APPLIES):
        applied = rigsync(env, "apply", "--repo", str(repo), "--yes")
        assert applied.returncode == 0, applied.stdout + applied.stderr
        if phase() == "succeeded":
            break
        time.sleep(0.3)
    else:
        pytest.fail(f"the run never succeeded: {phase()}")

    escaped = "\\x00" * TAIL_WINDOW_BYTES  # every NUL an escape of four characters
    for stream in (["--stderr"], []):  # the box's stderr.log (over the harvest's cap), then the store's stdout.log
        args = ["logs", run.id, "--tail", "5", "--repo", str(repo), *stream]
        tail = rigsync(env, *args)
        assert tail.returncode == 0, tail.stderr
        assert len(tail.stdout) == len(escaped) and tail.stdout == escaped, (stream, len(tail.stdout))
        assert tail.stderr.startswith(CUT), tail.stderr
        raw = rigsync(env, *args, "--raw")
        assert raw.returncode == 0 and len(raw.stdout) == TAIL_WINDOW_BYTES, (stream, len(raw.stdout))
        doc = json.loads(rigsync(env, *args, "--json").stdout)
        assert doc["source"] == ("box" if stream else "store") and len(doc["text"]) == TAIL_WINDOW_BYTES, doc["source"]
