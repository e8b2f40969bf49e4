"""Checking that a saved plan still fits the world before applying it exactly.

A plan is reviewed as a value and may be applied later; by then an offer may be rented by someone else or a
box may be gone. Applying it anyway would rent something nobody reviewed or act on a box that is not there,
so a plan whose premises no longer hold is refused as a whole, with every reason listed.
"""

from __future__ import annotations

from reconciler.actions import Bootstrap, Destroy, Kill, Launch, Plan, Rent, ShipCode
from reconciler.model import Desired, InstanceStatus, Observed


def stale_reasons(saved: Plan, desired: Desired, observed: Observed) -> list[str]:
    reasons: list[str] = []
    if saved.desired_commit and desired.commit and saved.desired_commit != desired.commit:
        reasons.append(
            f"desired state moved from {saved.desired_commit[:12]} to {desired.commit[:12]} since the plan was made"
        )
    offers = {o.id: o for o in observed.offers}
    instances = {i.id: i for i in observed.instances}
    probes = observed.probes_by_id()
    for action in saved.actions:
        if isinstance(action, Rent):
            offer = offers.get(action.offer_id)
            if offer is None:
                reasons.append(f"offer {action.offer_id} is no longer on the market")
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
        if isinstance(action, Launch) and desired.run(action.run_id) is None:
            reasons.append(f"run {action.run_id} is no longer desired")
    return sorted(set(reasons))
