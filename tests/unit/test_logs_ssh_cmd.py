"""`rigsync logs` and `rigsync ssh` without a provider: which attempt a person means, the box-side log reader run
with a real local bash, the store reader, the follow loop, and the one-line errors of the console entry point."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from reconciler import remote
from reconciler.adapters.ssh import _host_id, is_pinned, openssh_argv
from reconciler.adapters.store import LocalStore, attempt_dir
from reconciler.cli import main
from reconciler.cli._boxes import BoxAccess, FleetFacts
from reconciler.cli.logs_cmd import BoxSource, StoreSource, pump
from reconciler.cli.ssh_cmd import box_of
from reconciler.core.model import (
    AttemptOutcome,
    AttemptRecord,
    Budget,
    Desired,
    Endpoint,
    Fleet,
    Instance,
    InstanceStatus,
)
from reconciler.errors import HostKeyMismatch, HostUnreachable, RemoteCommandFailed, UserError
from reconciler.observed.run_lookup import AttemptIndex
from reconciler.ports import CommandResult
from reconciler.remote.logs import LogSlice, LogStream, parse_log_slice, read_log_script

REPO = Path(__file__).resolve().parents[2]
A = "tdmpc-9165e5518277"
B = "tdmpc-91aa00000000"
C = "tdmpc-446e57eb0a1b"
P = "tdmpc-0000aaaa1111"  # pending


def _record(run_id: str, attempt: int, instance: int, phase: AttemptOutcome, code: int) -> AttemptRecord:
    return AttemptRecord(run_id=run_id, attempt=attempt, sweep="tdmpc", phase=phase, instance_id=instance,
                         exit_code=code)


def _runs_doc() -> dict[str, object]:
    return {
        "sweeps": {
            "tdmpc": {
                A: {"phase": "running", "attempts": 2, "instance": 22},
                B: {"phase": "succeeded", "attempts": 1, "instance": 11},
                C: {"phase": "running", "attempts": 1, "instance": None},
                P: {"phase": "pending", "attempts": 0, "instance": None},
            }
        }
    }


def _index() -> AttemptIndex:
    fleet_doc = {"boxes": [{"id": 33, "gpus": [{"index": 0, "run": f"{C}.1"}, {"index": 1, "run": None}]}]}
    history = [
        _record(A, 1, 11, AttemptOutcome.LOST, 137),
        _record(B, 1, 11, AttemptOutcome.SUCCEEDED, 0),
    ]
    return AttemptIndex.build(_runs_doc(), fleet_doc, history, [(A, 2, 22)], desired_ids=[A, B, C, P, "tdmpc-promo"])


# --------------------------------------------------------------------------------------------- resolution


def test_a_run_id_or_a_unique_prefix_means_its_latest_attempt() -> None:
    idx = _index()
    for text in (A, "tdmpc-916", "9165", " 9165e5 "):
        place = idx.resolve(text)
        assert (place.run_id, place.attempt, place.instance_id, place.finished) == (A, 2, 22, False)
    first = idx.resolve(f"{A}.1")
    assert (first.attempt, first.instance_id, first.finished) == (1, 11, True)
    assert idx.resolve("446e.1").instance_id == 33  # fleet.yaml says which box runs it
    assert idx.resolve(B).record is not None and idx.resolve(B).record.exit_code == 0  # type: ignore[union-attr]


def test_an_ambiguous_prefix_names_the_candidates() -> None:
    with pytest.raises(UserError, match=r"run prefix '91' is ambiguous: it matches tdmpc-9165e5518277, "
                                         r"tdmpc-91aa00000000; give more characters"):
        _index().resolve("91")


def test_an_unknown_run_gets_a_close_match_hint() -> None:
    idx = _index()
    with pytest.raises(UserError, match=r"^unknown run 'tdmpc-9165e5518278'; did you mean tdmpc-9165e5518277\?$"):
        idx.resolve("tdmpc-9165e5518278")
    with pytest.raises(UserError, match=r"^unknown run '9166e5518277'; did you mean tdmpc-9165e5518277\?$"):
        idx.resolve("9166e5518277")
    with pytest.raises(UserError, match=r"^unknown run 'zzz' \(`rigsync runs` lists the run ids\)$"):
        idx.resolve("zzz")
    with pytest.raises(UserError, match="rigsync knows no runs here"):
        AttemptIndex({}).resolve("x")


def test_a_run_never_launched_says_pending() -> None:
    idx = _index()
    with pytest.raises(UserError, match=rf"^run {P} has not been launched yet \(pending\)$"):
        idx.resolve(P)
    with pytest.raises(UserError, match=r"^run tdmpc-promo has not been launched yet \(pending\)$"):
        idx.resolve("tdmpc-promo")  # in desired/ only (a promotion seed not wanted yet)


def test_an_attempt_that_never_was_is_refused() -> None:
    with pytest.raises(UserError, match=rf"^run {A} has no attempt 3 \(its attempts: 1..2\)$"):
        _index().resolve(f"{A}.3")
    with pytest.raises(UserError, match=rf"^run {B} has no attempt 0 \(its attempts: 1\)$"):
        _index().resolve(f"{B}.0")


def _facts(index: AttemptIndex, tmp_path: Path) -> FleetFacts:
    desired = Desired(fleet=Fleet(name="f"), budget=Budget(), sweeps=(), runs=())
    return FleetFacts(tmp_path, desired, index, tmp_path)


def test_ssh_target_is_a_box_id_or_a_running_run(tmp_path: Path) -> None:
    facts = _facts(_index(), tmp_path)
    assert box_of(facts, "31007002") == (31007002, "box 31007002")
    assert box_of(facts, "9165") == (9165, "box 9165")  # a number is a box id, always
    assert box_of(facts, "tdmpc-9165") == (22, f"box 22 (attempt {A}.2)")
    assert box_of(facts, "9165e") == (22, f"box 22 (attempt {A}.2)")
    with pytest.raises(UserError, match=rf"^run {B} is not running \(succeeded\): its last attempt {B}.1 ran on box "
                                        rf"11; `rigsync logs {B}.1` prints its output$"):
        box_of(facts, B)
    with pytest.raises(UserError, match="has not been launched yet"):
        box_of(facts, P)


def test_ssh_refuses_a_box_the_fleet_does_not_own_or_that_is_not_running(tmp_path: Path) -> None:
    boxes = BoxAccess(_facts(_index(), tmp_path), "http://127.0.0.1:1")
    ep = Endpoint("127.0.0.9", 2222)
    base = dict(gpu_name="RTX 3060", num_gpus=1, gpu_ram_mib=12288, dph_total=0.1, start_date=0.0, direct=ep)
    mine = Instance(id=5, label="rigsync:f:abc-1", status=InstanceStatus.RUNNING, **base)  # type: ignore[arg-type]
    assert boxes.running(boxes.owned(mine)) is mine
    for label in ("rigsync:other:abc-1", "someone's box", ""):
        foreign = Instance(id=6, label=label, status=InstanceStatus.RUNNING, **base)  # type: ignore[arg-type]
        with pytest.raises(UserError, match=r"^instance 6 is not rigsync's .* refusing to connect to it$"):
            boxes.owned(foreign)
    loading = Instance(id=7, label="rigsync:f:abc-1", status=InstanceStatus.LOADING, **base)  # type: ignore[arg-type]
    with pytest.raises(UserError, match=r"^box 7 is not running \(the provider says loading\)$"):
        boxes.running(loading)
    with pytest.raises(UserError, match="rigsync has no SSH key in"):
        _ = boxes.key_path


# ------------------------------------------------------------------------------------- the OpenSSH command


def test_openssh_command_uses_only_rigsyncs_key_and_pins(tmp_path: Path) -> None:
    kh = tmp_path / "state dir" / "known_hosts"
    argv = openssh_argv(Endpoint("127.0.0.9", 2222), private_key=tmp_path / "id_ed25519", known_hosts=kh)
    assert argv[0] == "ssh" and argv[-3:] == ["-p", "2222", "root@127.0.0.9"]
    opts = [argv[i + 1] for i, a in enumerate(argv) if a == "-o"]
    assert f'UserKnownHostsFile="{kh}"' in opts  # OpenSSH splits an unquoted value at spaces
    assert {"StrictHostKeyChecking=yes", "IdentitiesOnly=yes", "GlobalKnownHostsFile=/dev/null",
            "UpdateHostKeys=no"} <= set(opts)
    assert argv[argv.index("-i") + 1] == str(tmp_path / "id_ed25519")


def test_is_pinned_reads_the_bracketed_host_port_form(tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"
    assert not is_pinned(kh, Endpoint("127.0.0.9", 2222))
    key = "AAAAC3NzaC1lZDI1NTE5AAAAIBQ1ciaXn6Ha0sKrTqDgMNmNcdiGMbxzMQtIPyDD7nl/"
    kh.write_text(f"{_host_id(Endpoint('127.0.0.9', 2222))} ssh-ed25519 {key}\n")
    assert kh.read_text().startswith("[127.0.0.9]:2222 ssh-ed25519 ")
    assert is_pinned(kh, Endpoint("127.0.0.9", 2222))
    assert not is_pinned(kh, Endpoint("127.0.0.9", 2223))


# ---------------------------------------------------------------------------- the box-side reader, locally


@dataclass
class Box:
    home: Path
    env: dict[str, str]

    def read(self, run_id: str, attempt: int, stream: LogStream = LogStream.STDOUT, **kw: int) -> LogSlice:
        res = self.sh(read_log_script(run_id, attempt, stream, **kw))  # type: ignore[arg-type]
        assert res.returncode == 0, res.stderr
        return parse_log_slice(res.stdout)

    def sh(self, script: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(["bash", "-c", script], env=self.env, capture_output=True, timeout=60, check=False)

    def run_dir(self, name: str) -> Path:
        d = self.home / "rigsync" / "runs" / name
        d.mkdir(parents=True, exist_ok=True)
        return d


@pytest.fixture
def box(tmp_path: Path) -> Iterator[Box]:
    home = tmp_path / "home"
    home.mkdir()
    yield Box(home, {"HOME": str(home), "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"})


def test_reader_slices_from_an_offset_and_reports_the_attempt_state(box: Box) -> None:
    d = box.run_dir("r-1.1")
    (d / "stdout.log").write_bytes(b"one\ntwo\nthree\n")
    sleeper = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        (d / "pid").write_text(f"{sleeper.pid}\n")
        s = box.read("r-1", 1)
        assert (s.data, s.start, s.end, s.size, s.exit_code, s.wrapper_alive) == (
            b"one\ntwo\nthree\n", 0, 14, 14, None, True)
        s = box.read("r-1", 1, offset=4, max_bytes=3)
        assert (s.data, s.start, s.end, s.size) == (b"two", 4, 7, 14)
        s = box.read("r-1", 1, last_lines=2)
        assert (s.data, s.start) == (b"two\nthree\n", 4)
        assert box.read("r-1", 1, last_lines=0).data == b""
        assert box.read("r-1", 1, offset=99).data == b""
    finally:
        os.killpg(sleeper.pid, signal.SIGKILL)
        sleeper.wait()
    (d / "exit_code").write_text("3\n")
    s = box.read("r-1", 1, offset=8)
    assert (s.data, s.exit_code, s.wrapper_alive, s.ended) == (b"three\n", 3, False, True)
    assert box.read("r-1", 1, LogStream.STDERR).data == b""  # no stderr.log yet: an empty log


def test_reader_keeps_binary_bytes_and_a_missing_run_dir_is_its_own_exit(box: Box) -> None:
    d = box.run_dir("r-2.1")
    blob = bytes(range(256)) * 3 + b"rigsync-log 0 0 0 0 0\n"
    (d / "stderr.log").write_bytes(blob)
    assert box.read("r-2", 1, LogStream.STDERR).data == blob
    res = box.sh(read_log_script("r-9", 1, LogStream.STDOUT))
    assert res.returncode == remote.NO_SUCH_RUN_EXIT and b"no run directory runs/r-9.1" in res.stderr


def test_parse_skips_a_login_banner_and_refuses_garbage() -> None:
    s = parse_log_slice(b"Welcome to the box\nrigsync-log - - 0 3 3\nabc")
    assert (s.data, s.exit_code, s.wrapper_alive) == (b"abc", None, None)
    for bad in (b"", b"hello\n", b"rigsync-log - 1 0 5 5\nabc"):
        with pytest.raises(RemoteCommandFailed):
            parse_log_slice(bad)


def test_unsafe_run_names_never_reach_a_shell() -> None:
    with pytest.raises(ValueError, match="not a safe file name"):
        read_log_script("../../etc", 1, LogStream.STDOUT)


# ----------------------------------------------------------------------------------- store reader and pump


def test_store_source_reads_tails_and_takes_the_recorded_exit_code(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    directory = attempt_dir(tmp_path, "r1", 1)
    directory.mkdir(parents=True)
    (directory / "stdout.log").write_bytes(b"a\nb\nc")
    (directory / "exit_code").write_text("0\n")
    src = StoreSource(store, "r1", 1, LogStream.STDOUT, exit_code=5)
    assert src.read(0, None).data == b"a\nb\nc" and src.read(0, None).exit_code == 0
    assert src.read(0, 1).data == b"c" and src.read(0, 2).data == b"b\nc" and src.read(0, 9).data == b"a\nb\nc"
    assert src.read(0, 0).data == b"" and src.read(2, None).data == b"b\nc"
    (directory / "exit_code").unlink()
    nothing = StoreSource(store, "r1", 1, LogStream.STDERR, exit_code=5).read(0, None)
    assert (nothing.data, nothing.exit_code) == (b"", 5)


class GrowingLog:
    """A log that grows by one line per read until it ends (exit code), like a box answering ``--follow``."""

    finished = False

    def __init__(self, lines: int, *, gone: bool = False) -> None:
        self.lines, self.reads, self.gone = lines, 0, gone
        self.text = b""

    def read(self, offset: int, last_lines: int | None) -> LogSlice:
        self.reads += 1
        if self.reads <= self.lines:
            self.text += f"line {self.reads}\n".encode()
        done = self.reads >= self.lines
        code = 0 if done and not self.gone else None
        alive = not (done and self.gone)
        return LogSlice(self.text[offset:], offset, len(self.text), len(self.text), code, alive)


def test_pump_prints_what_is_there_or_follows_until_the_attempt_ends() -> None:
    out: list[bytes] = []
    last = pump(GrowingLog(5), out.append, follow=False)
    assert b"".join(out) == b"line 1\n" and last.exit_code is None
    out.clear()
    sleeps: list[float] = []
    src = GrowingLog(5)
    last = pump(src, out.append, follow=True, sleep=sleeps.append)
    assert b"".join(out) == b"".join(f"line {i}\n".encode() for i in range(1, 6))
    assert last.exit_code == 0 and len(sleeps) == 4
    out.clear()
    gone = GrowingLog(3, gone=True)
    last = pump(gone, out.append, follow=True, sleep=lambda s: None)
    assert last.exit_code is None and last.wrapper_alive is False and gone.reads == 4  # gone twice in a row


# ------------------------------------------------------------------------------ the console entry point


@pytest.fixture
def fleet_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "fleet"
    shutil.copytree(REPO / "desired", repo / "desired")
    shutil.copytree(REPO / "experiments", repo / "experiments", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "observed", repo / "observed")
    return repo


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_errors_are_one_line_and_exit_1(
    fleet_repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RIGSYNC_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("RIGSYNC_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("RIGSYNC_API_URL", raising=False)
    monkeypatch.delenv("VAST_API_KEY", raising=False)
    repo = ["--repo", str(fleet_repo)]
    code, out, err = _cli(capsys, "logs", "nope", *repo)
    assert (code, out) == (1, "") and err == "rigsync: error: unknown run 'nope' (`rigsync runs` lists the run ids)\n"
    code, _, err = _cli(capsys, "logs", "tdmpc-9165e5518276", *repo)
    assert code == 1 and err == "rigsync: error: unknown run 'tdmpc-9165e5518276'; did you mean tdmpc-9165e5518277?\n"
    code, _, err = _cli(capsys, "ssh", "tdmpc-", *repo)
    assert code == 1 and err.startswith("rigsync: error: run prefix 'tdmpc-' is ambiguous: it matches ")
    code, _, err = _cli(capsys, "ssh", "tdmpc-9165", *repo)
    assert code == 1 and err == (
        "rigsync: error: run tdmpc-9165e5518277 is not running (succeeded): its last attempt tdmpc-9165e5518277.1 ran "
        "on box 31007002; `rigsync logs tdmpc-9165e5518277.1` prints its output\n"
    )
    code, _, err = _cli(capsys, "logs", "9165.2", *repo)
    assert code == 1 and err == "rigsync: error: run tdmpc-9165e5518277 has no attempt 2 (its attempts: 1)\n"
    # A finished attempt is read from the store when the harvest brought it home: no provider, no key needed.
    stored = tmp_path / "data" / "demo" / "runs" / "tdmpc-9165e5518277.1"
    stored.mkdir(parents=True)
    (stored / "stdout.log").write_bytes(b"hello \x1b[31mred\x1b[0m\nbye\n")
    code, out, err = _cli(capsys, "logs", "9165", *repo)
    assert (code, err) == (0, "") and out == "hello \\x1b[31mred\\x1b[0m\nbye\n"
    code, out, _ = _cli(capsys, "logs", "9165", "--tail", "1", "--follow", *repo)
    assert code == 0 and out == "bye\n"


def test_cli_pending_run(fleet_repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIGSYNC_STATE_DIR", str(tmp_path / "state"))
    shutil.rmtree(fleet_repo / "observed")  # rigsync never ran here: every desired run is pending
    code, out, err = _cli(capsys, "logs", "tdmpc-9165", "--repo", str(fleet_repo))
    assert (code, out) == (1, "")
    assert err == "rigsync: error: run tdmpc-9165e5518277 has not been launched yet (pending)\n"


class FailingShell:
    """A ``Shell`` whose every command ends the way it was told to."""

    def __init__(self, *outcomes: Exception | CommandResult) -> None:
        self.outcomes = list(outcomes)
        self.commands: list[str] = []

    def run(self, endpoint: Endpoint, command: str, *, stdin: bytes | None = None,
            timeout: float = 30.0, max_stdout: int | None = None) -> CommandResult:
        self.commands.append(command)
        outcome = self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def run_many(self, targets: object, *, timeout: float = 10.0,
                 max_stdout: int | None = None) -> dict[int, CommandResult | Exception]:
        raise NotImplementedError

    def forget(self, endpoint: Endpoint) -> None: ...

    def close(self) -> None: ...


@pytest.mark.parametrize(
    ("outcome", "message"),
    [
        (HostUnreachable("127.0.0.9:2222: no answer within 30s"),
         r"^box 5 \(127.0.0.9:2222\) is unreachable: 127.0.0.9:2222: no answer within 30s$"),
        (HostKeyMismatch("127.0.0.9:2222: host key changed since it was pinned; refusing to connect"),
         r"^box 5 \(127.0.0.9:2222\): 127.0.0.9:2222: host key changed since it was pinned; refusing to connect$"),
        (CommandResult(remote.NO_SUCH_RUN_EXIT, b"", b"no run directory"),
         rf"^box 5 \(127.0.0.9:2222\) has no run directory for attempt {A}.2$"),
    ],
)
def test_box_reader_failures_are_one_clear_line(outcome: Exception | CommandResult, message: str) -> None:
    shell = FailingShell(outcome)
    src = BoxSource(shell, Endpoint("127.0.0.9", 2222), 5, _index().resolve(A), LogStream.STDOUT)
    with pytest.raises(UserError, match=message):
        src.read(0, None)
    assert len(shell.commands) == 1 and "read_log" in shell.commands[0]


def test_follow_tries_a_dropped_connection_again() -> None:
    answer = CommandResult(0, b"rigsync-log 0 0 0 3 3\nok\n", b"")
    sleeps: list[float] = []
    shell = FailingShell(HostUnreachable("dropped"), HostUnreachable("dropped"), answer)
    src = BoxSource(shell, Endpoint("h", 22), 5, _index().resolve(A), LogStream.STDOUT, retries=2,
                    sleep=sleeps.append)
    assert src.read(0, None).data == b"ok\n" and len(shell.commands) == 3 and len(sleeps) == 2
    shell = FailingShell(HostUnreachable("dropped"))
    src = BoxSource(shell, Endpoint("h", 22), 5, _index().resolve(A), LogStream.STDOUT, retries=2,
                    sleep=sleeps.append)
    with pytest.raises(UserError, match="is unreachable: dropped"):
        src.read(0, None)
    assert len(shell.commands) == 3
