"""The host reliability ledger on real parts: a ghost offer and a box that never boots, as the emulator makes them.

The real ``vastai`` SDK against the emulator, real cycles (``Reconciler.cycle``): a rent the market refuses puts
its offer in observed/hosts.yaml as a ghost and the next cycle rents another; a box that never boots is destroyed
at boot_timeout and its machine gets the fault; the file validates against its schema and is read back whole.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
import yaml
from world import fleet_repo

from reconciler.cli._common import load_local_desired, open_reconciler, write_observed_uncommitted
from reconciler.core.actions import Destroy, ReasonCode, Rent
from reconciler.emulator import Emulator
from reconciler.observed.memory import read_fleet_memory

pytestmark = pytest.mark.integration

ROOT = Path(__file__).parents[2]


def test_ghost_offer_and_boot_timeout_land_in_the_ledger(
    emulator: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VAST_API_KEY", emulator.api_key)
    fleet = fleet_repo(tmp_path / "fleet")
    fleet.edit("desired/sweeps/tdmpc.yaml", lambda d: d.update(seeds=[1]))
    fleet.commit("test: one seed per cell")
    fleet.edit_fleet(name="itledger", boot_timeout="3s", max=1)
    repo = fleet.work
    desired = load_local_desired(repo)
    rec = open_reconciler(repo, desired, str(tmp_path / "state"), emulator.url)

    emulator.fail_next("/api/v0/asks/", 1, 404)
    first = rec.cycle(desired)
    assert first.applied is not None
    failed = [o.action for o in first.applied.failures if isinstance(o.action, Rent)]
    assert len(failed) == 1
    ghost = failed[0].offer_id
    assert [g.offer_id for g in rec.memory.hosts.ghosts] == [ghost]
    assert rec.memory.hosts.failures_in_a_row == 1

    emulator.never_boot()
    second = rec.cycle(desired)
    skipped = [n for n in second.plan.noops if n.code is ReasonCode.GHOST_OFFER]
    assert [n.target for n in skipped] == [f"offer/{ghost}"]
    rents = [a for a in second.plan.actions if isinstance(a, Rent)]
    assert len(rents) == 1 and rents[0].offer_id != ghost
    assert second.applied is not None and not second.applied.failures
    box = second.applied.rented[0]
    machine = int(emulator.instance(box)["machine_id"])
    host = rec.memory.hosts.host(machine)
    assert host is not None and host.rents == 1 and rents[0].offer_id in host.offers

    destroyed = None
    for _ in range(40):  # bounded: the box never boots, so boot_timeout (3s) destroys it
        res = rec.cycle(desired)
        hit = [a for a in res.plan.actions if isinstance(a, Destroy) and a.instance_id == box]
        if hit:
            destroyed = hit[0]
            write_observed_uncommitted(repo, desired, res.observed, res.plan, rec, res.applied)
            break
        time.sleep(0.5)
    assert destroyed is not None and destroyed.code is ReasonCode.BOOT_TIMEOUT
    host = rec.memory.hosts.host(machine)
    assert host is not None and (host.boot_timeouts, host.faults) == (1, 1)

    doc = yaml.safe_load((repo / "observed" / "hosts.yaml").read_text())
    schema = json.loads((ROOT / "schemas" / "observed-hosts.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)
    entry = next(h for h in doc["hosts"] if h["machine_id"] == machine)
    assert (entry["boot_timeouts"], entry["penalty"], entry["blacklisted"]) == (1, 0.5, False)
    assert read_fleet_memory(repo).hosts == replace(rec.memory.hosts, noted_at=None)  # noted_at: in-process only


def test_a_hung_bootstrap_is_destroyed_marks_its_host_and_the_rent_rate_holds(
    emulator: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bootstrap_timeout ends a bootstrap that never finishes; max_rents_per_hour 1 keeps the next rent back, and
    `rigsync status` (the real console script) says why."""
    monkeypatch.setenv("VAST_API_KEY", emulator.api_key)
    fleet = fleet_repo(tmp_path / "fleet")
    fleet.edit("desired/sweeps/tdmpc.yaml", lambda d: d.update(seeds=[1]))
    fleet.commit("test: one seed per cell")
    fleet.edit_fleet(name="itboot", max=1, bootstrap_timeout="2s", max_rents_per_hour=1)
    fleet.write("desired/bootstrap.sh", "#!/bin/sh\nsleep 600\n")
    repo = fleet.work
    desired = load_local_desired(repo)
    rec = open_reconciler(repo, desired, str(tmp_path / "state"), emulator.url)

    box = machine = None
    destroyed = None
    for _ in range(60):  # bounded: rent, boot, bootstrap starts and hangs, bootstrap_timeout (2s) destroys it
        res = rec.cycle(desired)
        assert res.applied is not None
        if box is None and res.applied.rented:
            box = res.applied.rented[0]
            machine = int(emulator.instance(box)["machine_id"])
        hit = [a for a in res.plan.actions if isinstance(a, Destroy) and a.instance_id == box]
        if hit:
            destroyed = hit[0]
            break
        time.sleep(0.5)
    assert box is not None and destroyed is not None, "the hung bootstrap was never ended"
    assert destroyed.code is ReasonCode.BOOTSTRAP_TIMEOUT and machine is not None
    host = rec.memory.hosts.host(machine)
    assert host is not None and (host.rents, host.bootstrap_failures) == (1, 1)

    after = rec.cycle(desired)  # one rent in the last hour = max_rents_per_hour 1: nothing more is rented
    assert not [a for a in after.plan.actions if isinstance(a, Rent)]
    assert [n.code for n in after.plan.noops if n.target == "fleet/itboot"] == [ReasonCode.RENT_RATE_LIMITED]
    write_observed_uncommitted(repo, desired, after.observed, after.plan, rec, after.applied)
    out = subprocess.run(
        [str(Path(sys.executable).parent / "rigsync"), "status", "--repo", str(repo), "--api-url", emulator.url,
         "--state-dir", str(tmp_path / "state")],
        capture_output=True, text=True, check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "renting: rent rate: 1 rent(s) in the last hour >= max_rents_per_hour 1" in out.stdout
