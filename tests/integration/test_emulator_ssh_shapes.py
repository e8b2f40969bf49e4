"""The emulator's SSH endpoints have Vast's shapes, and the real ``vastai`` client finds each box where it is.

One shared proxy host with a port per instance; direct-port instances (``ports["22/tcp"]`` on ``public_ipaddr``)
when the offer has direct ports and the runtype asks ``ssh_direc``; proxy-only ones otherwise; and the jupyter
quirk (the record's ``ssh_port`` one below the sshd behind the proxy: the CLI's ``ssh-url`` adds one, the SDK's
``ssh_url()`` does not). Every address is checked with the real OpenSSH client against a real sshd.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paramiko
import pytest
from vastai import VastAI

from reconciler.emulator import Emulator
from reconciler.emulator.testing import KeyPair, ssh

pytestmark = pytest.mark.integration

VASTAI = str(Path(sys.executable).parent / "vastai")


@pytest.fixture(scope="module")
def emu(ssh_keypair: KeyPair) -> Iterator[Emulator]:
    with Emulator(seed=11, offers=80, boot_delay=0.1, ssh_shapes="offers", reuse_proxy_ports=True) as e:
        e.add_ssh_key(ssh_keypair.public)
        yield e


def cli(emu: Emulator, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VAST", "XDG"))}
    env.update(HOME=str(home), VAST_URL=emu.url, VASTAI_NO_UPDATE_CHECK="1", NO_COLOR="1", COLUMNS="200")
    return subprocess.run([VASTAI, *args, "--api-key", emu.api_key], capture_output=True, text=True, env=env,
                          timeout=60)


def offer_id(emu: Emulator, *, direct: bool) -> int:
    """A free offer with (or without) direct ports."""
    for o in VastAI(api_key=emu.api_key, server_url=emu.url).search_offers(query="num_gpus=1", limit=500):
        if (int(o["direct_port_count"]) > 0) == direct:
            return int(o["id"])
    raise AssertionError(f"no free offer with direct={direct}")


def cli_rent(emu: Emulator, home: Path, *flags: str, direct_offer: bool = True) -> int:
    r = cli(emu, home, "create", "instance", str(offer_id(emu, direct=direct_offer)), "--image", "rigsync/test",
            "--disk", "10", *flags, "--raw")
    assert r.returncode == 0, r.stderr
    iid = int(json.loads(r.stdout)["new_contract"])
    emu.wait_running([iid], timeout=20)
    return iid


def cli_ssh_url(emu: Emulator, home: Path, iid: int) -> tuple[str, int]:
    r = cli(emu, home, "ssh-url", str(iid))
    m = re.fullmatch(r"ssh://root@([0-9.]+):([0-9]+)", r.stdout.strip())
    assert m, (r.stdout, r.stderr)
    return m.group(1), int(m.group(2))


def container_id(key: KeyPair, host: str, port: int) -> str:
    r = ssh(key, host, port, "echo $CONTAINER_ID")
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def host_key(host: str, port: int) -> str:
    """The SSH host key a server at ``host:port`` shows (its fingerprint), with paramiko."""
    with socket.create_connection((host, port), timeout=5) as sock:
        t = paramiko.Transport(sock)
        try:
            t.start_client(timeout=5)
            return str(t.get_remote_server_key().fingerprint)
        finally:
            t.close()


def refused(host: str, port: int) -> bool:
    """Nothing answers an SSH banner there: the connection is refused or closed at once."""
    try:
        with socket.create_connection((host, port), timeout=2) as s:
            s.settimeout(2)
            return not s.recv(4).startswith(b"SSH-")
    except OSError:
        return True


def test_cli_ssh_url_reaches_every_shape(emu: Emulator, ssh_keypair: KeyPair, tmp_path: Path) -> None:
    shapes: dict[str, tuple[tuple[str, ...], bool]] = {
        "direct": (("--ssh", "--direct"), True),
        "proxy_runtype": (("--ssh",), True),
        "proxy_offer": (("--ssh", "--direct"), False),  # asked for a direct port, the offer has none
        "jupyter_proxy": (("--jupyter",), True),
        "jupyter_direct": (("--jupyter", "--direct"), True),
    }
    ids = {name: cli_rent(emu, tmp_path, *flags, direct_offer=d) for name, (flags, d) in shapes.items()}
    recs = {name: emu.instance(iid) for name, iid in ids.items()}
    assert {r["image_runtype"] for r in recs.values()} == {
        "ssh_direc ssh_proxy", "ssh_proxy", "jupyter_proxy ssh_proxy", "jupyter_direc ssh_direc ssh_proxy"}
    # One proxy host for all, one port each; the boxes' own addresses are all different.
    assert {r["ssh_host"] for r in recs.values()} == {emu.proxy.ip}
    assert len({r["ssh_port"] for r in recs.values()}) == len(recs)
    assert len({r["public_ipaddr"] for r in recs.values()} | {emu.proxy.ip}) == len(recs) + 1
    for name, rec in recs.items():
        has_direct = name in ("direct", "jupyter_direct")
        assert ("22/tcp" in rec["ports"]) == has_direct, name
        assert rec["direct_port_count"] == (1 if has_direct else 0)
        host, port = cli_ssh_url(emu, tmp_path, ids[name])
        if has_direct:
            assert (host, port) == (rec["public_ipaddr"], int(rec["ports"]["22/tcp"][0]["HostPort"]))
        else:
            plus = 1 if "jupyter" in rec["image_runtype"] else 0
            assert (host, port) == (emu.proxy.ip, int(rec["ssh_port"]) + plus)
        assert container_id(ssh_keypair, host, port) == str(ids[name]), name
    # A direct-port box answers behind the proxy too, with the same sshd (the same host key).
    rec = recs["direct"]
    direct_addr = (rec["public_ipaddr"], int(rec["ports"]["22/tcp"][0]["HostPort"]))
    assert container_id(ssh_keypair, emu.proxy.ip, int(rec["ssh_port"])) == str(ids["direct"])
    assert host_key(emu.proxy.ip, int(rec["ssh_port"])) == host_key(*direct_addr)
    # A proxy-only box's own address has no direct port listed, and nothing else answers on the proxy's ports.
    assert all(refused(emu.proxy.ip, int(r["ssh_port"])) for r in recs.values() if "jupyter" in r["image_runtype"]
               and "22/tcp" not in r["ports"])
    for iid in ids.values():
        emu.destroy_instance(iid)


def test_sdk_ssh_url_is_one_below_the_sshd_of_a_jupyter_box(emu: Emulator, ssh_keypair: KeyPair) -> None:
    v = VastAI(api_key=emu.api_key, server_url=emu.url)
    made = v.create_instance(id=offer_id(emu, direct=True), image="rigsync/test", disk=10, jupyter=True)
    jid = int(made["new_contract"])
    made = v.create_instance(id=offer_id(emu, direct=True), image="rigsync/test", disk=10, ssh=True)
    sid = int(made["new_contract"])
    emu.wait_running([jid, sid], timeout=20)
    m = re.fullmatch(r"ssh://root@([0-9.]+):([0-9]+)", v.ssh_url(id=jid))
    assert m and m.group(1) == emu.proxy.ip
    port = int(m.group(2))
    assert refused(emu.proxy.ip, port)  # the "SSH port one below the real sshd"
    assert container_id(ssh_keypair, emu.proxy.ip, port + 1) == str(jid)
    # Without jupyter the SDK and the CLI agree on a proxy-only box.
    m = re.fullmatch(r"ssh://root@([0-9.]+):([0-9]+)", v.ssh_url(id=sid))
    assert m and container_id(ssh_keypair, m.group(1), int(m.group(2))) == str(sid)
    emu.destroy_instance(jid)
    emu.destroy_instance(sid)


def test_set_runtype_forces_the_shape_of_the_next_rents(emu: Emulator, ssh_keypair: KeyPair) -> None:
    v = VastAI(api_key=emu.api_key, server_url=emu.url)
    emu.set_runtype("jupyter ssh_proxy")
    try:
        iid = int(v.create_instance(id=offer_id(emu, direct=True), image="rigsync/test", disk=10, ssh=True,
                                    direct=True)["new_contract"])
    finally:
        emu.set_runtype(None)
    emu.wait_running([iid], timeout=20)
    rec = v.show_instance(id=iid)
    assert rec["image_runtype"] == "jupyter ssh_proxy" and "22/tcp" not in rec["ports"]
    assert container_id(ssh_keypair, rec["ssh_host"], int(rec["ssh_port"]) + 1) == str(iid)
    emu.destroy_instance(iid)


def test_the_proxy_port_follows_its_box_through_hang_vanish_and_destroy(emu: Emulator, ssh_keypair: KeyPair) -> None:
    v = VastAI(api_key=emu.api_key, server_url=emu.url)
    iid = int(v.create_instance(id=offer_id(emu, direct=True), image="rigsync/test", disk=10, ssh=True)[
        "new_contract"])
    emu.wait_running([iid], timeout=20)
    rec: dict[str, Any] = emu.instance(iid)
    host, port = str(rec["ssh_host"]), int(rec["ssh_port"])
    first_key = host_key(host, port)
    emu.hang(iid)
    t0 = time.monotonic()
    r = ssh(ssh_keypair, host, port, "true", connect_timeout=2, timeout=30)
    assert r.returncode == 255 and time.monotonic() - t0 >= 1.5  # a partition: it times out, nothing refuses
    emu.resume(iid)
    assert container_id(ssh_keypair, host, port) == str(iid)
    # Stopped (or vanished), the box's proxy port stops answering; started again, the same port reaches it.
    v.stop_instance(id=iid)
    assert refused(host, port)
    v.start_instance(id=iid)
    emu.wait_running([iid], timeout=20)
    assert int(emu.instance(iid)["ssh_port"]) == port and container_id(ssh_keypair, host, port) == str(iid)
    emu.vanish(iid)
    assert refused(host, port)
    # Destroyed, its port goes to the next rental (reuse_proxy_ports), which answers there with its own key.
    emu.destroy_instance(iid)
    nid = int(v.create_instance(id=offer_id(emu, direct=True), image="rigsync/test", disk=10, ssh=True)[
        "new_contract"])
    emu.wait_running([nid], timeout=20)
    assert (emu.instance(nid)["ssh_host"], int(emu.instance(nid)["ssh_port"])) == (host, port)
    assert container_id(ssh_keypair, host, port) == str(nid)
    assert host_key(host, port) != first_key
    emu.destroy_instance(nid)
