"""Renting against waiting and multi-GPU boxes (``plan.renting``): a run waits for a held GPU that frees before a
new box would be ready; each slot absorbs runs in turn; the pool's measured readiness is what it is compared with.

``Placement.slot_free_s`` (each busy slot's free time after this plan's queue) is placement's; here it is given
through a wrapper of ``place``, so renting's rule is tested on its own.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from plan_case_io import load_case

import reconciler.plan as planner
from reconciler.core.actions import Noop, Plan, ReasonCode, Rent
from reconciler.plan.wake import BOOT_POLL_S

CASES = Path(__file__).parent / "plan_cases"


def _plan_with_slots(
    monkeypatch: pytest.MonkeyPatch, case: dict[str, Any], slots: tuple[tuple[int, tuple[int, ...], float], ...],
    tmp_path: Path,
) -> tuple[Plan, float]:
    real = planner.place

    def place(*args: Any, **kw: Any) -> Any:
        placement, out = real(*args, **kw)
        return replace(placement, slot_free_s=slots), out

    monkeypatch.setattr(planner, "place", place)
    path = tmp_path / "case.json"
    path.write_text(json.dumps(case))
    c = load_case(path)
    return planner.plan(c.desired, c.observed, c.controller, c.now), c.now


def _case(name: str) -> dict[str, Any]:
    return dict(json.loads((CASES / f"{name}.json").read_text()))


def _codes(p: Plan, code: ReasonCode) -> list[Noop]:
    return [n for n in p.noops if n.code is code]


def test_a_run_waits_for_a_slot_freeing_before_a_new_box_and_the_next_is_rented_for(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    case = _case("wait_for_busy_gpu")
    got, now = _plan_with_slots(monkeypatch, case, ((1, (0,), 100.0),), tmp_path)
    exp = case["expected"]
    assert [(a.kind.value, a.target, a.code.value, a.reason) for a in got.actions] == [
        (w["kind"], w["target"], w["code"], w["reason"]) for w in exp["actions"]
    ]
    for w in exp["noops_contain"]:
        assert any(n.target == w["target"] and n.code.value == w["code"] and n.reason == w["reason"] for n in got.noops)
    # the box rented now is looked at within BOOT_POLL_S (sooner than the slot that frees in 100 s)
    assert got.wake_at == now + BOOT_POLL_S


def test_each_slot_absorbs_runs_in_turn_the_soonest_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    case = _case("wait_for_busy_gpu")
    case["desired"]["fleet"]["max_instances"] = 5
    case["desired"]["runs"] += [{"id": f"r{i}", "expected_runtime_s": 600} for i in (4, 5)]
    case["observed"]["instances"] = [{"id": 1, "num_gpus": 2}]
    case["observed"]["probes"][0]["runs"].append({"run_id": "r4", "gpu_mask": [1], "started_ago": 450})
    case["observed"]["in_flight"].append({"run_id": "r4", "instance_id": 1, "gpu_mask": [1], "launched_ago": 450})
    # r2 -> GPU 0 (free in 100s, then 700s), r3 -> GPU 1 (free in 150s, then 750s); r5: every slot past 300s
    got, _ = _plan_with_slots(monkeypatch, case, ((1, (0,), 100.0), (1, (1,), 150.0)), tmp_path)
    waits = _codes(got, ReasonCode.WAIT_FOR_BUSY_GPU)
    assert [n.reason.split(":")[0] for n in waits] == [
        "1 pending run(s) (run/r2) wait for GPU 0", "1 pending run(s) (run/r3) wait for GPU 1"
    ]
    rents = [a for a in got.actions if isinstance(a, Rent)]
    assert [a.reason.split(" needs")[0] for a in rents] == ["pending run r5"]


def test_a_pool_measured_ready_sooner_than_the_slot_frees_rents(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    case = _case("wait_for_busy_gpu")
    # box 1 was ready 60s after its rent: a new box is predicted ready in 60s, before the slot frees in 100s
    case["observed"]["instances"] = [{"id": 1, "start_ago": 2000}]
    case["observed"]["memory"] = [{"instance_id": 1, "ready_ago": 1940, "reachable_ago": 1950, "pool": "default"}]
    case["observed"]["offers"].append({"id": 102, "dph_total": 0.3, "dlperf": 20})
    got, _ = _plan_with_slots(monkeypatch, case, ((1, (0,), 100.0),), tmp_path)
    assert not _codes(got, ReasonCode.WAIT_FOR_BUSY_GPU)
    rented = [a.reason.split(" needs")[0] for a in got.actions if isinstance(a, Rent)]
    assert rented == ["pending run r2", "pending run r3"]
    # measured slow (15m): both runs wait for the slot (free in 100s, then 700s, both before 900s)
    case["observed"]["memory"] = [{"instance_id": 1, "ready_ago": 1100, "pool": "default"}]
    got, _ = _plan_with_slots(monkeypatch, case, ((1, (0,), 100.0),), tmp_path)
    assert [n.reason.split(":")[0] for n in _codes(got, ReasonCode.WAIT_FOR_BUSY_GPU)] == [
        "2 pending run(s) (run/r2, run/r3) wait for GPU 0"
    ]
    assert not [a for a in got.actions if isinstance(a, Rent)]


def test_a_slot_too_small_for_the_run_is_not_waited_for(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    case = _case("wait_for_busy_gpu")
    for r in case["desired"]["runs"][1:]:
        r["gpus"] = 2
    case["observed"]["offers"] = [{"id": 101, "num_gpus": 2, "dph_total": 0.4, "dlperf": 40}]
    got, _ = _plan_with_slots(monkeypatch, case, ((1, (0,), 100.0),), tmp_path)
    assert not _codes(got, ReasonCode.WAIT_FOR_BUSY_GPU)
    assert [a.target for a in got.actions if isinstance(a, Rent)] == ["offer/101"]


def test_min_instances_still_holds_while_runs_wait(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    case = _case("wait_for_busy_gpu")
    case["desired"]["runs"] = case["desired"]["runs"][:2]
    case["desired"]["fleet"]["min_instances"] = 2
    case["observed"]["offers"].append({"id": 102, "dph_total": 0.3, "dlperf": 20})
    got, _ = _plan_with_slots(monkeypatch, case, ((1, (0,), 100.0),), tmp_path)
    assert _codes(got, ReasonCode.WAIT_FOR_BUSY_GPU)
    assert [(a.code, a.target) for a in got.actions if isinstance(a, Rent)] == [
        (ReasonCode.RENT_FOR_MIN_INSTANCES, "offer/101")
    ]


def test_a_multi_gpu_box_dearer_per_run_is_not_preferred(tmp_path: Path) -> None:
    # $1.00/h for four GPUs is $0.25/h a run's slot, more than the best 1-GPU box's $0.20/h
    case = _case("rent_multi_gpu")
    case["observed"]["offers"][1]["dph_total"] = 1.0
    for i, per in ((103, 150), (104, 140), (105, 130)):
        case["observed"]["offers"].append({"id": i, "dph_total": 0.2, "dlperf": 20, "dlperf_per_dph": per})
    case["desired"]["fleet"]["max_instances"] = 4
    path = tmp_path / "case.json"
    path.write_text(json.dumps(case))
    c = load_case(path)
    got = planner.plan(c.desired, c.observed, c.controller, c.now)
    assert [(a.code, a.target) for a in got.actions if isinstance(a, Rent)] == [
        (ReasonCode.RENT_FOR_PENDING, f"offer/{i}") for i in (101, 103, 104, 105)
    ]
