"""A forged pid kills nothing else, on real sshd boxes (each in its own PID namespace): a job that writes `1`, the
box's sshd pid or another run's pid into its pid file and stops its wrapper's heartbeat is ended by the identity its
launch recorded, while an unrelated process, the other run and rigsync's own SSH sessions live on; a kill without a
recorded identity still ends a job (its wrapper does) and records the exit code."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from waiting import wait_for

from reconciler import remote
from reconciler.adapters.box_control import ShellBoxes
from reconciler.adapters.ssh import SshShell
from reconciler.adapters.vast import VastProvider
from reconciler.core.model import Endpoint, Instance, OfferFilters
from reconciler.emulator import Emulator
from reconciler.emulator.testing import KeyPair
from reconciler.remote.launched import parse_launch_answer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def box(emulator: Emulator) -> Iterator[Instance]:
    provider = VastProvider(api_key=emulator.api_key, server_url=emulator.url)
    (offer, *_) = provider.search_offers(OfferFilters(verified=False), disk_gb=10)
    iid = provider.create_instance(offer.id, image="img", disk_gb=10, label="rigsync:kill:0", onstart="", env={})
    emulator.wait_running([iid])
    yield next(i for i in provider.list_instances() if i.id == iid)
    provider.destroy_instance(iid)


@pytest.fixture
def shell(ssh_keypair: KeyPair, tmp_path: Path) -> Iterator[SshShell]:
    s = SshShell(private_key=ssh_keypair.private_path, known_hosts=tmp_path / "known_hosts", connect_timeout=3)
    yield s
    s.close()


def _ep(inst: Instance) -> Endpoint:
    assert inst.ssh is not None
    return inst.ssh


def _sh(shell: SshShell, inst: Instance, command: str) -> str:
    res = shell.run(_ep(inst), command, timeout=30)
    assert res.exit_code == 0, res.stderr
    return res.stdout.decode().strip()


def _launch(shell: SshShell, inst: Instance, run_id: str, command: str) -> tuple[int, int]:
    script = remote.launch_script(
        run_id=run_id, attempt=1, gpu_mask=(0,), command=command, code_commit=None, desired_commit=None,
        metrics_file="metrics.jsonl", metric_key=None, metric_goal="max", max_runtime_s=3600, sweep="s", params={},
        seed=0,
    )  # fmt: skip
    res = shell.run(_ep(inst), script, timeout=30)
    assert res.exit_code == 0, res.stderr
    pid, started = parse_launch_answer(res.stdout)
    assert pid is not None and started is not None, res.stdout
    return pid, started


def _alive(shell: SshShell, inst: Instance, pid: int) -> bool:
    state = _sh(shell, inst, f"sed -e 's/.*) //' /proc/{pid}/stat 2>/dev/null | cut -c1 || true")
    return state not in ("", "Z")


def _group(shell: SshShell, inst: Instance, pgid: int) -> list[str]:
    out = _sh(shell, inst, f"ps -eo pid=,pgid=,stat= | awk '$2 == {pgid} && $3 !~ /^Z/ {{print $1}}'")
    return out.split()


def _run_dir(emulator: Emulator, inst: Instance, run_id: str) -> Path:
    return emulator.host_root(inst.id) / "rigsync" / "runs" / f"{run_id}.1"


def _heartbeat_stopped(shell: SshShell, inst: Instance, wrapper: int, job: int) -> bool:
    """The wrapper and its children but the job are stopped (SIGSTOP), and what they had forked has ended but their
    sleeps (a zombie now, or a ``sleep``): nothing is left that could touch the heartbeat again."""
    rows = [line.split(None, 3) for line in _sh(shell, inst, "ps -eo pid=,ppid=,stat=,comm=").splitlines()]
    procs = {int(pid): (int(ppid), stat, comm) for pid, ppid, stat, comm in rows}
    stopped = {wrapper} | {p for p, (pp, _, _) in procs.items() if pp == wrapper and p != job}
    if not all(procs.get(p, (0, "", ""))[1].startswith("T") for p in stopped):
        return False
    forked = [(stat, comm) for p, (pp, stat, comm) in procs.items() if pp in stopped - {wrapper} and p not in stopped]
    return all(stat.startswith("Z") or comm == "sleep" for stat, comm in forked)


# The job: its pid file says FORGED and its own pid is in ``job``, then it stops its wrapper and the wrapper's
# heartbeat (SIGSTOP), says so in a file of its own, and runs on.
FORGER = (
    'echo FORGED > "$RIGSYNC_RUN_DIR/pid"; echo $$ > "$RIGSYNC_RUN_DIR/job"; '
    'for c in $(pgrep -P "$PPID"); do [ "$c" != "$$" ] && kill -STOP "$c"; done; kill -STOP "$PPID"; '
    ': > "$RIGSYNC_RUN_DIR/stopped"; '
    "sleep 600 & sleep 600; wait"
)


@pytest.mark.parametrize("forged", ["1", "sshd", "other run"])
def test_a_forged_pid_file_kills_nothing_else_and_the_recorded_group_ends(
    forged: str, box: Instance, shell: SshShell, emulator: Emulator
) -> None:
    tag = {"1": "one", "sshd": "sshd", "other run": "other"}[forged]
    bystander = int(_sh(shell, box, "setsid nohup sleep 900 >/dev/null 2>&1 </dev/null & echo $!"))
    other_pid, _ = _launch(shell, box, f"other-{tag}", "sleep 900")
    sshd = int(_sh(shell, box, "pgrep -o -x sshd"))
    value = {"1": "1", "sshd": str(sshd), "other run": str(other_pid)}[forged]
    run_id = f"forger-{tag}"
    pid, started = _launch(shell, box, run_id, FORGER.replace("FORGED", value))
    d = _run_dir(emulator, box, run_id)
    wait_for("the job to stop its wrapper", lambda: (d / "stopped").exists(), 30)
    assert (d / "pid").read_text().strip() == value
    job = int((d / "job").read_text())
    wait_for("the job to stop its wrapper's heartbeat", lambda: _heartbeat_stopped(shell, box, pid, job), 30,
             explain=lambda: f"(wrapper {pid}, job {job}):\n{_sh(shell, box, 'ps -eo pid,ppid,stat,comm')}")

    ShellBoxes(shell).kill(box, run_id, 1, exit_code=137, reason="heartbeat stale", pid=pid, pid_started=started)

    assert _group(shell, box, pid) == [] and not _alive(shell, box, pid)
    assert (d / "exit_code").read_text().strip() == "137" and (d / "ended_at").exists()
    assert _alive(shell, box, bystander) and _alive(shell, box, other_pid) and _alive(shell, box, sshd)
    assert _sh(shell, box, "echo still here") == "still here"  # rigsync's SSH session and new ones work
    other_dir = _run_dir(emulator, box, f"other-{tag}")
    assert not (other_dir / "exit_code").exists()
    ShellBoxes(shell).kill(box, f"other-{tag}", 1, exit_code=137, reason="cleanup", pid=other_pid, pid_started=_)
    _sh(shell, box, f"kill {bystander}")


def test_a_kill_without_a_recorded_identity_ends_the_job_through_its_wrapper(
    box: Instance, shell: SshShell, emulator: Emulator
) -> None:
    bystander = int(_sh(shell, box, "setsid nohup sleep 900 >/dev/null 2>&1 </dev/null & echo $!"))
    pid, _ = _launch(shell, box, "plain", 'echo 1 > "$RIGSYNC_RUN_DIR/pid"; sleep 600 & sleep 600; wait')
    d = _run_dir(emulator, box, "plain")
    wait_for("the job's pid file to say 1", lambda: (d / "pid").read_text().strip() == "1", 30)

    ShellBoxes(shell).kill(box, "plain", 1, exit_code=137, reason="requeued")  # no pid, no start

    assert (d / "exit_code").read_text().strip() == "137"
    assert (d / "killed_reason").read_text().strip() == "requeued" and (d / "ended_at").exists()
    wait_for("the job's group to end", lambda: _group(shell, box, pid) == [], 15)
    assert _alive(shell, box, bystander) and _sh(shell, box, "echo ok") == "ok"
    probe = remote.parse_probe(
        box.id, shell.run(_ep(box), remote.probe_script(), timeout=30).stdout, gpus_listed=box.num_gpus
    )
    (run,) = [r for r in probe.runs if r.run_id == "plain"]
    assert run.exit_code == 137 and not run.pid_alive
    _sh(shell, box, f"kill {bystander}")
