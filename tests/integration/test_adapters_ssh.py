"""SshShell against real sshd boxes rented from the emulator: probe, pooling, host-key pinning, hangs, a run."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from gitutil import git
from waiting import wait_for

from reconciler import remote
from reconciler.adapters.ssh import SshShell, _host_id, ensure_keypair
from reconciler.adapters.vast import VastProvider
from reconciler.core.model import BoxProbe, Endpoint, Instance, OfferFilters, RunDirState
from reconciler.emulator import Emulator
from reconciler.emulator.testing import KeyPair
from reconciler.errors import HostKeyMismatch, HostUnreachable
from reconciler.ports import CommandResult
from reconciler.remote.launched import parse_launch_answer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def boxes(emulator: Emulator) -> Iterator[list[Instance]]:
    """Three running boxes, rented through the real SDK."""
    provider = VastProvider(api_key=emulator.api_key, server_url=emulator.url)
    offers = provider.search_offers(OfferFilters(verified=False), disk_gb=10)
    ids = [
        provider.create_instance(o.id, image="img", disk_gb=10, label=f"rigsync:ssh:{n}", onstart="", env={})
        for n, o in enumerate(offers[:3])
    ]
    emulator.wait_running(ids)
    listed = {i.id: i for i in provider.list_instances()}
    yield [listed[i] for i in ids]
    for i in ids:
        provider.destroy_instance(i)


@pytest.fixture
def shell(ssh_keypair: KeyPair, tmp_path: Path) -> Iterator[SshShell]:
    s = SshShell(private_key=ssh_keypair.private_path, known_hosts=tmp_path / "known_hosts", connect_timeout=3)
    yield s
    s.close()


def _ep(inst: Instance) -> Endpoint:
    assert inst.ssh is not None
    return inst.ssh


def test_ensure_keypair_is_stable_private_and_usable(tmp_path: Path) -> None:
    path, pub = ensure_keypair(tmp_path / "state")
    assert pub.startswith("ssh-ed25519 AAAA") and pub.endswith(" rigsync")
    assert (path.stat().st_mode & 0o777) == 0o600
    assert ensure_keypair(tmp_path / "state") == (path, pub)
    derived = subprocess.run(["ssh-keygen", "-y", "-f", str(path)], capture_output=True, text=True, check=True)
    assert derived.stdout.split()[:2] == pub.split()[:2]


def test_probe_a_rented_box(shell: SshShell, boxes: list[Instance], emulator: Emulator) -> None:
    inst = boxes[0]
    res = shell.run(_ep(inst), remote.probe_script(), timeout=20)
    assert res.exit_code == 0, res.stderr
    probe = remote.parse_probe(inst.id, res.stdout, gpus_listed=inst.num_gpus)
    assert probe.reachable and len(probe.gpus) == inst.num_gpus
    assert all(g.memory_used_mib <= 100 for g in probe.gpus)
    assert probe.python is not None and probe.runs == ()
    assert (emulator.host_root(inst.id)).exists()


def test_exit_codes_stdin_and_stderr_come_back(shell: SshShell, boxes: list[Instance]) -> None:
    # echoed back: more than a command's default stdout bound (COMMAND_STDOUT_BYTES), so the test states its own
    res = shell.run(_ep(boxes[0]), "cat; echo err >&2; exit 3", stdin=b"x" * 300_000, timeout=20, max_stdout=300_000)
    assert res == CommandResult(exit_code=3, stdout=b"x" * 300_000, stderr=b"err\n")
    assert res.answered_at is not None and abs(res.answered_at - time.time()) < 20


def test_connections_are_pooled_across_calls_and_cycles(shell: SshShell, boxes: list[Instance]) -> None:
    targets = {i.id: (_ep(i), "echo $HOME") for i in boxes}
    first = shell.run_many(targets, timeout=15)
    assert all(isinstance(r, CommandResult) and r.stdout == b"/root\n" for r in first.values()), first
    assert shell.connects == len(boxes)
    for _ in range(3):
        again = shell.run_many(targets, timeout=15)
        assert all(isinstance(r, CommandResult) and r.exit_code == 0 for r in again.values())
    shell.run(_ep(boxes[0]), "true")
    assert shell.connects == len(boxes)


def test_dead_pooled_connection_reconnects_transparently(shell: SshShell, boxes: list[Instance]) -> None:
    ep = _ep(boxes[1])
    assert shell.run(ep, "true").exit_code == 0
    shell._pool[ep].sock.close()  # the pooled connection dies under us between cycles
    assert shell.run(ep, "echo back").stdout == b"back\n"
    assert shell.connects == 2


def test_host_key_is_pinned_and_a_changed_key_refused(
    ssh_keypair: KeyPair, boxes: list[Instance], tmp_path: Path
) -> None:
    kh = tmp_path / "kh"
    a, b = _ep(boxes[0]), _ep(boxes[1])
    with SshShell(private_key=ssh_keypair.private_path, known_hosts=kh) as s:
        s.run(a, "true")
        s.run(b, "true")
    text = kh.read_text()
    assert f"{_host_id(a)} ssh-ed25519 " in text and _host_id(a) == f"vast-instance-{boxes[0].id}"
    # Box a's address now presents box b's key (as if the box behind the address changed).
    lines = {line.split()[0]: line.split(None, 1)[1] for line in text.splitlines()}
    lines[_host_id(a)] = lines[_host_id(b)]
    kh.write_text("".join(f"{h} {rest}\n" for h, rest in lines.items()))
    with SshShell(private_key=ssh_keypair.private_path, known_hosts=kh) as s:
        with pytest.raises(HostKeyMismatch):
            s.run(a, "true")
        res = s.run_many({1: (a, "true"), 2: (b, "true")}, timeout=10)
        assert isinstance(res[1], HostKeyMismatch) and isinstance(res[2], CommandResult)
        assert s.connects == 1
        s.forget(a)  # the box at this address was destroyed: the next one is trusted on first use
        assert s.run(a, "true").exit_code == 0


def test_a_hung_box_is_unreachable_alone_and_bounded(
    shell: SshShell, boxes: list[Instance], emulator: Emulator, ssh_keypair: KeyPair, tmp_path: Path
) -> None:
    targets = {i.id: (_ep(i), remote.probe_script()) for i in boxes}
    warm = shell.run_many(targets, timeout=15)
    assert all(isinstance(r, CommandResult) for r in warm.values())
    hung = boxes[2].id
    emulator.hang(hung)
    try:
        t0 = time.monotonic()
        res = shell.run_many(targets, timeout=3)  # pooled connection to a stopped sshd
        elapsed = time.monotonic() - t0
        assert isinstance(res[hung], HostUnreachable), res[hung]
        for i in boxes[:2]:
            r = res[i.id]
            assert isinstance(r, CommandResult) and r.exit_code == 0
            assert remote.parse_probe(i.id, r.stdout, gpus_listed=i.num_gpus).reachable
        print(f"hung pooled box answered HostUnreachable after {elapsed:.2f}s")

        cold = SshShell(private_key=ssh_keypair.private_path, known_hosts=tmp_path / "kh2", connect_timeout=2)
        with cold, pytest.raises(HostUnreachable):
            cold.run(_ep(boxes[2]), "true", timeout=3)  # new connection: TCP accepts, no banner
    finally:
        emulator.resume(hung)
    assert shell.run(_ep(boxes[2]), "echo alive", timeout=15).stdout == b"alive\n"


def test_launch_over_ssh_and_see_the_run_finish(
    shell: SshShell, boxes: list[Instance], emulator: Emulator, tmp_path: Path
) -> None:
    inst = boxes[0]
    ep = _ep(inst)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "train.py").write_text(
        "import json, os\n"
        "with open(os.environ['RIGSYNC_METRICS_FILE'], 'a') as f:\n"
        "    for step, acc in enumerate([0.2, 0.8, 0.6]):\n"
        "        f.write(json.dumps({'step': step, 'acc': acc}) + '\\n')\n"
        "print('trained on', os.environ['CUDA_VISIBLE_DEVICES'])\n"
    )
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "c"]):
        git(repo, *args)
    commit = git(repo, "rev-parse", "HEAD")
    tar = subprocess.run(["git", "archive", "--format=tar", commit], cwd=repo, capture_output=True, check=True).stdout

    shipped = shell.run(ep, remote.ship_code_script(commit), stdin=tar, timeout=30)
    assert shipped.exit_code == 0, shipped.stderr
    launch = remote.launch_script(
        run_id="sshrun", attempt=0, gpu_mask=(0,), command='"$RIGSYNC_PYTHON" train.py', code_commit=commit,
        desired_commit=commit, metrics_file="metrics.jsonl", metric_key="acc", metric_goal="max",
        max_runtime_s=600, sweep="s", params={"lr": 0.1}, seed=0,
    )
    started = shell.run(ep, launch, timeout=20)
    assert started.exit_code == 0, started.stderr
    pid, pid_started = parse_launch_answer(started.stdout)
    assert pid is not None and pid_started is not None, started.stdout
    assert shell.run(ep, launch, timeout=20).exit_code == remote.LAUNCH_LOCK_EXIT

    def ended() -> tuple[BoxProbe, RunDirState] | None:
        res = shell.run(ep, remote.probe_script(), timeout=20)
        probe = remote.parse_probe(inst.id, res.stdout, gpus_listed=inst.num_gpus)
        run = next(r for r in probe.runs if r.run_id == "sshrun")
        return (probe, run) if run.exit_code is not None else None

    probe, run = wait_for("the run to end", ended, 60)
    assert run.exit_code == 0, run
    assert run.best_metric == 0.8 and run.final_metric == 0.6 and run.code_commit == commit
    assert commit in probe.code_commits
    out = emulator.host_root(inst.id) / "rigsync" / "runs" / "sshrun.0" / "stdout.log"
    assert out.read_text() == "trained on 0\n"


def test_a_box_whose_real_host_key_changed_probes_as_host_key_changed(
    ssh_keypair: KeyPair, emulator: Emulator, tmp_path: Path
) -> None:
    """The box's sshd really gets a new key (the emulator rewrites it and HUPs sshd): the probe says so, apart from
    an unreachable box, and nothing runs on the box over the refused connection."""
    from reconciler.adapters.box_control import ShellBoxes

    provider = VastProvider(api_key=emulator.api_key, server_url=emulator.url)
    offer = provider.search_offers(OfferFilters(verified=False), disk_gb=10)[0]
    iid = provider.create_instance(offer.id, image="img", disk_gb=10, label="rigsync:ssh:rekey", onstart="", env={})
    try:
        emulator.wait_running([iid])
        box = next(i for i in provider.list_instances() if i.id == iid)
        ep = _ep(box)
        kh = tmp_path / "kh"
        with SshShell(private_key=ssh_keypair.private_path, known_hosts=kh, connect_timeout=3) as s:
            [before] = ShellBoxes(s).probe_many([box], timeout=10)
            assert before.reachable and not before.host_key_changed
        emulator.rekey(iid)  # returns once the re-executed sshd listens again
        marker = emulator.host_root(iid) / "touched-after-rekey"
        with SshShell(private_key=ssh_keypair.private_path, known_hosts=kh, connect_timeout=3) as s:
            [after] = ShellBoxes(s).probe_many([box], timeout=10)
            assert not after.reachable and after.host_key_changed
            assert after.error is not None and after.error.startswith("HostKeyMismatch:")
            with pytest.raises(HostKeyMismatch):
                s.run(ep, "touch /root/touched-after-rekey")
        assert not marker.exists()
    finally:
        provider.destroy_instance(iid)
