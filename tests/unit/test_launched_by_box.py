"""The one join of what boxes report with what this fleet launched (``runphase.launched_by_box``)."""

from __future__ import annotations

from reconciler.core.model import BoxProbe, InFlight, RunDirState
from reconciler.core.runphase import launched_by_box

NOW = 1_000_000.0


def run_dir(run_id: str, attempt: int = 1, *, alive: bool = True, exit_code: int | None = None) -> RunDirState:
    return RunDirState(run_id, attempt, (0,), alive, NOW - 60, heartbeat_age_s=1.0, exit_code=exit_code)


def flight(run_id: str, instance_id: int, attempt: int = 1) -> InFlight:
    return InFlight(run_id, attempt, instance_id, (0,), NOW - 60)


def test_only_a_launch_of_this_fleet_on_that_very_box_counts() -> None:
    box1 = BoxProbe(1, reachable=True, runs=(run_dir("ours"), run_dir("never"), run_dir("elsewhere")))
    box2 = BoxProbe(2, reachable=True, runs=(run_dir("ours", 2), run_dir("ended", exit_code=0)))
    flights = [flight("ours", 1), flight("elsewhere", 3), flight("ended", 2)]
    got = launched_by_box([box1, box2], flights)
    assert {box: [(a.run_dir.run_id, a.run_dir.attempt) for a in ours] for box, ours in got.items()} == {
        1: [("ours", 1)],  # "never" was launched nowhere, "elsewhere" on another box: foreign here
        2: [("ended", 1)],  # ours.2 is an attempt never launched; an ended attempt of ours is still ours
    }
    assert [a.live for a in got[2]] == [False] and got[1][0].launch == flights[0]


def test_archived_attempts_and_boxes_that_do_not_answer_show_nothing_of_ours() -> None:
    shown = (run_dir("r"),)
    flights = [flight("r", 1)]
    assert launched_by_box([BoxProbe(1, reachable=True, runs=shown)], flights, {("r", 1)}) == {}
    # a distrusted box is vetted unreachable, its claims kept beside: none of them is taken
    assert launched_by_box([BoxProbe(1, reachable=False, runs=shown, unusable="distrusted")], flights) == {}
