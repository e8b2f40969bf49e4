"""Reading launch's answer: the attempt's process group as the box reported it when rigsync started it.

``launch.sh`` prints one line ``PID START``: the wrapper's pid (it leads its own session, so it is the group's id)
and its start time in clock ticks since boot (``/proc/<pid>/stat`` field 22). The controller records both
(``InFlight.pid``/``pid_started``) and a kill later signals that group only while the pid still has that start
time (``kill.sh``). The answer comes from a stranger's machine, so this is a pure total parser: any bytes give a
pid that can be a group's (an integer > 1 and below the kernel's pid limit) or None, and a start tick (an integer
>= 0) or None; it never raises. A pid of 0, 1 or below is never a value here, so ``kill -- -1`` cannot follow from
it.
"""

from __future__ import annotations

from dataclasses import dataclass

from reconciler.core.bounds import COMMAND_STDOUT_BYTES

__all__ = ["PID_LIMIT", "START_DIGITS", "Launched", "launch_answer", "parse_launch_answer", "valid_pid", "valid_start"]

PID_LIMIT = 1 << 22  # the kernel's largest pid_max (PID_MAX_LIMIT on 64-bit): a pid is below it
START_DIGITS = 20  # a start tick fits a 64-bit counter: at most 20 decimal digits


def valid_pid(value: object) -> int | None:
    """``value`` when it is an int (not bool) that can name a process group of ours: > 1 and < ``PID_LIMIT``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 < value < PID_LIMIT:
        return None
    return value


def valid_start(value: object) -> int | None:
    """``value`` when it is an int (not bool) >= 0 that fits a 64-bit tick counter."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 64:
        return None
    return value


def _digits(word: bytes, most: int) -> int | None:
    if not 0 < len(word) <= most or not word.isdigit():
        return None
    return int(word)


def parse_launch_answer(stdout: bytes) -> tuple[int | None, int | None]:
    """(pid, start tick) from launch's stdout: its last non-empty line, ``PID`` or ``PID START``; None for what is
    not valid (a start is kept only beside a valid pid)."""
    lines = [line for line in stdout[-COMMAND_STDOUT_BYTES:].splitlines() if line.strip()]
    if not lines:
        return None, None
    words = lines[-1].split()
    if not 1 <= len(words) <= 2:
        return None, None
    pid = valid_pid(_digits(words[0], 7))
    if pid is None:
        return None, None
    start = valid_start(_digits(words[1], START_DIGITS)) if len(words) == 2 else None
    return pid, start


@dataclass(frozen=True)
class Launched:
    """A launch's answer, read (``BoxControl.launch``): the process group a kill may signal, as the box reported it
    when it started the attempt, its pid with that pid's start tick or neither (a pid alone cannot tell its process
    from a later one); for a queue entry, whether the box said it queued it (the box starts it when its slot frees,
    and its identity comes with the probe that sees it started)."""

    pid: int | None = None
    pid_started: int | None = None
    queued: bool = False


def launch_answer(stdout: bytes) -> Launched:
    """A started launch's stdout as its process group (``parse_launch_answer``): a pid and its start tick, or
    neither."""
    pid, started = parse_launch_answer(stdout)
    return Launched(pid, started) if pid is not None and started is not None else Launched()
