"""``adapters.boxes.ShellBoxes``: the ``BoxControl`` port over a ``Shell``, here a local bash in a temporary HOME.

The run protocol's real programs run (probe, ship code, launch, kill, bootstrap); only SSH is replaced. The SSH
itself, against real sshd boxes, is proven by the integration tests (``test_adapters_ssh``, ``test_reconcile``).
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from reconciler.adapters.box_control import ShellBoxes
from reconciler.core.model import Endpoint, Instance, InstanceStatus, MetricGoal
from reconciler.errors import HostUnreachable, LaunchLockHeld, OutputOverBound, RemoteCommandFailed
from reconciler.ports import CommandResult, LaunchJob

FAKE_SMI = """#!/bin/bash
echo "0, 12, 24564, 0"
echo "1, 30, 24564, 0"
"""


class LocalShell:
    """The ``Shell`` port over a local bash: each endpoint host is a HOME directory under ``root``."""

    def __init__(self, root: Path, path: str) -> None:
        self.root = root
        self.path = path
        self.forgotten: list[Endpoint] = []
        self.down: set[str] = set()
        self.scripted: dict[str, CommandResult] = {}

    def home(self, endpoint: Endpoint) -> Path:
        home = self.root / endpoint.host
        home.mkdir(exist_ok=True)
        return home

    def run(
        self, endpoint: Endpoint, command: str, *, stdin: bytes | None = None, timeout: float = 30.0,
        max_stdout: int | None = None, stdout_sink: IO[bytes] | None = None,
    ) -> CommandResult:
        if endpoint.host in self.down:
            raise HostUnreachable(f"{endpoint.host}: no answer within {timeout:g}s")
        if endpoint.host in self.scripted:
            return self.scripted[endpoint.host]
        env = {"HOME": str(self.home(endpoint)), "PATH": self.path, "LANG": "C.UTF-8"}
        res = subprocess.run(["sh", "-c", command], env=env, input=stdin, capture_output=True, timeout=timeout,
                             check=False)
        if max_stdout is not None and len(res.stdout) > max_stdout:
            raise OutputOverBound(f"{endpoint.host}: output over {max_stdout} bytes; stopped reading")
        if stdout_sink is not None:
            stdout_sink.write(res.stdout)
            return CommandResult(res.returncode, b"", res.stderr)
        return CommandResult(res.returncode, res.stdout, res.stderr)

    def run_many(
        self, targets: dict[int, tuple[Endpoint, str]], *, timeout: float = 10.0, max_stdout: int | None = None
    ) -> dict[int, CommandResult | Exception]:
        out: dict[int, CommandResult | Exception] = {}
        for iid, (endpoint, command) in targets.items():
            try:
                out[iid] = self.run(endpoint, command, timeout=timeout, max_stdout=max_stdout)
            except (HostUnreachable, OutputOverBound) as exc:
                out[iid] = exc
        return out

    def forget(self, endpoint: Endpoint) -> None:
        self.forgotten.append(endpoint)

    def close(self) -> None:
        pass


def _box(iid: int, *, ssh: bool = True) -> Instance:
    return Instance(
        id=iid, label="rigsync:lab:x-1", status=InstanceStatus.RUNNING, gpu_name="RTX 3090", num_gpus=2,
        gpu_ram_mib=24564, dph_total=0.2, start_date=0.0,
        direct=Endpoint(f"box{iid}", 22) if ssh else None, proxy=Endpoint("proxy", 4000 + iid) if ssh else None,
    )


def _job(run_id: str, command: str, *, code_commit: str | None = "c0ffee") -> LaunchJob:
    return LaunchJob(
        run_id=run_id, attempt=1, gpu_mask=(1,), command=command, code_commit=code_commit, desired_commit="d35173d",
        sweep="s", params=(("lr", 0.1),), seed=1, metrics_file="metrics.jsonl", metric_key="reward",
        metric_goal=MetricGoal.MAX, max_runtime_s=600.0,
    )


def _tar(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def shell(tmp_path: Path) -> Iterator[LocalShell]:
    fakebin = tmp_path / "bin"
    fakebin.mkdir()
    (fakebin / "nvidia-smi").write_text(FAKE_SMI)
    (fakebin / "nvidia-smi").chmod(0o755)
    sh = LocalShell(tmp_path, f"{fakebin}:/usr/local/bin:/usr/bin:/bin")
    yield sh
    for pid_file in [*tmp_path.rglob("pid"), *tmp_path.rglob("*.pid")]:  # only what this test started
        txt = pid_file.read_text().strip()
        if txt.isdigit():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(txt), signal.SIGKILL)


def _wait(predicate, limit_s: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + limit_s
    while not predicate():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.05)


def test_probe_many_answers_for_every_box_and_never_raises(shell: LocalShell) -> None:
    shell.down.add("box2")
    shell.scripted["box3"] = CommandResult(255, b"", b"banner\nbash: not found\n")
    shell.scripted["box4"] = CommandResult(0, b"Welcome!\n", b"")
    boxes = ShellBoxes(shell)
    probes = boxes.probe_many([_box(1), _box(2), _box(3), _box(4), _box(5, ssh=False)], timeout=5.0)

    assert [p.instance_id for p in probes] == [1, 2, 3, 4, 5]
    ok, down, failed, garbled, unaddressed = probes
    assert ok.reachable and [g.memory_used_mib for g in ok.gpus] == [12, 30] and ok.runs == ()
    assert not down.reachable and down.error == "HostUnreachable: box2: no answer within 5s"
    assert not failed.reachable and failed.error == "probe exited 255: bash: not found"
    assert not garbled.reachable and garbled.error == garbled.unusable == "probe: printed no JSON document: 'Welcome!'"
    assert not unaddressed.reachable and unaddressed.error == "no ssh address yet"


def test_ship_launch_kill_and_bootstrap_through_the_real_run_protocol(shell: LocalShell) -> None:
    boxes = ShellBoxes(shell)
    box = _box(1)
    boxes.ship_code(box, "c0ffee", _tar({"train.py": "print('hi')\n"}))
    boxes.ship_code(box, "c0ffee", _tar({"train.py": "ignored: the tree is already there\n"}))
    assert (shell.home(Endpoint("box1", 22)) / "rigsync/code/c0ffee/train.py").read_text() == "print('hi')\n"

    answer = boxes.launch(box, _job("r1", "sleep 30"))  # read as the process group the box reported
    pid, pid_started = answer.pid, answer.pid_started
    assert pid is not None and pid_started is not None and not answer.queued
    with pytest.raises(LaunchLockHeld):
        boxes.launch(box, _job("r1", "sleep 30"))  # the launch lock: this attempt exists

    (run,) = boxes.probe_many([box], timeout=10.0)[0].runs
    assert (run.run_id, run.attempt, run.gpu_mask, run.code_commit) == ("r1", 1, (1,), "c0ffee")
    boxes.kill(box, "r1", 1, exit_code=137, reason="past max_runtime", pid=pid, pid_started=pid_started)
    _wait(lambda: boxes.probe_many([box], timeout=10.0)[0].runs[0].exit_code == 137)
    boxes.kill(box, "r9", 1, exit_code=137, reason="launch never happened")  # a tombstone: a late launch is refused
    with pytest.raises(LaunchLockHeld):
        boxes.launch(box, _job("r9", "sleep 30"))

    assert boxes.bootstrap(box, "true", "bh01").startswith("started")
    _wait(lambda: "bh01" in boxes.probe_many([box], timeout=10.0)[0].bootstrap_hashes)
    assert boxes.bootstrap(box, "true", "bh01") == "ok"

    with pytest.raises(RemoteCommandFailed, match="no ssh address"):
        boxes.launch(_box(2, ssh=False), _job("r2", "true"))
    boxes.forget(box)
    assert shell.forgotten == [box.direct, box.proxy]


def test_harvest_and_stage_resume_through_the_shell(shell: LocalShell, tmp_path: Path) -> None:
    """The harvest stream comes back over the shell (capped), and a staged checkpoint lands in resume/."""
    from reconciler.adapters.store import LocalStore

    boxes = ShellBoxes(shell)
    box = _box(5)
    run_dir = shell.home(Endpoint("box5", 22)) / "rigsync" / "runs" / "r9.1"
    run_dir.mkdir(parents=True)
    (run_dir / "stderr.log").write_text("Traceback: boom\n")
    (run_dir / "out.bin").write_bytes(b"z" * 4096)
    store = LocalStore(tmp_path / "data")
    got = store.put_attempt("r9", 1, boxes.harvest(box, "r9", 1, what="run", patterns=["*.bin"], cap_bytes=1024))
    assert [p for p, _ in got.files] == ["stderr.log"] and got.skipped == (("out.bin", 4096, "over the size cap"),)
    with pytest.raises(RemoteCommandFailed):
        boxes.harvest(box, "nope", 1, what="run", patterns=[], cap_bytes=1024)
    boxes.stage_resume(box, "r9", 2, _tar({"ckpt/state.json": "{}"}))
    staged = shell.home(Endpoint("box5", 22)) / "rigsync" / "resume" / "r9.2" / "ckpt" / "state.json"
    assert staged.read_text() == "{}"


def test_a_harvest_stream_past_its_cap_is_refused(shell: LocalShell) -> None:
    """A box that ignores its cap cannot fill the controller's memory: the shell stops reading past cap + slack."""
    from reconciler.adapters import box_control as boxes_mod

    boxes = ShellBoxes(shell)
    box = _box(6)
    shell.scripted.pop("box6", None)
    run_dir = shell.home(Endpoint("box6", 22)) / "rigsync" / "runs" / "r8.1"
    run_dir.mkdir(parents=True)
    (run_dir / "stderr.log").write_bytes(b"x" * 3000)
    old = boxes_mod.HARVEST_SLACK
    boxes_mod.HARVEST_SLACK = 0  # the tar's own headers are now more than the cap allows
    try:
        with pytest.raises(RemoteCommandFailed, match="output over"):
            boxes.harvest(box, "r8", 1, what="run", patterns=[], cap_bytes=3000)
    finally:
        boxes_mod.HARVEST_SLACK = old
