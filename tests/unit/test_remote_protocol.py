"""The on-box run protocol, exercised with a real local bash in a temporary HOME and a fake nvidia-smi."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from gitutil import git
from waiting import wait_for

from reconciler import remote
from reconciler.box.boxlib import alive
from reconciler.core.model import BoxProbe, RunDirState
from reconciler.remote import commands
from reconciler.remote.launched import parse_launch_answer

# Answers only the one query the probe makes, as real nvidia-smi formats it, and logs every call.
FAKE_SMI = """#!/bin/bash
echo "$*" >> "$(dirname "$0")/calls"
case "$*" in
  "--query-gpu=index,memory.used,memory.total,utilization.gpu --format=csv,noheader,nounits")
    echo "0, 12, 24564, 0"
    echo "1, 20000, 24564, 97"
    ;;
  *)
    echo "Field \\"$1\\" is not a valid field to query." >&2
    exit 2
    ;;
esac
"""


@dataclass
class Box:
    home: Path
    env: dict[str, str]

    def sh(self, script: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            ["bash", "-c", script], env=self.env, input=stdin, capture_output=True, timeout=60, check=False
        )

    def probe(self) -> BoxProbe:
        res = self.sh(remote.probe_script())
        assert res.returncode == 0, res.stderr
        return remote.parse_probe(7, res.stdout, gpus_listed=2)

    def run_dir(self, run_id: str, attempt: int) -> Path:
        return self.home / "rigsync" / "runs" / f"{run_id}.{attempt}"

    def wait_file(self, path: Path, limit_s: float = 30.0) -> str:
        wait_for(f"{path} to appear", path.exists, limit_s, every=0.05)
        return path.read_text()


def _pids_under(home: Path) -> list[int]:
    out = []
    for p in (home / "rigsync").rglob("pid"):
        txt = p.read_text().strip()
        if txt.isdigit():
            out.append(int(txt))
    for p in (home / "rigsync").rglob("*.pid"):
        txt = p.read_text().strip()
        if txt.isdigit():
            out.append(int(txt))
    return out


@pytest.fixture
def box(tmp_path: Path) -> Iterator[Box]:
    home = tmp_path / "home"
    home.mkdir()
    fakebin = tmp_path / "bin"
    fakebin.mkdir()
    smi = fakebin / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    env = {"HOME": str(home), "PATH": f"{fakebin}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    b = Box(home=home, env=env)
    yield b
    for pid in _pids_under(home):  # only the process groups this test started
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def _launch(box: Box, run_id: str, command: str, *, attempt: int = 0, max_runtime_s: float = 3600.0,
            code_commit: str | None = None, mask: tuple[int, ...] = (1,)) -> subprocess.CompletedProcess[bytes]:
    return box.sh(
        remote.launch_script(
            run_id=run_id,
            attempt=attempt,
            gpu_mask=mask,
            command=command,
            code_commit=code_commit,
            desired_commit="d" * 40,
            metrics_file="metrics.jsonl",
            metric_key="acc",
            metric_goal="max",
            max_runtime_s=max_runtime_s,
            sweep="sw",
            params={"lr": 0.1, "name": "it's"},
            seed=3,
        )
    )


def _run(probe: BoxProbe, run_id: str, attempt: int = 0) -> RunDirState:
    for r in probe.runs:
        if (r.run_id, r.attempt) == (run_id, attempt):
            return r
    raise AssertionError(f"{run_id}.{attempt} not in probe: {[r.run_id for r in probe.runs]}")


def test_probe_of_an_empty_box_reports_gpus_python_and_disk(box: Box) -> None:
    p = box.probe()
    assert p.reachable and p.instance_id == 7
    assert [(g.index, g.memory_used_mib, g.memory_total_mib) for g in p.gpus] == [(0, 12, 24564), (1, 20000, 24564)]
    assert p.gpus[1].utilization_pct == 97.0
    assert p.python is not None and "python" in p.python
    assert p.disk_free_gb is not None and p.disk_free_gb > 0
    assert p.runs == () and p.code_commits == () and p.bootstrap_hashes == ()
    assert p.box_now is not None and abs(p.box_now - time.time()) < 60


def test_probe_calls_nvidia_smi_once(box: Box) -> None:
    calls = Path(box.env["PATH"].split(":")[0]) / "calls"
    box.probe()
    box.probe()
    assert calls.read_text().splitlines() == [
        "--query-gpu=index,memory.used,memory.total,utilization.gpu --format=csv,noheader,nounits"
    ] * 2


def test_probe_prefers_a_venv_python_that_runs(box: Box) -> None:
    venv = box.home / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to("/usr/bin/python3")
    assert box.probe().python == str(venv / "python")
    (venv / "python").unlink()
    (venv / "python").write_text("#!/bin/sh\nexit 1\n")
    (venv / "python").chmod(0o755)
    assert box.probe().python != str(venv / "python")


def test_run_that_writes_metrics_and_exits_zero(box: Box) -> None:
    cmd = (
        'for a in 0.5 0.9 0.7; do echo "{\\"step\\": 1, \\"acc\\": $a, \\"tag\\": \\"x\\"}" '
        '>> "$RIGSYNC_METRICS_FILE"; '
        "done; echo 'garbage{' >> \"$RIGSYNC_METRICS_FILE\"; echo done"
    )
    res = _launch(box, "r1", cmd)
    assert res.returncode == 0, res.stderr
    pid, started = parse_launch_answer(res.stdout)
    assert started is not None
    d = box.run_dir("r1", 0)
    assert box.wait_file(d / "exit_code").strip() == "0"
    assert int((d / "pid").read_text()) == pid
    wait_for("the wrapper to exit after its exit code", lambda: not alive(pid), 30, every=0.05)  # its last steps
    r = _run(box.probe(), "r1")
    assert r.exit_code == 0 and not r.pid_alive
    assert r.gpu_mask == (1,)
    assert r.best_metric == 0.9 and r.final_metric == 0.7
    assert dict(r.last_metrics) == {"step": 1, "acc": 0.7, "tag": "x"}
    assert r.started_at is not None and r.ended_at is not None and r.ended_at >= r.started_at
    assert r.desired_commit == "d" * 40
    assert (d / "stdout.log").read_text() == "done\n"
    meta = json.loads((d / "meta.json").read_text())
    assert meta["params"] == {"lr": 0.1, "name": "it's"} and meta["seed"] == 3 and meta["sweep"] == "sw"


def test_a_wrapper_that_ended_before_launch_answered_still_reports_its_start(box: Box, tmp_path: Path) -> None:
    # launch.sh waits for the wrapper's pid with `seq`; this one holds launch there until the wrapper has exited,
    # the order a loaded box gives a short command.
    slow = tmp_path / "slowbin"
    slow.mkdir()
    (slow / "seq").write_text(
        "#!/bin/bash\n"
        "for _ in $(/usr/bin/seq 1 600); do\n"
        '  p=$(cat pid 2>/dev/null); [ -e exit_code ] && [ -n "$p" ] && [ ! -e "/proc/$p" ] && break\n'
        "  /bin/sleep 0.05\n"
        "done\n"
        '/usr/bin/seq "$@"\n'
    )
    (slow / "seq").chmod(0o755)
    script = remote.launch_script(
        run_id="r9", attempt=0, gpu_mask=(1,), command="true", code_commit=None, desired_commit="d" * 40,
        metrics_file="metrics.jsonl", metric_key="acc", metric_goal="max", max_runtime_s=60.0, sweep="sw",
        params={}, seed=0,
    )
    res = subprocess.run(["bash", "-c", script], env={**box.env, "PATH": f"{slow}:{box.env['PATH']}"},
                         capture_output=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    pid, started = parse_launch_answer(res.stdout)
    d = box.run_dir("r9", 0)
    assert not Path(f"/proc/{pid}").exists() and (d / "exit_code").read_text().strip() == "0"
    assert started is not None and str(started) == (d / "pid_start").read_text().strip()


def test_second_launch_of_the_same_attempt_hits_the_lock(box: Box) -> None:
    assert _launch(box, "r2", "true").returncode == 0
    again = _launch(box, "r2", "echo second > $RIGSYNC_RUN_DIR/second")
    assert again.returncode == remote.LAUNCH_LOCK_EXIT
    assert b"launch lock held" in again.stderr
    box.wait_file(box.run_dir("r2", 0) / "exit_code")
    assert not (box.run_dir("r2", 0) / "second").exists()
    assert _launch(box, "r2", "true", attempt=1).returncode == 0  # the next attempt is its own directory


def test_wrapper_exports_the_run_environment_and_cds_into_the_code_dir(box: Box) -> None:
    code = box.home / "rigsync" / "code" / "abc123"
    code.mkdir(parents=True)
    cmd = 'env | grep -E "^(RIGSYNC_|CUDA_VISIBLE)" | sort > "$RIGSYNC_RUN_DIR/env"; pwd > "$RIGSYNC_RUN_DIR/cwd"'
    assert _launch(box, "r3", cmd, code_commit="abc123", mask=(0, 1), attempt=2).returncode == 0
    d = box.run_dir("r3", 2)
    box.wait_file(d / "exit_code")
    env = dict(line.split("=", 1) for line in (d / "env").read_text().splitlines())
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env["RIGSYNC_ATTEMPT"] == "2" and env["RIGSYNC_RUN_ID"] == "r3"
    assert env["RIGSYNC_RUN_DIR"] == str(d) and env["RIGSYNC_CODE_DIR"] == str(code)
    assert env["RIGSYNC_METRICS_FILE"] == str(d / "metrics.jsonl")
    assert "python" in env["RIGSYNC_PYTHON"]
    assert (d / "cwd").read_text().strip() == str(code)


def test_missing_code_dir_fails_the_run_not_the_launch(box: Box) -> None:
    assert _launch(box, "r4", "true", code_commit="deadbeef").returncode == 0
    d = box.run_dir("r4", 0)
    assert box.wait_file(d / "exit_code").strip() == "127"
    assert "code directory" in (d / "stderr.log").read_text()


def test_long_run_shows_alive_with_fresh_heartbeat_then_kill_ends_the_group(box: Box) -> None:
    cmd = "sleep 300 & sleep 300; wait"  # a child process too: the whole group must go
    assert _launch(box, "r5", cmd).returncode == 0
    d = box.run_dir("r5", 0)
    box.wait_file(d / "heartbeat")  # written after the pid and the start
    r = _run(box.probe(), "r5")
    assert r.pid_alive and r.exit_code is None
    assert r.heartbeat_age_s is not None and r.heartbeat_age_s < 10
    pid = int((d / "pid").read_text())
    assert os.getpgid(pid) == pid  # a session leader: the group is killable as one

    res = box.sh(remote.kill_script("r5", 0, exit_code=137, reason="max runtime exceeded"))
    assert res.returncode == 0, res.stderr
    assert (d / "exit_code").read_text().strip() == "137"
    assert (d / "killed_reason").read_text().strip() == "max runtime exceeded"
    r = _run(box.probe(), "r5")
    assert not r.pid_alive and r.exit_code == 137
    members = [p for p in os.listdir("/proc") if p.isdigit() and _pgid_state(int(p), pid)]
    assert members == []

    again = box.sh(remote.kill_script("r5", 0, exit_code=99, reason="second"))
    assert again.returncode == 0 and (d / "exit_code").read_text().strip() == "137"


def test_kill_of_an_attempt_never_launched_leaves_a_tombstone_a_late_launch_cannot_pass(box: Box) -> None:
    res = box.sh(remote.kill_script("late", 1, exit_code=137, reason="launch never happened"))
    assert res.returncode == 0, res.stderr
    d = box.run_dir("late", 1)
    assert (d / "tombstone").exists() and (d / "exit_code").read_text().strip() == "137"
    assert "never launched here: launch never happened" in (d / "killed_reason").read_text()
    r = _run(box.probe(), "late", 1)
    assert r.exit_code == 137 and not r.pid_alive and r.started_at is None
    # the launch that was on its way arrives now: the lock is taken, nothing starts
    late = _launch(box, "late", "touch started_anyway", attempt=1)
    assert late.returncode == remote.LAUNCH_LOCK_EXIT, late.stderr
    assert not (d / "pid").exists() and not (d / "started_anyway").exists()
    again = box.sh(remote.kill_script("late", 1, exit_code=137, reason="again"))
    assert again.returncode == 0 and (d / "exit_code").read_text().strip() == "137"


def test_a_kill_that_comes_while_the_launch_starts_wins(box: Box) -> None:
    """The kill takes the attempt between launch.sh's lock and the wrapper's pid: the command never runs."""
    d = box.run_dir("race", 0)
    d.mkdir(parents=True)  # launch.sh has taken the lock; its wrapper is not running yet
    killed = box.sh(remote.kill_script("race", 0, exit_code=137, reason="requeued"))
    assert killed.returncode == 0, killed.stderr
    assert (d / "exit_code").read_text().strip() == "137"
    # the wrapper starts after the kill: it writes its pid, sees the exit code, and never runs the command
    started = subprocess.run(
        ["bash", "-c", commands._script("wrapper.sh"), "rigsync-wrapper", str(d), "", "metrics.jsonl", "race", "0", "",
         "0", "2", f"touch {d}/ran"],
        env={**box.env, "RIGSYNC_ROOT": str(box.home / "rigsync")}, input=b"", capture_output=True, timeout=60,
        check=False,
    )
    assert started.returncode == 0, started.stderr
    assert (d / "pid").exists() and not (d / "ran").exists() and not (d / "started_at").exists()


def _pgid_state(pid: int, pgid: int) -> bool:
    """True when ``pid`` is a live (non-zombie) member of process group ``pgid``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[2]) == pgid and fields[0] != "Z"


