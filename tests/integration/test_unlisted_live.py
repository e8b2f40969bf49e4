"""A box the instance list hides while it runs is unlisted, not vanished (issue 33), on real parts: the emulator's
boxes are sshd hosts reached at their remembered addresses with their pinned host keys, the provider is the real
vastai SDK behind ``VastProvider``, the fleet a real git repo.

While both runs of the sweep are running, the list first hides one of the two boxes (the plan keeps it, says
``box_unlisted``, and rents, requeues and destroys nothing for it), then both (most of the fleet: the list is not
believed, ``list_implausible``, and the plan acts on nothing). When the list tells the truth again the sweep finishes
with each run succeeding once, on the boxes rented before: no attempt was lost, no box was rented twice.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import world
from test_reconcile import SWEEP, TIMEOUTS, drive, owned_alive, successes

from reconciler.adapters.archive import ShardedRunArchive
from reconciler.cli._common import load_local_desired, open_reconciler
from reconciler.core.actions import ReasonCode
from reconciler.core.model import AttemptOutcome
from reconciler.emulator import Emulator
from reconciler.loop import CycleResult

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

FLEET = "itunlisted"
CYCLES_HIDDEN = 3  # cycles with one box hidden, then as many with both


class Hider:
    """Hides one busy box, then both, for ``CYCLES_HIDDEN`` cycles each, once both runs are seen live; keeps what the
    plans of those cycles said and did."""

    def __init__(self, emu: Emulator) -> None:
        self.emu = emu
        self.boxes: list[int] = []
        self.cycles = 0
        self.codes: list[set[ReasonCode]] = []
        self.acted: list[str] = []

    def __call__(self, res: CycleResult) -> None:
        if self.boxes and self.cycles <= 2 * CYCLES_HIDDEN:
            self.codes.append({n.code for n in res.plan.noops})
            self.acted += [f"{a.kind.value} {a.target}" for a in res.plan.actions]
        if not self.boxes:
            probes = res.observed.probes
            busy = [p.instance_id for p in probes if any(r.pid_alive and r.exit_code is None for r in p.runs)]
            if len(busy) == 2:
                self.boxes = sorted(busy)
                self.emu.hide(self.boxes[0])
            return
        self.cycles += 1
        if self.cycles == CYCLES_HIDDEN:
            self.emu.hide(self.boxes[1])
        elif self.cycles == 2 * CYCLES_HIDDEN:
            for iid in self.boxes:
                self.emu.unhide(iid)


def test_a_hidden_box_that_answers_keeps_its_run_and_a_list_hiding_the_fleet_is_not_believed(
    emulator: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VAST_API_KEY", emulator.api_key)
    fleet = world.fleet_repo(tmp_path / "fleet")
    # no box-side queue: each run waits for a box of its own, so both boxes are busy at once
    fleet.edit_fleet(name=FLEET, queue_ahead="0s", **TIMEOUTS)
    fleet.write("desired/sweeps/tdmpc.yaml", SWEEP.format(seconds=30.0))
    fleet.commit(f"test: fleet {FLEET}, two runs, no queue", push=False)
    repo = fleet.work
    desired = load_local_desired(repo)
    rec = open_reconciler(repo, desired, str(tmp_path / "state"), emulator.url)
    hider = Hider(emulator)
    try:
        drive(rec, desired, emulator, hider)
    finally:
        rec.shell.close()
        for iid in owned_alive(emulator, FLEET):
            emulator.destroy_instance(iid)

    assert len(hider.boxes) == 2, "both runs were never seen live at once"
    assert hider.cycles >= 2 * CYCLES_HIDDEN, "the sweep ended before the list told the truth again"
    one, both = hider.codes[1:CYCLES_HIDDEN], hider.codes[CYCLES_HIDDEN + 1:2 * CYCLES_HIDDEN]
    assert one and all(ReasonCode.BOX_UNLISTED in c and ReasonCode.LIST_IMPLAUSIBLE not in c for c in one)
    assert both and all(ReasonCode.LIST_IMPLAUSIBLE in c for c in both)
    assert not [a for a in hider.acted if a.split()[0] in ("rent", "destroy", "requeue", "kill")], hider.acted
    records = list(ShardedRunArchive(repo).records())
    assert not [r for r in records if r.phase is AttemptOutcome.LOST], "an attempt on a hidden box was taken for lost"
    assert successes(records) == {r.id: 1 for r in desired.runs}
    created = [e for e in emulator.ledger.events if e["type"] == "create"]
    assert len(created) == 2, "no box was rented to replace a hidden one"
