"""Forecasts: how long a run takes on a given box, when a live attempt ends, and how soon a new box is ready.

The box-side queue (how much to give a slot ahead of time), the tail (the longest work to the fastest GPUs),
renting against waiting (a busy GPU that frees before a new box is ready), the price and the ETA all ask the same
questions; they ask them here, of one ``Forecast`` built once per plan, so that they never disagree. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from reconciler.model import RunDirState, RunSpec
from reconciler.offers import normalize_gpu_name
from reconciler.plan.money import Runtime, runtime_of
from reconciler.plan.readiness import measured_ready_s
from reconciler.plan.world import OwnedBox, World

# A new box's boot and bootstrap, before any box of its pool has been measured (a typical Vast boot is minutes).
DEFAULT_READY_S = 300.0

@dataclass(frozen=True)
class Forecast:
    world: World
    runtimes: Mapping[str, Runtime]  # sweep name -> expected runtime of one run (``Purse.runtimes``)

    def run_s(self, spec: RunSpec, gpu_name: str, machine_id: int = 0) -> float:
        """Predicted wall seconds of one whole run of ``spec`` on a GPU of that model (on that machine)."""
        dlperf = self.world.gpu_dlperf.get(normalize_gpu_name(gpu_name)) if gpu_name else None
        return runtime_of(self.runtimes, spec).on(dlperf) * 3600.0

    def remaining_s(self, spec: RunSpec, run: RunDirState, box: OwnedBox) -> float:
        """Predicted seconds until this live attempt on ``box`` ends (0: it is due now, or overdue)."""
        whole = self.run_s(spec, box.inst.gpu_name, box.inst.machine_id)
        started = run.started_at
        if started is None:
            return whole
        return max(0.0, whole - max(0.0, self.world.now - started))

    def ready_s(self, pool: str) -> float:
        """Predicted seconds from renting a box in ``pool`` to that box being ready for work (boot + bootstrap):
        as measured for the pool (``readiness.measured_ready_s``), ``DEFAULT_READY_S`` until one of its boxes was."""
        measured = measured_ready_s(self.world, pool)
        return DEFAULT_READY_S if measured is None else measured


def forecast(world: World, runtimes: Mapping[str, Runtime]) -> Forecast:
    return Forecast(world, runtimes)
