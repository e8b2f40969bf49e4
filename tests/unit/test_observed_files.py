"""observed/*.yaml: deterministic rendering, schema validity, reading memory back, commit messages."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from reconciler.core.actions import Destroy, Plan, ReasonCode
from reconciler.core.model import (
    AttemptOutcome,
    AttemptRecord,
    BoxMemory,
    BoxProbe,
    BoxSpend,
    Desired,
    Drift,
    DriftClass,
    FleetMemory,
    GhostOffer,
    GpuState,
    HostLedger,
    HostRecord,
    InFlight,
    Instance,
    InstanceStatus,
    Observed,
    OverheadRecord,
    RunDirState,
    Spend,
)
from reconciler.desired import load_desired_from_dir
from reconciler.errors import ObservedInvalid
from reconciler.observed.codec import BUDGET, DRIFT, FLEET, HOSTS, RUNS, STATUS, THROUGHPUT
from reconciler.observed.documents import ReconcilerStatus, render_observed
from reconciler.observed.memory import fleet_memory_from_files, read_fleet_memory
from reconciler.observed.summary import describe_change

ROOT = Path(__file__).parents[2]
SCHEMAS = {
    FLEET: "observed-fleet",
    RUNS: "observed-runs",
    DRIFT: "observed-drift",
    BUDGET: "observed-budget",
    STATUS: "observed-status",
    HOSTS: "observed-hosts",
    THROUGHPUT: "observed-throughput",
}
T0 = dt.datetime(2026, 11, 3, 12, 0, tzinfo=dt.UTC).timestamp()


@pytest.fixture(scope="module")
def desired() -> Desired:
    return replace(load_desired_from_dir(ROOT), commit="d" * 40)


def world(desired: Desired, *, extra_box: bool = False, spend: Spend | None = None) -> Observed:
    runs = [r for r in desired.runs if r.promotion_threshold is None]
    inst = [
        Instance(
            id=11,
            label="rigsync:demo:a1",
            status=InstanceStatus.RUNNING,
            gpu_name="RTX 3060",
            num_gpus=1,
            gpu_ram_mib=12288,
            dph_total=0.1,
            start_date=T0 - 7200.4,
        ),
        Instance(
            id=99,
            label="my-notebook",
            status=InstanceStatus.RUNNING,
            gpu_name="RTX 4090",
            num_gpus=1,
            gpu_ram_mib=24564,
            dph_total=0.4,
            start_date=T0 - 100,
        ),
    ]
    boxes = [BoxSpend(11, usd=0.2, at=T0, dph=0.1, started_at=T0 - 7200.4, gpu_name="RTX 3060", num_gpus=1)]
    if extra_box:
        inst.append(replace(inst[0], id=12, label="rigsync:demo:a2", dph_total=0.12))
        boxes.append(replace(boxes[0], instance_id=12, usd=0.001, dph=0.12))
    probe = BoxProbe(
        instance_id=11,
        reachable=True,
        gpus=(GpuState(index=0, memory_used_mib=5000, memory_total_mib=12288, utilization_pct=97.3),),
        disk_free_gb=12.3,
        runs=(
            RunDirState(
                run_id=runs[1].id,
                attempt=1,
                gpu_mask=(0,),
                pid_alive=True,
                started_at=T0 - 60,
                heartbeat_age_s=2.0,
                exit_code=None,
                best_metric=0.5,
            ),
        ),
    )
    history = (
        AttemptRecord(
            run_id=runs[0].id,
            attempt=1,
            sweep=runs[0].sweep.name,
            phase=AttemptOutcome.SUCCEEDED,
            best_metric=410.0,
            instance_id=11,
            ended_at=T0 - 100,
        ),
        AttemptRecord(
            run_id=runs[2].id,
            attempt=1,
            sweep=runs[2].sweep.name,
            phase=AttemptOutcome.FAILED,
            instance_id=11,
            ended_at=T0 - 90,
        ),
        *(
            AttemptRecord(
                run_id=runs[3].id,
                attempt=a,
                sweep=runs[3].sweep.name,
                phase=AttemptOutcome.LOST,
                instance_id=11,
                ended_at=T0 - 80,
            )
            for a in (1, 2, 3)
        ),
    )
    memory = FleetMemory(
        boxes=(
            BoxMemory(11, first_seen_at=T0 - 7000.2),
            BoxMemory(5, first_seen_at=T0 - 9000, unreachable_since=T0 - 60),
        ),
        spend=spend or Spend(today_usd=1.25, total_usd=7.5, boxes=tuple(boxes)),
        in_flight=(
            InFlight(run_id=runs[1].id, attempt=1, instance_id=11, gpu_mask=(0,), launched_at=T0 - 61, sweep="tdmpc"),
        ),
        hosts=HostLedger(
            hosts=(
                HostRecord(10007, "RTX 3060", rents=2, hangs=1, attempts_succeeded=1, dlperf=14.5, first_seen=T0 - 9000,
                           last_seen=T0 - 100, offers=(501, 502)),
            ),
            ghosts=(GhostOffer(503, 10009, T0 - 30, "offer no longer available"),),
            rents_at=(T0 - 7200.0,),
            failures_in_a_row=1,
            last_failure_at=T0 - 30,
            boxes=((11, 10007),),
        ),
    )
    return Observed(
        instances=tuple(inst), probes=(probe,), history=history, memory=memory, credit_usd=42.0, fleet_name="demo"
    )


def remembering(observed: Observed, **changes: Any) -> Observed:
    """``observed`` with some of its memory's fields replaced."""
    return replace(observed, memory=replace(observed.memory, **changes))


