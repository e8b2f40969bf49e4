"""Plan behaviour as data: each ``plan_cases/*.json`` states a world and the exact plan expected for it.

The FULL action list is compared (kind, target, reason code, reason), so an extra or missing action fails the
case; no-ops and drift are checked for the entries a case lists. Every expected action and no-op names its
reason ``code`` (the stable meaning); reason texts are compared exactly unless the case gives ``reason_contains``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reconciler.core.actions import Plan, ReasonCode, apply_key
from reconciler.plan import plan

try:
    from .plan_case_io import Case, load_case
except ImportError:  # tests/unit is not a package: pytest put this directory on sys.path
    from plan_case_io import Case, load_case  # type: ignore[no-redef]

CASES_DIR = Path(__file__).parent / "plan_cases"
CASE_FILES = sorted(CASES_DIR.glob("*.json"))

ACTION_FIELDS = (
    "offer_id",
    "label",
    "gpu_mask",
    "attempt",
    "run_id",
    "instance_id",
    "phase",
    "commit",
    "dph",
    "script_hash",
    "command",
    "code_commit",
    "exit_code",
    "num_gpus",
    "image",
    "disk_gb",
    "sweep",
    "bid_dph",
    "path",
    "skip_harvest",
    "pid",
    "pid_started",
    "queued",
    "pending_id",
    "accept",
    "new_dph",
)


def _describe(p: Plan) -> str:
    lines = [f"{a.kind.value:9} {a.target:32} [{a.code.value}] {a.reason}" for a in p.actions]
    lines += [f"{'noop':9} {n.target:32} [{n.code.value}] {n.reason}" for n in p.noops]
    lines += [f"drift     {d.cls.value}:{d.subject} -> {d.action} ({d.detail})" for d in p.drift]
    return "\n".join(lines)


def _match_reason(exp: dict[str, Any], reason: str) -> bool:
    if "reason" in exp:
        return bool(exp["reason"] == reason)
    if "reason_contains" in exp:
        return bool(exp["reason_contains"] in reason)
    return True


def test_cases_exist() -> None:
    assert len(CASE_FILES) >= 25


@pytest.mark.parametrize("path", CASE_FILES, ids=[p.stem for p in CASE_FILES])
def test_plan_case(path: Path) -> None:
    case: Case = load_case(path)
    got = plan(case.desired, case.observed, case.controller, case.now)
    exp = case.expected
    shown = f"\n--- plan for {case.name}: {case.description}\n{_describe(got)}"

    actions = got.actions
    want = exp["actions"]
    assert [(a.kind.value, a.target) for a in actions] == [(w["kind"], w["target"]) for w in want], shown
    for a, w in zip(actions, want, strict=True):
        assert a.code.value == w["code"], f"code of {a.kind.value} {a.target}: {a.code.value!r} vs {w}{shown}"
        assert _match_reason(w, a.reason), f"reason of {a.kind.value} {a.target}: {a.reason!r} vs {w}{shown}"
        got_json = a.to_json()
        for key in ACTION_FIELDS:
            if key in w:
                value = got_json[key]
                want_value = w[key]
                if isinstance(value, tuple):
                    value = list(value)
                assert value == want_value, f"{key} of {a.kind.value} {a.target}: {value!r} != {want_value!r}{shown}"
    # every action has a reason; order is the apply order
    assert all(a.reason for a in actions)
    assert [apply_key(a) for a in actions] == sorted(apply_key(a) for a in actions)

    for w in exp.get("noops_contain", []):
        hits = [
            n
            for n in got.noops
            if ("target" not in w or n.target == w["target"])
            and n.code.value == w["code"]
            and _match_reason(w, n.reason)
        ]
        assert hits, f"no noop matching {w}{shown}"
    for w in exp.get("drift", []):
        hits = [
            d
            for d in got.drift
            if d.cls.value == w["class"]
            and d.subject == w["subject"]
            and ("action" not in w or d.action == w["action"])
        ]
        assert hits, f"no drift matching {w}{shown}"
    if "drift_exact" in exp:
        assert sorted((d.cls.value, d.subject, d.action) for d in got.drift) == sorted(
            (w["class"], w["subject"], w["action"]) for w in exp["drift_exact"]
        ), shown
    if "suspended" in exp:
        assert got.suspended is exp["suspended"]
    if "fleet_dph_before" in exp:
        assert got.fleet_dph_before == pytest.approx(exp["fleet_dph_before"])
    if "fleet_dph_after" in exp:
        assert got.fleet_dph_after == pytest.approx(exp["fleet_dph_after"])
    if "desired_commit" in exp:
        assert got.desired_commit == exp["desired_commit"]
    for text in exp.get("warnings_contain", []):
        assert any(text in w for w in got.warnings), f"no warning containing {text!r} in {got.warnings}{shown}"
    if "estimates" in exp:
        assert [e.to_json() for e in got.estimates] == exp["estimates"], shown

    # a plan is a value: the same inputs give an equal plan, and it survives a JSON round trip
    assert plan(case.desired, case.observed, case.controller, case.now) == got
    assert Plan.from_json(got.to_json()).to_json() == got.to_json()


def test_every_reason_code_is_specified_by_a_case() -> None:
    """Each reason code is a rule; each rule is stated by at least one case that asserts it."""
    asserted: set[str] = set()
    for path in CASE_FILES:
        exp = load_case(path).expected
        asserted.update(w["code"] for w in exp.get("actions", []))
        asserted.update(w["code"] for w in exp.get("noops_contain", []))
    assert sorted(c.value for c in ReasonCode if c.value not in asserted) == []
