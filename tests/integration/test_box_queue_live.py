"""The box-side queue, fence and drain on real sshd boxes from the emulator, through the real adapter (``ShellBoxes``
over ``SshShell``): two attempts queued behind a running one run back to back with no controller call between (the
gap between one's end and the next's start is printed as a ``box-queue:`` line, ``pytest -s``); a killed queued
attempt never starts and the next one does; the fence refuses an older launch and entry and tombstones older entries;
a wrapper killed -9 leaves its slot's head to the next probe; a draining box with everything harvested destroys
itself through the emulator's API (destroy in the ledger, never stop); queued work keeps the watchdog's idle rule off.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from waiting import wait_for

from reconciler import remote
from reconciler.adapters.box_control import ShellBoxes
from reconciler.adapters.ssh import SshShell
from reconciler.adapters.vast import VastProvider
from reconciler.core.model import BoxProbe, Instance, MetricGoal, OfferFilters
from reconciler.emulator import Emulator
from reconciler.emulator.testing import KeyPair
from reconciler.errors import LaunchRefused
from reconciler.ports import LaunchJob

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

GATED = 'while [ ! -e "$HOME/go-$RIGSYNC_RUN_ID" ]; do sleep 0.05; done'  # runs until the test says go


def _rent(emulator: Emulator, label: str, onstart: str = "") -> Instance:
    provider = VastProvider(api_key=emulator.api_key, server_url=emulator.url)
    (offer, *_) = provider.search_offers(OfferFilters(verified=False), disk_gb=10)
    iid = provider.create_instance(offer.id, image="img", disk_gb=10, label=label, onstart=onstart, env={})
    emulator.wait_running([iid])
    return next(i for i in provider.list_instances() if i.id == iid)


def _listed(emulator: Emulator, iid: int) -> bool:
    provider = VastProvider(api_key=emulator.api_key, server_url=emulator.url)
    return any(i.id == iid for i in provider.list_instances())


@pytest.fixture(scope="module")
def box(emulator: Emulator) -> Iterator[Instance]:
    inst = _rent(emulator, "rigsync:queue:0")
    yield inst
    VastProvider(api_key=emulator.api_key, server_url=emulator.url).destroy_instance(inst.id)


@pytest.fixture
def boxes(ssh_keypair: KeyPair, tmp_path: Path) -> Iterator[ShellBoxes]:
    s = SshShell(private_key=ssh_keypair.private_path, known_hosts=tmp_path / "known_hosts", connect_timeout=3)
    yield ShellBoxes(s)
    s.close()


def _job(run_id: str, command: str, mask: tuple[int, ...], *, queued: bool = False, epoch: int = 0) -> LaunchJob:
    return LaunchJob(
        run_id=run_id, attempt=1, gpu_mask=mask, command=command, code_commit=None, desired_commit=None, sweep="s",
        params=(), seed=0, metrics_file="metrics.jsonl", metric_key=None, metric_goal=MetricGoal.MAX,
        max_runtime_s=600.0, queued=queued, epoch=epoch,
    )


def _root(emulator: Emulator, inst: Instance) -> Path:
    return emulator.host_root(inst.id) / "rigsync"


def _probe(boxes: ShellBoxes, inst: Instance, epoch: int = 0) -> BoxProbe:
    (p,) = boxes.probe_many([inst], timeout=30, epoch=epoch)
    assert p.reachable, p.error
    return p


def _go(boxes: ShellBoxes, inst: Instance, run_id: str) -> None:
    assert inst.ssh is not None
    assert boxes.shell.run(inst.ssh, f"touch $HOME/go-{run_id}", timeout=30).exit_code == 0


def _t(path: Path) -> float:
    return float(path.read_text())


def test_two_queued_behind_a_running_attempt_run_back_to_back(
    box: Instance, boxes: ShellBoxes, emulator: Emulator
) -> None:
    mask = (0,)
    boxes.launch(box, _job("b2b-head", GATED, mask))
    assert boxes.launch(box, _job("b2b-q1", "sleep 0.3", mask, queued=True)).queued
    assert boxes.launch(box, _job("b2b-q2", "sleep 0.3", mask, queued=True)).queued
    assert [q.run_id for q in _probe(boxes, box).queued] == ["b2b-q1", "b2b-q2"]
    _go(boxes, box, "b2b-head")  # from here on, no controller call until both have ended
    runs = _root(emulator, box) / "runs"
    wait_for("b2b-q2 to end", lambda: (runs / "b2b-q2.1" / "exit_code").exists(), 30)
    head_end, q1_start = _t(runs / "b2b-head.1" / "ended_at"), _t(runs / "b2b-q1.1" / "started_at")
    q1_end, q2_start = _t(runs / "b2b-q1.1" / "ended_at"), _t(runs / "b2b-q2.1" / "started_at")
    assert head_end <= q1_start and q1_end <= q2_start
    gaps = [q1_start - head_end, q2_start - q1_end]
    print(f"box-queue: gap from one attempt's ended_at to the next's started_at: {gaps[0]:.3f}s, {gaps[1]:.3f}s")
    assert max(gaps) < 5.0
    p = _probe(boxes, box)
    assert p.queued == ()
    q1 = next(r for r in p.runs if r.run_id == "b2b-q1")
    assert q1.exit_code == 0 and q1.pid is not None and q1.pid_started is not None


def test_a_killed_queued_attempt_never_starts_and_the_next_one_does(
    box: Instance, boxes: ShellBoxes, emulator: Emulator
) -> None:
    mask = (1,)
    boxes.launch(box, _job("kq-head", GATED, mask))
    boxes.launch(box, _job("kq-gone", "true", mask, queued=True))
    boxes.launch(box, _job("kq-next", "true", mask, queued=True))
    boxes.kill(box, "kq-gone", 1, exit_code=137, reason="superseded")
    assert [q.run_id for q in _probe(boxes, box).queued if q.gpu_mask == mask] == ["kq-next"]
    _go(boxes, box, "kq-head")
    runs = _root(emulator, box) / "runs"
    wait_for("kq-next to end", lambda: (runs / "kq-next.1" / "exit_code").exists(), 30)
    assert (runs / "kq-gone.1" / "tombstone").exists() and not (runs / "kq-gone.1" / "started_at").exists()


def test_a_wrapper_killed_9_leaves_the_head_to_the_next_probe(
    box: Instance, boxes: ShellBoxes, emulator: Emulator
) -> None:
    mask = (2,)
    boxes.launch(box, _job("k9-head", "sleep 300", mask))
    boxes.launch(box, _job("k9-next", "true", mask, queued=True))
    runs = _root(emulator, box) / "runs"
    pid = int((runs / "k9-head.1" / "pid").read_text())
    assert box.ssh is not None
    assert boxes.shell.run(box.ssh, f"kill -9 -- -{pid}", timeout=30).exit_code == 0
    time.sleep(0.5)
    assert not (runs / "k9-next.1").exists()  # nobody ran the slot's dequeue
    _probe(boxes, box)
    wait_for("k9-next to end", lambda: (runs / "k9-next.1" / "exit_code").exists(), 30)


def test_the_fence_refuses_older_launches_and_tombstones_older_entries(
    emulator: Emulator, boxes: ShellBoxes
) -> None:
    inst = _rent(emulator, "rigsync:queue:1")
    try:
        mask = (0,)
        boxes.launch(inst, _job("f-head", GATED, mask, epoch=5))
        boxes.launch(inst, _job("f-old", "true", mask, queued=True, epoch=5))
        assert _probe(boxes, inst, epoch=7).epoch == 7
        with pytest.raises(LaunchRefused, match=r"epoch 6.*epoch 7"):
            boxes.launch(inst, _job("f-late", "true", (1,), epoch=6))
        with pytest.raises(LaunchRefused, match=r"epoch 6.*epoch 7"):
            boxes.launch(inst, _job("f-late-q", "true", mask, queued=True, epoch=6))
        _go(boxes, inst, "f-head")
        old = _root(emulator, inst) / "runs" / "f-old.1"
        wait_for("the older entry's tombstone", lambda: (old / "tombstone").exists(), 30)
        assert (old / "killed_reason").read_text().strip() == "fenced: epoch 5 < 7"
        assert not (old / "started_at").exists()
        assert not (_root(emulator, inst) / "runs" / "f-late.1").exists()
    finally:
        VastProvider(api_key=emulator.api_key, server_url=emulator.url).destroy_instance(inst.id)


def _watchdog_box(emulator: Emulator, label: str) -> Instance:
    onstart = remote.watchdog_onstart(ttl_s=None, idle_timeout_s=10, orphan_timeout_s=600)  # checks every second
    inst = _rent(emulator, label, onstart)
    wait_for("the watchdog to start", lambda: (_root(emulator, inst) / "watchdog" / "pid").exists(), 30)
    return inst


def test_a_drained_box_with_everything_harvested_destroys_itself(emulator: Emulator, boxes: ShellBoxes) -> None:
    inst = _watchdog_box(emulator, "rigsync:queue:2")
    boxes.launch(inst, _job("d-run", "true", (0,)))
    wait_for("d-run to end", lambda: (_root(emulator, inst) / "runs" / "d-run.1" / "exit_code").exists(), 30)
    boxes.drain(inst)
    p = _probe(boxes, inst)
    assert p.draining
    with pytest.raises(LaunchRefused, match="draining"):
        boxes.launch(inst, _job("d-more", "true", (0,), queued=True))
    time.sleep(2.5)
    assert _listed(emulator, inst.id), "an unharvested run keeps a draining box"
    marked = time.monotonic()
    boxes.mark_harvested(inst, "d-run", 1)
    wait_for("the box to destroy itself", lambda: not _listed(emulator, inst.id), 30)
    print(f"box-queue: drained box gone {time.monotonic() - marked:.1f}s after its last harvest mark")
    kinds = [e["type"] for e in emulator.ledger.events if e.get("instance_id") == inst.id]
    assert "destroy" in kinds and "stop" not in kinds


def test_queued_work_keeps_the_watchdogs_idle_rule_off(emulator: Emulator, boxes: ShellBoxes) -> None:
    inst = _watchdog_box(emulator, "rigsync:queue:3")
    root = _root(emulator, inst)
    entry = root / "queue" / "0" / "000000000001-idle-q.1"  # waiting, with nothing alive to end (no dequeue yet)
    entry.mkdir(parents=True)
    (entry / "epoch").write_text("0\n")
    # The box looks old and never probed: idle (10 s) and past the controller's grace, but not orphaned (600 s).
    (root / "watchdog" / "started_at").write_text(f"{time.time() - 120:.6f}\n")
    assert inst.ssh is not None
    log = root / "watchdog" / "watchdog.log"
    starts = log.read_text().count("watching instance")
    restart = "kill $(pgrep -P $(cat $HOME/rigsync/watchdog/pid) -f watchdog.py)"
    assert boxes.shell.run(inst.ssh, restart, timeout=30).exit_code == 0  # the supervisor restarts it in 5 s
    wait_for("the watchdog to start again", lambda: log.read_text().count("watching instance") > starts, 30)
    time.sleep(3)  # a negative: three of its checks (every second) see the box idle but for its queue
    assert _listed(emulator, inst.id), "a box with queued work was destroyed as idle"
    assert "destroying" not in log.read_text()
    (entry / "epoch").unlink()
    entry.rmdir()
    # then idle: the watchdog was watching all along
    wait_for("the box to destroy itself", lambda: not _listed(emulator, inst.id), 30)