def a_plan(desired: Desired) -> Plan:
    return Plan(
        actions=(Destroy(reason="remembered box gone", code=ReasonCode.BOX_VANISHED, instance_id=5),),
        fleet_dph_before=0.1,
        fleet_dph_after=0.1,
        desired_commit=desired.commit,
        drift=(
            Drift(DriftClass.FOREIGN, "instance/99", "no rigsync label", "none"),
            Drift(DriftClass.DESTROYED_BY_HAND, "instance/5", "no longer listed", "forget instance/5"),
        ),
    )


STATUS_OK = ReconcilerStatus(desired_commit_applied="d" * 40, last_valid_desired_commit="d" * 40, holder="h1")


def test_every_file_validates_against_its_schema(desired: Desired) -> None:
    files = render_observed(desired=desired, observed=world(desired), plan=a_plan(desired), status=STATUS_OK, now=T0)
    assert sorted(files) == sorted(SCHEMAS)
    for path, text in files.items():
        schema = json.loads((ROOT / "schemas" / f"{SCHEMAS[path]}.schema.json").read_text())
        jsonschema.Draft202012Validator(schema).validate(yaml.safe_load(text))
    no_desired = render_observed(
        desired=None,
        observed=world(desired),
        plan=Plan(actions=()),
        status=ReconcilerStatus(desired_errors=("x",)),
        now=T0,
    )
    for path, text in no_desired.items():
        schema = json.loads((ROOT / "schemas" / f"{SCHEMAS[path]}.schema.json").read_text())
        jsonschema.Draft202012Validator(schema).validate(yaml.safe_load(text))


