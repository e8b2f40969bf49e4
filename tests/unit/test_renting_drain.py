"""The tail (``plan.boxes.retire_idle``): drain a box whose queue is its last work, destroy a drained one in the
plan that records its last attempts, keep a box with attempts queued on it, and hold min_instances throughout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from plan_case_io import load_case

from reconciler.core.actions import Destroy, Outcome, Plan, ReasonCode, Record, unmet_need, with_needs
from reconciler.plan import plan

CASES = Path(__file__).parent / "plan_cases"


def _plan(case: dict[str, Any], tmp_path: Path) -> Plan:
    path = tmp_path / "case.json"
    path.write_text(json.dumps(case))
    c = load_case(path)
    return plan(c.desired, c.observed, c.controller, c.now)


def _case(name: str) -> dict[str, Any]:
    return dict(json.loads((CASES / f"{name}.json").read_text()))


def _acts(p: Plan) -> list[tuple[str, str, str]]:
    return [(a.kind.value, a.target, a.code.value) for a in p.actions]


def test_no_drain_below_the_floor_nor_while_runs_wait_nor_for_work_ending_after_the_next_decision(
    tmp_path: Path,
) -> None:
    case = _case("drain_tail")
    case["desired"]["fleet"]["min_instances"] = 2
    assert _acts(_plan(case, tmp_path)) == []  # both boxes hold the floor
    case = _case("drain_tail")
    case["desired"]["runs"].append({"id": "r3"})
    case["desired"]["fleet"]["max_instances"] = 2
    assert not [a for a in _plan(case, tmp_path).actions if a.code is ReasonCode.DRAIN_TAIL]  # r3 waits for a GPU
    case = _case("drain_tail")
    case["controller"] = {"cycle_s": 20.0}  # r1 ends in 30s: after the next decision, which drains it then
    assert _acts(_plan(case, tmp_path)) == []


def test_a_box_already_draining_is_not_told_again_and_its_queue_counts_as_its_work(tmp_path: Path) -> None:
    case = _case("drain_tail")
    case["observed"]["probes"][0]["draining"] = True
    assert _acts(_plan(case, tmp_path)) == []
    case = _case("drain_tail")  # r2 queued behind r1: 30s + 600s of work left, past the next decision
    case["observed"]["probes"][0]["queued"] = [{"run_id": "r2", "gpu_mask": [0]}]
    case["observed"]["probes"][1]["runs"] = []
    case["observed"]["in_flight"][1] = {"run_id": "r2", "instance_id": 1, "launched_ago": 10, "queued": True}
    assert ("drain", "instance/1", "drain_tail") not in _acts(_plan(case, tmp_path))


def test_a_drained_box_goes_even_at_the_floor_while_an_idle_one_holds_it(tmp_path: Path) -> None:
    case = _case("drained")
    case["desired"]["fleet"]["min_instances"] = 1
    case["observed"]["instances"].append({"id": 2})
    got = _plan(case, tmp_path)
    assert ("destroy", "instance/1", "drained") in _acts(got)
    assert any(n.target == "instance/2" and n.code is ReasonCode.MIN_INSTANCES_KEPT for n in got.noops)


def test_a_drained_box_with_a_live_attempt_or_a_launch_is_not_destroyed(tmp_path: Path) -> None:
    case = _case("drained")
    case["observed"]["probes"][0]["runs"][0] = {"run_id": "r1", "started_ago": 60}
    assert not [a for a in _plan(case, tmp_path).actions if isinstance(a, Destroy)]


def test_apply_keeps_a_drained_box_whose_record_failed() -> None:
    rec = Record(reason="exited", code=ReasonCode.EXITED, run_id="r1", attempt=1, instance_id=1, phase="succeeded")
    drained = Destroy(reason="drained", code=ReasonCode.DRAINED, instance_id=1, dph=0.2)
    surplus = Destroy(reason="surplus", code=ReasonCode.SURPLUS, instance_id=1, dph=0.2)
    rec, drained = with_needs([rec, drained])
    (surplus,) = with_needs([surplus])
    failed = {rec.key: Outcome(rec, False, "HarvestFailed: no answer")}
    assert unmet_need(drained, failed) == "run/r1.1 was not harvested"
    assert with_needs([rec, surplus])[1].needs == ()  # the other destroys keep their own harvest rule
    assert unmet_need(drained, {rec.key: Outcome(rec, True, "archived")}) is None
