"""The lab's own machines (a ``provider: ssh`` pool) on real parts: a real sshd host on loopback that rigsync did not
rent runs a sweep through the same run protocol, and is never rented for nor destroyed.

The host is one of the test world's sshd boxes, created on the emulator by "someone else" (a foreign instance:
rigsync leaves it alone as such) after rigsync put its key on the account; the fleet lists its address and port as
its own machine. Cycles run until the sweep is done: probe, bootstrap, code shipping, the launch lock, heartbeat,
harvest and the archive are the code rented boxes use; no plan ever rents or destroys, and the emulator's books
show no rental by rigsync.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import jsonschema
import pytest
import yaml
from world import fleet_repo, rigsync

from reconciler.cli._common import load_local_desired, open_reconciler, write_observed_uncommitted
from reconciler.core.actions import Destroy, Rent
from reconciler.core.identity import own_box_id
from reconciler.core.model import AttemptOutcome
from reconciler.emulator import Emulator

pytestmark = pytest.mark.integration

SWEEP = """\
name: labrun
code: [experiments]
command: >-
  {{ python }} experiments/train.py --task walker-walk --lr 1e-3 --seed {{ seed }}
  --out {{ run_dir }}/metrics.jsonl --seconds 1 --evals 2
seeds: [1, 2]
max_runtime: 5m
metrics: {file: metrics.jsonl, key: episode_reward, goal: max}
"""


def test_a_provider_ssh_pool_runs_a_sweep_on_a_machine_rigsync_never_rents_or_destroys(
    emulator: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vastai import VastAI

    monkeypatch.setenv("VAST_API_KEY", emulator.api_key)
    fleet = fleet_repo(tmp_path / "fleet")
    fleet.set_sweeps({"labrun": SWEEP})
    fleet.edit_fleet(name="itown")
    repo = fleet.work
    desired = load_local_desired(repo)
    # rigsync's key goes on the account when the fleet is opened; the lab machine is set up after, so it accepts it
    rec = open_reconciler(repo, desired, str(tmp_path / "state"), emulator.url)
    client = VastAI(api_key=emulator.api_key, server_url=emulator.url, quiet=True)
    offer = client.search_offers(query="num_gpus=1 rentable=true", limit=1)[0]
    reply = client.create_instance(id=offer["id"], image="ubuntu:22.04", disk=10, label="the-lab-machine", ssh=True,
                                   direct=True)
    lab_id = int(reply["new_contract"])
    emulator.wait_running([lab_id])
    record = emulator.instance(lab_id)
    address, port = str(record["public_ipaddr"]), int(record["ports"]["22/tcp"][0]["HostPort"])
    assert address.startswith("127.")
    host = {"address": address, "port": port, "user": "root", "gpus": 1, "gpu_name": "RTX 3060"}
    fleet.edit_fleet(pools=[{"name": "lab", "provider": "ssh", "hosts": [host]}])
    desired = load_local_desired(repo)
    pool = desired.fleet.pools[0]
    own_id = own_box_id(pool, address, port)
    listed_before = sorted(emulator.instance_ids())

    acted: list[str] = []
    for _ in range(120):  # bounded: bootstrap, ship code, two 1s runs one after the other on the one GPU
        res = rec.cycle(desired)
        acted += [f"{a.kind.value} {a.target}" for a in res.plan.actions if isinstance(a, Rent | Destroy)]
        done = [r for r in rec.history if r.phase is AttemptOutcome.SUCCEEDED]
        if len(done) == 2:
            break
        time.sleep(0.5)
    assert len(done) == 2, f"not done: {[(r.run_id[:12], r.phase.value, r.reason) for r in rec.history]}"
    assert acted == []  # never a rent, never a destroy
    assert sorted(emulator.instance_ids()) == listed_before  # the emulator's books: nothing rented by rigsync
    assert emulator.status(lab_id) == "running"
    assert {r.instance_id for r in done} == {own_id}
    assert all(r.harvest is not None and r.harvest.startswith("ok") for r in done)
    # the idle machine is kept and says so; observed/ carries it like any box
    after = rec.cycle(desired)
    assert [n.code.value for n in after.plan.noops if n.target == f"instance/{own_id}"] == ["own_box_kept"]
    write_observed_uncommitted(repo, desired, after.observed, after.plan, rec, after.applied)
    assert str(own_id) in (repo / "observed" / "fleet.yaml").read_text()
    root = Path(__file__).parents[2]
    for name in ("fleet", "runs", "hosts"):
        doc = yaml.safe_load((repo / "observed" / f"{name}.yaml").read_text())
        schema = json.loads((root / "schemas" / f"observed-{name}.schema.json").read_text())
        jsonschema.Draft202012Validator(schema).validate(doc)
    archive_schema = json.loads((root / "schemas" / "archive-record.schema.json").read_text())
    for shard in (repo / "observed" / "runs").glob("*.jsonl"):
        for line in shard.read_text().splitlines():
            jsonschema.Draft202012Validator(archive_schema).validate(json.loads(line))


def test_rigsync_run_once_on_a_fleet_of_own_machines_needs_no_vast_key(emulator: Emulator, tmp_path: Path) -> None:
    """`rigsync run --once` (the console script) with VAST_API_KEY unset, no key file and an API URL where nothing
    listens: an own-boxes fleet runs its cycle anyway; adding a Vast pool makes it one line naming that pool."""
    from vastai import VastAI

    from reconciler.adapters.ssh import ensure_keypair

    state = tmp_path / "state"
    _key, public = ensure_keypair(state / "itnokey")  # rigsync's own key, put on the lab machine by its admin
    emulator.add_ssh_key(public)
    client = VastAI(api_key=emulator.api_key, server_url=emulator.url, quiet=True)
    offer = client.search_offers(query="num_gpus=1 rentable=true", limit=1)[0]
    lab_id = int(client.create_instance(id=offer["id"], image="ubuntu:22.04", disk=10, label="lab", ssh=True,
                                        direct=True)[
        "new_contract"])
    emulator.wait_running([lab_id])
    record = emulator.instance(lab_id)
    address, port = str(record["public_ipaddr"]), int(record["ports"]["22/tcp"][0]["HostPort"])
    fleet = fleet_repo(tmp_path / "fleet")
    fleet.set_sweeps({"labrun": SWEEP})
    host = {"address": address, "port": port, "user": "root", "gpus": 1, "gpu_name": "RTX 3060"}
    fleet.edit_fleet(name="itnokey", pools=[{"name": "lab", "provider": "ssh", "hosts": [host]}])
    fleet.commit("an own-boxes fleet")
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "VAST_API_KEY"}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), RIGSYNC_STATE_DIR=str(state),
               RIGSYNC_API_URL="http://127.0.0.1:1")  # nothing listens there: the Vast API is never called
    calls_before = len(emulator.ledger.events)
    got = rigsync(env, "run", "--once", "--repo", str(fleet.work))
    assert got.returncode == 0, got.stdout + got.stderr
    assert "cannot reach" not in got.stdout + got.stderr
    own_id = own_box_id(load_local_desired(fleet.work).fleet.pools[0], address, port)
    fleet.git("pull", "-q", "--ff-only")
    assert str(own_id) in (fleet.work / "observed" / "fleet.yaml").read_text()
    assert not [e for e in emulator.ledger.events[calls_before:] if e["type"] == "create"]

    fleet.edit_fleet(pools=[{"name": "lab", "provider": "ssh", "hosts": [host]}, {"name": "rented"}])
    fleet.commit("a mixed fleet")
    got = rigsync(env, "run", "--once", "--repo", str(fleet.work))
    assert got.returncode != 0, got.stdout + got.stderr
    lines = (got.stdout + got.stderr).strip().splitlines()
    assert lines[-1].count("pool rented (provider vast) needs a Vast API key") == 1, got.stdout + got.stderr
    assert "Traceback" not in got.stdout
