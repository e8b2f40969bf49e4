"""Bookkeeping: the checkpoints due to come home, and the bills of ended boxes due to close.

Neither changes the world, but each is a decision, so each is made here and apply only executes it:

- a running attempt this fleet launched on its box (``World.ours``: a run directory no launch of ours made there is
  foreign, and nothing of it comes home) of a sweep with a ``checkpoint`` has it pulled home when it was last
  pulled ``every`` ago (or never), on a box that answered this cycle and that this plan does not destroy, unless
  this plan settles the attempt (a killed or requeued attempt's checkpoint comes home with its harvest);
- a running attempt on a box whose contract ends within ``contract_margin`` (``reconciler.core.contract.ending``) has
  its checkpoint pulled home once more inside that window, whatever ``every`` says (``CONTRACT_ENDING``): it is
  then ended as preempted (``attempts.settle_live``) and resumes elsewhere from that pull (``contract_pull_due``);
- a box gone from the provider's list whose bill is final (``BoxSpend.bill_final``) has its overhead line
  archived: its bill minus the costs of its attempts. Its attempts still in flight are requeued by this same plan
  and archived first (``APPLY_ORDER``); should one of them fail, apply leaves the bill open for the next cycle.
"""

from __future__ import annotations

from collections.abc import Mapping

from reconciler.core import contract
from reconciler.core.actions import CloseBill, ReasonCode, SyncCheckpoint
from reconciler.core.model import RunDirState
from reconciler.plan.common import Decisions, fmt_duration
from reconciler.plan.world import OwnedBox, World

AttemptKey = tuple[str, int]


def contract_ending(world: World, box: OwnedBox) -> bool:
    """Whether a rented box's contract ends within the fleet's ``contract_margin`` (its work is moved before)."""
    accepted = world.observed.memory.accepted_increases
    return box.rented and contract.ending(box.inst, world.now, world.desired.fleet.contract_margin_s, accepted)


def contract_pull_due(world: World, box: OwnedBox, rd: RunDirState) -> bool:
    """Whether a live attempt on a box whose contract is ending has its checkpoint to pull home before it is moved:
    its sweep has a checkpoint, a result store takes it, and it was not pulled since the margin's window began."""
    spec = world.runs.get(rd.run_id)
    if spec is None or spec.sweep.checkpoint is None or not world.controller.harvesting:
        return False
    end = contract.box_end(box.inst, world.observed.memory.accepted_increases)
    if end is None:
        return False
    window = end - world.desired.fleet.contract_margin_s
    pulled = [p.at for p in world.observed.memory.checkpoint_pulls if p.key == (rd.run_id, rd.attempt)]
    return not pulled or max(pulled) < window


def sync_checkpoints(world: World, settled: frozenset[AttemptKey], destroyed: Mapping[int, str]) -> Decisions:
    """The checkpoint pulls due: of the live attempts this fleet launched (``World.ours``: a run directory no launch
    of ours made on that box is never pulled, whatever run it names), not settled by this plan, on a box that
    answered and that this plan does not destroy."""
    out = Decisions()
    if not world.controller.harvesting:
        return out  # no result store: nothing comes home, checkpoints neither
    pulled = {p.key: p.at for p in world.observed.memory.checkpoint_pulls}
    for box_id, ours in world.ours.items():
        box = world.boxes[box_id]
        if box_id in destroyed:
            continue
        for rd in (a.run_dir for a in ours if a.live):
            key = (rd.run_id, rd.attempt)
            if key in settled:
                continue
            spec = world.runs.get(rd.run_id)
            sweep = spec.sweep if spec is not None else None
            if sweep is None or sweep.checkpoint is None:
                continue
            last = pulled.get(key)
            if contract_ending(world, box) and contract_pull_due(world, box, rd):
                left = contract.time_left(box.inst, world.now, world.observed.memory.accepted_increases) or 0.0
                out.act(
                    SyncCheckpoint(
                        reason=f"its box's contract ends in {fmt_duration(left)} (contract_margin "
                        f"{fmt_duration(world.desired.fleet.contract_margin_s)}): checkpoint pulled home before the "
                        "attempt is moved",
                        code=ReasonCode.CONTRACT_ENDING,
                        instance_id=box_id,
                        run_id=rd.run_id,
                        attempt=rd.attempt,
                        path=sweep.checkpoint.path,
                    )
                )
                continue
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
