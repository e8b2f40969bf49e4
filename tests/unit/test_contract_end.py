"""Contract end dates outside the plan cases: the contract's predicates, the adapter reading an untrusted end_date,
the host ledger (a contract's end is no host fault), the desired field, and the end shown from committed facts."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from reconciler.adapters.vast import instance_from_record, offer_from_record
from reconciler.core import contract
from reconciler.core.actions import Destroy, Plan, ReasonCode
from reconciler.core.ledger import note_cycle
from reconciler.core.model import (
    Fleet,
    FleetMemory,
    HostLedger,
    Instance,
    InstanceStatus,
    Observed,
    Offer,
    PriceIncrease,
)
from reconciler.desired import load_desired_from_dir
from reconciler.observed.codec import FLEET
from reconciler.observed.documents import ReconcilerStatus, render_observed
from reconciler.plan.render import status_json, status_text
from reconciler.views.facts import build_view
from reconciler.views.status_md import render_status_md

ROOT = Path(__file__).parents[2]
NOW = 1_800_000_000.0
FLEET_NAME = "lab"


def box(iid: int = 1, end: float | None = NOW + 3600, machine: int = 5, status: str = "running") -> Instance:
    return Instance(id=iid, label=f"rigsync:{FLEET_NAME}:abc-{iid}", status=InstanceStatus(status), gpu_name="RTX 3090",
                    num_gpus=1, gpu_ram_mib=24576, dph_total=0.2, start_date=NOW - 600, machine_id=machine,
                    end_date=end)


def test_room_for_work_counts_the_margin_and_an_accepted_increase() -> None:
    b = box(end=NOW + 3600)
    assert contract.room_for(b, NOW, 1800, 1800) and not contract.room_for(b, NOW, 1801, 1800)
    assert contract.room_for(box(end=None), NOW, 1e9, 1800)  # no end said: never limited
    longer = PriceIncrease(id=3, instance_id=1, old_dph=0.2, new_dph=0.3, applies_at=NOW + 3600, new_end=NOW + 86400)
    assert contract.room_for(b, NOW, 36000, 1800, [longer])
    assert not contract.ending(b, NOW, 1800) and contract.ending(b, NOW + 1800, 1800)
    assert contract.ending(b, NOW + 7200, 1800) and not contract.ending(box(end=None), NOW, 1800)
    assert not contract.ending(b, NOW + 1800, 1800, [longer])
    offer = Offer(id=9, machine_id=5, gpu_name="RTX 3090", num_gpus=1, gpu_ram_mib=24576, dph_total=0.2, dlperf=20,
                  dlperf_per_dph=100, reliability=0.99, inet_down_mbps=500, cuda=12.4, verified=True,
                  geolocation="SE", disk_space_gb=100, end_date=NOW + 600)
    assert contract.offer_room_for(offer, NOW, 0, 600) and not contract.offer_room_for(offer, NOW, 1, 600)


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        (1_793_000_000.0, 1_793_000_000.0),
        ("1793000000.5", 1_793_000_000.5),  # numbers as strings, as some rows carry them
        (None, None),
        ("soon", None),
        (math.nan, None),
        (math.inf, None),
        (True, None),
        (-5.0, None),
        (1e30, None),  # far past any real contract: nonsense, not "no end"
        ([1], None),
    ],
)
def test_the_adapter_reads_end_date_as_untrusted_input(raw: Any, want: float | None) -> None:
    rec: dict[str, Any] = {"id": 7, "machine_id": 3, "gpu_name": "RTX 3090", "num_gpus": 1, "dph_total": 0.2}
    if raw is not None:
        rec["end_date"] = raw
    assert offer_from_record(rec).end_date == want
    assert instance_from_record({**rec, "actual_status": "running"}).end_date == want
    assert offer_from_record({k: v for k, v in rec.items() if k != "end_date"}).end_date is None


def test_a_contract_end_is_no_host_fault_in_the_ledger() -> None:
    fleet = Fleet(name=FLEET_NAME)
    observed = Observed(instances=(box(1, NOW - 60, machine=5, status="exited"), box(2, None, machine=6)))
    done = [
        (Destroy(reason="contract ended", code=ReasonCode.CONTRACT_ENDED, instance_id=1, dph=0.2), True, "ok"),
        (Destroy(reason="outbid", code=ReasonCode.PROVIDER_STOPPED, instance_id=2, dph=0.2), True, "ok"),
    ]
    ledger = note_cycle(HostLedger(), fleet, observed, done, [], NOW)
    five, six = ledger.host(5), ledger.host(6)
    assert five is not None and (five.faults, five.outbids, five.vanishes) == (0, 0, 0)
    assert six is not None and six.outbids == 1
    assert ledger.failures_in_a_row == 0


def test_contract_margin_is_a_fleet_duration(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "desired", tmp_path / "desired")
    (tmp_path / "experiments").mkdir()
    assert load_desired_from_dir(tmp_path).fleet.contract_margin_s == 1800.0  # the default: 30m
    fleet_yaml = tmp_path / "desired" / "fleet.yaml"
    fleet_yaml.write_text(fleet_yaml.read_text() + "\ncontract_margin: 10m\n")
    assert load_desired_from_dir(tmp_path).fleet.contract_margin_s == 600.0


def test_status_and_status_md_show_each_box_contract_end() -> None:
    accepted = PriceIncrease(id=4, instance_id=2, old_dph=0.2, new_dph=0.25, applies_at=NOW + 600,
                             new_end=NOW + 2 * 86400)
    observed = Observed(
        instances=(box(1, NOW + 5400), box(2, NOW + 600), box(3, None)),
        memory=FleetMemory(accepted_increases=(accepted,)),
        fleet_name=FLEET_NAME,
    )
    files = render_observed(desired=None, observed=observed, plan=Plan(actions=()), status=ReconcilerStatus(), now=NOW)
    doc = yaml.safe_load(files[FLEET])
    schema = json.loads((ROOT / "schemas" / "observed-fleet.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)
    ends = {b["id"]: b.get("ends_at") for b in doc["boxes"]}
    # the extended end of the accepted increase; none for a box that says no end
    assert ends == {1: "2027-01-15T09:30:00Z", 2: "2027-01-17T08:00:00Z", 3: None}
    view = build_view({**files}, [], None)
    assert {b.id: b.ends_in_s for b in view.boxes} == {1: 5400.0, 2: 2 * 86400.0, 3: None}
    text = render_status_md(files, [], None)
    assert "| contract ends in |" in text and "| 1h 30m |" in text and "| 2d 0h |" in text

    live = status_json(_desired(), observed, None, NOW + 1800)
    cli_schema = json.loads((ROOT / "schemas" / "cli-status.schema.json").read_text())
    jsonschema.Draft202012Validator(cli_schema).validate(live)
    rows = {b["id"]: (b["end_date"], b["ends_in_s"]) for b in live["boxes"]}
    assert rows == {1: (NOW + 5400, 3600.0), 2: (NOW + 2 * 86400, 2 * 86400 - 1800.0), 3: (None, None)}
    lines = status_text(live).splitlines()
    assert "contract ends in 1.0h" in lines[1] and "contract ends" not in lines[3]


def _desired() -> Any:
    try:
        from .plan_case_io import build_desired
    except ImportError:
        from plan_case_io import build_desired  # type: ignore[no-redef]
    return build_desired({"fleet": {"name": FLEET_NAME}})