def test_content_fleet_runs_drift(desired: Desired) -> None:
    obs = world(desired)
    files = render_observed(desired=desired, observed=obs, plan=a_plan(desired), status=STATUS_OK, now=T0)
    fleet = yaml.safe_load(files[FLEET])
    assert [b["id"] for b in fleet["boxes"]] == [11]
    assert [f["id"] for f in fleet["foreign"]] == [99]
    box = fleet["boxes"][0]
    runs = [r for r in desired.runs if r.promotion_threshold is None]
    assert box["gpus"] == [{"index": 0, "memory_total_mib": 12288, "busy": True, "run": f"{runs[1].id}.1"}]
    assert box["started_at"] == "2026-11-03T10:00:00Z" and fleet["dph"] == 0.1 and fleet["held"] == 1
    assert "utilization" not in files[FLEET] and "disk_free" not in files[FLEET]
    rdoc = yaml.safe_load(files[RUNS])["sweeps"]["tdmpc"]
    assert rdoc[runs[0].id]["phase"] == "succeeded" and rdoc[runs[0].id]["best_metric"] == 410.0
    assert rdoc[runs[1].id]["phase"] == "running" and rdoc[runs[1].id]["instance"] == 11
    # one attempt failed, retries left: "retrying" (runs.yaml said "failed", a word that meant four things)
    assert rdoc[runs[2].id]["phase"] == "retrying" and rdoc[runs[2].id]["attempts"] == 1
    assert rdoc[runs[3].id]["phase"] == "blocked"  # 3 attempts with retries: 2
    assert rdoc[runs[4].id] == {
        "phase": "pending",
        "attempts": 0,
        "instance": None,
        "best_metric": None,
        "seed": runs[4].seed,
        "params": dict(runs[4].params),
    }
    # The promotion seeds of the succeeded cell (best 410) are wanted up to threshold 380, not 500.
    promo = {r.id: r.promotion_threshold for r in desired.runs if r.cell == runs[0].cell and r.promotion_threshold}
    listed = {rid for rid in promo if rid in rdoc}
    assert {promo[r] for r in listed} == {380.0}
    counts = yaml.safe_load(files[RUNS])["counts"]["tdmpc"]
    assert counts["succeeded"] == 1 and counts["running"] == 1 and counts["blocked"] == 1
    assert counts["total"] == sum(v for k, v in counts.items() if k != "total")
    drift = yaml.safe_load(files[DRIFT])["drift"]
    assert [d["subject"] for d in drift] == ["instance/5", "instance/99"]  # sorted, not plan order


def test_unchanged_world_renders_byte_identical_files(desired: Desired) -> None:
    obs = world(desired)
    first = render_observed(desired=desired, observed=obs, plan=a_plan(desired), status=STATUS_OK, now=T0)
    # Ten minutes later; the GPU readings moved, the box billed along its rate (0.1 $/h), the credit went down at
    # the account's (0.5 $/h, the foreign box included), each read a few seconds off the line.
    later = T0 + 600
    probe = replace(obs.probes[0], gpus=(GpuState(0, 5100, 12288, 12.0),), disk_free_gb=11.0)
    billed = replace(obs.memory.spend.boxes[0], usd=0.2 + 0.1 / 6 + 0.1 * 3 / 3600, at=later)
    spend2 = Spend(today_usd=1.25 + 0.1 / 6 + 0.1 * 3 / 3600, total_usd=7.5 + 0.1 / 6 + 0.1 * 3 / 3600, boxes=(billed,))
    obs2 = replace(obs, probes=(probe,), credit_usd=42.0 - 0.5 / 6 + 0.004, memory=replace(obs.memory, spend=spend2))
    second = render_observed(
        desired=desired, observed=obs2, plan=a_plan(desired), status=STATUS_OK, now=later, previous=first
    )
    assert second == first
    budget = yaml.safe_load(first[BUDGET])["spend"]
    assert budget["source"] == "billed" and budget["credit_usd"] == 42.0 and budget["account_dph"] == 0.5
    assert budget["boxes"] == [
        {"instance_id": 11, "usd": 0.2, "rate": 0.1, "dph": 0.1, "estimated": False, "gone_at": None,
         "started_at": "2026-11-03T10:00:00Z", "machine_id": 0, "gpu_name": "RTX 3060", "num_gpus": 1}
    ]
    # A box read 15 s of its rate off its line is news: a new anchor, with the figures as read.
    drifted = replace(billed, usd=billed.usd + 0.1 * 15 / 3600)
    third = render_observed(
        desired=desired, observed=remembering(obs2, spend=replace(spend2, boxes=(drifted,))), plan=a_plan(desired),
        status=STATUS_OK, now=later, previous=first,
    )
    assert yaml.safe_load(third[BUDGET])["spend"]["as_of"] == "2026-11-03T12:10:00Z"
    # Without the previous files the stamps would move: that is what ``previous`` is for.
    assert render_observed(desired=desired, observed=obs2, plan=a_plan(desired), status=STATUS_OK, now=later) != first


