"""Search: grid, random and bayes, each with and without ASHA, on the emulator, for the same budget and run cap.

The objective is synthetic and its optimum known: ``experiments/train.py``'s final reward falls off with
``|log10(lr) - log10(1e-3)|`` (``final_reward``; seed noise ±30), so the best possible learning rate is 1e-3 and
the best reward is ``final_reward(task, 1e-3, seed)``. Every scenario is one sweep ``tune`` of one parameter,
``lr`` in [1e-5, 1e-1] (``log_uniform``; grid takes ``run_cap`` log-spaced values of that range, which miss 1e-3
as a real grid would), ``run_cap`` configurations, one training seed, with the same ``max_total_usd`` in
desired/budget.yaml. With ASHA, ``early_terminate: {type: asha, min_iter, eta: 2, max_iter}`` in the sweep's
``progress`` units (train.py's steps): rungs at a quarter and a half of the run.

Each scenario is a fresh emulator (market seed 7) and the real ``FleetDaemon`` cycle in-process on a throwaway fleet
repo, as ``bench/economics.py`` drives rigsync (``demo.make_fleet_repo``, ``demo._drive``, the example fleet's
timeouts scaled by ``economics.SCALE``, ``economics.fleet_settings``). A bayes search adds batches as results are
archived, so the drive is repeated until a cycle adds no run.

Per method x ASHA x seed (``--seeds``, default 1,2: the search's ``seed`` and the training seed), printed as JSON
from the fleet repo's committed facts (the archive read by ``views.dashboard.read_repo``, ranked by
``views.search.configurations``, the same objective the dashboard and STATUS.md show) and the emulator's ledger:
``best_metric`` (the best configuration's objective), ``best_lr``, ``optimum`` (the known best reward for that
seed) and ``regret`` (optimum - best_metric), ``usd`` (what the emulator billed), ``runs_started``,
``runs_stopped_early``, ``runs_succeeded``, ``wall_s``, ``complete`` (no timeout). Then ``summary``: per method x
ASHA the means over seeds. No targets: the figures are reported as they come.

Run as root (the emulated boxes are sshd in namespaces):

    .venv/bin/python bench/search.py [--quick] [--seeds 1,2] [--only grid,random,bayes] [--asha both|on|off]
        [--keep DIR]

``--keep DIR`` keeps each scenario's fleet repo (``DIR/<scenario>/fleet``) for ``rigsync dashboard --repo``.
``--quick``: run_cap 4 and shorter runs, one seed (under 3 minutes); the default: run_cap 8 (under ~10 minutes).
Progress goes to stderr, the JSON document to stdout.

Measured (2026-12-02, 2 shared cores, load ~4): the default matrix took 372 s, ``--quick`` 91 s. Means over seeds 1
and 2 (run_cap 8, optimum ~726 and ~683): grid best 656.0 (regret 48.5) for $0.00101, with ASHA the same best for
$0.00074 (5 of 8 runs stopped early); random 632.1 (regret 72.4), $0.00099 / ASHA $0.00069 (6 stopped); bayes
698.2 (regret 6.4), $0.00125 / ASHA $0.00095 (5 stopped). ASHA cut 24-30 % of the dollars everywhere, and ~1/3
of the wall time of grid and random, without losing a best (the cap is on runs, so it started no more of them).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reconciler" / "example" / "fleet" / "experiments"))

import economics
from train import BEST_LR, final_reward

from reconciler import demo
from reconciler.core.model import AttemptOutcome
from reconciler.daemon import DaemonConfig, FleetDaemon
from reconciler.emulator import Emulator
from reconciler.views.dashboard import read_repo
from reconciler.views.progress_display import LineProgress
from reconciler.views.search_results import configurations

TASK = "walker-walk"
LR_MIN, LR_MAX = 1e-5, 1e-1
METHODS = ("grid", "random", "bayes")
MAX_TOTAL_USD = 1.0  # the same budget for every scenario (desired/budget.yaml max_total_usd)
SWEEP = "tune"


@dataclass(frozen=True)
class Shape:
    run_cap: int
    batch: int  # bayes's batch
    evals: int  # train.py's metrics lines (1000 steps each)
    work_s: float  # train.py --seconds (speed-1 wall time)
    timeout_s: float


FULL = Shape(run_cap=8, batch=3, evals=8, work_s=4.0, timeout_s=150.0)
QUICK = Shape(run_cap=4, batch=2, evals=6, work_s=2.0, timeout_s=60.0)


def grid_values(n: int) -> list[float]:
    """``n`` log-spaced learning rates over [LR_MIN, LR_MAX] (rounded as a person would write them)."""
    lo, hi = math.log10(LR_MIN), math.log10(LR_MAX)
    return [float(f"{10 ** (lo + (hi - lo) * i / (n - 1)):.3g}") for i in range(n)]


def yaml_number(v: float) -> str:
    """A float as YAML 1.1 reads it as a number (``1.0e-05``, never ``1e-05``, which it takes as text)."""
    return f"{v:.6e}"


def sweep_yaml(method: str, asha: bool, seed: int, shape: Shape) -> str:
    total = shape.evals * 1000
    if method == "grid":
        lr = "{values: [" + ", ".join(yaml_number(v) for v in grid_values(shape.run_cap)) + "]}"
    else:
        lr = f"{{distribution: log_uniform, min: {yaml_number(LR_MIN)}, max: {yaml_number(LR_MAX)}}}"
    early = (f"early_terminate: {{type: asha, min_iter: {total // 4}, eta: 2, max_iter: {total}}}\n"
             if asha else "")
    batch = f"  batch: {shape.batch}\n" if method == "bayes" else ""
    return f"""\
