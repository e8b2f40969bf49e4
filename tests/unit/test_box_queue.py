"""The box side of the queue, the fence and the drain, run for real with a local bash in a temporary HOME
(``enqueue.sh``, ``dequeue.sh``, ``queue.sh``, ``drain.sh``, ``harvested.sh``, the probe's reading of them, the
adapter's errors), and the watchdog's rules for queued work and a drained box (``watchdog.decide``, pure)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler import remote
from reconciler.adapters.box_control import ShellBoxes
from reconciler.box import boxlib
from reconciler.box.watchdog import decide
from reconciler.core.model import BoxProbe, Endpoint, Instance, InstanceStatus, MetricGoal
from reconciler.errors import LaunchLockHeld, LaunchRefused
from reconciler.ports import CommandResult, LaunchJob

FAKE_SMI = '#!/bin/bash\necho "0, 12, 24564, 0"\necho "1, 30, 24564, 0"\n'


class LocalShell:
    """The ``Shell`` port over a local bash in one HOME (enough of it for ``ShellBoxes``)."""

    def __init__(self, home: Path, path: str) -> None:
        self.home = home
        self.path = path

    def run(self, endpoint: Endpoint, command: str, *, stdin: bytes | None = None, timeout: float = 30.0,
            max_stdout: int | None = None, stdout_sink: object = None) -> CommandResult:
        env = {"HOME": str(self.home), "PATH": self.path, "LANG": "C.UTF-8"}
        res = subprocess.run(["sh", "-c", command], env=env, input=stdin, capture_output=True, timeout=timeout,
                             check=False)
        return CommandResult(res.returncode, res.stdout, res.stderr)

    def run_many(self, targets: dict[int, tuple[Endpoint, str]], *, timeout: float = 10.0,
                 max_stdout: int | None = None) -> dict[int, CommandResult | Exception]:
        return {iid: self.run(ep, cmd, timeout=timeout) for iid, (ep, cmd) in targets.items()}

    def forget(self, endpoint: Endpoint) -> None:
        pass


BOX = Instance(id=7, label="rigsync:lab:x-1", status=InstanceStatus.RUNNING, gpu_name="RTX 3090", num_gpus=2,
               gpu_ram_mib=24564, dph_total=0.2, start_date=0.0, direct=Endpoint("box7", 22))


@pytest.fixture
def boxes(tmp_path: Path) -> Iterator[ShellBoxes]:
    home = tmp_path / "home"
    home.mkdir()
    fakebin = tmp_path / "bin"
    fakebin.mkdir()
    (fakebin / "nvidia-smi").write_text(FAKE_SMI)
    (fakebin / "nvidia-smi").chmod(0o755)
    yield ShellBoxes(LocalShell(home, f"{fakebin}:/usr/local/bin:/usr/bin:/bin"))  # type: ignore[arg-type]
    for pid_file in home.rglob("pid"):  # only the process groups this test started
        txt = pid_file.read_text().strip()
        if txt.isdigit():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(txt), signal.SIGKILL)


def _root(boxes: ShellBoxes) -> Path:
    return boxes.shell.home / "rigsync"  # type: ignore[attr-defined, no-any-return]


def _job(run_id: str, command: str, *, queued: bool = False, epoch: int = 0, mask: tuple[int, ...] = (1,)) -> LaunchJob:
    return LaunchJob(
        run_id=run_id, attempt=1, gpu_mask=mask, command=command, code_commit=None, desired_commit="d35173d",
        sweep="s", params=(), seed=1, metrics_file="metrics.jsonl", metric_key=None, metric_goal=MetricGoal.MAX,
        max_runtime_s=600.0, queued=queued, epoch=epoch,
    )


def _probe(boxes: ShellBoxes, epoch: int = 0) -> BoxProbe:
    (p,) = boxes.probe_many([BOX], timeout=20, epoch=epoch)
    assert p.reachable, p.error
    return p


def _wait(predicate, limit_s: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + limit_s
    while not predicate():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.05)


# Real processes on a local bash that wait out wrappers and kills: seconds, not the fast loop's.
LOCAL_BASH = pytest.mark.integration
GATED = 'while [ ! -e "$HOME/go" ]; do sleep 0.05; done'  # runs until the test says go


def _t(path: Path) -> float:
    return float(path.read_text())


@LOCAL_BASH
def test_two_queued_behind_a_running_attempt_run_back_to_back_without_the_controller(boxes: ShellBoxes) -> None:
    boxes.launch(BOX, _job("head", GATED))
    assert boxes.launch(BOX, _job("q1", "sleep 0.2", queued=True)).queued
    assert boxes.launch(BOX, _job("q2", "true", queued=True)).queued
    p = _probe(boxes)
    assert [(q.run_id, q.position, q.gpu_mask) for q in p.queued] == [("q1", 0, (1,)), ("q2", 1, (1,))]
    (boxes.shell.home / "go").touch()  # type: ignore[attr-defined]
    runs = _root(boxes) / "runs"
    _wait(lambda: (runs / "q2.1" / "exit_code").exists())
    assert _t(runs / "q1.1" / "started_at") >= _t(runs / "head.1" / "ended_at")
    assert _t(runs / "q2.1" / "started_at") >= _t(runs / "q1.1" / "ended_at")
    p = _probe(boxes)
    assert p.queued == ()
    q1 = next(r for r in p.runs if r.run_id == "q1")
    assert q1.pid is not None and q1.pid_started is not None  # launch's own answer, from the dequeue
    assert next(r for r in p.runs if r.run_id == "head").pid is None  # launched directly: the controller has it
    with pytest.raises(LaunchLockHeld):
        boxes.launch(BOX, _job("q1", "true", queued=True))


@LOCAL_BASH
def test_an_entry_on_a_free_slot_starts_at_once_and_another_slot_does_not_wait(boxes: ShellBoxes) -> None:
    boxes.launch(BOX, _job("busy", "sleep 30"))
    assert boxes.launch(BOX, _job("other", "true", queued=True, mask=(0,))).queued
    _wait(lambda: (_root(boxes) / "runs" / "other.1" / "exit_code").exists())
    assert _probe(boxes).queued == ()


@LOCAL_BASH
def test_a_killed_queued_attempt_never_starts_and_the_next_one_does(boxes: ShellBoxes) -> None:
    boxes.launch(BOX, _job("head", "sleep 30"))
    boxes.launch(BOX, _job("gone", "touch started", queued=True))
    boxes.launch(BOX, _job("next", "true", queued=True))
    boxes.launch(BOX, _job("not-gone", "true", queued=True))  # its entry's name ends like gone's: it stays
    boxes.kill(BOX, "gone", 1, exit_code=137, reason="superseded")
    assert [q.run_id for q in _probe(boxes).queued] == ["next", "not-gone"]
    boxes.kill(BOX, "head", 1, exit_code=137, reason="done with it")
    runs = _root(boxes) / "runs"
    _wait(lambda: (runs / "next.1" / "exit_code").exists(), 30)
    assert (runs / "gone.1" / "tombstone").exists() and not (runs / "gone.1" / "started_at").exists()


@LOCAL_BASH
def test_the_fence_refuses_an_older_launch_and_entry_and_tombstones_older_entries(boxes: ShellBoxes) -> None:
    boxes.launch(BOX, _job("head", "sleep 30", epoch=5))
    boxes.launch(BOX, _job("old", "touch started", queued=True, epoch=5))
    assert _probe(boxes, epoch=7).epoch == 7
    with pytest.raises(LaunchRefused, match=r"epoch 6.*epoch 7"):
        boxes.launch(BOX, _job("late", "true", epoch=6))
    with pytest.raises(LaunchRefused, match=r"epoch 6.*epoch 7"):
        boxes.launch(BOX, _job("late", "true", queued=True, epoch=6))
    assert not (_root(boxes) / "runs" / "late.1").exists()
    assert _probe(boxes).epoch == 7  # epoch 0 never lowers it
    boxes.kill(BOX, "head", 1, exit_code=137, reason="x")
    old = _root(boxes) / "runs" / "old.1"
    _wait(lambda: (old / "tombstone").exists(), 30)
    assert (old / "killed_reason").read_text().strip() == "fenced: epoch 5 < 7"
    assert not (old / "started_at").exists()
    boxes.launch(BOX, _job("unleased", "true"))  # epoch 0: never refused


@LOCAL_BASH
def test_a_draining_box_refuses_entries_and_reports_it(boxes: ShellBoxes) -> None:
    assert not _probe(boxes).draining
    boxes.drain(BOX)
    assert _probe(boxes).draining
    with pytest.raises(LaunchRefused, match="draining"):
        boxes.launch(BOX, _job("q", "true", queued=True))
    boxes.launch(BOX, _job("direct", "true"))
    _wait(lambda: (_root(boxes) / "runs" / "direct.1" / "exit_code").exists())
    root = str(_root(boxes))
    assert boxlib.unharvested(root) == 1
    boxes.mark_harvested(BOX, "direct", 1)
    assert boxlib.unharvested(root) == 0


@LOCAL_BASH
def test_the_probe_starts_the_head_of_a_slot_whose_wrapper_died(boxes: ShellBoxes) -> None:
    boxes.launch(BOX, _job("head", "sleep 30"))
    boxes.launch(BOX, _job("next", "true", queued=True))
    runs = _root(boxes) / "runs"
    pid = int((runs / "head.1" / "pid").read_text())
    os.killpg(pid, signal.SIGKILL)  # the wrapper and its command: nobody runs the dequeue
    _wait(lambda: not boxlib.alive(pid))
    assert boxlib.box_activity(str(_root(boxes))).queued
    _probe(boxes)
    _wait(lambda: (runs / "next.1" / "exit_code").exists())


# ------------------------------------------------------------------------------------------- the watchdog

BASE = {"started_at": 0.0, "ttl_s": None, "idle_timeout_s": 60.0, "orphan_timeout_s": 10_000.0,
        "touched_at": None, "run_activity_at": 0.0, "run_alive": False}


def test_queued_work_is_not_idle_but_ttl_and_orphan_still_fire() -> None:
    assert decide(1000.0, **BASE)  # type: ignore[arg-type]
    assert decide(1000.0, **BASE, queued=True) is None  # type: ignore[arg-type]
    ttl = decide(1000.0, **{**BASE, "ttl_s": 500.0}, queued=True)  # type: ignore[arg-type]
    orphan = decide(1000.0, **{**BASE, "orphan_timeout_s": 500.0}, queued=True)  # type: ignore[arg-type]
    assert ttl is not None and ttl.reason == "ttl" and orphan is not None and orphan.reason == "orphan"


def test_a_drained_box_goes_at_once_and_only_when_everything_is_harvested() -> None:
    fresh = {**BASE, "touched_at": 99.0, "run_activity_at": 99.0}
    drained = decide(100.0, **fresh, draining=True)  # type: ignore[arg-type]
    assert drained is not None and drained.reason == "drained"
    assert decide(100.0, **fresh) is None
    assert decide(100.0, **fresh, draining=True, unharvested=1) is None  # type: ignore[arg-type]
    assert decide(100.0, **fresh, draining=True, queued=True) is None  # type: ignore[arg-type]
    assert decide(100.0, **{**fresh, "run_alive": True}, draining=True) is None  # type: ignore[arg-type]


def test_the_onstart_stays_under_vasts_limit_with_the_longest_limits() -> None:
    onstart = remote.watchdog_onstart(ttl_s=1e15 + 0.123, idle_timeout_s=1e15 + 0.123, orphan_timeout_s=1e15 + 0.1)
    assert len(onstart) < 10_000, len(onstart)


# ------------------------------------------------------------------------------------------------ apply


def test_apply_gives_a_queued_launch_its_epoch_and_records_it_queued_without_a_pid() -> None:
    from dataclasses import replace

    from fakes import FakeArchive, FakeClock, FakeWorld, code_tar, desired_state, observe_and_plan, offer

    from reconciler.apply import ApplyContext, _attempt_record, apply
    from reconciler.core.actions import Launch, Plan
    from reconciler.core.model import AttemptOutcome

    desired = desired_state(1, max_instances=1)
    world = FakeWorld([offer(1, gpus=2)], clock=FakeClock(), boot_s=10.0)
    archive = FakeArchive()

    def ctx(observed: Any) -> ApplyContext:
        return ApplyContext(provider=world.provider, boxes=world.box_control, desired=desired, observed=observed,
                            archive=archive, code_tar=code_tar, now=world.clock.now, epoch=lambda: 9)

    observed, p = observe_and_plan(world, desired, archive)
    assert apply(p, ctx(observed)).failures == []
    world.clock.advance(11.0)
    observed, p = observe_and_plan(world, desired, archive)
    jobs: list[LaunchJob] = []
    real = world.box_control.launch

    def launch(box: Instance, job: LaunchJob) -> str:
        jobs.append(job)
        return real(box, job)

    world.box_control.launch = launch  # type: ignore[method-assign]
    actions = tuple(replace(a, queued=True) if isinstance(a, Launch) else a for a in p.actions)
    result = apply(Plan(actions=actions), ctx(observed))
    assert result.failures == []
    (job,) = jobs
    assert job.queued and job.epoch == 9
    (flight,) = result.launched
    assert flight.queued and flight.pid is None and flight.pid_started is None and flight.epoch == 9
    (outcome,) = [o for o in result.outcomes if isinstance(o.action, Launch)]
    assert outcome.detail == "queued"
    remembered = replace(observed, memory=replace(observed.memory, in_flight=(flight,)))
    rec = _attempt_record(ctx(remembered), {}, flight.run_id, flight.attempt, flight.instance_id, None,
                          AttemptOutcome.LOST, None, "x")
    assert rec.queued_at == flight.launched_at and rec.started_at is None
