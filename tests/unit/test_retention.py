"""fleet.yaml's ``retention:`` block: what the result store keeps (``Fleet.keep_checkpoints``, ``keep_harvests_s``)."""

from __future__ import annotations

from pathlib import Path

from reconciler.desired import load_desired, read_desired_files

REPO = Path(__file__).resolve().parents[2]


def fleet_with(retention: str) -> dict[str, bytes]:
    files = read_desired_files(REPO)
    text = files["desired/fleet.yaml"].decode()
    files["desired/fleet.yaml"] = (text.rstrip("\n") + "\n" + retention).encode()
    return files


def test_without_retention_two_checkpoints_are_kept_and_harvests_for_ever() -> None:
    fleet = load_desired(read_desired_files(REPO)).fleet
    assert (fleet.keep_checkpoints, fleet.keep_harvests_s) == (2, None)


def test_retention_sets_the_checkpoints_kept_and_how_long_harvests_stay() -> None:
    fleet = load_desired(fleet_with("retention:\n  checkpoints: 5\n  harvests_for: 30d\n")).fleet
    assert (fleet.keep_checkpoints, fleet.keep_harvests_s) == (5, 30 * 86400.0)
    fleet = load_desired(fleet_with("retention: {harvests_for: 12h}\n")).fleet
    assert (fleet.keep_checkpoints, fleet.keep_harvests_s) == (2, 12 * 3600.0)