# bench/search.py: {method}{' + ASHA' if asha else ''}, seed {seed}
name: {SWEEP}
priority: 10
code: [experiments]
command: >-
  {{{{ python }}}} experiments/train.py --task {TASK} --lr {{{{ lr }}}} --seed {{{{ seed }}}}
  --evals {shape.evals} --seconds {shape.work_s:g} --out {{{{ run_dir }}}}/metrics.jsonl
seeds: [{seed}]
search:
  method: {method}
  metric: {{key: episode_reward, goal: max}}
  parameters:
    lr: {lr}
  run_cap: {shape.run_cap}
{batch}  seed: {seed}
{early}progress: {{key: step, total: {total}}}
resources:
  gpus: 1
  min_gpu_ram_gib: 4
max_runtime: {int(shape.work_s / 0.3 * 2) + 30}s
retries: 1
metrics:
  file: metrics.jsonl
  key: episode_reward
  goal: max
"""


def run_one(method: str, asha: bool, seed: int, shape: Shape, ok: economics.Acceptable, tmp: Path) -> dict[str, Any]:
    name = f"{method}{'-asha' if asha else ''}-seed{seed}"
    workdir = tmp / name / "fleet"
    workdir.parent.mkdir(parents=True)
    sc = economics.Scenario(name, "search", (seed,), shape.work_s, 2.0, (), shape.timeout_s)
    settings = economics.fleet_settings(sc, ok)
    interval = round(DaemonConfig().interval_s * economics.SCALE, 2)
    old_key = os.environ.get("VAST_API_KEY")
    t0 = time.monotonic()
    with Emulator(seed=sc.market_seed, offers=sc.offers, boot_delay=sc.boot_s) as emu:
        try:
            os.environ["VAST_API_KEY"] = emu.api_key
            economics.bench_fleet_repo(workdir, settings)
            budget = workdir / "desired" / "budget.yaml"
            budget.write_text(re.sub(r"(?m)^max_total_usd:.*$", f"max_total_usd: {MAX_TOTAL_USD:.2f}",
                                     budget.read_text()))
            (workdir / "desired" / "sweeps" / f"{SWEEP}.yaml").write_text(sweep_yaml(method, asha, seed, shape))
            demo._git(workdir, "add", "-A")
            demo._git(workdir, "commit", "-q", "-m", f"bench: the search sweep ({name})")
            demo._git(workdir, "push", "-q", "origin", "main")
            daemon = FleetDaemon(workdir, config=DaemonConfig(interval_s=interval, lease_renew_s=30.0),
                                 state_dir=str(tmp / name / "state"), api_url=emu.url)
            daemon.acquire()
            timed_out, cycles = False, 0
            try:
                deadline = time.monotonic() + shape.timeout_s
                while True:  # bayes suggests its next batch from the archive: drive until a cycle adds no run
                    left = deadline - time.monotonic()
                    opts = demo.DemoOptions(timeout_s=max(1.0, left), interval_s=interval,
                                            say=lambda s: economics.say(f"{name} {s}"))
                    summary = demo._drive(daemon, emu, opts, LineProgress(opts.say), None, time.monotonic())
                    cycles += summary.cycles
                    timed_out = summary.timed_out
                    before = summary.runs_total
                    res = daemon.cycle().result
                    cycles += 1
                    if timed_out or res is None or len(res.desired.runs) <= before:
                        break
            finally:
                if daemon.reconciler is not None:
                    daemon.reconciler.shell.close()
                daemon.release()
            usd = emu.ledger.total_usd()
        finally:
            if old_key is None:
                os.environ.pop("VAST_API_KEY", None)
            else:
                os.environ["VAST_API_KEY"] = old_key
    wall = time.monotonic() - t0
    records = [a for a in read_repo(workdir).attempts if a.sweep == SWEEP]
    configs = configurations(records, SWEEP, "max")
    best = configs[0] if configs and configs[0].mean is not None else None
    best_lr = dict(best.params).get("lr") if best else None
    optimum = final_reward(TASK, BEST_LR, seed)
    return {
        "method": method, "asha": asha, "seed": seed,
        "best_metric": round(best.mean, 3) if best and best.mean is not None else None,
        "best_lr": best_lr, "optimum": round(optimum, 3),
        "regret": round(optimum - best.mean, 3) if best and best.mean is not None else None,
        "usd": round(usd, 5),
        "runs_started": len({a.run_id for a in records}),
        "runs_stopped_early": len({a.run_id for a in records if a.phase is AttemptOutcome.STOPPED_EARLY}),
        "runs_succeeded": len({a.run_id for a in records if a.phase is AttemptOutcome.SUCCEEDED}),
        "configurations": len(configs),
        "cycles": cycles, "wall_s": round(wall, 1), "complete": not timed_out,
    }


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if isinstance(r.get(key), int | float)]
    return round(sum(vals) / len(vals), 6) if vals else None


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="run_cap 4, shorter runs, one seed (under 3 minutes)")
    ap.add_argument("--seeds", default=None, help="search and training seeds, comma-separated (default 1,2; quick 1)")
    ap.add_argument("--only", default=",".join(METHODS), help="methods, comma-separated (default all three)")
    ap.add_argument("--asha", choices=("both", "on", "off"), default="both")
    ap.add_argument("--keep", type=Path, default=None,
                    help="keep each scenario's fleet repo under this (new) directory: `rigsync dashboard --repo` it")
    args = ap.parse_args()
    shape = QUICK if args.quick else FULL
    seeds = [int(s) for s in (args.seeds or ("1" if args.quick else "1,2")).split(",")]
    methods = [m for m in args.only.split(",") if m]
    ashas = {"both": (False, True), "on": (True,), "off": (False,)}[args.asha]
    started = time.monotonic()
    ok = economics.acceptable()
    rows = []
    with tempfile.TemporaryDirectory(prefix="rigsync-bench-search-") as tmp_name:
        tmp = Path(tmp_name) if args.keep is None else args.keep.resolve()
        tmp.mkdir(parents=True, exist_ok=True)
        tmp.chmod(0o755)
        for seed in seeds:
            for method in methods:
                for asha in ashas:
                    row = run_one(method, asha, seed, shape, ok, tmp)
                    economics.say(json.dumps(row))
                    rows.append(row)
    summary = []
    for method in methods:
        for asha in ashas:
            mine = [r for r in rows if r["method"] == method and r["asha"] == asha]
            summary.append({"method": method, "asha": asha, **{k: _mean(mine, k) for k in (
                "best_metric", "regret", "usd", "runs_started", "runs_stopped_early", "wall_s")}})
    out = {
        "shape": shape.__dict__, "max_total_usd": MAX_TOTAL_USD, "task": TASK, "best_lr": BEST_LR,
        "lr_range": [LR_MIN, LR_MAX], "grid_values": grid_values(shape.run_cap),
        "runs": rows, "summary": summary,
        "wall_s": round(time.monotonic() - started, 1),
    }
    out["host"] = {"cores": os.cpu_count(), "load_at_end": [round(x, 2) for x in os.getloadavg()]}
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
