"""Billing, injected faults (Python and admin HTTP API), and the ``rigsync emulator`` command's teardown."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from vastai import VastAI
from waiting import wait_for

from reconciler.emulator import Emulator, EmulatorUnavailable
from reconciler.emulator import sshd_boxes as hosts_mod
from reconciler.emulator.testing import KeyPair, ssh

pytestmark = pytest.mark.integration


def sdk(emu: Emulator) -> VastAI:
    return VastAI(api_key=emu.api_key, server_url=emu.url)


def create(emu: Emulator, query: str = "num_gpus=1", bid: bool = False) -> tuple[int, dict[str, object]]:
    v = sdk(emu)
    offer = v.search_offers(query=query, order="dph_total", limit=1)[0]
    price = offer["min_bid"] if bid else None
    iid = int(v.create_instance(id=offer["id"], image="x", disk=10, price=price)["new_contract"])
    return iid, offer


def test_ledger_charges_elapsed_time_times_price(emulator: Emulator) -> None:
    t0 = time.time()
    iid, _ = create(emulator, "num_gpus>=4")
    t1 = time.time()
    dph = float(emulator.instance(iid)["dph_total"])
    emulator.wait_running([iid])
    t2 = time.time()
    usd = emulator.ledger.instance_usd(iid)
    t3 = time.time()
    assert dph * (t2 - t1) / 3600 <= usd <= dph * (t3 - t0) / 3600
    assert abs(usd - dph * (t2 - t1) / 3600) < 0.01
    # and each hour from now bills the price, read an hour ahead rather than waited for
    assert emulator.ledger.instance_usd(iid, at=t3 + 3600) - emulator.ledger.instance_usd(iid, at=t3) == \
        pytest.approx(dph)
    # stopped: storage only; destroyed: nothing more
    sdk(emulator).stop_instance(id=iid)
    storage = emulator.ledger.rate(iid)
    assert 0 < storage < dph
    assert storage == pytest.approx(float(emulator.instance(iid)["storage_total_cost"]), abs=1e-6)
    sdk(emulator).destroy_instance(id=iid)
    frozen = emulator.ledger.instance_usd(iid)
    assert emulator.ledger.instance_usd(iid, at=time.time() + 3600) == frozen
    assert emulator.ledger.total_usd() >= frozen
    types = [e["type"] for e in emulator.ledger.events if e["instance_id"] == iid]
    assert types == ["create", "running", "stop", "destroy"]


def test_outbid_interruptible_goes_stopped_and_bills_storage(emulator: Emulator, ssh_keypair: KeyPair) -> None:
    iid, offer = create(emulator, bid=True)
    rec = emulator.instance(iid)
    assert rec["is_bid"] is True and float(rec["dph_total"]) < float(offer["dph_total"])
    emulator.wait_running([iid])
    assert ssh(ssh_keypair, str(rec["ssh_host"]), int(str(rec["ssh_port"])), "true").returncode == 0
    emulator.outbid(iid)
    after = sdk(emulator).show_instance(id=iid)
    assert (after["actual_status"], after["intended_status"]) == ("stopped", "running")
    assert iid in emulator.instance_ids()
    assert ssh(ssh_keypair, str(rec["ssh_host"]), int(str(rec["ssh_port"])), "true", connect_timeout=2
               ).returncode == 255
    assert 0 < emulator.ledger.rate(iid) < float(rec["dph_total"])
    low = requests.put(f"{emulator.url}/api/v0/asks/{offer['id']}/", json={"image": "x", "price": 0.0001},
                       headers={"Authorization": f"Bearer {emulator.api_key}"}, timeout=10)
    assert low.status_code == 404  # the offer is rented: it left the market
    sdk(emulator).destroy_instance(id=iid)


def admin(emu: Emulator, path: str, body: dict[str, object] | None = None, key: str | None = None
          ) -> requests.Response:
    headers = {"Authorization": f"Bearer {key or emu.api_key}"}
    if body is None and not path.endswith(("vanish", "hang", "resume", "outbid", "never_boot")):
        return requests.get(f"{emu.url}/_emulator/{path}", headers=headers, timeout=10)
    return requests.post(f"{emu.url}/_emulator/{path}", json=body or {}, headers=headers, timeout=10)


def test_admin_http_api_injects_faults(emulator: Emulator, ssh_keypair: KeyPair) -> None:
    iid, _ = create(emulator)
    emulator.wait_running([iid])
    assert admin(emulator, f"instances/{iid}/hang", key="wrong").status_code == 401
    assert admin(emulator, f"instances/{iid}/hang").json() == {"success": True}
    rec = emulator.instance(iid)
    host, port = str(rec["ssh_host"]), int(str(rec["ssh_port"]))
    assert ssh(ssh_keypair, host, port, "true", connect_timeout=2).returncode == 255
    assert admin(emulator, f"instances/{iid}/resume").status_code == 200
    assert ssh(ssh_keypair, host, port, "echo ok").stdout == "ok\n"
    assert admin(emulator, f"instances/{iid}/vanish").status_code == 200
    assert sdk(emulator).show_instance(id=iid)["actual_status"] == "offline"
    assert admin(emulator, "fail_next", {"path_prefix": "/api/v0/users", "n": 1, "status": 500}).status_code == 200
    r = requests.get(f"{emulator.url}/api/v0/users/current", headers={"Authorization": f"Bearer {emulator.api_key}"},
                     timeout=10)
    assert r.status_code == 500 and r.json()["error"] == "server_error"
    assert admin(emulator, "latency", {"seconds": 0.05}).status_code == 200
    assert emulator.latency == 0.05
    assert admin(emulator, "latency", {"seconds": 0}).status_code == 200
    assert admin(emulator, "latency", {"nope": 1}).status_code == 400
    state = admin(emulator, "state").json()
    assert state["instances"][str(iid)]["status"] == "offline"
    ledger = admin(emulator, "ledger").json()
    assert ledger["total_usd"] > 0 and str(iid) in ledger["instances"]
    events = admin(emulator, "events").json()["events"]
    assert {"hang", "resume", "vanish", "fail_next", "latency"} <= {e["type"] for e in events}
    assert admin(emulator, "nonsense").status_code == 404
    sdk(emulator).destroy_instance(id=iid)


def test_never_boot_via_admin_and_churn_vanishes_boxes(emulator: Emulator) -> None:
    assert admin(emulator, "never_boot", {}).status_code == 200
    stuck, _ = create(emulator)
    iid, _ = create(emulator)
    emulator.wait_running([iid])
    assert emulator.status(stuck) == "loading"
    assert admin(emulator, "churn", {"rate_per_hour": 3.6e6, "seed": 1}).status_code == 200  # ~1 death per ms
    wait_for("churn to take the running box", lambda: emulator.status(iid) == "offline", 60, every=0.05)
    emulator.churn(0.0, 0)
    assert emulator.status(stuck) == "loading"  # churn only hits running boxes
    assert any(e["type"] == "churn_vanish" and e["instance_id"] == iid for e in emulator.ledger.events)
    for i in (stuck, iid):
        sdk(emulator).destroy_instance(id=i)


def test_prices_drift(emulator: Emulator) -> None:
    before = {o["id"]: o["dph_base"] for o in emulator.market.all()}
    emulator.drift_prices(0.2, seed=5)
    after = {o["id"]: o["dph_base"] for o in emulator.market.all()}
    changed = [i for i in before if after[i] != before[i]]
    assert len(changed) > len(before) // 2
    assert all(abs(after[i] / before[i] - 1) <= 0.2 + 0.01 for i in before)


def test_preflight_says_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hosts_mod, "SSHD", "/nonexistent/sshd")
    with pytest.raises(EmulatorUnavailable, match=r"apt-get install -y openssh-server"):
        hosts_mod.preflight()
    monkeypatch.setattr(hosts_mod.os, "geteuid", lambda: 1000)
    with pytest.raises(EmulatorUnavailable, match="need root"):
        hosts_mod.preflight()


def test_rigsync_emulator_command_tears_down_on_sigterm(tmp_path: Path, ssh_keypair: KeyPair) -> None:
    state = tmp_path / "emu-state"
    rigsync = str(Path(sys.executable).parent / "rigsync")
    proc = subprocess.Popen(
        [rigsync, "emulator", "--api-key", "k-123", "--state-dir", str(state), "--offers", "40", "--seed", "2",
         "--boot-delay", "0.1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        url_line = proc.stdout.readline().strip()
        key_line = proc.stdout.readline().strip()
        assert url_line.startswith("VAST_URL=http://127.0.0.1:") and key_line == "VAST_API_KEY=k-123"
        url = url_line.split("=", 1)[1]
        # the line a shell needs to point rigsync at it (desired/ never names a URL)
        assert proc.stdout.readline().strip() == f"export RIGSYNC_API_URL={url} VAST_API_KEY=k-123"
        v = VastAI(api_key="k-123", server_url=url_line.split("=", 1)[1])
        v.create_ssh_key(ssh_key=ssh_keypair.public)
        offers = v.search_offers(query="num_gpus=1", limit=2)
        ids = [v.create_instance(id=o["id"], image="x", disk=10)["new_contract"] for o in offers]
        wait_for("both boxes to run", lambda: all(v.show_instance(id=i)["actual_status"] == "running" for i in ids),
                 60, every=0.05)
        rec = v.show_instance(id=ids[0])
        r = ssh(ssh_keypair, rec["ssh_host"], rec["ssh_port"], "setsid nohup sleep 300 >/dev/null 2>&1 </dev/null &")
        assert r.returncode == 0
        assert _procs_mentioning(state) >= 4  # unshare + sshd for each box
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert _procs_mentioning(state) == 0
    assert _pids_with_env(f"CONTAINER_ID={ids[0]}") == []


def _procs_mentioning(marker: Path) -> int:
    n = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if str(marker).encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    n += 1
            except OSError:
                pass
    return n


def _pids_with_env(needle: str) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if needle.encode() + b"\0" in Path(f"/proc/{entry}/environ").read_bytes():
                    out.append(int(entry))
            except OSError:
                pass
    return out
