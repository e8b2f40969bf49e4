"""Measured readiness on real parts: a sweep on the emulator's sshd boxes, driven by ``Reconciler.cycle()``.

Each box's memory gets its first answer and its first ready answer (``reachable_at``/``ready_at``, with its pool)
from real probes, and the overhead line archived when the box's bill closes keeps them:
the pool's measured time to a ready box (``Forecast.ready_s``) then comes from the fleet's own boxes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_reconcile import drive, fleet_repo, owned_alive

from reconciler.adapters.archive import ShardedRunArchive
from reconciler.cli._common import load_local_desired, open_reconciler
from reconciler.core.model import BoxMemory
from reconciler.emulator import Emulator
from reconciler.loop import CycleResult
from reconciler.plan.forecast import DEFAULT_READY_S, forecast
from reconciler.plan.world import index_world

pytestmark = pytest.mark.integration


def test_boxes_readiness_is_measured_kept_in_fleet_yaml_and_in_their_overhead_lines(
    emulator: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VAST_API_KEY", emulator.api_key)
    repo = fleet_repo(tmp_path, emulator, "itready", seconds=1.0)
    desired = load_local_desired(repo)
    rec = open_reconciler(repo, desired, str(tmp_path / "state"), emulator.url)
    seen: dict[int, BoxMemory] = {}
    ready_figures: list[float] = []

    def watch(res: CycleResult) -> None:
        for m in res.observed.memory.boxes:
            if m.ready_at is not None:
                seen[m.instance_id] = m
                world, _ = index_world(desired, res.observed, res.controller, res.finished_at)
                ready_figures.append(forecast(world, {}).ready_s(m.pool))

    try:
        drive(rec, desired, emulator, watch)
        assert seen, "no box was ever ready"
        for m in seen.values():
            assert m.reachable_at is not None and m.ready_at is not None
            assert m.first_seen_at <= m.reachable_at <= m.ready_at
            assert m.pool == desired.fleet.pools[0].name
        assert ready_figures and all(0.0 <= f < DEFAULT_READY_S for f in ready_figures)  # measured, not the guess
        overheads = {o.instance_id: o for o in ShardedRunArchive(repo).overheads()}
        assert set(seen) <= set(overheads)
        for iid, m in seen.items():
            o = overheads[iid]
            assert (o.reachable_at, o.ready_at, o.pool) == (m.reachable_at, m.ready_at, m.pool)
            assert o.started_at is not None and o.started_at <= o.ready_at  # type: ignore[operator]
    finally:
        rec.shell.close()
        for iid in owned_alive(emulator, "itready"):
            emulator.destroy_instance(iid)
