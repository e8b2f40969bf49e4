"""Preemption has its own outcome: an attempt the provider took (an outbid box) spends no retry, the run is launched
again, and past the sweep's ``max_preemptions`` it is blocked; runs.yaml and ``status`` count the preemptions."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import yaml

from reconciler.core.actions import Plan, ReasonCode, Requeue, action_from_json
from reconciler.core.model import AttemptOutcome, AttemptRecord, Desired, Observed, RunPhase
from reconciler.core.runphase import UNTOUCHED, run_phase, tally_runs
from reconciler.observed.codec import RUNS
from reconciler.observed.documents import ReconcilerStatus, render_observed
from reconciler.plan.render import status_json, status_text

try:
    from .plan_case_io import build_desired
except ImportError:  # run as a top-level module
    from plan_case_io import build_desired  # type: ignore[no-redef]

ROOT = Path(__file__).parents[2]
NOW = 1_000_000.0


def desired(**run: object) -> Desired:
    return build_desired({"runs": [{"id": "a", **run}]})


def record(attempt: int, phase: AttemptOutcome) -> AttemptRecord:
    return AttemptRecord(run_id="a", attempt=attempt, sweep="s", phase=phase, exit_code=None, instance_id=attempt)


def test_a_preempted_attempt_spends_no_retry_and_the_run_blocks_only_past_max_preemptions() -> None:
    spec = desired(retries=0, max_preemptions=2).runs[0]
    assert not AttemptOutcome.PREEMPTED.uses_a_retry and AttemptOutcome.PREEMPTED.launches_again
    history = [record(i, AttemptOutcome.PREEMPTED) for i in (1, 2)]
    tally = tally_runs(history)["a"]
    assert (tally.used, tally.preempted) == (0, 2)
    assert run_phase(spec, tally) is RunPhase.RETRYING  # two preemptions are allowed, retries 0 untouched
    assert run_phase(spec, tally_runs([*history, record(3, AttemptOutcome.PREEMPTED)])["a"]) is RunPhase.BLOCKED
    assert run_phase(spec, tally_runs([record(1, AttemptOutcome.LOST)])["a"]) is RunPhase.BLOCKED  # a loss is not
    assert run_phase(spec, UNTOUCHED._replace(preempted=3, live=True)) is RunPhase.RUNNING  # live beats blocked


def test_runs_yaml_and_status_count_the_preemptions() -> None:
    d = desired()
    observed = Observed(history=(record(1, AttemptOutcome.PREEMPTED),))
    files = render_observed(desired=d, observed=observed, plan=Plan(actions=()), status=ReconcilerStatus(), now=NOW)
    doc = yaml.safe_load(files[RUNS])
    jsonschema.Draft202012Validator(json.loads((ROOT / "schemas" / "observed-runs.schema.json").read_text())).validate(
        doc
    )
    assert doc["sweeps"]["s"]["a"]["phase"] == "retrying" and doc["sweeps"]["s"]["a"]["preempted"] == 1
    status = status_json(d, observed)
    schema = json.loads((ROOT / "schemas" / "cli-status.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(status)
    assert status["preempted"] == 1
    assert "preempted: 1 attempt(s) taken by the provider" in status_text(status)
    assert "preempted" not in status_text(status_json(d, Observed()))


def test_a_saved_plan_keeps_a_requeue_s_phase() -> None:
    requeue = Requeue("preempted", code=ReasonCode.PREEMPTED, run_id="a", attempt=1, instance_id=7,
                      phase=AttemptOutcome.PREEMPTED)
    back = action_from_json(json.loads(json.dumps(requeue.to_json())))
    assert back == requeue and isinstance(back, Requeue) and back.phase is AttemptOutcome.PREEMPTED
