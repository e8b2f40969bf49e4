"""The job environment's one planning rule: a sweep whose ``env`` references a variable the controller does not
set is not launched (and nothing is rented for it); every other sweep goes on.

The planner never sees a value: ``Observed.controller_env`` holds the names the controller has (set, non-empty),
and the sweeps' references are names too (``reconciler.jobenv``). The withheld runs stay pending (their phase is
a fact about the run, not about this controller); the reason is a no-op per sweep (``secret_missing``) and a
warning, which ``rigsync plan``, ``status`` and ``observed/status.yaml`` show.
"""

from __future__ import annotations

from dataclasses import replace

from reconciler.actions import ReasonCode
from reconciler.jobenv import SECRET_WARNING, missing, missing_text
from reconciler.plan.attempts import PendingRun, RunQueue
from reconciler.plan.common import Decisions
from reconciler.plan.world import World


def withhold_missing_secrets(world: World, queue: RunQueue) -> tuple[RunQueue, Decisions]:
    out = Decisions()
    available = world.observed.controller_env
    absent_of: dict[tuple[tuple[str, str], ...], tuple[str, ...]] = {}
    held: dict[str, tuple[tuple[str, ...], int]] = {}
    kept: list[PendingRun] = []
    for run in queue.pending:
        env = run.spec.sweep.env
        if not env:
            kept.append(run)
            continue
        absent = absent_of.get(env)
        if absent is None:
            absent = absent_of[env] = missing(env, available)
        if not absent:
            kept.append(run)
            continue
        names, n = held.get(run.spec.sweep.name, ((), 0))
        held[run.spec.sweep.name] = (tuple(dict.fromkeys((*names, *absent))), n + 1)
    for sweep in sorted(held):
        names, n = held[sweep]
        text = f"{missing_text(sweep, names)}: {n} run(s) not launched"
        out.noop(f"sweep/{sweep}", ReasonCode.SECRET_MISSING, text)
        out.warnings.append(f"{SECRET_WARNING}{text}")
    if not held:
        return queue, out
    return replace(queue, pending=tuple(kept)), out
