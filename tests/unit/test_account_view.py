"""`views.account`: the account's instances grouped by the fleet and pool their labels name (`rigsync fleets`).

Pure: an instance list and checkouts in, the JSON document and its text out, the document valid against
schemas/cli-fleets.schema.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from reconciler.core.identity import rent_label
from reconciler.core.model import DEFAULT_POOL, Fleet, InFlight, Instance, InstanceStatus, Pool
from reconciler.views.account import Checkout, account_json, account_text

SCHEMA = Draft202012Validator(
    json.loads((Path(__file__).resolve().parents[2] / "schemas" / "cli-fleets.schema.json").read_text())
)
NOW = 1_800_000_000.0
NAMED = Fleet(name="lab", max_instances=4, pools=(Pool(name="big"), Pool(name="small")))
PLAIN = Fleet(name="solo", pools=(Pool(name=DEFAULT_POOL),))


def inst(iid: int, label: str, dph: float = 0.25, age_s: float | None = 3600.0) -> Instance:
    return Instance(id=iid, label=label, status=InstanceStatus.RUNNING, gpu_name="RTX 3090", num_gpus=1,
                    gpu_ram_mib=24576, dph_total=dph, start_date=0.0 if age_s is None else NOW - age_s)


ACCOUNT = [
    inst(3, rent_label(NAMED, 903, NAMED.pools[1]), 0.5),
    inst(1, rent_label(NAMED, 901, NAMED.pools[0])),
    inst(2, rent_label(PLAIN, 902), 0.125),
    inst(4, "my notebook box", 1.0),
    inst(5, "", 2.0, age_s=None),
]


def doc_of(checkouts: list[Checkout]) -> dict[str, Any]:
    doc = account_json(ACCOUNT, checkouts, NOW)
    SCHEMA.validate(doc)
    return doc


def group(doc: dict[str, Any], fleet: str | None, pool: str | None) -> dict[str, Any]:
    return next(g for g in doc["groups"] if g["fleet"] == fleet and g["pool"] == pool)


def test_grouped_by_fleet_and_pool_hand_rented_last() -> None:
    doc = doc_of([])
    keys = [(g["fleet"], g["pool"], g["hand_rented"]) for g in doc["groups"]]
    # without a checkout, a label's pool is its -<pool> suffix; the plain fleet's label names none
    assert keys == [("lab", "big", False), ("lab", "small", False), ("solo", None, False), (None, None, True)]
    assert [b["id"] for b in group(doc, None, None)["instances"]] == [4, 5]
    assert doc["count"] == 5 and doc["dph"] == 3.875
    assert group(doc, None, None)["dph"] == 3.0
    assert group(doc, "lab", "big")["instances"][0]["age_s"] == 3600.0
    assert group(doc, None, None)["instances"][1]["age_s"] is None  # no start date: unknown, not 56 years


def test_checkouts_name_the_repo_the_pool_and_what_runs_on_their_own_boxes() -> None:
    on_1 = InFlight(run_id="r-a", attempt=2, instance_id=1, gpu_mask=(0,), launched_at=NOW - 60, sweep="s")
    # a checkout of `solo` claiming an attempt on lab's box 3 does not speak for lab's box
    stray = InFlight(run_id="r-x", attempt=1, instance_id=3, gpu_mask=(0,), launched_at=NOW - 60, queued=True)
    doc = doc_of([Checkout("/w/lab", NAMED, (on_1,)), Checkout("/w/solo", PLAIN, (stray,))])
    assert doc["repos"] == [{"repo": "/w/lab", "fleet": "lab"}, {"repo": "/w/solo", "fleet": "solo"}]
    big, small, solo = group(doc, "lab", "big"), group(doc, "lab", "small"), group(doc, "solo", DEFAULT_POOL)
    assert big["repo"] == small["repo"] == "/w/lab" and solo["repo"] == "/w/solo"
    assert big["instances"][0]["runs"] == [{"run_id": "r-a", "attempt": 2, "sweep": "s", "queued": False}]
    assert small["instances"][0]["runs"] == []
    assert group(doc, None, None)["repo"] is None
    text = account_text(doc)
    assert "fleet lab / pool big  repo /w/lab: 1 box, $0.250/h" in text
    assert "runs: r-a.2" in text
    assert "hand-rented (no rigsync label): 2 boxes, $3.000/h" in text
    assert text.endswith("total: 5 instances, $3.875/h")


def test_an_empty_account() -> None:
    doc = account_json([], [], NOW)
    SCHEMA.validate(doc)
    assert doc["groups"] == [] and doc["count"] == 0
    assert account_text(doc) == "no instances on the account\ntotal: 0 instances, $0.000/h"
