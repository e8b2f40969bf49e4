"""`rigsync logs --tail 5` on logs of NULs without a newline (issue 33: one printed 64 MiB), on a real sshd box of
the emulator: from the box (a 300 MB sparse stderr.log the harvest leaves behind) and from the store (a 17 MiB
stdout.log the harvest brought home). Each prints at most the log's last ``TAIL_WINDOW_BYTES``, escaped, and says
on stderr that the lines were longer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_logs_large import run_to_success
from world import rigsync

from reconciler.emulator import Emulator
from reconciler.remote.logs import TAIL_WINDOW_BYTES

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

FLEET = "itnullog"
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
CUT = f"rigsync: the last 5 line(s) are longer than {TAIL_WINDOW_BYTES >> 20} MiB: only the log's last "


def test_a_tail_of_nuls_is_bounded_in_bytes_on_the_box_and_in_the_store(emulator: Emulator, tmp_path: Path) -> None:
    done = run_to_success(emulator, tmp_path, FLEET, SWEEP)
    repo, run, env = done.repo, done.run, done.env

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
