"""`rigsync status`'s share of issue 21: a box's queued attempts in its row, and the ops tax of the checkout's archive
plus the boxes held now (``status_cmd.live_ops_tax``), on a hand-made world and archive."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from reconciler.cli.status_cmd import live_ops_tax
from reconciler.core.model import (
    AttemptOutcome,
    AttemptRecord,
    BoxMemory,
    BoxProbe,
    FleetMemory,
    InFlight,
    Instance,
    InstanceStatus,
    Observed,
    OverheadRecord,
    QueuedEntry,
    RunDirState,
)
from reconciler.desired import load_desired_from_dir
from reconciler.observed.archive_lines import entry_to_json
from reconciler.plan.render import status_json, status_text
from reconciler.views.opstax import tax_lines

REPO = Path(__file__).resolve().parents[2]
T0 = 1_790_000_000.0
DPH = 3.6


def world(reachable: bool = True) -> Observed:
    box = Instance(id=11, label="rigsync:lab:a1", status=InstanceStatus.RUNNING, gpu_name="RTX 3060", num_gpus=2,
                   gpu_ram_mib=12288, dph_total=DPH, start_date=T0)
    live = RunDirState(run_id="r-1", attempt=1, gpu_mask=(0,), pid_alive=True, started_at=T0 + 100,
                       heartbeat_age_s=1.0, exit_code=None)
    probe = BoxProbe(instance_id=11, reachable=True, runs=(live,),
                     queued=(QueuedEntry("r-2", 1, (0,), position=0), QueuedEntry("r-3", 2, (1,), position=0)))
    memory = FleetMemory(
        boxes=(BoxMemory(11, first_seen_at=T0 + 5, reachable_at=T0 + 40, ready_at=T0 + 60),),
        in_flight=(InFlight("r-1", 1, 11, (0,), T0 + 100), InFlight("r-2", 1, 11, (0,), T0 + 150, queued=True)),
    )
    return Observed(instances=(box,), probes=(probe if reachable else BoxProbe(11, False, error="timed out"),),
                    memory=memory)


def test_a_box_row_shows_its_queue_as_the_box_says_it_or_as_launched_when_it_does_not_answer() -> None:
    desired = load_desired_from_dir(REPO)
    desired = replace(desired, fleet=replace(desired.fleet, name="lab"))
    doc = status_json(desired, world())
    assert doc["boxes"][0]["runs"] == ["r-1.1"] and doc["boxes"][0]["queued"] == ["r-2.1", "r-3.2"]
    assert "r-1.1; queued r-2.1, r-3.2" in status_text(doc)
    away = status_json(desired, world(reachable=False))
    assert away["boxes"][0]["queued"] == ["r-2.1"]  # runs.yaml's in flight, marked queued
    assert "queued" in doc["runs"]  # runphase's counts name every phase


def test_the_live_ops_tax_is_the_archive_plus_the_held_boxes_to_now(tmp_path: Path) -> None:
    ended = [
        AttemptRecord(run_id="r-0", attempt=1, sweep="s", phase=AttemptOutcome.SUCCEEDED, instance_id=5, dph=DPH,
                      started_at=T0 - 900, ended_at=T0 - 700, cost_usd=0.2),
        AttemptRecord(run_id="r-0", attempt=2, sweep="s", phase=AttemptOutcome.LOST, instance_id=5, dph=DPH,
                      started_at=T0 - 700, ended_at=T0 - 600, cost_usd=0.1),
    ]
    overhead = OverheadRecord(instance_id=5, billed_usd=0.5, attempts_usd=0.3, cost_usd=0.2, dph=DPH, num_gpus=1,
                              started_at=T0 - 1000, ended_at=T0 - 500)
    shard = tmp_path / "observed" / "runs" / "2026-09.jsonl"
    shard.parent.mkdir(parents=True)
    shard.write_text("".join(entry_to_json(r) + "\n" for r in [*ended, overhead]))
    observed = replace(world(), history=tuple(ended))
    tax = live_ops_tax(tmp_path, observed, T0 + 300)
    # box 5: $0.5 billed, boot to its first attempt ($0.1), lost $0.1, idle $0.1; box 11: 300 s at $3.6/h = $0.3,
    # of which r-1.1 ran 200 s on one of its two GPUs ($0.1), boot 40 s, bootstrap 20 s
    assert math.isclose(tax.billed_usd, 0.8) and math.isclose(tax.running_usd, 0.1)
    assert math.isclose(tax.boot_usd, 0.14) and math.isclose(tax.bootstrap_usd, 0.02)
    assert math.isclose(tax.lost_usd, 0.1) and math.isclose(tax.idle_usd, 0.1 + 0.14)
    assert math.isclose(tax.useful_usd, 0.2) and tax.boxes == 2 and tax.held == 1
    head, _ = tax_lines(tax)
    assert head.startswith("ops tax: $0.5000 of $0.8000 billed (62.5%)") and "still running $0.1000" in head
