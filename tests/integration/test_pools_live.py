"""Pools on real parts: one fleet renting cheap 1-GPU boxes for one sweep and a multi-GPU box for another.

The real ``vastai`` SDK against the emulator (one offer query per pool), real sshd boxes, real cycles: each sweep's
run lands on a box of its own pool, rented from that pool's offers and labelled with it, and both succeed.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from world import fleet_repo

from reconciler.cli._common import load_local_desired, open_reconciler
from reconciler.core.actions import Launch, Rent
from reconciler.core.identity import slot_pool
from reconciler.core.model import AttemptOutcome, Ownership
from reconciler.emulator import Emulator

pytestmark = pytest.mark.integration

POOLS = """
pools:
  - name: cheap
    instances: {max: 1}
  - name: wide
    instances: {max: 1}
    offers: {gpus_min: 2, gpus_max: 4, max_dph: 5, min_gpu_ram_gib: 6, verified: false, rank_by: price}
"""

WIDE = """\
name: wide
code: [experiments]
command: >-
  {{ python }} experiments/train.py --task walker-walk --lr 1e-3 --seed {{ seed }}
  --out {{ run_dir }}/metrics.jsonl --seconds 1 --evals 2
seeds: [7]
pool: wide
resources: {gpus: 2}
max_runtime: 5m
metrics: {file: metrics.jsonl, key: episode_reward, goal: max}
"""

NARROW = WIDE.replace("name: wide", "name: narrow").replace("pool: wide\n", "").replace("gpus: 2", "gpus: 1")


def test_each_sweep_runs_on_a_box_of_its_pool(
    emulator: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VAST_API_KEY", emulator.api_key)
    fleet = fleet_repo(tmp_path / "fleet")
    fleet.edit_fleet(name="itpools", **yaml.safe_load(POOLS))
    fleet.write("desired/budget.yaml", "max_instance_dph: 5\nmax_fleet_dph: 10\nmax_total_usd: 50\n")
    fleet.set_sweeps({"wide": WIDE, "narrow": NARROW})
    repo = fleet.work
    desired = load_local_desired(repo)
    assert [p.name for p in desired.fleet.pools] == ["cheap", "wide"]
    rec = open_reconciler(repo, desired, str(tmp_path / "state"), emulator.url)

    rents: dict[int, Rent] = {}
    launched_on: dict[str, int] = {}  # sweep -> instance
    pool_of_box: dict[int, str] = {}
    for _ in range(120):  # bounded: rent two boxes, boot, bootstrap, run two short runs
        res = rec.cycle(desired)
        for inst in res.observed.instances:
            own = Ownership.parse(inst.label)
            if own is not None and own.fleet == "itpools":
                pool_of_box[inst.id] = slot_pool(desired.fleet, own.slot)
        rents.update({a.offer_id: a for a in res.plan.actions if isinstance(a, Rent)})
        launched_on.update({a.sweep: a.instance_id for a in res.plan.actions if isinstance(a, Launch)})
        done = {r.sweep for r in rec.history if r.phase is AttemptOutcome.SUCCEEDED}
        if done == {"wide", "narrow"}:
            break
        time.sleep(0.5)
    assert done == {"wide", "narrow"}, f"not both succeeded: {[(r.sweep, r.phase.value) for r in rec.history]}"
    assert sorted(a.label.rsplit("-", 1)[1] for a in rents.values()) == ["cheap", "wide"]
    assert pool_of_box[launched_on["wide"]] == "wide" and pool_of_box[launched_on["narrow"]] == "cheap"
    wide_rent = next(a for a in rents.values() if a.label.endswith("-wide"))
    wide = next(r for r in rec.history if r.sweep == "wide")
    assert 2 <= wide_rent.num_gpus <= 4 and wide.gpu_name == wide_rent.gpu_name
