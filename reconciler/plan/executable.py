"""The last phase: each action carries what apply needs to carry it out, so a plan is a complete value.

apply reads no fleet setting and decides nothing: what the deciding phases leave open is filled in here, from the
same inputs. A bootstrap carries its pool's script and its bootstrap cache (the key on that box, the paths, how
long the upload URL must live); a code shipment the paths it ships; a requeue whether its box is contacted (listed,
and it answered its probe) or why not; every action whose harvest may sync a checkpoint how many syncs the store
keeps. A rent's onstart is built where the rent is decided (``plan.renting``); the needs between actions are named
when the plan is finished (``actions.with_needs``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from reconciler.core.actions import Action, Bootstrap, Kill, Record, Requeue, ShipCode, SyncCheckpoint, closed
from reconciler.core.identity import box_cache_key, slot_pool
from reconciler.core.model import BoxProbe, Desired, Fleet, Instance, Observed, Ownership, Pool

# A bootstrap cache's upload URL is used after the script, which may take up to the fleet's bootstrap_timeout, plus
# this much for packing (the store clamps it to what SigV4 allows).
CACHE_UPLOAD_MARGIN_S = 900.0


def executable(desired: Desired, observed: Observed, actions: Sequence[Action]) -> list[Action]:
    """``actions``, each with what apply needs of the fleet and the observation to carry it out."""
    listed = {i.id: i for i in observed.instances}
    return [_executable(desired, observed, listed, a) for a in actions]


def _executable(desired: Desired, observed: Observed, listed: Mapping[int, Instance], planned: Action) -> Action:
    action = closed(planned)
    keep = desired.fleet.keep_checkpoints
    match action:
        case Bootstrap():
            box = listed.get(action.instance_id)
            return _bootstrap(desired.fleet, box, action) if box is not None else action
        case ShipCode():
            return replace(action, paths=desired.code_paths())
        case Requeue():
            unreached = _unreached(observed.probe(action.instance_id), action.instance_id in listed)
            return replace(action, unreached=unreached, keep_checkpoints=keep)
        case Kill() | Record() | SyncCheckpoint():
            return replace(action, keep_checkpoints=keep)
        case _:
            return action


def _bootstrap(fleet: Fleet, box: Instance, action: Bootstrap) -> Bootstrap:
    """The bootstrap with its pool's script, and its cache on that box when the pool declares one."""
    pool = _bootstrap_pool(fleet, box, action.script_hash)
    if pool is None:
        return action
    key = box_cache_key(pool, box)
    return replace(
        action, script=pool.bootstrap_script, cache_key=key, cache_paths=pool.bootstrap_cache if key else (),
        cache_upload_ttl_s=fleet.bootstrap_timeout_s + CACHE_UPLOAD_MARGIN_S if key else 0.0,
    )


def _bootstrap_pool(fleet: Fleet, box: Instance, script_hash: str) -> Pool | None:
    """The pool whose bootstrap ``script_hash`` is: the box's own (its label's), else the first with that script."""
    own = Ownership.parse(box.label)
    pool = fleet.pool(slot_pool(fleet, own.slot)) if own is not None else None
    if pool is not None and pool.bootstrap_hash == script_hash:
        return pool
    return next((p for p in fleet.pools if p.bootstrap_hash == script_hash), None)


def _unreached(probe: BoxProbe | None, listed: bool) -> str | None:
    """Why a requeue does not contact the attempt's box (None: it is listed and answered its probe, as the box
    answered it: a box the planner distrusts is contacted too)."""
    if listed and probe is not None and probe.reachable:
        return None
    if probe is not None and probe.host_key_changed:
        return "host key changed, not contacted"
    return "box unreachable" if listed else "box vanished"