def test_a_change_moves_last_change_at_and_a_new_rate_moves_the_spend_anchor(desired: Desired) -> None:
    first = render_observed(desired=desired, observed=world(desired), plan=a_plan(desired), status=STATUS_OK, now=T0)
    obs = world(desired, extra_box=True)
    obs = remembering(obs, spend=replace(obs.memory.spend, today_usd=1.26, total_usd=7.51))
    second = render_observed(
        desired=desired, observed=obs, plan=a_plan(desired), status=STATUS_OK, now=T0 + 60, previous=first
    )
    assert yaml.safe_load(second[STATUS])["last_change_at"] == "2026-11-03T12:01:00Z"
    spend = yaml.safe_load(second[BUDGET])["spend"]
    assert spend["as_of"] == "2026-11-03T12:01:00Z" and spend["fleet_dph"] == 0.22
    # Spend off the straight line (a box billed more than its listed rate) also re-anchors.
    off = world(desired)
    third = render_observed(
        desired=desired,
        observed=remembering(off, spend=replace(off.memory.spend, today_usd=3.0, total_usd=9.0)),
        plan=a_plan(desired),
        status=STATUS_OK,
        now=T0 + 60,
        previous=first,
    )
    assert yaml.safe_load(third[BUDGET])["spend"]["total_usd"] == 9.0
    # So does a box turning estimated (the provider could not say), a gone box, and a credit that became unknown.
    for changed in (
        remembering(off, spend=replace(off.memory.spend, boxes=(replace(off.memory.spend.boxes[0], estimated=True),))),
        remembering(off, spend=replace(off.memory.spend, boxes=(replace(off.memory.spend.boxes[0], gone_at=T0 + 30),))),
        replace(off, credit_usd=None),
    ):
        doc = yaml.safe_load(render_observed(
            desired=desired, observed=changed, plan=a_plan(desired), status=STATUS_OK, now=T0 + 60, previous=first
        )[BUDGET])["spend"]
        assert doc["as_of"] == "2026-11-03T12:01:00Z", changed
    first_box = off.memory.spend.boxes[0]
    estimated = remembering(off, spend=replace(off.memory.spend, boxes=(replace(first_box, estimated=True),)))
    doc = yaml.safe_load(render_observed(
        desired=desired, observed=estimated, plan=a_plan(desired), status=STATUS_OK, now=T0
    )[BUDGET])["spend"]
    assert doc["source"] == "estimated" and doc["boxes"][0]["estimated"] is True
    gone = remembering(off, spend=replace(off.memory.spend, boxes=(replace(first_box, gone_at=T0 - 5),)))
    doc = yaml.safe_load(render_observed(
        desired=desired, observed=gone, plan=a_plan(desired), status=STATUS_OK, now=T0
    )[BUDGET])["spend"]
    assert doc["boxes"][0]["rate"] == 0.0 and doc["fleet_dph"] == 0.0 and doc["boxes"][0]["gone_at"]


def test_status_reports_errors_and_a_changed_status_is_a_change(desired: Desired) -> None:
    first = render_observed(desired=desired, observed=world(desired), plan=a_plan(desired), status=STATUS_OK, now=T0)
    bad = replace(STATUS_OK, desired_errors=("desired/fleet.yaml:3:1: unknown key 'maxx'",))
    second = render_observed(
        desired=desired, observed=world(desired), plan=a_plan(desired), status=bad, now=T0 + 5, previous=first
    )
    doc = yaml.safe_load(second[STATUS])
    assert doc["desired_valid"] is False and doc["desired_errors"] == list(bad.desired_errors)
    assert doc["last_change_at"] == "2026-11-03T12:00:05Z"


