"""observe.update_box_memory: the per-box clocks the planner reads (unreachable_since, bootstrap_since)."""

from __future__ import annotations

from reconciler.model import BoxMemory, BoxProbe, Instance, InstanceStatus
from reconciler.observe import update_box_memory

T = 1_000_000.0
BOX = Instance(1, "rigsync:lab:abc-1", InstanceStatus.RUNNING, "RTX 3090", 1, 24576, 0.2, T - 600)


def test_bootstrap_since_starts_when_the_box_answers_without_it_and_ends_when_it_is_done() -> None:
    missing = BoxProbe(1, reachable=True, bootstrap_running=("h1",))
    first = update_box_memory((), [BOX], [missing], T, "h1")
    assert first == (BoxMemory(1, first_seen_at=T, bootstrap_since=T),)
    # still missing: the clock keeps its start; unreachable for a cycle: it keeps running too
    assert update_box_memory(first, [BOX], [missing], T + 60, "h1")[0].bootstrap_since == T
    dark = update_box_memory(first, [BOX], [BoxProbe(1, reachable=False)], T + 90, "h1")[0]
    assert (dark.bootstrap_since, dark.unreachable_since) == (T, T + 90)
    done = update_box_memory(first, [BOX], [BoxProbe(1, reachable=True, bootstrap_hashes=("h1",))], T + 120, "h1")
    assert done[0].bootstrap_since is None
    # a fleet without a bootstrap never starts the clock
    assert update_box_memory((), [BOX], [missing], T, "")[0].bootstrap_since is None
