"""A sweep's ``progress: {key, total}``: loaded from desired/, the fraction done of a live attempt read from the
box's last metrics line, and shown where people look (``rigsync status``, observed/runs.yaml)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from reconciler.core.actions import Plan
from reconciler.core.model import (
    BoxProbe,
    Desired,
    FleetMemory,
    InFlight,
    Instance,
    InstanceStatus,
    Observed,
    Progress,
    RunDirState,
)
from reconciler.core.runphase import live_progress
from reconciler.desired import load_desired_from_dir
from reconciler.observed.codec import RUNS
from reconciler.observed.documents import ReconcilerStatus, render_observed
from reconciler.plan.render import status_json, status_text

REPO = Path(__file__).resolve().parents[2]
T0 = 1_790_000_000.0


@pytest.fixture(scope="module")
def desired() -> Desired:
    return load_desired_from_dir(REPO)


def test_the_example_sweep_declares_its_progress(desired: Desired) -> None:
    assert {s.name: s.progress for s in desired.sweeps} == {"tdmpc": Progress(key="step", total=20000.0)}
    assert all(r.sweep.progress == Progress("step", 20000.0) for r in desired.runs)


@pytest.mark.parametrize(
    ("metrics", "want"),
    [
        ({"step": 5000}, 0.25),
        ({"step": 5000.0, "episode_reward": 1.0}, 0.25),
        ({"step": 0}, 0.0),
        ({"step": 40000}, 1.0),  # a box that overshoots (or lies) is done, not 200 % done
        ({"step": -3}, 0.0),
        ({"step": True}, None),  # bools are not counts
        ({"step": "5000"}, None),
        ({"step": math.nan}, None),
        ({"step": math.inf}, None),
        ({"step": 1e308 * 10}, None),
        ({"step": 10**400}, None),  # JSON has no bound on integers: a float cannot hold this one
        ({"episode_reward": 3.0}, None),  # a line without the key says nothing
        ({}, None),
    ],
)
def test_fraction_is_total_and_clamped(metrics: dict[str, object], want: float | None) -> None:
    assert Progress("step", 20000.0).fraction(metrics) == want  # type: ignore[arg-type]


def a_world(desired: Desired, step: object) -> Observed:
    run = desired.runs[0]
    box = Instance(
        id=11, label="rigsync:lab:a1", status=InstanceStatus.RUNNING, gpu_name="RTX 3060", num_gpus=1,
        gpu_ram_mib=12288, dph_total=0.1, start_date=T0 - 600,
    )
    state = RunDirState(
        run_id=run.id, attempt=2, gpu_mask=(0,), pid_alive=True, started_at=T0 - 60, heartbeat_age_s=1.0,
        exit_code=None, last_metrics=(("episode_reward", 12.5), ("step", step)),  # type: ignore[arg-type]
    )
    launched = FleetMemory(in_flight=(InFlight(run.id, 2, 11, (0,), T0 - 60),))  # only what was launched is live
    return Observed(
        instances=(box,), probes=(BoxProbe(instance_id=11, reachable=True, runs=(state,)),), memory=launched
    )


def test_live_progress_is_per_live_attempt(desired: Desired) -> None:
    run = desired.runs[0]
    world = a_world(desired, 7000)
    assert live_progress(desired.runs, world) == {(run.id, 2): 0.35}
    finished = replace(world.probes[0].runs[0], exit_code=0)
    assert live_progress(desired.runs, replace(world, probes=(replace(world.probes[0], runs=(finished,)),))) == {}
    unlisted = replace(desired, runs=tuple(replace(r, sweep=replace(r.sweep, progress=None)) for r in desired.runs))
    assert live_progress(unlisted.runs, world) == {}  # a sweep that declares no progress shows none


def test_status_shows_the_fraction_done(desired: Desired) -> None:
    run = desired.runs[0]
    doc = status_json(replace(desired, fleet=replace(desired.fleet, name="lab")), a_world(desired, 7000))
    assert doc["boxes"][0]["progress"] == {f"{run.id}.2": 0.35}
    assert f"{run.id}.2 (35%)" in status_text(doc)


def test_runs_yaml_floors_progress_to_tenths(desired: Desired) -> None:
    run = desired.runs[0]

    def progress_in_runs_yaml(step: object) -> object:
        files = render_observed(
            desired=desired, observed=a_world(desired, step), plan=Plan(actions=()), status=ReconcilerStatus(), now=T0
        )
        return yaml.safe_load(files[RUNS])["sweeps"]["tdmpc"][run.id].get("progress")

    assert progress_in_runs_yaml(7999) == 0.3  # 0.39995: a commit at each tenth, not at every cycle
    assert progress_in_runs_yaml(20000) == 1.0
    assert progress_in_runs_yaml("garbage") is None
