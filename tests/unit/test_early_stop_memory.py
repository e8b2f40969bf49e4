"""Early termination's memory: the rung values remember() keeps from the probes, runs.yaml keeping them over a
restart, a run stopped early as its own settled phase, and the rung ladder (ASHA levels, Hyperband brackets)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from reconciler.core.actions import Plan
from reconciler.core.model import (
    AttemptOutcome,
    AttemptRecord,
    BoxProbe,
    Desired,
    EarlyTerminate,
    EarlyTerminateType,
    FleetMemory,
    InFlight,
    Observed,
    RunDirState,
    RungValue,
    RunPhase,
)
from reconciler.core.remember import Observation, remember, track_rungs
from reconciler.core.runphase import UNTOUCHED, run_phase, tally_runs
from reconciler.errors import ObservedInvalid
from reconciler.observed.codec import RUNS
from reconciler.observed.documents import ReconcilerStatus, render_observed
from reconciler.observed.memory import fleet_memory_from_files

try:
    from .plan_case_io import build_desired
except ImportError:  # run as a top-level module
    from plan_case_io import build_desired  # type: ignore[no-redef]

ROOT = Path(__file__).parents[2]
NOW = 1_000_000.0
ASHA = {"type": "asha", "min_iter": 100, "eta": 2}


def desired(*ids: str, early_terminate: dict[str, Any] | None = None) -> Desired:
    et = ASHA if early_terminate is None else early_terminate
    return build_desired(
        {
            "runs": [
                {"id": i, "metric_key": "reward", "progress": {"key": "step", "total": 1000}, "early_terminate": et}
                for i in ids
            ]
        }
    )


def probe(*runs: RunDirState, iid: int = 1) -> BoxProbe:
    return BoxProbe(iid, reachable=True, runs=runs)


def at(run_id: str, step: Any, reward: Any, attempt: int = 1, exit_code: int | None = None) -> RunDirState:
    return RunDirState(
        run_id, attempt, (0,), pid_alive=exit_code is None, started_at=NOW - 60, heartbeat_age_s=1.0,
        exit_code=exit_code, last_metrics=(("step", step), ("reward", reward)),
    )


def flying(*run_ids: str, iid: int = 1, attempt: int = 1) -> tuple[InFlight, ...]:
    return tuple(InFlight(r, attempt, iid, (0,), NOW - 60) for r in run_ids)


def test_a_run_gets_its_metric_at_each_rung_it_reached_and_the_first_record_stands() -> None:
    d = desired("a", "b")
    first = track_rungs((), d, flying("a", "b"), [probe(at("a", 250, 3.5), at("b", 99, 9.0))])
    # rungs at 100, 200, 400, 800: a passed two of them, b none yet
    assert first == (RungValue("a", 100.0, 3.5), RungValue("a", 200.0, 3.5))
    later = track_rungs(first, d, flying("a", "b"), [probe(at("a", 450, 7.0), at("b", 120, 1.0))])
    assert later == (
        RungValue("a", 100.0, 3.5), RungValue("a", 200.0, 3.5), RungValue("a", 400.0, 7.0), RungValue("b", 100.0, 1.0)
    )


@pytest.mark.parametrize(
    ("step", "reward"),
    [(250, math.nan), (250, math.inf), (250, True), (250, "9"), (math.nan, 1.0), ("250", 1.0), (-5, 1.0), (250, 1e300)],
)
def test_untrusted_metrics_record_nothing(step: Any, reward: Any) -> None:
    assert track_rungs((), desired("a"), flying("a"), [probe(at("a", step, reward))]) == ()


def test_only_our_attempts_on_the_box_we_launched_them_on_count() -> None:
    d = desired("a")
    assert track_rungs((), d, (), [probe(at("a", 250, 1.0))]) == ()  # no launch of ours: foreign
    assert track_rungs((), d, flying("a", iid=2), [probe(at("a", 250, 1.0), iid=1)]) == ()  # launched elsewhere
    assert track_rungs((), d, flying("a"), [BoxProbe(1, reachable=False)]) == ()


def test_finished_runs_keep_their_values_and_runs_no_longer_desired_lose_theirs() -> None:
    before = (RungValue("a", 100.0, 2.0), RungValue("gone", 100.0, 5.0))
    # a finished long ago (no probe shows it any more): its value stays a peer; "gone" left desired/
    assert track_rungs(before, desired("a"), (), []) == (RungValue("a", 100.0, 2.0),)
    # a finished attempt still on its box records the rungs its last line reached
    ended = track_rungs((), desired("a"), flying("a"), [probe(at("a", 1000, 4.0, exit_code=0))])
    assert [r.level for r in ended] == [100.0, 200.0, 400.0, 800.0]


def test_a_sweep_without_early_terminate_records_nothing() -> None:
    d = build_desired({"runs": [{"id": "a", "metric_key": "reward", "progress": {"key": "step", "total": 1000}}]})
    assert track_rungs((), d, flying("a"), [probe(at("a", 500, 1.0))]) == ()


def test_an_observation_brings_the_rung_values_up_to_the_probes() -> None:
    memory = FleetMemory(in_flight=flying("a"), rungs=(RungValue("a", 100.0, 1.0),))
    after = remember(memory, Observation(desired("a"), (), (), (probe(at("a", 210, 6.0)),), {}, NOW))
    assert after.rungs == (RungValue("a", 100.0, 1.0), RungValue("a", 200.0, 6.0))


def test_runs_yaml_keeps_the_rung_values_over_a_restart_and_counts_runs_stopped_early() -> None:
    d = desired("a", "b")
    stopped = AttemptRecord(run_id="a", attempt=1, sweep="s", phase=AttemptOutcome.STOPPED_EARLY, exit_code=137)
    rungs = (RungValue("a", 100.0, 0.25), RungValue("b", 100.0, 3.0), RungValue("b", 200.0, 1e-7))
    observed = Observed(history=(stopped,), memory=FleetMemory(rungs=rungs))
    files = render_observed(desired=d, observed=observed, plan=Plan(actions=()), status=ReconcilerStatus(), now=NOW)
    doc = yaml.safe_load(files[RUNS])
    schema = json.loads((ROOT / "schemas" / "observed-runs.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)
    assert doc["sweeps"]["s"]["a"]["phase"] == "stopped_early"
    assert doc["counts"]["s"]["stopped_early"] == 1
    assert fleet_memory_from_files(files).rungs == rungs
    # no rung values: runs.yaml has no rungs key (other fleets' files stay as they were)
    plain = render_observed(desired=d, observed=replace(observed, memory=FleetMemory()), plan=Plan(actions=()),
                            status=ReconcilerStatus(), now=NOW)
    assert "rungs" not in yaml.safe_load(plain[RUNS])


@pytest.mark.parametrize("entry", [{"run_id": "a", "rung": ".nan", "value": 1}, {"run_id": "a", "value": 1},
                                   {"run_id": "a", "rung": 100, "value": "x"}])
def test_a_malformed_rung_entry_is_refused_naming_it(entry: dict[str, Any]) -> None:
    text = yaml.safe_dump({"format_version": 1, "in_flight": [], "rungs": [entry]}).replace("'.nan'", ".nan")
    with pytest.raises(ObservedInvalid, match=r"rungs\[0\]"):
        fleet_memory_from_files({RUNS: text})


def test_a_run_stopped_early_is_settled_without_spending_a_retry() -> None:
    d = desired("a")
    spec = d.runs[0]
    rec = AttemptRecord(run_id="a", attempt=1, sweep="s", phase=AttemptOutcome.STOPPED_EARLY, exit_code=137)
    tally = tally_runs([rec])["a"]
    assert tally.used == 0 and tally.stopped
    assert run_phase(spec, tally) is RunPhase.STOPPED_EARLY
    assert not RunPhase.STOPPED_EARLY.launchable and RunPhase.STOPPED_EARLY.finished
    assert run_phase(replace(spec, sweep=replace(spec.sweep, retries=0)), tally) is RunPhase.STOPPED_EARLY
    assert run_phase(spec, UNTOUCHED.with_outcome(AttemptOutcome.FAILED)) is RunPhase.RETRYING


def test_the_rung_ladder() -> None:
    asha = EarlyTerminate(EarlyTerminateType.ASHA, min_iter=1000, eta=3)
    assert asha.levels(10000) == (1000.0, 3000.0, 9000.0)
    assert asha.levels(9000) == (1000.0, 3000.0)  # a run at the total has finished: no rung there
    assert replace(asha, max_iter=3000).levels(10000) == (1000.0, 3000.0)
    assert asha.levels(None) == () and asha.brackets(10000) == 1
    hb = EarlyTerminate(EarlyTerminateType.HYPERBAND, min_iter=1000, eta=2)
    assert hb.brackets(8000) == 4 and hb.levels(8000) == (1000.0, 2000.0, 4000.0)
    assert hb.brackets(7999) == 3
    for bad in (replace(hb, eta=1.0), replace(hb, min_iter=0), replace(hb, eta=1e300)):
        assert bad.levels(8000) in ((), (1000.0,))
        assert bad.brackets(8000) >= 1


def test_every_run_phase_has_a_bucket_in_rigsync_diff() -> None:
    from reconciler.cli.diff_cmd import _BUCKETS

    assert set(_BUCKETS) == set(RunPhase)
    assert _BUCKETS[RunPhase.STOPPED_EARLY] == "done"


def test_status_counts_runs_stopped_early_in_its_json_and_text() -> None:
    from reconciler.plan.render import status_json, status_text

    d = desired("a", "b")
    stopped = AttemptRecord(run_id="a", attempt=1, sweep="s", phase=AttemptOutcome.STOPPED_EARLY, exit_code=137)
    doc = status_json(d, Observed(history=(stopped,)))
    schema = json.loads((ROOT / "schemas" / "cli-status.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)
    assert doc["runs"]["stopped_early"] == 1 and doc["runs"]["pending"] == 1
    assert "stopped_early 1" in status_text(doc)
