"""`rigsync fleets` (and the MCP tool ``fleets``) against the emulator, through the real vastai client.

The account holds boxes of two fleets, each with a checkout, and boxes rented by hand (no label). The command
lists them all, grouped by fleet and pool, with what each fleet's checkout says runs on its own boxes and which
checkout it belongs to; and it changes nothing: the emulator's ledger, instances and account keys are as before,
the checkouts' working trees are clean, and no SSH key was ever made (so no box was reached).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from world import RIGSYNC, FleetRepo, dump, emulator_env, fleet_repo, rigsync

from reconciler.adapters.vast import VastProvider
from reconciler.core.identity import rent_label
from reconciler.core.model import DEFAULT_POOL, InFlight, OfferFilters
from reconciler.desired import load_desired_from_dir
from reconciler.emulator import Emulator
from reconciler.observed.codec import RUNS
from reconciler.observed.memory import in_flight_entries

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SCHEMA = Draft202012Validator(
    json.loads((Path(__file__).resolve().parents[2] / "schemas" / "cli-fleets.schema.json").read_text())
)


@pytest.fixture(scope="module")
def account(emulator: Emulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Two fleet checkouts (alpha, beta), a box of each and one rented by hand; alpha's runs.yaml has an attempt
    in flight on its box, and (wrongly) on beta's box too, which alpha's checkout does not speak for."""
    base = tmp_path_factory.mktemp("fleets")
    provider = VastProvider(api_key=emulator.api_key, server_url=emulator.url)
    offers = provider.search_offers(OfferFilters(verified=False), disk_gb=10)
    repos: dict[str, FleetRepo] = {}
    ids: dict[str, int] = {}
    for n, name in enumerate(("alpha", "beta")):
        repo = fleet_repo(base / name)
        repo.edit_fleet(name=name)
        fleet = load_desired_from_dir(repo.work).fleet
        ids[name] = provider.create_instance(offers[n].id, image="img", disk_gb=10,
                                             label=rent_label(fleet, offers[n].id), onstart="", env={})
        repos[name] = repo
    ids["hand"] = provider.create_instance(offers[2].id, image="img", disk_gb=10, label="", onstart="", env={})
    emulator.wait_running(list(ids.values()))
    flights = [InFlight(run_id="tdmpc-aaaa", attempt=1, instance_id=ids["alpha"], gpu_mask=(0,),
                        launched_at=1_700_000_000.0, sweep="tdmpc"),
               InFlight(run_id="tdmpc-bbbb", attempt=3, instance_id=ids["beta"], gpu_mask=(0,),
                        launched_at=1_700_000_000.0, sweep="tdmpc")]
    repos["alpha"].write(RUNS, dump({"in_flight": in_flight_entries(flights)}))
    for repo in repos.values():
        repo.commit("fleet named, observed in flight", push=False)
    state = base / "state"
    state.mkdir()
    env = {**emulator_env(emulator), "RIGSYNC_STATE_DIR": str(state), "HOME": str(base / "home"),
           "XDG_STATE_HOME": str(base / "xdg")}
    yield {"repos": repos, "ids": ids, "env": env, "state": state, "emu": emulator}
    for iid in ids.values():
        provider.destroy_instance(iid)


def _world(emu: Emulator) -> Any:
    return ([(r["id"], r.get("label"), r.get("actual_status")) for r in emu.records()], emu.ledger.events,
            emu.ssh_keys())


def _porcelain(repo: FleetRepo) -> str:
    return subprocess.run(["git", "-C", str(repo.work), "status", "--porcelain"], capture_output=True,
                          text=True, check=True).stdout


def _group(doc: dict[str, Any], iid: int) -> dict[str, Any]:
    return next(g for g in doc["groups"] if any(b["id"] == iid for b in g["instances"]))


def _box(doc: dict[str, Any], iid: int) -> dict[str, Any]:
    return next(b for b in _group(doc, iid)["instances"] if b["id"] == iid)


def _stable(doc: dict[str, Any]) -> Any:
    """The document less what moves with the clock (its time, the boxes' ages)."""
    return [{**g, "instances": [{k: v for k, v in b.items() if k != "age_s"} for b in g["instances"]]}
            for g in doc["groups"]]


def test_fleets_lists_the_account_by_fleet_and_pool_and_changes_nothing(account: dict[str, Any]) -> None:
    alpha, beta = account["repos"]["alpha"], account["repos"]["beta"]
    ids, env, emu = account["ids"], account["env"], account["emu"]
    before = _world(emu)
    out = rigsync(env, "fleets", "--repo", str(alpha.work), "--repo", str(beta.work), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    SCHEMA.validate(doc)
    assert doc["count"] == 3
    a, b, hand = _group(doc, ids["alpha"]), _group(doc, ids["beta"]), _group(doc, ids["hand"])
    assert (a["fleet"], a["pool"], a["repo"]) == ("alpha", DEFAULT_POOL, str(alpha.work))
    assert (b["fleet"], b["pool"], b["repo"]) == ("beta", DEFAULT_POOL, str(beta.work))
    assert hand["hand_rented"] and hand["fleet"] is None and hand["repo"] is None
    assert [r["run_id"] for r in _box(doc, ids["alpha"])["runs"]] == ["tdmpc-aaaa"]
    assert _box(doc, ids["beta"])["runs"] == []  # alpha's file does not speak for beta's box
    assert _box(doc, ids["alpha"])["gpu_name"] and _box(doc, ids["alpha"])["dph"] > 0
    assert _box(doc, ids["alpha"])["age_s"] is not None

    text = rigsync(env, "fleets", "--repo", str(alpha.work), "--repo", str(beta.work))
    assert text.returncode == 0, text.stderr
    assert f"fleet alpha / pool {DEFAULT_POOL}  repo {alpha.work}: 1 box" in text.stdout
    assert "hand-rented (no rigsync label): 1 box" in text.stdout
    assert "runs: tdmpc-aaaa.1" in text.stdout

    alone = json.loads(rigsync(env, "fleets", "--json").stdout)  # no checkout: the labels alone
    assert _group(alone, ids["alpha"])["repo"] is None and _group(alone, ids["alpha"])["pool"] is None
    assert _box(alone, ids["alpha"])["runs"] == []

    assert _world(emu) == before  # no instance, ledger event or account key changed
    assert _porcelain(alpha) == _porcelain(beta) == ""
    assert not any(account["state"].iterdir())  # no SSH key made: no box was reached


def test_fleets_without_the_key_is_one_line(account: dict[str, Any]) -> None:
    env = {k: v for k, v in account["env"].items() if k != "VAST_API_KEY"}
    out = rigsync(env, "fleets")
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.startswith("rigsync: error:") and len(out.stderr.strip().splitlines()) == 1


def test_the_mcp_tool_returns_what_the_command_prints(account: dict[str, Any]) -> None:
    import anyio
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    alpha = account["repos"]["alpha"]
    env, emu = account["env"], account["emu"]
    before = _world(emu)

    async def go() -> Any:
        params = StdioServerParameters(command=str(RIGSYNC), args=["mcp", "--repo", str(alpha.work)], env=env)
        with open(os.devnull, "w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                listed = await session.list_tools()
                return listed, await session.call_tool("fleets", {})

    listed, result = anyio.run(go)
    assert "fleets" in {t.name for t in listed.tools}
    assert not result.is_error, result.content
    cli = json.loads(rigsync(env, "fleets", "--repo", str(alpha.work), "--json").stdout)
    SCHEMA.validate(result.structured_content)
    assert _stable(result.structured_content) == _stable(cli)
    assert _world(emu) == before