def test_box_side_max_runtime_guard_kills_an_overrunning_command(box: Box) -> None:
    assert _launch(box, "r6", "sleep 120", max_runtime_s=1).returncode == 0
    d = box.run_dir("r6", 0)
    code = box.wait_file(d / "exit_code", limit_s=60).strip()
    assert code == "143"
    assert "max_runtime_s" in (d / "killed_reason").read_text()


def test_hostile_command_text_stays_one_argument(box: Box) -> None:
    hostile = "it's \"quoted\" $HOME `id` $(echo sub) ; echo INJECTED \\ \n second line"
    cmd = "printf '%s' " + _sq(hostile) + ' > "$RIGSYNC_RUN_DIR/out"'
    assert _launch(box, "r7", cmd).returncode == 0
    d = box.run_dir("r7", 0)
    assert box.wait_file(d / "exit_code").strip() == "0"
    assert (d / "out").read_text() == hostile
    assert json.loads((d / "meta.json").read_text())["command"] == cmd


def _sq(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"


def test_unsafe_names_are_refused_before_any_shell_runs() -> None:
    with pytest.raises(ValueError):
        remote.kill_script("../../etc", 0, reason="x")
    with pytest.raises(ValueError):
        remote.ship_code_script("abc/../def")
    with pytest.raises(ValueError):
        remote.bootstrap_script("true", "a b")


def test_bootstrap_ok_and_failed_markers(box: Box) -> None:
    b = box.home / "rigsync" / "bootstrap"
    res = box.sh(remote.bootstrap_script("echo setting up; touch $HOME/ready\n", "aaaa1111"))
    assert res.returncode == 0 and res.stdout.startswith(b"started"), res
    box.wait_file(b / "aaaa1111.ok")
    assert (box.home / "ready").exists() and "setting up" in (b / "aaaa1111.log").read_text()
    again = box.sh(remote.bootstrap_script("echo setting up; touch $HOME/ready\n", "aaaa1111"))
    assert again.stdout.strip() == b"ok"

    box.sh(remote.bootstrap_script("echo broken >&2; exit 3\n", "bbbb2222"))
    assert box.wait_file(b / "bbbb2222.failed").strip() == "3"

    box.sh(remote.bootstrap_script("sleep 300\n", "cccc3333"))
    box.wait_file(b / "cccc3333.pid")
    while_running = box.sh(remote.bootstrap_script("sleep 300\n", "cccc3333"))
    assert while_running.stdout.strip() == b"running"

    p = box.probe()
    assert p.bootstrap_hashes == ("aaaa1111",)
    assert p.bootstrap_failed == ("bbbb2222",)
    assert p.bootstrap_running == ("cccc3333",)
    assert p.last_activity_at is not None and p.last_activity_at >= (b / "aaaa1111.ok").stat().st_mtime - 1


def test_failed_bootstrap_is_retried_when_asked_again(box: Box) -> None:
    b = box.home / "rigsync" / "bootstrap"
    flag = box.home / "second-try"
    script = f"if [ -e {flag} ]; then exit 0; fi; touch {flag}; exit 1\n"
    box.sh(remote.bootstrap_script(script, "dddd4444"))
    box.wait_file(b / "dddd4444.failed")
    assert box.sh(remote.bootstrap_script(script, "dddd4444")).stdout.startswith(b"started")
    box.wait_file(b / "dddd4444.ok")
    assert not (b / "dddd4444.failed").exists()


def test_ship_code_from_a_real_git_archive(box: Box, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "train.py").write_text("print('hi')\n")
    (repo / "pkg").mkdir()
    (repo / "pkg" / "m.py").write_text("X = 1\n")
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "init"]):
        git(repo, *args)
    commit = git(repo, "rev-parse", "HEAD")
    tar = subprocess.run(["git", "archive", "--format=tar", commit], cwd=repo, capture_output=True, check=True).stdout

    res = box.sh(remote.ship_code_script(commit), stdin=tar)
    assert res.returncode == 0, res.stderr
    dest = box.home / "rigsync" / "code" / commit
    assert (dest / "train.py").read_text() == "print('hi')\n" and (dest / "pkg" / "m.py").exists()
    again = box.sh(remote.ship_code_script(commit), stdin=tar)
    assert again.returncode == 0 and again.stdout.strip() == b"present"
    bad = box.sh(remote.ship_code_script("f" * 40), stdin=b"this is not a tar")
    assert bad.returncode != 0 and not (box.home / "rigsync" / "code" / ("f" * 40)).exists()
    assert box.probe().code_commits == (commit,)


