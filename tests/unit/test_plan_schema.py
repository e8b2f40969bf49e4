"""The plan JSON contract: every plan the planner makes validates against ``schemas/plan.schema.json``.

Plans come from every case in ``plan_cases/`` (the planner's behaviour as data), so a new action field or kind
that the schema does not describe fails here. A plan is also a value: it must read back from its JSON equal,
and a saved plan read back must hold in the world it was made from and be refused once its premises are gone
(``saved_plan.stale_reasons``).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from reconciler.core.actions import ACTION_TYPES, Kind, Launch, Noop, Plan, ReasonCode, Record
from reconciler.core.model import (
    AttemptOutcome,
    AttemptRecord,
    Budget,
    Controller,
    Desired,
    Drift,
    DriftClass,
    InFlight,
    Observed,
)
from reconciler.desired import schema_path
from reconciler.plan import plan
from reconciler.plan.saved import SavedPlan, stale_reasons

try:
    from .plan_case_io import build_instance, load_case
except ImportError:  # tests/unit is not a package: pytest put this directory on sys.path
    from plan_case_io import build_instance, load_case  # type: ignore[no-redef]

CASE_FILES = sorted((Path(__file__).parent / "plan_cases").glob("*.json"))
SCHEMA: dict[str, Any] = json.loads(schema_path("plan").read_text())
VALIDATOR = Draft202012Validator(SCHEMA)


def _errors(doc: object) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(doc)]


def _as_json(p: Plan) -> dict[str, Any]:
    """What `rigsync plan --json` prints, read back (tuples become lists, as in the file)."""
    doc: dict[str, Any] = json.loads(json.dumps(p.to_json()))
    return doc


def test_schema_is_valid_draft_2020_12_with_conventions() -> None:
    Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert SCHEMA["$id"]

    def walk(node: object, where: str) -> None:
        if isinstance(node, dict):
            for name, sub in (node.get("properties") or {}).items():
                assert isinstance(sub, dict) and sub.get("description"), f"{where}/properties/{name}: no description"
            if node.get("type") == "object":
                assert node.get("additionalProperties") is False, f"{where} allows additional properties"
            for key, sub in node.items():
                walk(sub, f"{where}/{key}")
        elif isinstance(node, list):
            for i, sub in enumerate(node):
                walk(sub, f"{where}/{i}")

    walk(SCHEMA, "#")


def test_schema_describes_every_action_kind() -> None:
    refs = [r["$ref"] for r in SCHEMA["properties"]["actions"]["items"]["oneOf"]]
    assert sorted(refs) == sorted(f"#/$defs/{k.value}" for k in Kind if k is not Kind.NOOP)
    for kind, cls in ACTION_TYPES.items():
        props = set(SCHEMA["$defs"][kind.value]["properties"])
        fields = set(cls.__dataclass_fields__) - {"kind"}
        assert props == fields | {"kind", "target"}, kind


@pytest.mark.parametrize("path", CASE_FILES, ids=[p.stem for p in CASE_FILES])
def test_plan_of_case_validates_and_round_trips(path: Path) -> None:
    case = load_case(path)
    p = plan(case.desired, case.observed, case.controller, case.now)
    doc = _as_json(p)
    assert _errors(doc) == []
    assert doc["format_version"] == 2
    assert sum(doc["counts"].values()) == len(doc["actions"])
    assert Plan.from_json(doc) == p
    assert Plan.from_json(p.to_json()) == p
    # saved with the controller that made it (``rigsync plan --out``): it validates, and reads back whole
    saved = json.loads(json.dumps(SavedPlan(p, case.controller).to_json()))
    assert _errors(saved) == []
    assert SavedPlan.from_json(saved) == SavedPlan(p, case.controller)


def test_cases_cover_every_action_kind() -> None:
    seen: set[str] = set()
    for path in CASE_FILES:
        case = load_case(path)
        seen |= {a.kind.value for a in plan(case.desired, case.observed, case.controller, case.now).actions}
    assert seen == {k.value for k in Kind if k is not Kind.NOOP}


def _hand_plan() -> Plan:
    return Plan(
        actions=(
            Record(
                reason="exit code 0", code=ReasonCode.EXITED, run_id="r1", attempt=1, instance_id=5,
                phase="succeeded", exit_code=0,
            ),
            Launch(
                reason="pending", code=ReasonCode.PENDING_RUN, instance_id=5, run_id="r2", attempt=1,
                gpu_mask=(0,), command="python t.py", code_commit=None, sweep="s",
            ),
        ),
        noops=(Noop(reason="busy", subject="instance/5", code=ReasonCode.BUSY),),
        fleet_dph_before=0.1,
        fleet_dph_after=0.1,
        desired_commit="abc",
        warnings=("w",),
        drift=(Drift(DriftClass.FOREIGN, "instance/9", "label 'x'", "none"),),
    )


def test_hand_built_plan_with_nulls_validates() -> None:
    p = _hand_plan()
    doc = _as_json(p)
    assert _errors(doc) == []
    assert Plan.from_json(doc) == p


@pytest.mark.parametrize(
    ("mutate", "where"),
    [
        (lambda d: d.update(format_version=1), "format_version"),
        (lambda d: d["actions"][0].pop("code"), "actions/0"),
        (lambda d: d["actions"][0].update(code="because"), "actions/0"),
        (lambda d: d.update(extra=1), ""),
        (lambda d: d["actions"][0].update(kind="stop"), "actions/0"),
        (lambda d: d["actions"][1].pop("gpu_mask"), "actions/1"),
        (lambda d: d["actions"][1].update(attempt=0), "actions/1"),
        (lambda d: d["actions"][0].update(unknown="x"), "actions/0"),
        (lambda d: d["drift"][0].update({"class": "weird"}), "drift/0/class"),
        (lambda d: d["counts"].update(stop=1), "counts"),
        (lambda d: d["noops"][0].pop("reason"), "noops/0"),
    ],
)
def test_schema_rejects_what_plans_never_hold(mutate: Any, where: str) -> None:
    doc = _as_json(_hand_plan())
    mutate(doc)
    errors = _errors(doc)
    assert errors, "the schema accepted a malformed plan"
    assert any(e.startswith(where) for e in errors), errors


# ----------------------------------------------------------------------------- saved plans: still valid?


def _case_plan(name: str) -> tuple[Any, Plan]:
    case = load_case(Path(__file__).parent / "plan_cases" / f"{name}.json")
    return case, plan(case.desired, case.observed, case.controller, case.now)


def _stale(p: Plan, desired: Desired, observed: Observed) -> list[str]:
    """Why ``p``, saved by a controller, no longer holds when the same controller applies it."""
    controller = Controller()
    return stale_reasons(SavedPlan(p, controller), desired, observed, controller)


@pytest.mark.parametrize("path", CASE_FILES, ids=[p.stem for p in CASE_FILES])
def test_fresh_plan_holds_in_the_world_it_was_made_from(path: Path) -> None:
    case = load_case(path)
    p = plan(case.desired, case.observed, case.controller, case.now)
    saved = SavedPlan.from_json(json.loads(json.dumps(SavedPlan(p, case.controller).to_json())))
    assert stale_reasons(saved, case.desired, case.observed, case.controller) == []


def test_saved_plan_refused_when_the_applying_controller_lacks_what_it_was_made_with() -> None:
    case, p = _case_plan("secret_present")
    made_by = replace(case.controller, harvesting=True)
    saved = SavedPlan(p, made_by)
    assert stale_reasons(saved, case.desired, case.observed, made_by) == []
    applying = Controller(cycle_s=5.0, allowed_secrets=frozenset({"WANDB_API_KEY"}))
    assert stale_reasons(saved, case.desired, case.observed, applying) == [
        "the plan was made with HF_TOKEN allowed to sweeps, and this controller does not allow it",
        "the plan was made with WANDB_API_KEY set on the controller, and it is not set now",
        "the plan was made with a result store and this apply has none",
    ]
    # a store or a secret the plan was made without is no reason; nor is another cycle length, nor a plan saved
    # before plans carried their controller
    richer = replace(made_by, cycle_s=999.0, env_names=made_by.env_names | {"HF_TOKEN"})
    assert stale_reasons(SavedPlan(p, case.controller), case.desired, case.observed, richer) == []
    assert stale_reasons(SavedPlan(p), case.desired, case.observed, applying) == []


def test_saved_rent_refused_when_offer_gone_or_dearer() -> None:
    case, p = _case_plan("fresh_rent")
    offers = tuple(o for o in case.observed.offers if o.id != 101)
    assert _stale(p, case.desired, replace(case.observed, offers=offers)) == [
        "offer 101 is no longer on the market"
    ]
    dearer = tuple(replace(o, dph_total=0.25) if o.id == 102 else o for o in case.observed.offers)
    assert _stale(p, case.desired, replace(case.observed, offers=dearer)) == [
        "offer 102 now costs $0.2500/h, the plan said $0.1000/h"
    ]


def test_saved_rent_refused_when_the_fleet_grew_since() -> None:
    """Another apply rented meanwhile: the caps the plan was checked against no longer hold."""
    case, p = _case_plan("fresh_rent")
    box = build_instance({"id": 500, "dph_total": 0.3}, case.now, case.desired.fleet)
    grown = replace(case.observed, instances=(box,))
    assert _stale(p, case.desired, grown) == [
        "the fleet now costs $0.3000/h, the plan was made when it cost $0.0000/h"
    ]
    foreign = replace(box, label="someone-else")  # foreign boxes are not the fleet's money
    assert _stale(p, case.desired, replace(case.observed, instances=(foreign,))) == []


def test_saved_launch_refused_when_the_run_moved_on() -> None:
    # the daily-drain world without its (spent) cap, one box at most: a run on GPU 0 of a 2-GPU box, r2 launched
    # beside it, nothing rented
    case = load_case(Path(__file__).parent / "plan_cases" / "cap_daily_drain.json")
    one_box = replace(case.desired.fleet, max_instances=1, queue_ahead_s=0)  # the launch alone, nothing queued
    case = replace(case, desired=replace(case.desired, budget=Budget(), fleet=one_box))
    p = plan(case.desired, case.observed, case.controller, case.now)
    (launch,) = [a for a in p.actions if isinstance(a, Launch)]
    assert (launch.run_id, launch.gpu_mask) == ("r2", (1,))
    obs = case.observed
    done = replace(obs, history=(AttemptRecord(run_id="r2", attempt=1, sweep="s", phase=AttemptOutcome.SUCCEEDED),))
    assert _stale(p, case.desired, done) == ["run r2 has succeeded since the plan was made"]
    ran = replace(obs, history=(AttemptRecord(run_id="r2", attempt=1, sweep="s", phase=AttemptOutcome.FAILED),))
    assert _stale(p, case.desired, ran) == ["attempt r2.1 has already run"]
    flight = InFlight(run_id="r2", attempt=1, instance_id=1, gpu_mask=(1,), launched_at=0)
    flying = replace(obs, memory=replace(obs.memory, in_flight=(flight,)))
    assert _stale(p, case.desired, flying) == ["run r2 is already running (attempt r2.1)"]
    probe = obs.probes[0]
    hot = replace(probe, gpus=tuple(replace(g, memory_used_mib=4000) for g in probe.gpus))
    assert _stale(p, case.desired, replace(obs, probes=(hot,))) == ["GPU 1 of instance 1 is in use now"]
    dark = replace(probe, reachable=False, gpus=())
    assert _stale(p, case.desired, replace(obs, probes=(dark,))) == [
        "instance 1 is not running and reachable"
    ]
    gone = replace(obs, instances=(), probes=())
    assert _stale(p, case.desired, gone) == ["instance 1 is gone"]
    moved = replace(case.desired, commit="f" * 40)
    assert _stale(replace(p, desired_commit="e" * 40), moved, obs) == [
        "desired state moved from eeeeeeeeeeee to ffffffffffff since the plan was made"
    ]


def test_schema_lists_exactly_the_reason_codes() -> None:
    schema = json.loads(schema_path("plan").read_text(encoding="utf-8"))
    assert schema["$defs"]["reason_code"]["enum"] == [c.value for c in ReasonCode]
