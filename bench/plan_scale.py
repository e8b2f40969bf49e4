"""How plan() scales: time at 1k and 10k runs against 500 boxes (4 GPUs each) and 2k offers; prints JSON.

Synthetic world built in code: half the GPUs run an attempt, a tenth of the runs are archived (succeeded or
failed), the rest are pending, so the planner records nothing but places, packs and rents at full width.
Run: ``.venv/bin/python bench/plan_scale.py``. Figures are medians of several runs: wall time (perf_counter) and
this process's CPU time (process_time, which other load on a shared machine disturbs less).
"""

from __future__ import annotations

import gc
import json
import platform
import statistics
import sys
import time

from reconciler.core.model import (
    AttemptOutcome,
    AttemptRecord,
    BoxProbe,
    Budget,
    Controller,
    Desired,
    Fleet,
    FleetMemory,
    GpuState,
    InFlight,
    Instance,
    InstanceStatus,
    MetricGoal,
    Observed,
    Offer,
    Ownership,
    RunDirState,
    RunSpec,
    Sweep,
)
from reconciler.plan import fleet_spec_hash, plan

NOW = 1_000_000.0
BOXES = 500
GPUS_PER_BOX = 4
OFFERS = 2000
REPEATS = 11


def world(n_runs: int) -> tuple[Desired, Observed]:
    fleet = Fleet(name="bench", max_instances=BOXES + 300, min_instances=0)
    budget = Budget(max_instance_dph=1.0, max_fleet_dph=500.0)
    # what runs of a sweep share is their sweep's; these used to vary per run, so each (sweep, priority, gpus) is one
    def sweep_of(i: int) -> Sweep:
        return Sweep(
            name=f"sweep{i % 7}", command="python train.py --i {{ i }}", priority=i % 4, order=i % 7,
            gpus_per_run=2 if i % 10 == 0 else 1, max_runtime_s=7200.0, retries=2, metric_key="reward",
            metric_goal=MetricGoal.MAX,
        )

    runs = tuple(
        RunSpec(
            id=f"run{i:05d}",
            sweep=sweep_of(i),
            cell=f"cell{i // 3}",
            params=(("lr", i % 11), ("seed", i % 3)),
            seed=i % 3,
            command=f"python train.py --i {i}",
            promotion_threshold=0.9 if i % 9 == 8 else None,
        )
        for i in range(n_runs)
    )
    spec = fleet_spec_hash(fleet)
    instances = []
    probes = []
    in_flight = []
    r = 0
    for b in range(BOXES):
        iid = 100_000 + b
        instances.append(
            Instance(
                iid,
                Ownership("bench", f"{spec}-{iid}").label(),
                InstanceStatus.RUNNING,
                "RTX 3090",
                GPUS_PER_BOX,
                24576,
                0.1 + (b % 10) / 100,
                NOW - 3600,
            )
        )
        rundirs = []
        for g in range(0, GPUS_PER_BOX, 2):  # half the GPUs busy
            if r < n_runs // 2 and runs[r].sweep.gpus_per_run == 1:
                rundirs.append(RunDirState(runs[r].id, 1, (g,), True, NOW - 600, 2.0, None))
                in_flight.append(InFlight(runs[r].id, 1, iid, (g,), NOW - 600))
            r += 1
        busy = {i for rd in rundirs for i in rd.gpu_mask}
        gpus = tuple(GpuState(g, 4000 if g in busy else 0, 24576) for g in range(GPUS_PER_BOX))
        probes.append(BoxProbe(iid, True, gpus=gpus, runs=tuple(rundirs), last_activity_at=NOW - 60))
    history = tuple(
        AttemptRecord(
            runs[i].id, 1, runs[i].sweep, AttemptOutcome.SUCCEEDED if i % 2 else AttemptOutcome.FAILED, best_metric=0.5
        )
        for i in range(n_runs - n_runs // 10, n_runs)
    )
    offers = tuple(
        Offer(
            id=1_000_000 + k,
            machine_id=k,
            gpu_name=("RTX 3090", "RTX 4090", "A4000")[k % 3],
            num_gpus=(1, 2, 4, 8)[k % 4],
            gpu_ram_mib=24576,
            dph_total=0.05 + (k % 97) / 100,
            dlperf=10 + k % 40,
            dlperf_per_dph=(10 + k % 40) / (0.05 + (k % 97) / 100),
            reliability=0.95 + (k % 5) / 100,
            inet_down_mbps=500,
            cuda=12.2,
            verified=True,
            geolocation="SE",
            disk_space_gb=200,
        )
        for k in range(OFFERS)
    )
    observed = Observed(
        instances=tuple(instances),
        probes=tuple(probes),
        offers=offers,
        history=history,
        fleet_name="bench",
        memory=FleetMemory(in_flight=tuple(in_flight)),
    )
    return Desired(fleet=fleet, budget=budget, sweeps=(), runs=runs), observed


def measure(n_runs: int) -> dict[str, float | int]:
    desired, observed = world(n_runs)
    times = []
    cpu = []
    result = None
    for _ in range(REPEATS):
        gc.collect()
        t0, c0 = time.perf_counter(), time.process_time()
        result = plan(desired, observed, Controller(), NOW)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    assert result is not None
    counts = result.counts()
    return {
        "runs": n_runs,
        "boxes": BOXES,
        "gpus": BOXES * GPUS_PER_BOX,
        "offers": OFFERS,
        "median_s": round(statistics.median(times), 4),
        "min_s": round(min(times), 4),
        "cpu_median_s": round(statistics.median(cpu), 4),
        "launches": counts.get("launch", 0),
        "rents": counts.get("rent", 0),
        "noops": len(result.noops),
    }


def main() -> int:
    small = measure(1_000)
    large = measure(10_000)
    print(
        json.dumps(
            {
                "bench": "plan_scale",
                "python": platform.python_version(),
                "repeats": REPEATS,
                "results": [small, large],
                "ratio_10k_over_1k": round(float(large["median_s"]) / float(small["median_s"]), 2),
                "cpu_ratio_10k_over_1k": round(float(large["cpu_median_s"]) / float(small["cpu_median_s"]), 2),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
