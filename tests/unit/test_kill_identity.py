"""A kill signals only the process group its launch recorded: launch's answer parsed (any bytes), the kill
command's builder (no pid <= 1 ever on its command line), and kill.sh and the wrapper in a real local bash."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_remote_protocol import FAKE_SMI, Box, _launch, _pids_under

from reconciler import remote
from reconciler.remote.launched import PID_LIMIT, parse_launch_answer


def _start_tick(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _gone(pid: int, limit_s: float = 15.0) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


# ------------------------------------------------------------------------------------------ launch's answer


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        (b"1234 98765\n", (1234, 98765)),
        (b"banner\n\n4321 0\n", (4321, 0)),
        (b"1234\n", (1234, None)),
        (b"2 5\n", (2, 5)),
        (b"1 5\n", (None, None)),
        (b"0 5\n", (None, None)),
        (b"-1 5\n", (None, None)),
        (b"-5 5\n", (None, None)),
        (f"{PID_LIMIT} 5\n".encode(), (None, None)),
        (f"{PID_LIMIT - 1} 5\n".encode(), (PID_LIMIT - 1, 5)),
        (b"1234 -3\n", (1234, None)),
        (b"1234 1e9\n", (1234, None)),
        (b"1; rm -rf / 5\n", (None, None)),
        (b"12a4 5\n", (None, None)),
        (b"1234 5 6\n", (None, None)),
        ("١٢٣٤ 5\n".encode(), (None, None)),  # not ASCII digits
        (b"", (None, None)),
        (b"\xff\xfe\n", (None, None)),
        (b"9" * 5000 + b" 1\n", (None, None)),
        (b"1234 " + b"9" * 5000 + b"\n", (1234, None)),
    ],
)
def test_launch_answer_examples(raw: bytes, want: tuple[int | None, int | None]) -> None:
    assert parse_launch_answer(raw) == want


@given(st.binary(max_size=4096))
def test_any_launch_answer_gives_a_pid_above_one_or_none_and_never_raises(raw: bytes) -> None:
    pid, started = parse_launch_answer(raw)
    assert pid is None or (type(pid) is int and 1 < pid < PID_LIMIT)
    assert started is None or (type(started) is int and 0 <= started < 1 << 64)
    assert pid is not None or started is None


@given(st.integers(), st.integers())
def test_a_printed_pair_reads_back_only_when_valid(pid: int, started: int) -> None:
    got = parse_launch_answer(f"{pid} {started}\n".encode())
    if 1 < pid < PID_LIMIT:
        assert got == (pid, started if 0 <= started < 1 << 64 else None)
    else:
        assert got == (None, None)


# ------------------------------------------------------------------------------------------- the kill builder


def _identity_words(command: str) -> list[str]:
    return shlex.split(command)[-2:]


@pytest.mark.parametrize("pid", [0, 1, -1, -1234, "1; rm -rf /", "-1", None, True, PID_LIMIT, 12.0, "1234"])
def test_a_pid_that_cannot_be_ours_never_reaches_a_kill(pid: Any) -> None:
    cmd = remote.kill_script("r", 1, reason="x", pid=pid, pid_started=5)
    assert _identity_words(cmd) == ["", ""]
    assert "rm -rf" not in cmd


@pytest.mark.parametrize("started", [None, -1, "5", 1.5, False, 1 << 64])
def test_a_pid_without_a_valid_start_tick_travels_not_at_all(started: Any) -> None:
    assert _identity_words(remote.kill_script("r", 1, reason="x", pid=1234, pid_started=started)) == ["", ""]


def test_a_recorded_identity_travels_as_two_words() -> None:
    assert _identity_words(remote.kill_script("r", 1, reason="x", pid=1234, pid_started=98765)) == ["1234", "98765"]
    assert _identity_words(remote.kill_script("r", 1, reason="x")) == ["", ""]


# ----------------------------------------------------------------------------------- kill.sh on a real bash


@pytest.fixture
def box(tmp_path: Path) -> Iterator[Box]:
    """A temporary HOME run by a local bash, as in test_remote_protocol."""
    home = tmp_path / "home"
    home.mkdir()
    fakebin = tmp_path / "bin"
    fakebin.mkdir()
    (fakebin / "nvidia-smi").write_text(FAKE_SMI)
    (fakebin / "nvidia-smi").chmod(0o755)
    yield Box(home=home, env={"HOME": str(home), "PATH": f"{fakebin}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"})
    for pid in _pids_under(home):  # only the process groups this test started (a wrapper's pid file)
        if pid > 1 and _alive(pid) and os.getsid(pid) == pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """An unrelated process in a session of its own (so a group kill of its pid would end it)."""
    p = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield p
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)
    p.wait()


def _forging_job(run_dir_pid: int) -> str:
    # writes another process's pid into its own pid file, then runs on (with a child in its group)
    return f'echo {run_dir_pid} > "$RIGSYNC_RUN_DIR/pid"; sleep 300 & sleep 300; wait'


def _launched(box: Box, run_id: str, command: str) -> tuple[int, int]:
    res = _launch(box, run_id, command)
    assert res.returncode == 0, res.stderr
    pid, started = parse_launch_answer(res.stdout)
    assert pid is not None and started is not None, res.stdout
    assert started == _start_tick(pid) and os.getsid(pid) == pid
    box.wait_file(box.run_dir(run_id, 0) / "started_at")
    return pid, started


def test_kill_by_recorded_identity_ends_the_job_and_not_the_pid_it_wrote(
    box: Box, bystander: subprocess.Popen[bytes]
) -> None:
    pid, started = _launched(box, "forger", _forging_job(bystander.pid))
    d = box.run_dir("forger", 0)
    deadline = time.monotonic() + 10
    while (d / "pid").read_text().strip() != str(bystander.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (d / "pid").read_text().strip() == str(bystander.pid)
    res = box.sh(remote.kill_script("forger", 0, exit_code=137, reason="requeued", pid=pid, pid_started=started))
    assert res.returncode == 0, res.stderr
    assert res.stdout.decode().strip() == "137"
    assert not _alive(pid)
    assert [p for p in os.listdir("/proc") if p.isdigit() and _in_group(int(p), pid)] == []
    assert bystander.poll() is None and _alive(bystander.pid)
    assert (d / "killed_reason").read_text().strip() == "requeued" and (d / "ended_at").exists()


def test_kill_without_identity_records_the_end_and_the_wrapper_ends_its_command(
    box: Box, bystander: subprocess.Popen[bytes]
) -> None:
    pid, _ = _launched(box, "noid", _forging_job(bystander.pid))
    d = box.run_dir("noid", 0)
    res = box.sh(remote.kill_script("noid", 0, exit_code=137, reason="stale"))
    assert res.returncode == 0, res.stderr
    assert res.stdout.decode().strip() == "137"
    assert (d / "exit_code").read_text().strip() == "137" and (d / "ended_at").exists()
    assert _gone(pid), "the wrapper should end on its own"
    assert [p for p in os.listdir("/proc") if p.isdigit() and _in_group(int(p), pid)] == []
    assert bystander.poll() is None
    again = box.sh(remote.kill_script("noid", 0, exit_code=99, reason="again"))
    assert again.returncode == 0 and again.stdout.decode().strip() == "137"


def test_a_recorded_pid_with_another_start_tick_is_not_signalled(box: Box, bystander: subprocess.Popen[bytes]) -> None:
    """The recorded pid now belongs to someone else (reused): its start differs, so nothing is signalled."""
    _launched(box, "reused", "sleep 300")
    tick = _start_tick(bystander.pid)
    res = box.sh(remote.kill_script("reused", 0, reason="x", pid=bystander.pid, pid_started=tick + 1))
    assert res.returncode == 0, res.stderr
    time.sleep(0.2)
    assert bystander.poll() is None


@pytest.mark.integration  # real processes that wait out a heartbeat: seconds, not the fast loop's
def test_a_recorded_pid_that_leads_no_session_is_not_signalled(box: Box) -> None:
    _launched(box, "member", "sleep 300")
    parent = subprocess.Popen(
        ["bash", "-c", "sleep 300 & echo $!; wait"], start_new_session=True, stdout=subprocess.PIPE
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        res = box.sh(remote.kill_script("member", 0, reason="x", pid=child, pid_started=_start_tick(child)))
        assert res.returncode == 0, res.stderr
        time.sleep(0.2)
        assert _alive(child) and parent.poll() is None
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()


def test_the_recorded_group_itself_is_what_a_kill_signals(bystander: subprocess.Popen[bytes], box: Box) -> None:
    """The check is the identity and the attempt's wrapper path on its command line (a box-reported identity can be
    forged by a job): the bystander's own identity ends nothing; one naming runs/other.0/wrapper.sh is ended."""
    box.sh(remote.kill_script("other", 0, reason="x"))  # a tombstone; then a kill carrying an identity
    res = box.sh(remote.kill_script("other", 0, reason="x", pid=bystander.pid, pid_started=_start_tick(bystander.pid)))
    assert res.returncode == 0, res.stderr
    assert bystander.poll() is None
    wrapper = str(box.run_dir("other", 0) / "wrapper.sh")
    named = subprocess.Popen(["bash", "-c", "sleep 300; true", wrapper], start_new_session=True)
    try:
        res = box.sh(remote.kill_script("other", 0, reason="x", pid=named.pid, pid_started=_start_tick(named.pid)))
        assert res.returncode == 0, res.stderr
        assert named.wait(timeout=10) == -signal.SIGTERM
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(named.pid, signal.SIGKILL)
        named.wait()


