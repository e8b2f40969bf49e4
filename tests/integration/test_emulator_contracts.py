"""Contracts end in the emulator as on Vast, seen through the real ``vastai`` 1.9.1 SDK and CLI (no mocks).

Every instance carries its offer's fixed ``end_date`` (and ``duration``, the seconds left); offers are searchable by
``duration`` as the client sends it (days on the command line, seconds on the wire); at the end the host takes the
box back: its processes die, it is listed exited with a status message saying so, and the GPU part stops billing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from vastai import VastAI
from waiting import wait_for

from reconciler.emulator import Emulator
from reconciler.emulator.testing import KeyPair, ssh

pytestmark = pytest.mark.integration

VASTAI = str(Path(sys.executable).parent / "vastai")
DAY = 86400.0


def _cli(emu: Emulator, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VAST", "XDG"))}
    env.update(HOME=str(home), VAST_URL=emu.url, VASTAI_NO_UPDATE_CHECK="1", NO_COLOR="1", COLUMNS="200")
    return subprocess.run([VASTAI, *args, "--api-key", emu.api_key], capture_output=True, text=True, env=env,
                          timeout=60)


def _raw(emu: Emulator, method: str, path: str, **kw: Any) -> requests.Response:
    return requests.request(method, f"{emu.url}{path}", headers={"Authorization": f"Bearer {emu.api_key}"},
                            timeout=10, **kw)


@pytest.fixture(scope="module")
def emu(ssh_keypair: KeyPair) -> Any:
    # contracts 1 to 6 days out: a duration filter of 3 days splits the market
    with Emulator(seed=11, offers=60, boot_delay=0.2, host_prefix="127.0.24", contract_s=(DAY, 6 * DAY)) as e:
        e.add_ssh_key(ssh_keypair.public)
        yield e


def test_offers_are_searched_by_duration_as_the_client_sends_it(emu: Emulator, tmp_path: Path) -> None:
    everything = _raw(emu, "POST", "/api/v0/bundles/", json={"order": [["id", "asc"]]})
    offers = everything.json()["offers"]
    now = time.time()
    for o in offers:  # duration is the seconds left until end_date, computed per request
        assert o["duration"] == pytest.approx(o["end_date"] - now, abs=5)
        assert DAY - 5 <= o["duration"] <= 6 * DAY
    v = VastAI(api_key=emu.api_key, server_url=emu.url)
    wanted = {o["id"] for o in offers if o["end_date"] - now >= 3 * DAY and o["verification"] == "verified"
              and not o["external"]}
    long = {o["id"] for o in v.search_offers(query="duration>=3", limit=1000)}
    assert wanted and long == wanted and len(long) < len(offers)
    r = _cli(emu, tmp_path, "search", "offers", "duration>=3", "--raw", "--limit", "1000")
    assert r.returncode == 0, r.stderr
    assert {o["id"] for o in json.loads(r.stdout)} == wanted


def test_an_instance_is_taken_back_at_its_contract_end(emu: Emulator, ssh_keypair: KeyPair, tmp_path: Path) -> None:
    v = VastAI(api_key=emu.api_key, server_url=emu.url)
    offer = v.search_offers(query="num_gpus=1", order="dph_total", limit=1)[0]
    iid = v.create_instance(id=offer["id"], image="pytorch/pytorch", disk=10, label="ends")["new_contract"]
    emu.wait_running([iid])
    shown = v.show_instance(id=iid)
    assert shown["end_date"] == pytest.approx(offer["end_date"])  # the offer's fixed end, carried by the contract
    raw = _raw(emu, "GET", f"/api/v0/instances/{iid}/").json()["instances"]
    assert raw["duration"] == pytest.approx(offer["end_date"] - time.time(), abs=5)  # seconds left on the wire
    listed = _cli(emu, tmp_path, "show", "instance", str(iid), "--raw")
    assert listed.returncode == 0 and json.loads(listed.stdout)["end_date"] == pytest.approx(offer["end_date"])
    rec = emu.instance(iid)
    assert ssh(ssh_keypair, rec["ssh_host"], rec["ssh_port"], "echo up").stdout.strip() == "up"

    # the contract now ends in a second
    bad = _raw(emu, "POST", f"/_emulator/instances/{iid}/end_date", json={"at": "soon"})
    assert bad.status_code == 400
    at = time.time() + 1.0
    moved = _raw(emu, "POST", f"/_emulator/instances/{iid}/end_date", json={"at": at})
    assert moved.status_code == 200 and v.show_instance(id=iid)["end_date"] == pytest.approx(at)
    wait_for("the box to be taken back at its contract's end",
             lambda: v.show_instance(id=iid)["actual_status"] == "exited", 60, every=0.1)
    after = v.show_instance(id=iid)
    assert after["intended_status"] == "stopped" and "contract ended" in after["status_msg"]
    assert _raw(emu, "GET", f"/api/v0/instances/{iid}/").json()["instances"]["duration"] == 0
    # its processes died with it
    assert ssh(ssh_keypair, rec["ssh_host"], rec["ssh_port"], "echo up", timeout=10,
               connect_timeout=2).returncode != 0
    # the GPU part stopped billing; storage bills while it is listed, as for any stopped instance
    assert emu.ledger.rate(iid) == pytest.approx(float(after["storage_total_cost"]), abs=1e-6)
    gpu_then = emu.ledger.charge(iid)
    gpu_now = emu.ledger.charge(iid, at=time.time() + 3600)  # the bill an hour on
    assert gpu_then is not None and gpu_now is not None and gpu_now.gpu_usd == pytest.approx(gpu_then.gpu_usd)
    assert gpu_now.storage_usd > gpu_then.storage_usd
    assert "contract_end" in [e["type"] for e in emu.ledger.events if e["instance_id"] == iid]
    # an ended contract cannot be started again; destroying it ends the bill
    refused = _raw(emu, "PUT", f"/api/v0/instances/{iid}/", json={"state": "running"})
    assert refused.status_code == 400 and "contract ended" in refused.json()["msg"]
    v.destroy_instance(id=iid)
    assert emu.ledger.rate(iid) == 0.0


def test_an_offer_past_its_end_is_not_for_rent(ssh_keypair: KeyPair) -> None:
    clock = [time.time()]
    with Emulator(seed=12, offers=10, boot_delay=0.2, host_prefix="127.0.25", contract_s=(60.0, 120.0),
                  clock=lambda: clock[0]) as e:
        v = VastAI(api_key=e.api_key, server_url=e.url)
        offers = v.search_offers(query="verified=any", limit=100)
        assert offers and all(60 - 1 <= o["duration"] <= 120 for o in offers)
        clock[0] += 121.0
        assert v.search_offers(query="verified=any", limit=100) == []
        r = _raw(e, "PUT", f"/api/v0/asks/{offers[0]['id']}/", json={"image": "x"})
        assert r.status_code == 404
