"""A stand-in training script for the demo sweep: writes a deterministic learning curve, no GPU needed.

It exists so the example sweep in desired/ has something real to run on emulated boxes: it behaves like a
short RL training job (a few seconds of wall time, a metrics line per evaluation, a final reward that depends
on task, learning rate and seed) so promotion rules trigger for some cells and not others. Standard library
only, because it runs with whatever Python the box has.

Wall time: ``--seconds`` or env ``RIGSYNC_DEMO_SECONDS`` (default 4), divided by env ``EMULATOR_SPEED_FACTOR``
(default 1). Output: JSON lines ``{"step": N, "episode_reward": R}`` appended to ``--out``.

Checkpoints: after every evaluation, its state (the evaluations done, the step reached) goes to
``$RIGSYNC_RUN_DIR/ckpt/state.json`` (written whole: a temporary file renamed over it), which rigsync syncs home
while the run runs when the sweep declares ``checkpoint: {path: ckpt/, ...}``. Started with ``RIGSYNC_RESUME_DIR``
(a retried or requeued attempt, given the last synced checkpoint), it resumes: its curve continues from the step
reached, and only the remaining evaluations (and their share of the wall time) are run. A checkpoint of a finished
training (its attempt was lost between its last evaluation and its exit) is evaluated once more, as a real job
restoring a trained policy would: the attempt still reports its final reward, so it has a metric and a curve.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
from pathlib import Path

# Rough final rewards per task at a good learning rate; unknown tasks get a hash-derived level.
TASK_LEVEL = {"walker-walk": 700.0, "cheetah-run": 440.0, "cartpole-swingup": 820.0, "humanoid-walk": 150.0}
BEST_LR = 1e-3


def _unit(*parts: object) -> float:
    """A deterministic number in [0, 1) from the arguments."""
    digest = hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def final_reward(task: str, lr: float, seed: int) -> float:
    """The reward the curve converges to: task level, scaled down the further lr is from 1e-3, plus seed noise."""
    level = TASK_LEVEL.get(task, 200.0 + 500.0 * _unit("task", task))
    distance = abs(math.log10(max(lr, 1e-12)) - math.log10(BEST_LR))
    lr_factor = max(0.2, 1.0 - 0.35 * distance)
    noise = (_unit("seed", task, lr, seed) - 0.5) * 60.0
    return max(0.0, level * lr_factor + noise)


def curve(task: str, lr: float, seed: int, steps: int) -> list[tuple[int, float]]:
    """(step, episode_reward) points of a saturating learning curve with deterministic jitter."""
    final = final_reward(task, lr, seed)
    points = []
    for i in range(1, steps + 1):
        frac = i / steps
        jitter = (_unit("eval", task, lr, seed, i) - 0.5) * 0.04 * final
        reward = final * (1.0 - math.exp(-4.0 * frac)) / (1.0 - math.exp(-4.0)) + jitter * (1.0 - frac)
        points.append((i * 1000, round(max(0.0, reward), 3)))
    return points


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    try:
        value = float(raw) if raw else default
    except ValueError:
        print(f"train.py: ignoring {name}={raw!r} (not a number)", file=sys.stderr)
        return default
    return value if value > 0 and math.isfinite(value) else default


CKPT_DIR = "ckpt"
CKPT_FILE = "state.json"


def _resume_from(task: str, lr: float, seed: int, evals: int) -> int:
    """Evaluations already done by the attempt whose checkpoint is in ``$RIGSYNC_RESUME_DIR`` (0: start fresh)."""
    resume = os.environ.get("RIGSYNC_RESUME_DIR")
    if not resume:
        return 0
    try:
        state = json.loads((Path(resume) / CKPT_DIR / CKPT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"train.py: no usable checkpoint in {resume} ({exc}); starting fresh", file=sys.stderr)
        return 0
    if [state.get("task"), state.get("lr"), state.get("seed"), state.get("evals")] != [task, lr, seed, evals]:
        print("train.py: the checkpoint is another run's; starting fresh", file=sys.stderr)
        return 0
    return max(0, min(evals, int(state.get("done", 0))))


def _checkpoint(state: dict[str, object]) -> None:
    run_dir = os.environ.get("RIGSYNC_RUN_DIR")
    if not run_dir:
        return
    d = Path(run_dir) / CKPT_DIR
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{CKPT_FILE}.tmp"
    tmp.write_text(json.dumps(state, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, d / CKPT_FILE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--task", required=True)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True, help="metrics file (JSON lines, appended)")
    parser.add_argument("--evals", type=int, default=20, help="number of metrics lines")
    parser.add_argument("--seconds", type=float, default=None, help="wall time before the speed factor")
    args = parser.parse_args(argv)

    seconds = args.seconds if args.seconds is not None else _env_float("RIGSYNC_DEMO_SECONDS", 4.0)
    wall = max(0.0, seconds) / _env_float("EMULATOR_SPEED_FACTOR", 1.0)
    evals = max(1, args.evals)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    done = _resume_from(args.task, args.lr, args.seed, evals)
    start = time.monotonic() - wall * done / evals  # the schedule as if the evaluations done had just run
    resumed = f", resuming after evaluation {done}" if done else ""
    print(f"training {args.task} lr={args.lr} seed={args.seed} for {wall:.2f}s{resumed}", flush=True)
    with args.out.open("a", encoding="utf-8") as fh:
        for i, (step, reward) in enumerate(curve(args.task, args.lr, args.seed, evals), start=1):
            if i <= done:
                continue
            delay = start + wall * i / evals - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            fh.write(json.dumps({"step": step, "episode_reward": reward}) + "\n")
            fh.flush()
            _checkpoint({"task": args.task, "lr": args.lr, "seed": args.seed, "evals": evals, "done": i, "step": step})
            print(f"step {step} episode_reward {reward}", flush=True)
        if done >= evals:
            step, reward = curve(args.task, args.lr, args.seed, evals)[-1]
            fh.write(json.dumps({"step": step, "episode_reward": reward}) + "\n")
            print(f"step {step} episode_reward {reward} (the restored policy, evaluated again)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
