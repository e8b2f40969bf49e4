"""``Placement.slot_free_s``: what renting is told of each busy slot after this plan's queue (renting waits for a
held GPU that frees before a new box is ready). Read off the plan of a case world, as renting receives it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from plan_case_io import load_case

import reconciler.plan as planner
from reconciler.plan import plan

CASES = Path(__file__).parent / "plan_cases"


def _slots(name: str, monkeypatch: pytest.MonkeyPatch) -> tuple[tuple[int, tuple[int, ...], float], ...]:
    seen: list[Any] = []
    real = planner.rent_for

    def spy(*args: Any, **kw: Any) -> Any:
        seen.append(kw["slots"])
        return real(*args, **kw)

    monkeypatch.setattr(planner, "rent_for", spy)
    case = load_case(CASES / f"{name}.json")
    plan(case.desired, case.observed, case.controller, case.now)
    (slots,) = seen
    return tuple(slots)


def test_each_busy_slot_is_free_after_its_current_attempt_and_its_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    # GPU 0: r1's 60 s left + r3, r5, r7 (2 min each); GPU 1: r2's 100 s left + r4, r6
    assert _slots("queue_ahead_fills_busy_slots", monkeypatch) == ((1, (0,), 420.0), (1, (1,), 340.0))


def test_the_boxs_own_queue_counts_and_a_draining_box_has_no_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    # r1's 5 min left + r2's 10 min waiting in the box's queue
    assert _slots("queued_attempt_waits", monkeypatch) == ((1, (0,), 900.0),)
    assert _slots("queue_not_on_draining_box", monkeypatch) == ()
