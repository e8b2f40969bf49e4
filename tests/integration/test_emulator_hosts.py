"""The emulator's instances are real hosts: real OpenSSH and paramiko log in, jobs run, faults bite."""

from __future__ import annotations

import time
from typing import Any

import paramiko
import pytest
from vastai import VastAI
from waiting import wait_for

from reconciler.emulator import Emulator
from reconciler.emulator.testing import KeyPair, make_keypair, ssh

pytestmark = pytest.mark.integration


def rent(emu: Emulator, query: str = "num_gpus=1", **kw: Any) -> int:
    v = VastAI(api_key=emu.api_key, server_url=emu.url)
    offers = v.search_offers(query=query, order="dph_total")
    assert offers, f"no offer matches {query!r}"
    r = v.create_instance(id=offers[0]["id"], image="rigsync/test", disk=10, **kw)
    iid = int(r["new_contract"])
    emu.wait_running([iid], timeout=20)
    return iid


def addr(emu: Emulator, iid: int) -> tuple[str, int, int]:
    rec = emu.instance(iid)
    return rec["ssh_host"], int(rec["ssh_port"]), int(rec["ports"]["22/tcp"][0]["HostPort"])


def test_openssh_logs_in_on_proxy_and_direct_address(emulator: Emulator, ssh_keypair: KeyPair) -> None:
    iid = rent(emulator, onstart_cmd="echo booted > /root/onstart_ran")
    host, proxy, direct = addr(emulator, iid)
    rec = emulator.instance(iid)
    # The proxy is a host of its own (shared by every box); the direct port is on the box's own address.
    assert host == emulator.proxy.ip and rec["public_ipaddr"].startswith("127.0.1.") and rec["public_ipaddr"] != host
    for h, port in ((host, proxy), (rec["public_ipaddr"], direct)):
        r = ssh(ssh_keypair, h, port,
                "echo $CONTAINER_ID $EMULATOR_SPEED_FACTOR; echo ${#CONTAINER_API_KEY}; python3 -c 'print(6*7)'; "
                "cat ~/onstart_ran; command -v git tar nvidia-smi; echo $HOME")
        assert r.returncode == 0, r.stderr
        lines = r.stdout.split("\n")
        assert lines[0] == f"{iid} {rec['emulator_speed_factor']:g}"
        assert lines[1] == "64"
        assert lines[2] == "42"
        assert lines[3] == "booted"
        assert lines[4:7] == ["/usr/bin/git", "/usr/bin/tar", "/usr/local/bin/nvidia-smi"]
        assert lines[7] == "/root"
    # The box's /root is its own directory on the real disk.
    ssh(ssh_keypair, host, proxy, "mkdir -p ~/rigsync/runs/r1 && echo 5 > ~/rigsync/runs/r1/exit_code")
    assert (emulator.host_root(iid) / "rigsync/runs/r1/exit_code").read_text() == "5\n"
    # ...and it sees only its own processes.
    r = ssh(ssh_keypair, host, proxy, "ps -e -o pid= | wc -l")
    assert int(r.stdout) < 10


def test_wrong_key_is_refused(emulator: Emulator, tmp_path: Any) -> None:
    iid = rent(emulator)
    host, proxy, _ = addr(emulator, iid)
    r = ssh(make_keypair(tmp_path), host, proxy, "true")
    assert r.returncode == 255 and "Permission denied" in r.stderr


def test_paramiko_and_nvidia_smi_see_a_cuda_job(emulator: Emulator, ssh_keypair: KeyPair) -> None:
    iid = rent(emulator, query="num_gpus>=2")
    _, _, direct = addr(emulator, iid)
    host = emulator.instance(iid)["public_ipaddr"]
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    client.connect(host, port=direct, username="root", key_filename=str(ssh_keypair.private_path),
                   timeout=5, allow_agent=False, look_for_keys=False)
    try:
        def run(cmd: str) -> tuple[int, str, str]:
            _, out, err = client.exec_command(cmd, timeout=15)
            code = out.channel.recv_exit_status()
            return code, out.read().decode(), err.read().decode()

        q = "nvidia-smi --query-gpu=index,memory.used,memory.total,utilization.gpu --format=csv,noheader,nounits"
        code, out, _ = run(q)
        assert code == 0
        idle = [line.split(", ") for line in out.strip().splitlines()]
        assert len(idle) == emulator.instance(iid)["num_gpus"]
        assert all(int(row[1]) <= 100 and row[3] == "0" for row in idle)

        code, _, _ = run("CUDA_VISIBLE_DEVICES=1 setsid nohup python3 -c 'import time; time.sleep(120)' "
                         ">/dev/null 2>&1 </dev/null & echo $! > ~/job.pid")
        assert code == 0
        def gpu1_busy() -> list[list[str]] | None:
            rows = [line.split(", ") for line in run(q)[1].strip().splitlines()]
            return rows if int(rows[1][1]) > 100 else None

        rows = wait_for("GPU 1 to show the job's memory", gpu1_busy, 60, every=0.1)
        assert rows[1][3] != "0"
        assert int(rows[0][1]) <= 100
        code, out, _ = run("nvidia-smi --query-compute-apps=pid,used_memory,gpu_uuid --format=csv,noheader,nounits")
        apps = [line.split(", ") for line in out.strip().splitlines()]
        _, pid, _ = run("cat ~/job.pid")
        assert [a[0] for a in apps] == [pid.strip()]
        code, _, err = run("nvidia-smi --query-gpu=index,foo --format=csv")
        assert code == 2 and 'Field "foo" is not a valid field to query.' in err
    finally:
        client.close()


