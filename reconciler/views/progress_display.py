"""What a long command is waiting for, told as it happens: a live line on a terminal, plain lines otherwise.

`rigsync apply` and `rigsync demo` spend most of their time waiting on the world: a rent, a box booting, its
bootstrap, a launch. Apply reports each action as it starts (``ApplyContext.on_action``, one callback from the apply
layer, set by the caller on ``Reconciler.on_action``); the demo adds the boxes still booting after each cycle. Where
it goes: a ``ProgressDisplay``. On a terminal ``LiveProgress`` rewrites one line in place (carriage return, erase to
end of line) and prints lasting notes above it; anywhere else ``LineProgress`` prints one plain line per change, so a
log or a pipe reads as a list. Machine output never carries it (callers give it stderr when stdout is ``--json``).

Text is made visible (``textsafe.visible``) before it is written: the control characters of the live line are ours
and written to the stream beneath the CLI's escaping wrapper, so a value from the world cannot bring its own.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable
from typing import IO, Protocol

from reconciler.core.actions import Action, Kind
from reconciler.core.model import Instance, InstanceStatus, owns
from reconciler.core.textsafe import visible

_VERB = {
    Kind.RENT: "rent",
    Kind.BOOTSTRAP: "bootstrap",
    Kind.SHIP_CODE: "ship code",
    Kind.LAUNCH: "launch",
    Kind.DRAIN: "drain",
    Kind.DESTROY: "destroy",
    Kind.KILL: "kill",
    Kind.REQUEUE: "requeue",
    Kind.RECORD: "record",
    Kind.NOOP: "no-op",
}
_BOOTING = (InstanceStatus.CREATED, InstanceStatus.LOADING)


def describe(action: Action) -> str:
    """``launch: tdmpc-1234.1 on box 17``: the step an apply is waiting on."""
    return f"{_VERB.get(action.kind, action.kind.value)}: {action.target}"


def booting(instances: Iterable[Instance], fleet: str) -> list[str]:
    """``boot: box 17 (RTX 3060) loading``, one per owned box the provider still starts."""
    return [
        f"boot: box {i.id} ({i.num_gpus}x {i.gpu_name}) {i.status.value}"
        for i in sorted(instances, key=lambda i: i.id)
        if owns(fleet, i.label) and i.status in _BOOTING
    ]


class ProgressDisplay(Protocol):
    def update(self, text: str) -> None:
        """What is being waited for now (replaces the previous update on a terminal)."""

    def note(self, text: str) -> None:
        """A line that stays."""

    def close(self) -> None:
        """End the live line, if any."""


class LineProgress:
    """One plain line per change, through ``write_line`` (``print`` by default): for logs, pipes and CI."""

    def __init__(self, write_line: Callable[[str], None] = print) -> None:
        self.write_line = write_line
        self._last = ""

    def update(self, text: str) -> None:
        if text != self._last:
            self.write_line(text)
            self._last = text

    def note(self, text: str) -> None:
        self.write_line(text)

    def close(self) -> None:
        self._last = ""


class LiveProgress:
    """One line rewritten in place on a terminal (``\\r`` + erase to end of line), notes printed above it."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = getattr(stream, "inner", stream)  # beneath the CLI's SafeStream: the \r and ESC are ours
        self._shown = False

    def _width(self) -> int:
        return max(20, shutil.get_terminal_size((100, 24)).columns - 1)

    def update(self, text: str) -> None:
        line = visible(text)[: self._width()]
        self.stream.write(f"\r{line}\x1b[K")
        self.stream.flush()
        self._shown = True

    def note(self, text: str) -> None:
        if self._shown:
            self.stream.write("\r\x1b[K")
            self._shown = False
        self.stream.write(visible(text, block=True) + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._shown:
            self.stream.write("\n")
            self.stream.flush()
            self._shown = False


def progress_for(stream: IO[str], write_line: Callable[[str], None] | None = None) -> ProgressDisplay:
    """``LiveProgress`` when ``stream`` is a terminal, else ``LineProgress`` (writing to ``stream``, or
    ``write_line`` when given)."""
    isatty = getattr(stream, "isatty", None)
    if callable(isatty) and isatty():
        return LiveProgress(stream)
    if write_line is None:
        def write_line(text: str) -> None:
            print(text, file=stream, flush=True)
    return LineProgress(write_line)
