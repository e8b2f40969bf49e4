"""The emulator speaks Vast.ai as the real ``vastai`` 1.9.1 SDK and CLI expect it (no mocks: real client, real HTTP)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
from vastai import VastAI
from waiting import wait_for

from reconciler.emulator import Emulator

pytestmark = pytest.mark.integration

VASTAI = str(Path(sys.executable).parent / "vastai")
Offer = dict[str, Any]


def sdk(emu: Emulator) -> VastAI:
    return VastAI(api_key=emu.api_key, server_url=emu.url)


def all_offers(emu: Emulator, storage: float = 5.0, kind: str = "on-demand") -> list[Offer]:
    """Every offer on the market, straight from the endpoint without client-side defaults (the test oracle)."""
    r = requests.post(f"{emu.url}/api/v0/bundles/", json={"order": [["id", "asc"]], "allocated_storage": storage,
                                                          "type": kind},
                      headers={"Authorization": f"Bearer {emu.api_key}"}, timeout=10)
    r.raise_for_status()
    offers: list[Offer] = r.json()["offers"]
    return offers


def default_ok(o: Offer) -> bool:
    return o["verification"] == "verified" and o["external"] is False and o["rentable"] is True


def by_score(offers: list[Offer]) -> list[int]:
    return [o["id"] for o in sorted(sorted(offers, key=lambda o: o["id"]), key=lambda o: -o["score"])]


CASES: list[tuple[str, Callable[[Offer], bool]]] = [
    ("num_gpus=2", lambda o: o["num_gpus"] == 2),
    ("num_gpus == 4", lambda o: o["num_gpus"] == 4),
    ("num_gpus eq 1", lambda o: o["num_gpus"] == 1),
    ("num_gpus!=1", lambda o: o["num_gpus"] != 1),
    ("num_gpus neq 1", lambda o: o["num_gpus"] != 1),
    ("dph_total>0.5", lambda o: o["dph_total"] > 0.5),
    ("dph_total gt 0.5", lambda o: o["dph_total"] > 0.5),
    ("dph_total>=0.5", lambda o: o["dph_total"] >= 0.5),
    ("dph<0.1", lambda o: o["dph_total"] < 0.1),
    ("dph_total lte 0.1", lambda o: o["dph_total"] <= 0.1),
    ("reliability<=0.9", lambda o: o["reliability"] <= 0.9),
    ("reliability lt 0.9", lambda o: o["reliability"] < 0.9),
    ("reliability gte 0.99", lambda o: o["reliability"] >= 0.99),
    ("gpu_name=RTX_3090", lambda o: o["gpu_name"] == "RTX 3090"),
    ("gpu_name in [RTX_3090,RTX_4090]", lambda o: o["gpu_name"] in ("RTX 3090", "RTX 4090")),
    ('gpu_name in ["RTX 2060", "Titan V"]', lambda o: o["gpu_name"] in ("RTX 2060", "Titan V")),
    ("gpu_name notin [RTX_3090,RTX_4090]", lambda o: o["gpu_name"] not in ("RTX 3090", "RTX 4090")),
    ("gpu_name nin [RTX_3060]", lambda o: o["gpu_name"] != "RTX 3060"),
    ("geolocation in [SE,TW]", lambda o: o["geolocation"][-2:] in ("SE", "TW")),
    ("gpu_ram>=20", lambda o: o["gpu_ram"] >= 20_000),  # GB on the command line, MB on the wire
    ("gpu_ram<10", lambda o: o["gpu_ram"] < 10_000),
    ("cpu_ram>100", lambda o: o["cpu_ram"] > 100_000),
    ("cuda_vers>=12.4", lambda o: o["cuda_max_good"] >= 12.4),
    ("dlperf_usd>200", lambda o: o["dlperf_per_dphtotal"] > 200),
    ("driver_version>=550.0.0", lambda o: o["driver_vers"] >= 550_000_000),
    ("inet_down>1000 num_gpus=1", lambda o: o["inet_down"] > 1000 and o["num_gpus"] == 1),
]


@pytest.mark.parametrize(("query", "pred"), CASES, ids=[c[0] for c in CASES])
def test_sdk_search_returns_exactly_the_matching_offers_in_order(
    emulator: Emulator, query: str, pred: Callable[[Offer], bool]
) -> None:
    expected = by_score([o for o in all_offers(emulator) if default_ok(o) and pred(o)])
    got = [o["id"] for o in sdk(emulator).search_offers(query=query, limit=1000)]
    assert expected, f"test market has no offer for {query!r}; the case proves nothing"
    assert got == expected


def test_search_defaults_can_be_dropped_and_overridden(emulator: Emulator) -> None:
    offers = all_offers(emulator)
    unverified = [o["id"] for o in offers if o["verification"] != "verified" and not o["external"]]
    got = {o["id"] for o in sdk(emulator).search_offers(query="verified=false", limit=1000)}
    assert unverified and got == set(unverified)
    external = {o["id"] for o in sdk(emulator).search_offers(query="external=any verified=any", limit=1000)}
    assert external == {o["id"] for o in offers}


def test_search_ordering_limit_and_bid_pricing(emulator: Emulator) -> None:
    v = sdk(emulator)
    pool = [o for o in all_offers(emulator) if default_ok(o)]
    asc = [o["id"] for o in v.search_offers(order="dph_total", limit=1000)]
    assert asc == [o["id"] for o in sorted(sorted(pool, key=lambda o: o["id"]), key=lambda o: o["dph_total"])]
    multi = [o["id"] for o in v.search_offers(order="num_gpus-,dph_total", limit=1000)]
    exp = sorted(sorted(pool, key=lambda o: o["id"]), key=lambda o: (-o["num_gpus"], o["dph_total"]))
    assert multi == [o["id"] for o in exp]
    assert [o["id"] for o in v.search_offers(order="dph_total", limit=5)] == asc[:5]
    bid = {o["id"]: o for o in v.search_offers(type="bid", limit=1000)}
    for o in pool:
        assert bid[o["id"]]["is_bid"] is True
        assert bid[o["id"]]["dph_total"] == pytest.approx(o["min_bid"] + o["dph_total"] - o["dph_base"], abs=1e-5)
    # allocated storage changes the total price
    big = {o["id"]: o["dph_total"] for o in all_offers(emulator, storage=500)}
    assert all(big[o["id"]] > o["dph_total"] for o in pool)


def test_market_has_plenty_of_cheap_reliable_consumer_boxes(emulator: Emulator) -> None:
    q = ("gpu_name in [RTX_2060,RTX_3060,RTX_3070,RTX_A4000,Titan_V] dph_total<0.15 reliability>=0.95 "
         "verified=true")
    offers = sdk(emulator).search_offers(query=q, order="dlperf_usd-", limit=1000)
    assert len(offers) >= 15
    assert all(o["dph_total"] < 0.15 and o["reliability"] >= 0.95 for o in offers)
    # numbers are numbers (the CLI formats them with {:0.1f})
    for key in ("dph_total", "dlperf", "dlperf_per_dphtotal", "reliability", "inet_up", "inet_down", "gpu_ram"):
        assert isinstance(offers[0][key], (int, float)), key


def test_sdk_create_show_label_sshurl_destroy_round_trip(emulator: Emulator) -> None:
    v = sdk(emulator)
    offer = v.search_offers(query="num_gpus=1", order="dph_total", limit=1)[0]
    r = v.create_instance(id=offer["id"], image="pytorch/pytorch", disk=16, label="rt-1",
                          env="-e FOO=bar -p 8080:8080", onstart_cmd="echo hi")
    assert r["success"] is True
    iid = r["new_contract"]
    assert offer["id"] not in {o["id"] for o in v.search_offers(query="num_gpus=1", limit=1000)}
    inst = v.show_instance(id=iid)
    assert inst["actual_status"] in ("loading", "running") and inst["label"] == "rt-1"
    assert inst["extra_env"]["FOO"] == "bar"
    assert inst["disk_space"] == 16 and inst["image_uuid"] == "pytorch/pytorch"
    assert inst["gpu_name"] == offer["gpu_name"] and inst["dph_total"] == pytest.approx(
        offer["dph_base"] + offer["storage_cost"] * 16 / 720, abs=1e-5)
    emulator.wait_running([iid])
    assert v.show_instance(id=iid)["actual_status"] == "running"
    v.label_instance(id=iid, label="rt-2")
    assert [i["label"] for i in v.show_instances() if i["id"] == iid] == ["rt-2"]
    assert v.ssh_url(id=iid) == f"ssh://root@{inst['ssh_host']}:{inst['ssh_port']}"
    v.destroy_instance(id=iid)
    assert v.show_instance(id=iid) is None
    assert iid not in emulator.instance_ids()
    assert offer["id"] in {o["id"] for o in v.search_offers(query="num_gpus=1", limit=1000)}


def test_list_instances_pages_and_instance_key_is_scoped(emulator: Emulator, ssh_keypair: Any) -> None:
    v = sdk(emulator)
    offers = v.search_offers(query="num_gpus=1", order="dph_total", limit=3)
    ids = [v.create_instance(id=o["id"], image="x", disk=10)["new_contract"] for o in offers]
    auth = {"Authorization": f"Bearer {emulator.api_key}"}
    pages: list[int] = []
    token = ""
    while True:
        params = {"select_filters": "{}", "order_by": json.dumps([{"col": "id", "dir": "asc"}]), "limit": "2"}
        if token:
            params["after_token"] = token
        body = requests.get(f"{emulator.url}/api/v1/instances/", params=params, headers=auth, timeout=10).json()
        assert len(body["instances"]) <= 2 and body["total_instances"] == len(emulator.instance_ids())
        pages += [i["id"] for i in body["instances"]]
        token = body["next_token"]
        if not token:
            break
    assert pages == sorted(emulator.instance_ids())
    assert {i["id"] for i in v.show_instances()} >= set(ids)
    # CONTAINER_API_KEY (in the box's environment) lets the box ask about itself only.
    own = emulator._get(ids[0]).api_key
    me = requests.get(f"{emulator.url}/api/v0/instances/{ids[0]}/", params={"owner": "me"},
                      headers={"Authorization": f"Bearer {own}"}, timeout=10)
    assert me.status_code == 200 and me.json()["instances"]["id"] == ids[0]
    other = requests.get(f"{emulator.url}/api/v0/instances/{ids[1]}/",
                         headers={"Authorization": f"Bearer {own}"}, timeout=10)
    assert other.status_code == 401
    for iid in ids:
        v.destroy_instance(id=iid)


def test_errors_have_the_real_shapes(emulator: Emulator) -> None:
    bad = requests.get(f"{emulator.url}/api/v0/users/current", headers={"Authorization": "Bearer nope"}, timeout=10)
    assert bad.status_code == 401 and bad.json()["msg"] == "Invalid user key"
    assert bad.headers["Content-Type"] == "application/json"
    auth = {"Authorization": f"Bearer {emulator.api_key}"}
    missing = requests.put(f"{emulator.url}/api/v0/asks/1/", json={"image": "x"}, headers=auth, timeout=10)
    assert missing.status_code == 404
    assert missing.json() == {"success": False, "error": "invalid_args",
                              "msg": "error 404/3603: no_such_ask  Instance type by id 1 is not available."}
    gone = requests.delete(f"{emulator.url}/api/v0/instances/5/", json={}, headers=auth, timeout=10)
    assert gone.status_code == 404 and gone.json()["error"] == "no_such_instance"
    unknown = requests.get(f"{emulator.url}/api/v0/no/such/thing/", headers=auth, timeout=10)
    assert unknown.status_code == 404
    assert unknown.json() == {"success": False, "error": "not_found",
                              "msg": "Unknown endpoint: GET /api/v0/no/such/thing/"}
    badq = requests.post(f"{emulator.url}/api/v0/bundles/", json={"num_gpus": {"approx": "1"}}, headers=auth,
                         timeout=10)
    assert badq.status_code == 400 and "unknown operator" in badq.json()["msg"]
    names = requests.get(f"{emulator.url}/api/v0/gpu_names/unique/", timeout=10)  # no auth, as the CLI calls it
    assert "RTX 3090" in names.json()["gpu_names"]
    with pytest.raises(requests.HTTPError):
        VastAI(api_key="wrong", server_url=emulator.url).show_instances()


def test_sdk_retries_through_injected_429s(emulator: Emulator) -> None:
    v = sdk(emulator)
    emulator.fail_next("/api/v0/bundles", 2, 429)
    assert v.search_offers(query="num_gpus=1", limit=1)  # the client's 3 attempts absorb two 429s
    emulator.fail_next("/api/v0/bundles", 3, 503)
    with pytest.raises(requests.HTTPError) as err:
        v.search_offers(query="num_gpus=1", limit=1)
    assert err.value.response.status_code == 503
    kinds = [e for e in emulator.ledger.events if e["type"] == "injected_failure"]
    assert [e["status"] for e in kinds[-5:]] == [429, 429, 503, 503, 503]


# ---- the real CLI -------------------------------------------------------------------------------------------
def cli(emu: Emulator, home: Path, *args: str, key: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VAST", "XDG"))}
    env.update(HOME=str(home), VAST_URL=emu.url, VASTAI_NO_UPDATE_CHECK="1", NO_COLOR="1", COLUMNS="200")
    return subprocess.run([VASTAI, *args, "--api-key", key or emu.api_key], capture_output=True, text=True,
                          env=env, timeout=60)


def test_cli_search_matches_the_sdk(emulator: Emulator, tmp_path: Path) -> None:
    for query, order in [("gpu_ram>=20 num_gpus=1", "dph_total"), ("reliability>0.97 dph<0.2", "dlperf_usd-")]:
        r = cli(emulator, tmp_path, "search", "offers", query, "-o", order, "--raw", "--limit", "500")
        assert r.returncode == 0, r.stderr
        got = [o["id"] for o in json.loads(r.stdout)]
        want = [o["id"] for o in sdk(emulator).search_offers(query=query, order=order, limit=500)]
        assert got == want and got
    table = cli(emulator, tmp_path, "search", "offers", "gpu_name=RTX_3090", "-o", "dph_total", "--limit", "3")
    assert table.returncode == 0 and "RTX_3090" in table.stdout and "invalid return Content-Type" not in table.stdout


def test_cli_create_show_label_sshurl_destroy(emulator: Emulator, tmp_path: Path) -> None:
    offer = sdk(emulator).search_offers(query="num_gpus=1", order="dph_total", limit=1)[0]
    r = cli(emulator, tmp_path, "create", "instance", str(offer["id"]), "--image", "pytorch/pytorch", "--disk", "12",
            "--label", "cli-1", "--ssh", "--direct", "--raw")
    assert r.returncode == 0, r.stderr
    iid = json.loads(r.stdout)["new_contract"]
    emulator.wait_running([iid])
    show = cli(emulator, tmp_path, "show", "instance", str(iid), "--raw")
    rec = json.loads(show.stdout)
    assert rec["id"] == iid and rec["label"] == "cli-1" and rec["actual_status"] == "running"
    table = cli(emulator, tmp_path, "show", "instances")
    assert str(iid) in table.stdout and "running" in table.stdout
    lab = cli(emulator, tmp_path, "label", "instance", str(iid), "cli-2")
    assert f"label for {iid} set to cli-2." in lab.stdout
    url = cli(emulator, tmp_path, "ssh-url", str(iid))
    # The CLI prefers the direct address (ports["22/tcp"]), the SDK the proxy: both reach the same box.
    assert url.stdout.strip() == f"ssh://root@{rec['public_ipaddr']}:{rec['ports']['22/tcp'][0]['HostPort']}"
    gone = cli(emulator, tmp_path, "destroy", "instance", str(iid), "-y")
    assert f"destroying instance {iid}." in gone.stdout
    after = cli(emulator, tmp_path, "show", "instance", str(iid))
    assert after.returncode == 1 and f"Instance {iid} not found or no longer exists." in after.stderr


def test_cli_prints_the_real_error_messages(emulator: Emulator, tmp_path: Path) -> None:
    r = cli(emulator, tmp_path, "show", "instances", key="not-the-key")
    assert "Failed with error 401: Invalid user key" in r.stderr
    r = cli(emulator, tmp_path, "create", "instance", "12345", "--image", "x")
    assert "Failed with error 404: error 404/3603: no_such_ask  Instance type by id 12345 is not available." in r.stderr
    emulator.fail_next("/api/v0/bundles", 3, 429)
    r = cli(emulator, tmp_path, "search", "offers", "num_gpus=1")
    assert "Failed with error 429" in r.stderr


# ---- billing: credit, charges, invoices -------------------------------------------------------------------
def _charges(v: VastAI, **params: Any) -> list[dict[str, Any]]:
    """Every page of ``show_invoices_v1(charges=True)``, following ``next_token`` as the CLI does."""
    rows: list[dict[str, Any]] = []
    token = None
    while True:
        reply = v.show_invoices_v1(charges=True, next_token=token, **params)
        assert reply["success"] is True and reply["count"] == len(reply["results"])
        rows += reply["results"]
        token = reply["next_token"]
        if not token:
            return rows


def test_credit_goes_down_as_boxes_bill_and_charges_match_the_ledger(emulator: Emulator) -> None:
    v = sdk(emulator)
    start = v.show_user()
    assert "api_key" not in start
    assert start["credit"] == pytest.approx(emulator.credit_usd(), abs=1e-4)
    offers = v.search_offers(query="num_gpus>=2", order="dph_total-", limit=3)
    ids = [v.create_instance(id=o["id"], image="x", disk=10, label=f"bill-{n}")["new_contract"]
           for n, o in enumerate(offers)]
    emulator.wait_running(ids)
    wait_for("the credit to go down as the boxes bill", lambda: v.show_user()["credit"] < start["credit"], 30)
    v.destroy_instance(id=ids[0])
    wait_for("the destroyed box's bill to close", lambda: emulator.ledger.rate(ids[0]) == 0, 30)
    now = int(time.time())
    # Paged one by one; the destroyed box is still charged; amounts are the ledger's to the micro-dollar.
    rows = _charges(v, start_date=now - 86400, end_date=now, charge_type=["instance"], limit=1)
    by_id = {int(r["source"].split("-")[1]): r for r in rows}
    assert set(ids) <= set(by_id)
    assert by_id[ids[0]]["amount"] == pytest.approx(emulator.ledger.instance_usd(ids[0]), abs=1e-9)
    for iid in ids[1:]:
        assert by_id[iid]["amount"] == pytest.approx(emulator.ledger.instance_usd(iid), abs=1e-4)
    row = by_id[ids[1]]
    assert row["type"] == "instance" and row["metadata"]["label"] == "bill-1"
    assert row["start"] == row["end"] == now // 86400 * 86400  # one UTC day, named by its 00:00
    parts = {i["type"]: i["amount"] for i in row["items"]}
    assert set(parts) == {"gpu", "storage"} and sum(parts.values()) == pytest.approx(row["amount"], abs=1e-12)
    assert parts["storage"] < parts["gpu"]
    # A window of days that ends before today selects nothing; a type filter without instances neither.
    assert _charges(v, start_date=now - 3 * 86400, end_date=now - 2 * 86400) == []
    assert _charges(v, start_date=now - 86400, end_date=now, charge_type=["volume"]) == []
    # Credit is the deposits minus everything billed.
    assert v.show_user()["credit"] == pytest.approx(1000.0 - emulator.ledger.total_usd(), abs=1e-4)
    invoices = v.show_invoices_v1(invoices=True, start_date=now - 86400, end_date=now + 60)
    assert [(r["type"], r["amount"]) for r in invoices["results"]] == [("credit", -1000.0)]
    for iid in ids[1:]:
        v.destroy_instance(id=iid)


def test_zero_credit_stops_every_box_which_keeps_billing_storage(ssh_keypair: Any) -> None:
    with Emulator(seed=3, offers=40, boot_delay=0.2, credit=0.002, host_prefix="127.0.9") as emu:
        emu.add_ssh_key(ssh_keypair.public)
        v = sdk(emu)
        offer = v.search_offers(query="num_gpus>=4", order="dph_total-", limit=1)[0]
        assert offer["dph_total"] > 2.0, "an expensive box, so the credit runs out within seconds"
        iid = v.create_instance(id=offer["id"], image="x", disk=10)["new_contract"]
        wait_for("the box to be stopped at zero credit", lambda: v.show_instance(id=iid)["actual_status"] == "stopped",
                 60, every=0.1)
        rec = v.show_instance(id=iid)
        assert rec["intended_status"] == "stopped" and "credit" in rec["status_msg"]
        assert iid in emu.instance_ids(), "stopped, never destroyed"
        assert emu.ledger.rate(iid) == pytest.approx(float(rec["storage_total_cost"]), abs=1e-6)
        user = v.show_user()
        assert -0.001 < user["credit"] <= 0 and user["balance"] == user["credit"] and user["can_pay"] is False
        wait_for("storage to keep billing the stopped box", lambda: v.show_user()["credit"] < user["credit"], 30)
        other = v.search_offers(query="num_gpus=1", limit=1)[0]
        refused = requests.put(f"{emu.url}/api/v0/asks/{other['id']}/", json={"image": "x"},
                               headers={"Authorization": f"Bearer {emu.api_key}"}, timeout=10)
        assert refused.status_code == 400 and refused.json()["error"] == "insufficient_credit"
        assert [e["type"] for e in emu.ledger.events if e["instance_id"] == iid][-1] == "out_of_credit"
        topped = requests.post(f"{emu.url}/_emulator/credit", json={"usd": 5.0},
                               headers={"Authorization": f"Bearer {emu.api_key}"}, timeout=10)
        assert topped.status_code == 200 and topped.json()["credit"] > 4.99
        assert v.create_instance(id=other["id"], image="x", disk=10)["success"] is True
        now = int(time.time())
        paid = v.show_invoices_v1(invoices=True, start_date=now - 86400, end_date=now + 60)["results"]
        assert [r["amount"] for r in paid] == [-0.002, -5.0]


def test_cli_shows_credit_charges_and_invoices(emulator: Emulator, tmp_path: Path) -> None:
    v = sdk(emulator)
    offer = v.search_offers(query="num_gpus=1", order="dph_total", limit=1)[0]
    iid = v.create_instance(id=offer["id"], image="x", disk=10, label="cli-bill")["new_contract"]
    emulator.wait_running([iid])
    v.destroy_instance(id=iid)
    user = cli(emulator, tmp_path, "show", "user", "--raw")
    assert user.returncode == 0 and json.loads(user.stdout)["credit"] == pytest.approx(emulator.credit_usd(), abs=1e-4)
    table = cli(emulator, tmp_path, "show", "user")
    assert "Credit" in table.stdout and f"{emulator.credit_usd():0.2f}" in table.stdout
    raw = cli(emulator, tmp_path, "show", "invoices-v1", "--charges", "--raw", "--limit", "100")
    rows = json.loads(raw.stdout)["results"]
    mine = [r for r in rows if r["source"] == f"instance-{iid}"]
    assert len(mine) == 1 and mine[0]["amount"] == pytest.approx(emulator.ledger.instance_usd(iid), abs=1e-9)
    tree = cli(emulator, tmp_path, "show", "invoices-v1", "--charges", "--format", "tree", "--verbose",
               "--limit", "100", "--no-color")
    assert tree.returncode == 0 and "Charges Breakdown" in tree.stdout and str(iid) in tree.stdout, tree.stderr
    inv = cli(emulator, tmp_path, "show", "invoices-v1", "--invoices", "--no-color")
    assert inv.returncode == 0 and "$1000.00" in inv.stdout and "Stripe" in inv.stdout, inv.stdout + inv.stderr
    old = cli(emulator, tmp_path, "show", "invoices", "--raw")
    kinds = {r["type"] for r in json.loads(old.stdout)}
    assert kinds == {"charge", "payment"}
