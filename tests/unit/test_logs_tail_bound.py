"""`rigsync logs --tail N` is bounded in bytes as well as lines (issue 33): a log of NULs without a newline printed
64 MiB of escapes for ``--tail 5``. The box-side reader (a real local bash), the store reader and the command."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_logs_ssh_cmd import Box, _cli, box, fleet_repo

from reconciler.adapters.store import LocalStore, attempt_dir
from reconciler.cli.logs_cmd import StoreSource, pump, tail_cut
from reconciler.remote.logs import TAIL_WINDOW_BYTES, LogSlice, LogStream

__all__ = ["box", "fleet_repo"]  # test_logs_ssh_cmd's fixtures

NULS = 16 << 20  # what the log held: 16 MiB of NULs, the old window


class BoxLog:
    """``Box.read`` as a ``LogSource`` (what ``BoxSource`` does over SSH)."""

    finished = False

    def __init__(self, box: Box, run_id: str) -> None:
        self.box, self.run_id = box, run_id

    def read(self, offset: int, last_lines: int | None) -> LogSlice:
        return self.box.read(self.run_id, 1, LogStream.STDERR, offset=offset,
                             **({} if last_lines is None else {"last_lines": last_lines}))


def _tail(source: BoxLog | StoreSource, lines: int) -> tuple[bytes, list[LogSlice]]:
    out: list[bytes] = []
    first: list[LogSlice] = []
    pump(source, out.append, follow=False, tail=lines, on_tail=first.append)
    return b"".join(out), first


def test_the_box_reader_tails_a_log_without_newlines_from_its_last_window_only(box: Box) -> None:
    d = box.run_dir("nul-1.1")
    (d / "stderr.log").write_bytes(b"\0" * NULS)
    data, (first,) = _tail(BoxLog(box, "nul-1"), 5)
    assert len(data) == TAIL_WINDOW_BYTES and first.start == NULS - TAIL_WINDOW_BYTES
    assert tail_cut(first)
    (d / "stderr.log").write_bytes(b"\0" * NULS + b"\nlast\n")
    data, (first,) = _tail(BoxLog(box, "nul-1"), 1)  # the last line found in the window: not cut
    assert data == b"last\n" and not tail_cut(first)
    data, (first,) = _tail(BoxLog(box, "nul-1"), 2)  # the line before it is 16 MiB long: its end only
    assert len(data) == TAIL_WINDOW_BYTES and data.endswith(b"\0\nlast\n") and tail_cut(first)


def test_the_store_reader_tails_the_same_bound(tmp_path: Path) -> None:
    directory = attempt_dir(tmp_path, "r1", 1)
    directory.mkdir(parents=True)
    (directory / "stderr.log").write_bytes(b"\0" * NULS)
    data, (first,) = _tail(StoreSource(LocalStore(tmp_path), "r1", 1, LogStream.STDERR), 5)
    assert len(data) == TAIL_WINDOW_BYTES and tail_cut(first)
    (directory / "stderr.log").write_bytes(b"a\n" * 10)
    data, (first,) = _tail(StoreSource(LocalStore(tmp_path), "r1", 1, LogStream.STDERR), 3)
    assert data == b"a\na\na\n" and not tail_cut(first)


def test_logs_tail_prints_a_bounded_tail_and_says_it_was_cut(
    fleet_repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RIGSYNC_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("RIGSYNC_DATA_DIR", str(tmp_path / "data"))
    stored = tmp_path / "data" / "demo" / "runs" / "tdmpc-9165e5518277.1"
    stored.mkdir(parents=True)
    (stored / "stderr.log").write_bytes(b"\0" * NULS)
    code, out, err = _cli(capsys, "logs", "9165", "--stderr", "--tail", "5", "--repo", str(fleet_repo))
    assert code == 0
    assert out == "\\x00" * TAIL_WINDOW_BYTES  # each NUL shown as an escape: 4 MiB, not 64
    assert err == "rigsync: the last 5 line(s) are longer than 1 MiB: only the log's last 1 MiB shown\n"
    (stored / "stderr.log").write_bytes(b"\0" * NULS + b"\nbye\n")
    code, out, err = _cli(capsys, "logs", "9165", "--stderr", "--tail", "1", "--repo", str(fleet_repo))
    assert (code, out, err) == (0, "bye\n", "")
