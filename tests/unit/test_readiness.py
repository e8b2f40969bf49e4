"""Measured readiness: each box's first answer and first ready answer (``remember.update_box_memory``), kept in
fleet.yaml and in its overhead line when its bill closes, and the pool's time to a ready box (``Forecast.ready_s``).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import jsonschema
import yaml
from plan_case_io import build_desired, build_observed

from reconciler.core.model import BoxMemory, BoxProbe, BoxSpend, Controller, Instance, InstanceStatus
from reconciler.core.remember import overhead_record, update_box_memory
from reconciler.observed.archive_lines import entry_from_json, overhead_to_json
from reconciler.observed.codec import FLEET
from reconciler.observed.memory import box_memory_entries, fleet_memory_from_files
from reconciler.plan.forecast import DEFAULT_READY_S, forecast
from reconciler.plan.readiness import RECENT_BOXES
from reconciler.plan.world import index_world

T = 1_000_000.0
SCHEMAS = Path(__file__).parents[2] / "schemas"
BOX = Instance(1, "rigsync:lab:abc-1", InstanceStatus.RUNNING, "RTX 3090", 1, 24576, 0.2, T - 600)


def test_reachable_then_ready_once_the_pools_bootstrap_is_done() -> None:
    booting = update_box_memory((), [BOX], [BoxProbe(1, reachable=False)], T, "h1", pools={1: "default"})
    assert (booting[0].reachable_at, booting[0].ready_at, booting[0].pool) == (None, None, "default")
    answered = update_box_memory(booting, [BOX], [BoxProbe(1, reachable=True)], T + 30, "h1")
    assert (answered[0].reachable_at, answered[0].ready_at) == (T + 30, None)
    done = BoxProbe(1, reachable=True, bootstrap_hashes=("h1",))
    ready = update_box_memory(answered, [BOX], [done], T + 90, "h1")
    assert (ready[0].reachable_at, ready[0].ready_at, ready[0].pool) == (T + 30, T + 90, "default")
    # first times stay first: a later dark cycle or answer changes neither
    later = update_box_memory(ready, [BOX], [BoxProbe(1, reachable=False)], T + 200, "h1")
    assert (later[0].reachable_at, later[0].ready_at) == (T + 30, T + 90)


def test_without_a_bootstrap_a_box_is_ready_when_it_first_answers() -> None:
    m = update_box_memory((), [BOX], [BoxProbe(1, reachable=True)], T, "")
    assert (m[0].reachable_at, m[0].ready_at) == (T, T)
    failed = update_box_memory((), [BOX], [BoxProbe(1, reachable=True, bootstrap_failed=("h1",))], T, "h1")
    assert failed[0].ready_at is None  # answering with its bootstrap failed is not ready


def test_a_gone_box_keeps_its_memory_while_its_bill_is_open() -> None:
    m = (BoxMemory(1, T - 600, reachable_at=T - 500, ready_at=T - 400, pool="default"),)
    assert update_box_memory(m, [], [], T, "", open_bills=frozenset({1})) == m
    assert update_box_memory(m, [], [], T, "") == ()  # its bill closed: nothing left to carry


def test_fleet_yaml_keeps_readiness_and_its_entries_match_the_schema() -> None:
    m = (BoxMemory(1, T - 600, reachable_at=T - 500, ready_at=T - 400, pool="gpu"), BoxMemory(2, T - 60))
    entries = box_memory_entries(m)
    schema = json.loads((SCHEMAS / "observed-fleet.schema.json").read_text())
    item = schema["properties"]["memory"]["items"]
    for e in entries:
        jsonschema.Draft202012Validator(item).validate(e)
    assert "ready_at" not in entries[1] and "pool" not in entries[1]  # older entries stay as they were
    back = fleet_memory_from_files({FLEET: yaml.safe_dump({"memory": entries})}).boxes
    assert back == m


def test_the_overhead_line_carries_the_boxs_readiness() -> None:
    bill = BoxSpend(7, usd=0.3, at=T, dph=0.2, gone_at=T - 10, started_at=T - 3600, gpu_name="RTX 3090", num_gpus=1)
    mem = BoxMemory(7, T - 3500, reachable_at=T - 3540, ready_at=T - 3300, pool="default")
    rec = overhead_record(bill, (), mem)
    assert (rec.reachable_at, rec.ready_at, rec.pool) == (T - 3540, T - 3300, "default")
    line = overhead_to_json(rec)
    assert entry_from_json(line) == rec
    jsonschema.Draft202012Validator(json.loads((SCHEMAS / "archive-record.schema.json").read_text())).validate(
        json.loads(line)
    )
    assert '"ready_at"' not in overhead_to_json(overhead_record(bill, ()))  # unknown: not written


def _ready(boxes: list[tuple[int, float, float | None]], gone: list[tuple[int, float, float]] | None = None) -> float:
    """ready_s of pool default for listed boxes (id, started ago, ready ago) and gone ones with an open bill."""
    gone = gone or []
    desired = build_desired({})
    instances = [{"id": i, "start_ago": s} for i, s, _ in boxes]
    memory = [{"instance_id": i, "ready_ago": r, "pool": "default"} for i, _, r in boxes if r is not None]
    memory += [{"instance_id": i, "ready_ago": r, "pool": "default"} for i, _, r in gone]
    spend = {"boxes": [{"instance_id": i, "gone_ago": 5} for i, _, _ in gone]}
    observed = build_observed({"instances": instances, "memory": memory, "spend": spend}, T, desired)
    if gone:  # the bill says the rental's start
        bills = tuple(
            replace(b, started_at=T - next(s for i, s, _ in gone if i == b.instance_id))
            for b in observed.memory.spend.boxes
        )
        observed = replace(observed, memory=replace(observed.memory, spend=replace(observed.memory.spend, boxes=bills)))
    world, _ = index_world(desired, observed, Controller(), T)
    return forecast(world, {}).ready_s("default")


def test_ready_s_is_the_median_over_the_pools_recent_boxes_else_the_default() -> None:
    assert _ready([]) == DEFAULT_READY_S
    assert _ready([(1, 1000, None)]) == DEFAULT_READY_S  # not ready yet: nothing measured
    assert _ready([(1, 1000, 900), (2, 800, 500), (3, 700, 660)]) == 100.0  # 100, 300, 40
    # the oldest boxes fall out of the window
    old = [(i, 10_000 + i, 0) for i in range(10, 10 + RECENT_BOXES)]  # ready at once... long ago
    recent = [(i, 500 - i, 500 - i - 120) for i in range(1, 1 + RECENT_BOXES)]  # each 120s to ready
    assert _ready(old + recent) == 120.0
    # a gone box whose bill is still open counts, from its bill's start
    assert _ready([(1, 1000, 900)], gone=[(5, 2000, 1700), (6, 2000, 1700)]) == 300.0


def test_fleet_yaml_shows_each_held_boxs_reachable_and_ready_times() -> None:
    from reconciler.core.actions import Plan
    from reconciler.observed.documents import ReconcilerStatus, render_observed

    desired = build_desired({})
    memory = [{"instance_id": 1, "reachable_ago": 300, "ready_ago": 240, "pool": "default"}, {"instance_id": 2}]
    observed = build_observed({"instances": [{"id": 1}, {"id": 2}], "memory": memory}, T, desired)
    files = render_observed(desired=desired, observed=observed, plan=Plan(actions=()), status=ReconcilerStatus(), now=T)
    doc = yaml.safe_load(files[FLEET])
    jsonschema.Draft202012Validator(json.loads((SCHEMAS / "observed-fleet.schema.json").read_text())).validate(doc)
    by_id = {b["id"]: b for b in doc["boxes"]}
    assert (by_id[1]["reachable_at"], by_id[1]["ready_at"]) == ("1970-01-12T13:41:40Z", "1970-01-12T13:42:40Z")
    assert "ready_at" not in by_id[2]  # not known: not written
    assert {m["instance_id"]: m.get("ready_at") for m in doc["memory"]} == {1: "1970-01-12T13:42:40Z", 2: None}