def test_probe_reports_hundreds_of_run_dirs(box: Box) -> None:
    runs = box.home / "rigsync" / "runs"
    for i in range(300):
        d = runs / f"run{i:03d}.1"
        d.mkdir(parents=True)
        (d / "meta.json").write_text(json.dumps({"gpu_mask": [i % 2], "metric_key": "loss", "metric_goal": "min"}))
        (d / "exit_code").write_text("1\n" if i % 3 else "0\n")
        (d / "metrics.jsonl").write_text('{"loss": 3}\n{"loss": 1.5}\n{"loss": 2}\n')
    (runs / "not-a-run").mkdir()
    p = box.probe()
    assert len(p.runs) == 300
    r = _run(p, "run299", 1)
    assert r.exit_code == 1 and r.gpu_mask == (1,) and r.best_metric == 1.5 and r.final_metric == 2.0


def _unusable(stdout: bytes) -> str:
    p = remote.parse_probe(1, stdout, gpus_listed=1)
    assert not p.reachable and p.unusable is not None and p.error == p.unusable, p
    return p.unusable


def test_parse_probe_rejects_garbage() -> None:
    """Garbage is an unusable probe (never an exception): the box answered, with nothing to act on."""
    assert "no JSON" in _unusable(b"bash: line 1: python3: command not found\n")
    assert "no JSON" in _unusable(b"")
    assert "not a JSON object" in _unusable(b"[1, 2]")
    assert "no python3" in _unusable(b'{"v": 1, "box_now": 1, "error": "no python3 on the box: the probe needs one"}')
    # a malformed GPU entry is refused on its own (the rest of the probe stands), and named
    p = remote.parse_probe(1, b'{"gpus": [{"index": "x"}]}', gpus_listed=1)
    assert p.reachable and p.gpus == () and p.rejected == ("gpu 'x': not one of the instance's 1 GPU(s)",)


def test_parse_probe_skips_a_login_banner() -> None:
    p = remote.parse_probe(3, b'Welcome!\n{"v": 1, "box_now": 5.0, "gpus": [], "runs": []}\n', gpus_listed=1)
    assert p.reachable and p.box_now == 5.0


def test_probe_without_python_says_so(box: Box, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    for tool in ("bash", "date", "printf"):
        src = Path("/usr/bin") / tool
        if not src.exists():
            src = Path("/bin") / tool
        (bare / tool).symlink_to(src)
    env = {"HOME": str(box.home), "PATH": str(bare)}
    res = subprocess.run(["/usr/bin/bash", "-c", remote.probe_script()], env=env, capture_output=True, check=False)
    assert "no python3" in _unusable(res.stdout)
