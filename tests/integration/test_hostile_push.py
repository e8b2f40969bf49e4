"""A hostile push to the fleet repository cannot stop `rigsync run`.

Before issue 10 an escape byte in a sweep's *comment* made the loader raise PyYAML's ReaderError, and the
daemon died on the next cycle. Here a human pushes one commit carrying the inputs that used to crash the loader
(an ESC in a sweep comment, a bidi override in the fleet's comment, a new sweep with a grid parameter ``self``,
another with a 5000-digit seed) while a run of the last valid revision is on a box. The daemon must keep cycling,
``observed/status.yaml`` at the remote must name each problem by file:line:col, and the last valid revision must
keep being acted on: its run finishes and is archived, and nothing of the hostile revision is launched.

The world (emulator, fleet repo, bare remote, `rigsync run` processes) comes from ``test_run_daemon``'s helpers.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_run_daemon import BoxRuns, World, git, log_text, run_ids_by_seed, validate_observed, world_factory
from waiting import wait_for

pytestmark = pytest.mark.integration
__all__ = ["world_factory"]  # the fixture, shared with test_run_daemon

EVIL_SWEEP = 'name: evil\ncommand: "run {{ self }} {{ seed }}"\ngrid: {self: [1]}\nseeds: [1]\n'
HUGE_SWEEP = 'name: huge\ncommand: "run {{ seed }}"\nseeds: [' + "9" * 5000 + "]\n"


def test_hostile_push_is_reported_and_the_last_valid_revision_keeps_going(
    world_factory: Callable[..., World],
) -> None:
    w = world_factory("t-hostile", seeds="1", seconds=6.0)
    ids = run_ids_by_seed(w)
    valid = git(w.work, "rev-parse", "HEAD")
    boxes = BoxRuns(w.emu, w.name).start()
    proc, log = w.start("--interval", "1")
    try:
        wait_for("seed 1 to be launched", lambda: any(n.startswith(ids[1]) for n in boxes.dirs()), 60)
        human = w.clone("human")

        def hostile(clone: Path) -> None:
            sweep = clone / "desired" / "sweeps" / "tdmpc.yaml"
            text = sweep.read_text().replace("seeds: [1]", "seeds: [1, 2, 3]")
            sweep.write_text(text + "# \x1b[31mlooks harmless\x1b[0m\n")
            fleet = clone / "desired" / "fleet.yaml"
            fleet.write_text(fleet.read_text() + "# admin\u202e \u2066nimda\n")
            (clone / "desired" / "sweeps" / "evil.yaml").write_text(EVIL_SWEEP)
            (clone / "desired" / "sweeps" / "huge.yaml").write_text(HUGE_SWEEP)
            git(clone, "add", "desired")

        bad = w.human_push(human, hostile, "sweep: more seeds, and a few bytes nobody sees")
        sweep_lines = (human / "desired" / "sweeps" / "tdmpc.yaml").read_text().splitlines()
        esc_line = len(sweep_lines)
        fleet_line = len((human / "desired" / "fleet.yaml").read_text().splitlines())

        def reported() -> Any:
            st = w.remote_yaml("observed/status.yaml") or {}
            return st if st.get("desired_errors") else None

        status = wait_for("status.yaml to report the hostile desired commit", reported, 30)
        errors = status["desired_errors"]
        assert f"desired/sweeps/tdmpc.yaml:{esc_line}:3: /: control character U+001B ESC" in "\n".join(errors), errors
        assert any(e.startswith(f"desired/fleet.yaml:{fleet_line}:8: /: bidirectional") for e in errors), errors
        assert any(e.startswith("desired/sweeps/evil.yaml:") and "'self'" in e for e in errors), errors
        assert any(e.startswith("desired/sweeps/huge.yaml:3:9:") and "5000 digits" in e for e in errors), errors
        assert not any("internal error" in e for e in errors), errors
        assert status["desired_commit_applied"] == valid
        assert status["last_valid_desired_commit"] == valid
        assert status.get("desired_valid") is False

        # Still cycling on the last valid revision, a few cycles after the push.
        cycles = log_text(log).count("cycle:")
        wait_for("three more cycles", lambda: log_text(log).count("cycle:") >= cycles + 3, 60)
        assert proc.poll() is None, log_text(log)[-3000:]
        wait_for(
            "seed 1 to succeed under the last valid revision",
            lambda: any(r["run_id"] == ids[1] and r["phase"] == "succeeded" for r in w.remote_archive_lines()),
            60,
        )
        assert proc.poll() is None, log_text(log)[-3000:]
        out = log_text(log)
        assert "Traceback" not in out, out[-3000:]
        assert f"desired {bad[:12]} is invalid" in out, out[-3000:]
        assert (w.remote_yaml("observed/status.yaml") or {}).get("desired_commit_applied") == valid
        # Nothing of the hostile revision ran: its seeds 2 and 3 and the evil sweep were never launched.
        boxes.stop()
        assert boxes.run_ids() == {ids[1]}, boxes.dirs()
        assert {r["run_id"] for r in w.remote_archive_lines()} == {ids[1]}
        validate_observed(w)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        boxes.stop()
    w.assert_never_forced()