def test_vanish_kills_detached_jobs(emulator: Emulator, ssh_keypair: KeyPair) -> None:
    iid = rent(emulator)
    host, proxy, _ = addr(emulator, iid)
    r = ssh(ssh_keypair, host, proxy,
            "nohup sh -c 'while true; do date +%s%N >> ~/tick_nohup; sleep 0.05; done' >/dev/null 2>&1 </dev/null &"
            " setsid sh -c 'while true; do date +%s%N >> ~/tick_setsid; sleep 0.05; done' >/dev/null 2>&1 </dev/null &"
            " sleep 0.3")
    assert r.returncode == 0, r.stderr
    root = emulator.host_root(iid)
    box = emulator._get(iid).box
    assert len(box.pids()) >= 3
    emulator.vanish(iid)
    assert box.pids() == []
    sizes = [(root / f).stat().st_size for f in ("tick_nohup", "tick_setsid")]
    time.sleep(0.3)
    assert [(root / f).stat().st_size for f in ("tick_nohup", "tick_setsid")] == sizes
    assert emulator.instance(iid)["actual_status"] == "offline"
    r = ssh(ssh_keypair, host, proxy, "true", connect_timeout=3)
    assert r.returncode == 255
    assert any(e["type"] == "vanish" and e["instance_id"] == iid for e in emulator.ledger.events)


def test_hang_times_out_and_resume_heals(emulator: Emulator, ssh_keypair: KeyPair) -> None:
    iid = rent(emulator)
    host, proxy, _ = addr(emulator, iid)
    emulator.hang(iid)
    r = ssh(ssh_keypair, host, proxy, "true", connect_timeout=2)
    assert r.returncode == 255 and "timed out" in r.stderr
    assert emulator.instance(iid)["actual_status"] == "running"  # the API does not know
    emulator.resume(iid)
    r = ssh(ssh_keypair, host, proxy, "echo back")
    assert r.returncode == 0 and r.stdout == "back\n"


def test_stop_keeps_disk_and_start_reboots(emulator: Emulator, ssh_keypair: KeyPair) -> None:
    iid = rent(emulator)
    host, proxy, _ = addr(emulator, iid)
    assert ssh(ssh_keypair, host, proxy, "echo kept > ~/data").returncode == 0
    v = VastAI(api_key=emulator.api_key, server_url=emulator.url)
    v.stop_instance(id=iid)
    rec = v.show_instance(id=iid)
    assert (rec["actual_status"], rec["cur_state"]) == ("stopped", "stopped")
    assert ssh(ssh_keypair, host, proxy, "true", connect_timeout=2).returncode == 255
    v.start_instance(id=iid)
    emulator.wait_running([iid], timeout=20)
    r = ssh(ssh_keypair, host, proxy, "cat ~/data")
    assert r.stdout == "kept\n"


def test_never_boot_stays_loading(emulator: Emulator) -> None:
    emulator.never_boot()
    v = VastAI(api_key=emulator.api_key, server_url=emulator.url)
    offer = v.search_offers(query="num_gpus=1", order="dph_total")[0]
    iid = int(v.create_instance(id=offer["id"], image="x", disk=10)["new_contract"])
    with pytest.raises(TimeoutError):
        emulator.wait_running([iid], timeout=1.5)
    assert emulator.instance(iid)["actual_status"] == "loading"
    v.destroy_instance(id=iid)


def test_teardown_leaves_no_processes(ssh_keypair: KeyPair) -> None:
    with Emulator(seed=3, offers=50, boot_delay=0.1) as emu:
        emu.add_ssh_key(ssh_keypair.public)
        ids = [rent(emu), rent(emu)]
        for iid in ids:
            host, proxy, _ = addr(emu, iid)
            r = ssh(ssh_keypair, host, proxy, "setsid nohup sleep 300 >/dev/null 2>&1 </dev/null & true")
            assert r.returncode == 0
        emu.hang(ids[1])  # a frozen box must die too
        assert emu.alive_processes() >= 6
        state_dir = emu.state_dir
    assert emu.alive_processes() == 0
    assert not state_dir.exists()
