"""Pools (fleet.yaml ``pools:``): loading, defaults taken from the fleet, labels, and today's single-pool fleet."""

from __future__ import annotations

from pathlib import Path

from reconciler.core.identity import fleet_spec_hash, pool_spec_hash, rent_label, slot_pool
from reconciler.core.model import DEFAULT_POOL, Ownership
from reconciler.desired import load_desired, read_desired_files

REPO = Path(__file__).resolve().parents[2]

POOLED = b"""\
name: demo
instances: {max: 4}
image: pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime
bootstrap: bootstrap.sh
offers: {gpu_names: ["RTX 3060"], max_dph: 0.15}
pools:
  - name: cheap
    instances: {min: 1, max: 3}
  - name: big
    offers: {gpu_names: ["A100 SXM4"], gpus_min: 8, rank_by: price}
    image: big/image:1
    disk_gb: 200
    bootstrap: big.sh
"""

SWEEP = b"""\
name: huge
code: [experiments]
command: "{{ python }} experiments/train.py --seed {{ seed }} --out {{ run_dir }}/metrics.jsonl"
seeds: [1]
pool: big
resources: {gpus: 8}
"""


def test_a_fleet_with_pools_loads_each_with_the_fleet_defaults_and_sweeps_name_theirs() -> None:
    files = dict(read_desired_files(REPO))
    files["desired/fleet.yaml"] = POOLED
    files["desired/big.sh"] = b"#!/bin/sh\necho big\n"
    files["desired/sweeps/huge.yaml"] = SWEEP
    desired = load_desired(files)
    fleet = desired.fleet
    cheap, big = fleet.pools
    assert (cheap.name, cheap.min_instances, cheap.max_instances) == ("cheap", 1, 3)
    assert cheap.filters.gpu_names == ("RTX 3060",) and cheap.image == "pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime"
    assert cheap.bootstrap_path == "desired/bootstrap.sh" and cheap.bootstrap_hash != ""
    assert big.filters.gpu_names == ("A100 SXM4",) and big.filters.num_gpus_min == 8 and big.filters.dph_max is None
    assert (big.image, big.disk_gb, big.bootstrap_script) == ("big/image:1", 200.0, "#!/bin/sh\necho big\n")
    assert big.bootstrap_hash not in ("", cheap.bootstrap_hash)
    assert {r.sweep.pool for r in desired.runs if r.sweep.name == "huge"} == {"big"}
    assert {r.sweep.pool for r in desired.runs if r.sweep.name == "tdmpc"} == {""}  # the first pool
    assert fleet.pool("") == cheap and fleet.pool("big") == big and fleet.pool("nope") is None
    label = rent_label(fleet, 42, big)
    assert label == f"rigsync:demo:{pool_spec_hash(big)}-42-big"
    own = Ownership.parse(label)
    assert own is not None and slot_pool(fleet, own.slot) == "big"
    assert slot_pool(fleet, f"{pool_spec_hash(cheap)}-7") == "cheap"  # a box from before pools: the first pool


def test_todays_single_pool_fleet_is_one_pool_called_default_with_the_same_labels() -> None:
    fleet = load_desired(read_desired_files(REPO)).fleet
    (pool,) = fleet.pools
    assert pool.name == DEFAULT_POOL and not fleet.named_pools
    assert (pool.min_instances, pool.max_instances) == (fleet.min_instances, fleet.max_instances)
    assert pool.filters.dph_max == 0.15 and pool.bootstrap_path == "desired/bootstrap.sh"
    assert pool_spec_hash(pool) == fleet_spec_hash(fleet)
    assert rent_label(fleet, 42) == f"rigsync:demo:{fleet_spec_hash(fleet)}-42"
    assert slot_pool(fleet, f"{fleet_spec_hash(fleet)}-42") == DEFAULT_POOL


def test_which_providers_a_fleet_and_its_pools_may_name_is_said_in_one_place() -> None:
    import pytest

    from reconciler.core.model import Fleet, OwnHost, Pool
    from reconciler.errors import UserError
    from reconciler.fleet import require_supported_provider

    lab = Pool(name="lab", provider="ssh", hosts=(OwnHost("127.0.0.9", 2222, gpus=2),))
    require_supported_provider(Fleet(name="f", pools=(lab, Pool(name="cloud"))))
    with pytest.raises(UserError, match="pool gcp: unknown provider 'gcp'"):
        require_supported_provider(Fleet(name="f", pools=(Pool(name="gcp", provider="gcp"),)))
    with pytest.raises(UserError, match="pool lab: provider ssh needs its hosts"):
        require_supported_provider(Fleet(name="f", pools=(Pool(name="lab", provider="ssh"),)))
    with pytest.raises(UserError, match="only 'vast' is supported"):
        require_supported_provider(Fleet(name="f", provider="ssh"))
