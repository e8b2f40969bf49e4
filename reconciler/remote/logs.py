"""Reading an attempt's log on its box, for ``rigsync logs``: the command (``read_log.sh``) and its answer.

The wrapper (``wrapper.sh``) writes the command's output to ``stdout.log`` and ``stderr.log`` in the attempt's run
directory and records ``exit_code`` once the command ended; the harvest keeps the same file names in the local
store (``adapters.store.attempt_dir``). ``read_log_script`` asks for a slice of one of them from a byte offset
(or the last lines), bounded in size so a large log comes home in pieces and ``--follow`` can poll for new bytes;
``parse_log_slice`` turns the answer into a ``LogSlice``. Pure: no I/O beyond reading the package's script.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from reconciler.core.bounds import bounded_text
from reconciler.core.model import run_dir_name
from reconciler.errors import RemoteCommandFailed
from reconciler.remote.commands import NO_SUCH_RUN_EXIT, _check_name, _command

EXIT_CODE_FILE = "exit_code"
MAX_SLICE_BYTES = 1 << 20  # one answer carries at most this much of a log
# --tail N: the last lines are looked for in, and printed from, at most the log's last this many bytes: a tail is
# bounded in bytes as well as lines (16 MiB of NULs without a newline printed 64 MiB of escapes)
TAIL_WINDOW_BYTES = 1 << 20


class LogStream(enum.StrEnum):
    """Which of an attempt's two logs; the value is its file name in the run directory (on the box and in the store)."""

    STDOUT = "stdout.log"
    STDERR = "stderr.log"


@dataclass(frozen=True)
class LogSlice:
    """Bytes ``[start, end)`` of a log whose size was ``size`` when read, and what the attempt's directory said then.

    ``exit_code`` is set once the attempt ended (then ``size`` is final); ``wrapper_alive`` is None before the
    wrapper recorded its pid, False once it is gone (with no exit code: it died, or its box rebooted).
    """

    data: bytes
    start: int
    end: int
    size: int
    exit_code: int | None
    wrapper_alive: bool | None

    @property
    def ended(self) -> bool:
        return self.exit_code is not None


# the first such line: a login banner or a chatty .bashrc may print before it, the log's own bytes only after it.
# Bounded digits: a byte offset fits in 19, an exit code in 10 (anything longer is not an answer of read_log.sh).
_HEADER = re.compile(rb"(?m)^rigsync-log (-|-?\d{1,10}) (-|0|1) (\d{1,19}) (\d{1,19}) (\d{1,19})\n")


def read_log_script(
    run_id: str, attempt: int, stream: LogStream, *, offset: int = 0, max_bytes: int = MAX_SLICE_BYTES,
    last_lines: int | None = None,
) -> str:
    """The command printing a ``LogSlice`` of one attempt's log: from ``offset``, or its last ``last_lines`` lines.

    Exits ``NO_SUCH_RUN_EXIT`` when the box has no such run directory.
    """
    name = _check_name("run directory", run_dir_name(run_id, attempt))
    lines = -1 if last_lines is None else max(0, int(last_lines))
    return _command(
        "read_log.sh", name, stream.value, str(max(0, int(offset))), str(max(1, int(max_bytes))), str(lines),
        str(NO_SUCH_RUN_EXIT), str(TAIL_WINDOW_BYTES),
    )


def parse_log_slice(stdout: bytes) -> LogSlice:
    """The answer of ``read_log_script``. Total: any other answer (a header that is not one, bytes that do not
    match it, a slice past ``MAX_SLICE_BYTES`` or past the size it names) is ``RemoteCommandFailed``, whose message
    shows the answer's start escaped and bounded; no other exception leaves it."""
    m = _HEADER.search(stdout[: 64 << 10])  # a banner longer than this is no login banner
    if m is None:
        head = bounded_text(stdout[:80].decode("utf-8", "replace"), 120)
        raise RemoteCommandFailed(f"unexpected answer from the log reader: {head!r}")
    code, alive, start, end, size = (g.decode() for g in m.groups())
    data = stdout[m.end():]
    first, last, total = int(start), int(end), int(size)
    if first + len(data) != last:
        raise RemoteCommandFailed(f"the log reader sent {len(data)} bytes for [{start}, {end})")
    if last > total or len(data) > MAX_SLICE_BYTES:
        raise RemoteCommandFailed(f"the log reader sent [{start}, {end}) of a log of {size} bytes")
    return LogSlice(
        data=data,
        start=first,
        end=last,
        size=total,
        exit_code=None if code == "-" else int(code),
        wrapper_alive=None if alive == "-" else alive == "1",
    )
