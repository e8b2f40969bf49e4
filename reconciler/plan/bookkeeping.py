"""Bookkeeping: the checkpoints due to come home, and the bills of ended boxes due to close.

Neither changes the world, but each is a decision, so each is made here and apply only executes it:

- a running attempt of a sweep with a ``checkpoint`` has it pulled home when it was last pulled ``every`` ago (or
  never), on a box that answered this cycle and that this plan does not destroy, unless this plan settles the
  attempt (a killed or requeued attempt's checkpoint comes home with its harvest);
- a box gone from the provider's list whose bill is final (``BoxSpend.bill_final``) has its overhead line
  archived: its bill minus the costs of its attempts. Its attempts still in flight are requeued by this same plan
  and archived first (``APPLY_ORDER``); should one of them fail, apply leaves the bill open for the next cycle.
"""

from __future__ import annotations

from collections.abc import Mapping

from reconciler.actions import CloseBill, ReasonCode, SyncCheckpoint
from reconciler.plan.common import Decisions, fmt_duration
from reconciler.plan.world import World
from reconciler.runphase import is_live

AttemptKey = tuple[str, int]


def sync_checkpoints(world: World, settled: frozenset[AttemptKey], destroyed: Mapping[int, str]) -> Decisions:
    out = Decisions()
    if not world.observed.harvesting:
        return out  # no result store: nothing comes home, checkpoints neither
    pulled = {(r, a): t for r, a, t in world.observed.memory.checkpoint_pulls}
    for box_id, box in world.boxes.items():
        if not box.reachable or box.probe is None or box_id in destroyed:
            continue
        for rd in box.probe.runs:
            key = (rd.run_id, rd.attempt)
            if not is_live(rd) or key in settled or key in world.archived:
                continue
            spec = world.runs.get(rd.run_id)
            sweep = spec.sweep if spec is not None else None
            if sweep is None or sweep.checkpoint is None:
                continue
            last = pulled.get(key)
            if last is not None and world.now - last < sweep.checkpoint.every_s:
                continue
            why = "never pulled" if last is None else f"last pulled {fmt_duration(world.now - last)} ago"
            out.act(
                SyncCheckpoint(
                    reason=f"checkpoint every {fmt_duration(sweep.checkpoint.every_s)}: {why}",
                    code=ReasonCode.CHECKPOINT_DUE,
                    instance_id=box_id,
                    run_id=rd.run_id,
                    attempt=rd.attempt,
                    path=sweep.checkpoint.path,
                )
            )
    return out


def close_bills(world: World) -> Decisions:
    out = Decisions()
    for box in world.observed.memory.spend.boxes:
        if not box.bill_final(box.at):
            continue
        reason = f"box ended: billed ${box.usd:.6f}{box.estimate_note}"
        out.act(CloseBill(reason=reason, code=ReasonCode.BILL_FINAL, instance_id=box.instance_id))
    return out