def _in_group(pid: int, pgid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return int(fields[2]) == pgid and fields[0] != "Z"


def _members(pgid: int) -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and _in_group(int(p), pgid)]


@pytest.mark.integration  # real processes that wait out a heartbeat: seconds, not the fast loop's
def test_a_dead_wrappers_leftover_processes_are_ended_by_its_recorded_identity(box: Box) -> None:
    """The wrapper (and its heartbeat) died, its command's processes did not: they are still its session and group,
    started after it, so a kill by the recorded identity ends them; one naming a later start ends nothing."""
    pid, started = _launched(box, "orphan", "sleep 300 & sleep 300; wait")
    time.sleep(0.5)  # its command has started its two sleeps
    for m in _members(pid):
        if b"wrapper.sh" in Path(f"/proc/{m}/cmdline").read_bytes():
            os.kill(m, signal.SIGKILL)
    assert _gone(pid)
    time.sleep(2.5)  # the heartbeat's last sleep ends
    left = _members(pid)
    assert len(left) == 3  # bash -c and its sleeps

    later = box.sh(remote.kill_script("orphan", 0, reason="x", pid=pid, pid_started=started + 10**6))
    assert later.returncode == 0, later.stderr
    assert _members(pid) == left  # they started before that: not the recorded attempt's

    res = box.sh(remote.kill_script("orphan", 0, reason="lost", pid=pid, pid_started=started))
    assert res.returncode == 0, res.stderr
    assert _members(pid) == []
