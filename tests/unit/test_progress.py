"""views.progress_display: plain lines off a terminal, one live line on a terminal (a real pty), and the apply hook."""

from __future__ import annotations

import io
import os
import pty

from fakes import (
    FakeClock,
    FakeWorld,
    desired_state,
    fake_reconciler,
    offer,
)

from reconciler.core.actions import Action
from reconciler.core.textsafe import SafeStream
from reconciler.views.progress_display import LineProgress, LiveProgress, booting, describe, progress_for


def test_off_a_terminal_each_change_is_one_plain_line() -> None:
    stream = io.StringIO()
    progress = progress_for(stream)
    assert isinstance(progress, LineProgress)
    for text in ("rent: offer/1", "rent: offer/1", "boot: box 7 loading", "launch: run/r0.1@7"):
        progress.update(text)
    progress.note("chaos: a box vanished")
    progress.close()
    assert stream.getvalue().splitlines() == [
        "rent: offer/1", "boot: box 7 loading", "launch: run/r0.1@7", "chaos: a box vanished"
    ]
    assert "\r" not in stream.getvalue() and "\x1b" not in stream.getvalue()


def _drain(master: int) -> bytes:
    """Everything written to the pty, once its other end is closed (Linux then reports EIO)."""
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            return out
        if not chunk:
            return out
        out += chunk


def test_on_a_terminal_one_line_is_rewritten_in_place() -> None:
    master, slave = pty.openpty()
    try:
        with os.fdopen(slave, "w", closefd=False) as tty:
            wrapped = SafeStream(tty)  # as the CLI wraps stderr: the live line's controls go beneath it
            progress = progress_for(wrapped)
            assert isinstance(progress, LiveProgress)
            progress.update("rent: offer/1")
            progress.update("bootstrap: instance/7 \x1b]8;;evil\x07")  # a value from the world brings its own ESC
            progress.note("kept line")
            progress.update("launch: run/r0.1@7")
            progress.close()
        os.close(slave)
        out = _drain(master).decode()
    finally:
        os.close(master)
    assert out.startswith("\rrent: offer/1\x1b[K\rbootstrap: instance/7 \\x1b]8;;evil\\x07\x1b[K")
    assert "\r\x1b[Kkept line\r\n" in out  # the live line is cleared, the note stays (the pty adds \r to \n)
    assert out.endswith("\rlaunch: run/r0.1@7\x1b[K\r\n")
    assert out.count("\x1b") == 4  # ours only (three updates, one clear); the evil one arrives escaped


def test_apply_tells_each_action_as_it_starts_and_boot_is_what_the_provider_still_starts() -> None:
    desired = desired_state(2, max_instances=1)
    world = FakeWorld([offer(1, gpus=2, dph=0.2)], clock=FakeClock())
    seen: list[str] = []
    rec = fake_reconciler(world)

    def told(action: Action) -> None:
        seen.append(describe(action))

    rec.on_action = told
    boots: list[str] = []
    for _ in range(12):
        res = rec.cycle(desired)
        boots += booting(res.observed.instances, desired.fleet.name)
        world.clock.advance(20.0)
    kinds = [s.split(":")[0] for s in seen]
    assert kinds.index("rent") < kinds.index("launch"), seen
    assert any(s.startswith("boot: box ") and s.endswith("loading") for s in boots), boots