def test_fleet_memory_round_trip_and_spend_extrapolation(desired: Desired, tmp_path: Path) -> None:
    obs = world(desired)
    files = render_observed(desired=desired, observed=obs, plan=a_plan(desired), status=STATUS_OK, now=T0)
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    memory = read_fleet_memory(tmp_path)
    assert memory.boxes == (
        BoxMemory(5, first_seen_at=T0 - 9000, unreachable_since=T0 - 60),
        BoxMemory(11, first_seen_at=T0 - 7000),  # whole seconds
    )
    assert memory.in_flight == tuple(replace(f, launched_at=T0 - 61) for f in obs.memory.in_flight)
    # Spend is the snapshot at as_of, with every box's bill then (whole seconds): the first cycle's billed read adds
    # what each box was billed since, whenever that is.
    assert memory.spend == replace(obs.memory.spend, boxes=(replace(obs.memory.spend.boxes[0], started_at=T0 - 7200),))
    assert memory.spend_at == T0
    assert memory.hosts == obs.memory.hosts  # the host ledger comes back whole (its derived fields are ignored)
    assert read_fleet_memory(tmp_path, now=T0 + 7200) == memory
    # No files at all: empty memory.
    assert read_fleet_memory(tmp_path / "empty") == FleetMemory()


def test_an_older_estimate_anchor_is_extrapolated_to_now() -> None:
    """A budget.yaml from before billed spend (no boxes): its line is extrapolated to now and counted from there."""
    old = {BUDGET: "spend:\n  as_of: '2026-11-03T12:00:00Z'\n  day: '2026-11-03'\n  fleet_dph: 0.1\n"
                   "  today_usd: 1.25\n  total_usd: 7.5\n"}
    later = fleet_memory_from_files(old, now=T0 + 7200)
    assert later.spend.total_usd == pytest.approx(7.7) and later.spend.today_usd == pytest.approx(1.45)
    assert later.spend_at == T0 + 7200
    next_day = T0 + 13 * 3600  # 01:00 UTC the next day: today restarted at midnight
    tomorrow = fleet_memory_from_files(old, now=next_day).spend
    assert tomorrow.total_usd == pytest.approx(7.5 + 1.3) and tomorrow.today_usd == pytest.approx(0.1)


def test_host_ledger_file_is_readable_and_rejects_malformed_entries(desired: Desired) -> None:
    files = render_observed(desired=desired, observed=world(desired), plan=a_plan(desired), status=STATUS_OK, now=T0)
    doc = yaml.safe_load(files[HOSTS])
    host = doc["hosts"][0]
    assert (host["machine_id"], host["faults"], host["penalty"], host["blacklisted"]) == (10007, 1, 0.5, False)
    assert doc["ghost_offers"][0]["failed_at"] == "2026-11-03T11:59:30Z"
    with pytest.raises(ObservedInvalid, match=r"hosts\.yaml: malformed host ledger"):
        fleet_memory_from_files({HOSTS: "hosts:\n- gpu_name: RTX 3060\n"})
    with pytest.raises(ObservedInvalid, match=r"hosts\.yaml: hosts\[0\]\.last_seen"):
        fleet_memory_from_files({HOSTS: "hosts:\n- machine_id: 1\n  last_seen: yesterday\n"})


def test_fleet_memory_rejects_malformed_files_with_location() -> None:
    with pytest.raises(ObservedInvalid, match=r"observed/fleet\.yaml:3:1: not valid YAML"):
        fleet_memory_from_files({FLEET: "memory:\n  - [unclosed\n"})
    with pytest.raises(ObservedInvalid, match=r"memory\[0\].*first_seen_at"):
        fleet_memory_from_files({FLEET: "memory:\n- instance_id: 1\n  first_seen_at: yesterday\n"})
    with pytest.raises(ObservedInvalid, match="in_flight"):
        fleet_memory_from_files({RUNS: "in_flight:\n- run_id: r\n"})


