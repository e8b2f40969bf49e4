"""Forecasts: how long a run takes on a given box, when a live attempt ends, and how soon a new box is ready.

The box-side queue (how much to give a slot ahead of time), the tail (the longest work to the fastest GPUs),
renting against waiting (a busy GPU that frees before a new box is ready), the price and the ETA all ask the same
questions; they ask them here, of one ``Forecast`` built once per plan, so that they never disagree. Pure.

A run of a sweep with a ``progress`` key takes ``total / rate`` on a box where ``throughput.predict`` finds a rate
(that machine, that GPU model, or the nearest measured model scaled by DLPerf; ``World.rates``, live attempts
included); a live attempt that reports its progress has ``(total - done) / rate`` left. Otherwise the sweep's
runtime (``money.Runtime``: the archive's median, expected_runtime or max_runtime) scaled by DLPerf, and a live
attempt has that less the time it has run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from reconciler.core.model import RunDirState, RunSpec
from reconciler.core.offers import normalize_gpu_name
from reconciler.core.throughput import predict, progress_value
from reconciler.plan.money import Runtime, runtime_of
from reconciler.plan.readiness import measured_ready_s
from reconciler.plan.world import OwnedBox, World

# A new box's boot and bootstrap, before any box of its pool has been measured (a typical Vast boot is minutes).
DEFAULT_READY_S = 300.0

@dataclass(frozen=True)
class Forecast:
    world: World
    runtimes: Mapping[str, Runtime]  # sweep name -> expected runtime of one run (``Purse.runtimes``)

    def rate(self, spec: RunSpec, gpu_name: str, machine_id: int = 0) -> float | None:
        """The sweep's predicted progress units per second on that GPU (machine), when its sweep has a progress
        key and something measured predicts one; else None."""
        if spec.sweep.progress is None or spec.sweep.progress.total <= 0 or not gpu_name:
            return None
        p = predict(
            self.world.rates, spec.sweep.name, normalize_gpu_name(gpu_name), machine_id, self.world.gpu_dlperf
        )
        return p.per_s if p.per_s is not None and p.per_s > 0 else None

    def run_s(self, spec: RunSpec, gpu_name: str, machine_id: int = 0) -> float:
        """Predicted wall seconds of one whole run of ``spec`` on a GPU of that model (on that machine)."""
        rate = self.rate(spec, gpu_name, machine_id)
        if rate is not None and spec.sweep.progress is not None:
            return spec.sweep.progress.total / rate
        dlperf = self.world.gpu_dlperf.get(normalize_gpu_name(gpu_name)) if gpu_name else None
        return runtime_of(self.runtimes, spec).on(dlperf) * 3600.0

    def remaining_s(self, spec: RunSpec, run: RunDirState, box: OwnedBox) -> float:
        """Predicted seconds until this live attempt on ``box`` ends (0: it is due now, or overdue)."""
        rate = self.rate(spec, box.inst.gpu_name, box.inst.machine_id)
        done = progress_value(spec.sweep, run.last_metrics)
        if rate is not None and done is not None and spec.sweep.progress is not None:
            return max(0.0, spec.sweep.progress.total - done) / rate
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
