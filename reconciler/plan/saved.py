"""A saved plan, and checking that it still fits the world before applying it exactly.

A saved plan is a complete value: the plan (``Plan.to_json``) with the settings of the controller that made it
(``controller``: its cycle, the secrets it could pass, whether a store took harvests), as ``rigsync plan --out``
writes it and ``rigsync apply --plan`` reads it (``schemas/plan.schema.json``).

A plan is reviewed as a value and may be applied later; by then an offer may be rented by someone else, a box
may be gone, another apply may have rented boxes or started the same run, or the controller applying it may lack
what the plan was made with (a store, a secret). Applying it anyway would rent something nobody reviewed, rent past
a cap that held when it was made, run work twice or fail half-way, so a plan whose premises no longer hold is
refused as a whole, with every reason listed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reconciler.core.actions import (
    Bootstrap,
    Destroy,
    Kill,
    Launch,
    Plan,
    Record,
    Rent,
    Requeue,
    ShipCode,
    needs_problems,
)
from reconciler.core.model import AttemptOutcome, Controller, Desired, Instance, InstanceStatus, Observed, split_owned
from reconciler.core.remember import still_held
from reconciler.core.runphase import is_live, is_unfinished

DPH_TOLERANCE = 1e-6


@dataclass(frozen=True)
class SavedPlan:
    """A plan with the settings of the controller it was made by (None: saved by a rigsync before plans carried
    them; the applying controller's stand in)."""

    plan: Plan
    controller: Controller | None = None

    def to_json(self) -> dict[str, Any]:
        doc = self.plan.to_json()
        if self.controller is not None:
            doc["controller"] = controller_to_json(self.controller)
        return doc

    @staticmethod
    def from_json(doc: dict[str, Any]) -> SavedPlan:
        saved = doc.get("controller")
        return SavedPlan(Plan.from_json(doc), controller_from_json(saved) if saved is not None else None)


def controller_to_json(c: Controller) -> dict[str, Any]:
    """A plan's ``controller`` (names only, never a value)."""
    return {
        "cycle_s": c.cycle_s,
        "allowed_secrets": sorted(c.allowed_secrets),
        "env_names": sorted(c.env_names),
        "harvesting": c.harvesting,
    }


def controller_from_json(d: dict[str, Any]) -> Controller:
    return Controller(
        cycle_s=float(d["cycle_s"]),
        allowed_secrets=frozenset(str(n) for n in d["allowed_secrets"]),
        env_names=frozenset(str(n) for n in d["env_names"]),
        harvesting=bool(d["harvesting"]),
    )


def controller_reasons(saved: Controller, applying: Controller) -> list[str]:
    """Why the controller applying a saved plan cannot carry out what the plan was made with: no result store where
    the plan had one (its checkpoint pulls and resumes), or a secret the plan could pass that is no longer allowed or
    set. Another cycle length only moves the budget's horizon, which the caps' own checks cover."""
    reasons: list[str] = []
    if saved.harvesting and not applying.harvesting:
        reasons.append("the plan was made with a result store and this apply has none")
    for name in sorted(saved.allowed_secrets - applying.allowed_secrets):
        reasons.append(f"the plan was made with {name} allowed to sweeps, and this controller does not allow it")
    for name in sorted((saved.env_names & applying.allowed_secrets) - applying.env_names):
        reasons.append(f"the plan was made with {name} set on the controller, and it is not set now")
    return reasons


def _held(observed: Observed) -> list[Instance]:
    """The instances listed, and the held boxes the list dropped that still answer (``remember.still_held``): the
    boxes a plan may act on, as the planner indexed them."""
    vetted = (observed.memory.vetted(p) for p in observed.probes)
    return [*observed.instances, *still_held(observed.unlisted, vetted)]


def _fleet_dph(desired: Desired, observed: Observed) -> float:
    """What the owned boxes cost now, as the planner computed ``fleet_dph_before``."""
    mine, _ = split_owned(_held(observed), desired.fleet.name)
    return sum(inst.dph_total for inst in mine)


def stale_reasons(saved_plan: SavedPlan, desired: Desired, observed: Observed, controller: Controller) -> list[str]:
    """Every reason the saved plan no longer holds for ``desired``, ``observed`` and the ``controller`` applying it
    (empty: apply it exactly)."""
    saved = saved_plan.plan
    reasons = needs_problems(saved.actions, suspended=saved.suspended)  # edited since it was made: not the planner's
    if saved_plan.controller is not None:
        reasons += controller_reasons(saved_plan.controller, controller)
    if saved.desired_commit and desired.commit and saved.desired_commit != desired.commit:
        reasons.append(
            f"desired state moved from {saved.desired_commit[:12]} to {desired.commit[:12]} since the plan was made"
        )
    offers = {o.id: o for o in observed.offers}
    instances = {i.id: i for i in _held(observed)}
    probes = observed.probes_by_id()
    if any(isinstance(a, Rent) for a in saved.actions):
        # The caps were checked against the fleet as it was; if boxes came or went since, they no longer hold.
        now_dph = _fleet_dph(desired, observed)
        if abs(now_dph - saved.fleet_dph_before) > DPH_TOLERANCE:
            reasons.append(
                f"the fleet now costs ${now_dph:.4f}/h, the plan was made when it cost ${saved.fleet_dph_before:.4f}/h"
            )
    succeeded = {h.run_id for h in observed.history if h.phase is AttemptOutcome.SUCCEEDED}
    archived = {h.key for h in observed.history}
    # attempts the plan itself settles (requeue, record, kill) may be relaunched by the same plan
    settled = {(a.run_id, a.attempt) for a in saved.actions if isinstance(a, Requeue | Record | Kill)}
    live: dict[str, str] = {
        f.run_id: f"{f.run_id}.{f.attempt}" for f in observed.memory.in_flight if (f.run_id, f.attempt) not in settled
    }
    busy_gpus: dict[int, set[int]] = {}
    for seen in observed.probes:
        for r in seen.runs:
            if is_unfinished(r) and (r.run_id, r.attempt) not in settled:
                live[r.run_id] = f"{r.run_id}.{r.attempt}"
                if is_live(r):
                    busy_gpus.setdefault(seen.instance_id, set()).update(r.gpu_mask)
        for g in seen.gpus:
            if g.memory_in_use:
                busy_gpus.setdefault(seen.instance_id, set()).add(g.index)
    for action in saved.actions:
        if isinstance(action, Rent):
            offer = offers.get(action.offer_id)
            if offer is None:
                reasons.append(f"offer {action.offer_id} is no longer on the market")
            elif action.bid_dph is not None:
                if offer.min_bid is None or offer.min_bid > action.bid_dph + 1e-9:
                    reasons.append(
                        f"offer {action.offer_id} no longer takes the plan's bid ${action.bid_dph:.4f}/h "
                        f"(minimum now {'none' if offer.min_bid is None else f'${offer.min_bid:.4f}/h'})"
                    )
            elif offer.dph_total > action.dph + 1e-9:
                reasons.append(
                    f"offer {action.offer_id} now costs ${offer.dph_total:.4f}/h, the plan said ${action.dph:.4f}/h"
                )
        elif isinstance(action, Destroy):
            if action.instance_id not in instances:
                reasons.append(f"instance {action.instance_id} is gone")
        elif isinstance(action, Launch | Bootstrap | ShipCode | Kill):
            inst = instances.get(action.instance_id)
            probe = probes.get(action.instance_id)
            if inst is None:
                reasons.append(f"instance {action.instance_id} is gone")
            elif inst.status is not InstanceStatus.RUNNING or probe is None or not probe.reachable:
                reasons.append(f"instance {action.instance_id} is not running and reachable")
        if isinstance(action, Launch):
            if desired.run(action.run_id) is None:
                reasons.append(f"run {action.run_id} is no longer desired")
            if action.run_id in succeeded:
                reasons.append(f"run {action.run_id} has succeeded since the plan was made")
            elif (action.run_id, action.attempt) in archived:
                reasons.append(f"attempt {action.run_id}.{action.attempt} has already run")
            elif action.run_id in live:
                reasons.append(f"run {action.run_id} is already running (attempt {live[action.run_id]})")
            taken = sorted(busy_gpus.get(action.instance_id, set()) & set(action.gpu_mask))
            if taken and not action.queued:  # a queued entry waits behind its slot's current attempt by design
                gpus = ", ".join(str(g) for g in taken)
                reasons.append(f"GPU {gpus} of instance {action.instance_id} is in use now")
    return sorted(set(reasons))
