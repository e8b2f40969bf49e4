"""Where rigsync finds a rented box's SSH server, and the name its host key is pinned under (issue 24, point 4).

Behind one proxy host boxes differ by port only, and a destroyed box's port goes to the next rental: a pin by
address would confuse them. A rented box's pin is its instance, shared by its direct and proxy addresses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reconciler.adapters import vast
from reconciler.adapters.ssh import _host_id, is_pinned, openssh_argv
from reconciler.core.model import Endpoint
from reconciler.errors import ShellError

KEY = "AAAAC3NzaC1lZDI1NTE5AAAAIBQ1ciaXn6Ha0sKrTqDgMNmNcdiGMbxzMQtIPyDD7nl/"
REC: dict[str, Any] = {
    "id": 29876543, "actual_status": "running", "label": "rigsync:f:abc-1", "image_runtype": "ssh_direc ssh_proxy",
    "public_ipaddr": "203.0.113.57", "ssh_host": "ssh7.vast.ai", "ssh_port": 36542,
    "ports": {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": "41201"}]}, "num_gpus": 1, "gpu_name": "RTX 4090",
}
ALIAS = "vast-instance-29876543"


@pytest.mark.parametrize(
    ("runtype", "ports", "want"),
    [
        ("ssh_direc ssh_proxy", REC["ports"], ("203.0.113.57", 41201)),
        ("ssh_direc ssh_proxy", {}, ("ssh7.vast.ai", 36542)),  # asked for a direct port, the offer had none
        ("ssh_proxy", {}, ("ssh7.vast.ai", 36542)),
        ("jupyter_proxy ssh_proxy", {}, ("ssh7.vast.ai", 36543)),  # the CLI's +1
        ("jupyter ssh_proxy", None, ("ssh7.vast.ai", 36543)),
        ("jupyter_direc ssh_direc ssh_proxy", REC["ports"], ("203.0.113.57", 41201)),  # direct: no +1
    ],
)
def test_the_box_is_found_where_the_vastai_cli_finds_it(runtype: str, ports: Any, want: tuple[str, int]) -> None:
    inst = vast.instance_from_record({**REC, "image_runtype": runtype, "ports": ports})
    assert inst.ssh == Endpoint(*want, host_key_alias=ALIAS)
    assert inst.proxy is not None and inst.proxy.host_key_alias == ALIAS


def test_two_boxes_behind_one_proxy_host_never_share_a_pin() -> None:
    a = vast.instance_from_record({**REC, "ports": {}})
    b = vast.instance_from_record({**REC, "id": 29876544, "ssh_port": 36544, "ports": {}})
    successor = vast.instance_from_record({**REC, "id": 29876545, "ports": {}})  # a's port, handed on
    assert a.ssh is not None and b.ssh is not None and successor.ssh is not None
    assert (a.ssh.host, a.ssh.port) == (successor.ssh.host, successor.ssh.port) and a.ssh.host == b.ssh.host
    assert len({_host_id(e) for e in (a.ssh, b.ssh, successor.ssh)}) == 3
    # ...while a box's direct and proxy addresses are one pin.
    assert a.proxy is not None and _host_id(a.proxy) == _host_id(vast.instance_from_record(REC).ssh or a.proxy)


def test_a_pin_is_named_by_the_alias_or_else_the_address() -> None:
    assert _host_id(Endpoint("127.0.0.9", 2222)) == "[127.0.0.9]:2222"
    assert _host_id(Endpoint("lab1", 22, "ubuntu")) == "lab1"
    assert _host_id(Endpoint("127.0.0.9", 2222, host_key_alias=ALIAS)) == ALIAS


def test_openssh_looks_a_rented_box_up_by_its_alias(tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"
    ep = Endpoint("127.0.1.1", 30001, host_key_alias="vast-instance-7")
    argv = openssh_argv(ep, private_key=tmp_path / "id_ed25519", known_hosts=kh)
    opts = [argv[i + 1] for i, a in enumerate(argv) if a == "-o"]
    assert "HostKeyAlias=vast-instance-7" in opts and "StrictHostKeyChecking=yes" in opts
    assert argv[-3:] == ["-p", "30001", "root@127.0.1.1"]
    plain = openssh_argv(Endpoint("127.0.0.9", 2222), private_key=tmp_path / "k", known_hosts=kh)
    assert not any(o.startswith("HostKeyAlias") for o in plain)  # the lab's own machines: pinned by address
    kh.write_text(f"[127.0.1.1]:30001 ssh-ed25519 {KEY}\n")  # another box's pin at this address does not count
    assert not is_pinned(kh, ep)
    kh.write_text(f"vast-instance-7 ssh-ed25519 {KEY}\n")
    assert is_pinned(kh, ep) and is_pinned(kh, Endpoint("127.0.9.9", 2222, host_key_alias="vast-instance-7"))
    assert not is_pinned(kh, Endpoint("127.0.1.1", 30001, host_key_alias="vast-instance-8"))
    with pytest.raises(ShellError, match="not a host key alias"):
        openssh_argv(Endpoint("h", 22, host_key_alias="x -oProxyCommand=evil"), private_key=kh, known_hosts=kh)