def test_describe_change_names_rents_destroys_launches_and_finishes(desired: Desired) -> None:
    first = render_observed(desired=desired, observed=world(desired), plan=a_plan(desired), status=STATUS_OK, now=T0)
    msg = describe_change({}, first)
    assert msg is not None and msg.startswith("rented 11 RTX 3060 $0.10/h: ") and "applied desired dddddddddd" in msg
    more = render_observed(
        desired=desired, observed=world(desired, extra_box=True), plan=a_plan(desired), status=STATUS_OK,
        now=T0 + 60, previous=first,
    )
    pending = yaml.safe_load(more[RUNS])["counts"]
    n = sum(c["pending"] + c["retrying"] for c in pending.values())
    assert describe_change(first, more) == f"rented 12 RTX 3060 $0.12/h: {n} runs pending"
    assert describe_change(more, first, destroyed={12: "idle for 10m (idle_timeout 10m)"}) == (
        "destroyed 12: idle for 10m (idle_timeout 10m)"
    )
    assert describe_change(more, first) == "12 gone from the provider's list"
    bad = world(desired)
    record = replace(bad.memory.hosts.hosts[0], boot_timeouts=2)  # 3 faults: the demo fleet's blacklist_after
    worse = render_observed(
        desired=desired, observed=remembering(bad, hosts=replace(bad.memory.hosts, hosts=(record,))),
        plan=a_plan(desired),
        status=STATUS_OK, now=T0, previous=first,
    )
    assert describe_change(first, worse) == "blacklisted machine 10007"
    run = desired.runs[4]
    done = AttemptRecord(run_id=run.id, attempt=1, sweep=run.sweep.name, phase=AttemptOutcome.SUCCEEDED, seed=2,
                         best_metric=612.04, instance_id=11)
    launched = remembering(world(desired), in_flight=(
        InFlight(run_id=run.id, attempt=2, instance_id=11, gpu_mask=(0,), launched_at=T0, sweep=run.sweep.name),
        InFlight(run_id=desired.runs[5].id, attempt=1, instance_id=12, gpu_mask=(0,), launched_at=T0,
                 sweep=run.sweep.name),
    ))
    after = render_observed(desired=desired, observed=launched, plan=a_plan(desired), status=STATUS_OK, now=T0 + 9,
                            previous=first)
    assert describe_change(first, after, archived=[done], metric_keys={run.sweep.name: "reward"}) == (
        f"{run.sweep.name}: 2 launched on 2 boxes, 1 succeeded (seed 2, reward 612)"
    )


def test_describe_change_ignores_probe_noise_plan_counts_and_the_clock(desired: Desired) -> None:
    """A GPU turning busy, a box booting, a reachability flip, the plan's counts and the clock make no commit."""
    first = render_observed(desired=desired, observed=world(desired), plan=a_plan(desired), status=STATUS_OK, now=T0)
    base = world(desired)
    noisy = replace(
        base,
        instances=tuple(replace(i, status=InstanceStatus.LOADING) if i.id == 11 else i for i in base.instances),
        probes=tuple(
            replace(p, gpus=tuple(replace(g, memory_used_mib=0, utilization_pct=0.0) for g in p.gpus))
            for p in base.probes
        ),
    )
    quiet_plan = replace(a_plan(desired), actions=())
    later = render_observed(desired=desired, observed=noisy, plan=quiet_plan, status=STATUS_OK, now=T0 + 3600,
                            previous=first)
    assert later != first  # the files did move (status, busy, last_plan, last_change_at)...
    assert describe_change(first, later) is None  # ...and none of it is a change worth a commit
    assert describe_change(first, later, archive_pending=True) == "archive lines of an earlier cycle"
    overhead = OverheadRecord(instance_id=11, billed_usd=0.25, attempts_usd=0.2, cost_usd=0.05)
    assert describe_change(first, later, overheads=[overhead]) == "closed 11's bill: $0.2500, $0.0500 outside runs"
