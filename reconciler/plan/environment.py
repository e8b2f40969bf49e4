"""The job environment's one planning rule: a sweep whose ``env`` references a variable the operator does not
allow (``RIGSYNC_JOB_SECRETS``) or the controller does not set is not launched (and nothing is rented for it);
every other sweep goes on.

The planner never sees a value: ``Controller.allowed_secrets`` holds the names the operator lists,
``Controller.env_names`` the allowed names the controller has (set, non-empty), and the sweeps' references are
names too (``reconciler.core.jobenv``). Not allowed is decided first: a sweep with a reference off the list is held for
that alone (``secret_not_allowed``), whatever else it lacks. The withheld runs stay pending (their phase is a fact
about the run, not about this controller); the reason is a no-op per sweep (``secret_not_allowed`` or
``secret_missing``) and a warning, which ``rigsync plan``, ``status``, ``diff``, the commit message and
``observed/status.yaml`` show.
"""

from __future__ import annotations

from dataclasses import replace

from reconciler.core.actions import ReasonCode
from reconciler.core.jobenv import (
    NOT_ALLOWED_WARNING,
    SECRET_WARNING,
    EnvSpec,
    missing,
    missing_text,
    not_allowed,
    not_allowed_text,
)
from reconciler.plan.attempts import PendingRun, RunQueue
from reconciler.plan.common import Decisions
from reconciler.plan.world import World


def withhold_missing_secrets(world: World, queue: RunQueue) -> tuple[RunQueue, Decisions]:
    out = Decisions()
    allowed, available = world.controller.allowed_secrets, world.controller.env_names
    why_of: dict[EnvSpec, tuple[tuple[str, ...], tuple[str, ...]]] = {}
    held: dict[str, tuple[dict[str, None], dict[str, None], int]] = {}  # sweep -> (off the list, missing, runs)
    kept: list[PendingRun] = []
    for run in queue.pending:
        env = run.spec.sweep.env
        if env not in why_of:
            off = not_allowed(env, allowed)  # before missing: a name off the list is never looked up
            why_of[env] = (off, () if off else missing(env, available))
        off, absent = why_of[env]
        if not off and not absent:
            kept.append(run)
            continue
        offs, absents, n = held.setdefault(run.spec.sweep.name, ({}, {}, 0))
        offs.update(dict.fromkeys(off))
        absents.update(dict.fromkeys(absent))
        held[run.spec.sweep.name] = (offs, absents, n + 1)
    for sweep in sorted(held):
        offs, absents, n = held[sweep]
        if offs:  # not allowed wins: what is missing too is said once the operator allows it
            code, prefix = ReasonCode.SECRET_NOT_ALLOWED, NOT_ALLOWED_WARNING
            sentence = not_allowed_text(sweep, tuple(offs))
        else:
            code, prefix, sentence = ReasonCode.SECRET_MISSING, SECRET_WARNING, missing_text(sweep, tuple(absents))
        text = f"{sentence}: {n} run(s) not launched"
        out.noop(f"sweep/{sweep}", code, text)
        out.warnings.append(f"{prefix}{text}")
    if not held:
        return queue, out
    return replace(queue, pending=tuple(kept)), out
