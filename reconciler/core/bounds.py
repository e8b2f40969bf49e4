"""How much of a rented box's word the controller takes: byte bounds per source, and the checks of its values.

A box is a stranger's machine: everything it sends back (the probe's document, nvidia-smi's numbers, a run's
metrics, logs, harvest manifests) is untrusted input. Each source is read under the byte bound named here, and
never past it; each value read from it passes one of the checks below before it is stored or compared. These are
the one home of those bounds and checks: parsers (``remote.parse``, ``remote.logs``, ``curves``), the planner
and writers (``observed``, ``views``) import them and never restate a number.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from reconciler.core.textsafe import visible

__all__ = [
    "COMMAND_STDERR_BYTES",
    "COMMAND_STDOUT_BYTES",
    "EXIT_CODE_RANGE",
    "HARVEST_CAP_BYTES",
    "MANIFEST_BYTES",
    "MAX_ATTEMPT",
    "MAX_EPOCH",
    "MAX_GPUS",
    "MAX_GPU_MEMORY_MIB",
    "MAX_HARVEST_FILES",
    "MAX_HARVEST_MEMBERS",
    "MAX_JSON_DEPTH",
    "MAX_LIST_ENTRIES",
    "MAX_METRIC_ABS",
    "MAX_METRIC_KEYS",
    "MAX_NOTE_CHARS",
    "MAX_OMITTED_RUNS",
    "MAX_PROBE_RUNS",
    "MAX_QUEUE_ENTRIES",
    "MAX_REJECTED",
    "MAX_REPORTED_CLAIMS",
    "MAX_TEXT_CHARS",
    "METRICS_FILE_BYTES",
    "METRICS_LINE_BYTES",
    "PROBE_STDOUT_BYTES",
    "TIME_WINDOW_S",
    "bounded_block",
    "bounded_int",
    "bounded_text",
    "clamp_time",
    "finite",
    "json_depth",
    "strict_json",
]

PROBE_STDOUT_BYTES = 1 << 20  # the probe's whole answer; an honest one is a few KiB per run directory
COMMAND_STDOUT_BYTES = 64 << 10  # launch, kill, bootstrap, ship-code, stage-resume: each prints a line or two
COMMAND_STDERR_BYTES = 64 << 10  # every command's stderr: only its tail is kept past this
MAX_JSON_DEPTH = 16  # nesting of any JSON document from a box (the probe's is 4 deep)
MAX_PROBE_RUNS = 1024  # run directories one probe may report (the box reports its newest first)
MAX_OMITTED_RUNS = 10**9  # run directories a probe may say it left out (``runs_omitted``)
MAX_QUEUE_ENTRIES = 256  # queue entries one probe may report (all slots); past it, the first are read, the rest refused
MAX_EPOCH = 10**18  # a lease epoch a box reports as its fence: an integer in [0, this)
MAX_GPUS = 64  # GPU entries one probe may report; the instance's listed count caps it further
MAX_REPORTED_CLAIMS = 8  # foreign run directories and refused claims reported one by one per box; the rest counted
MAX_TEXT_CHARS = 512  # any one string from a box that is stored (ids, commits, metric keys, reasons, errors)
METRICS_LINE_BYTES = 64 << 10  # one line of a metrics.jsonl; a longer line is unusable, not read into memory
# a harvested metrics.jsonl read for its curve: a second or so of parsing (64 MiB of short lines held a busy
# controller's cycle for tens of seconds); the probe reads as much of a file's tail on the box
METRICS_FILE_BYTES = 16 << 20
MAX_METRIC_ABS = 1e15  # a metric that promotes, ranks or stops runs is finite and at most this in magnitude
# files one harvest unpacks into the store; the rest are named as skipped (the box takes no more: its harvest looks
# at as many files at most, ``box.limits.HARVEST_FILES``); each costs the store about a millisecond, several on a
# busy machine
MAX_HARVEST_FILES = 10_000
MAX_HARVEST_MEMBERS = MAX_HARVEST_FILES + 1024  # members of a harvest stream read at all: past it, none is kept
# an attempt's files that come home, at most (logs first, then artifacts), counted by apparent size on the box and
# in the store alike: a sparse member of 50 GiB counts 50 GiB, not the 23 bytes it takes in the stream
HARVEST_CAP_BYTES = 256 << 20
MAX_NOTE_CHARS = 2000  # a note or message rigsync composes around a box's texts (harvest notes, drift, errors)
MANIFEST_BYTES = 32 << 20  # a harvest's manifest (.rigsync-harvest.json); 200k files' entries fit
TIME_WINDOW_S = 7 * 86400.0  # a box's times are clamped to this window around the controller's clock
MAX_ATTEMPT = 10_000  # an attempt number a box reports (the planner numbers them from 1; 0 is read, never launched)
MAX_GPU_MEMORY_MIB = 1 << 24  # a GPU's reported memory (16 TiB): more is a lie, not a GPU
MAX_LIST_ENTRIES = 64  # entries of any list of names a probe reports (bootstrap hashes, code commits): read and stored
MAX_METRIC_KEYS = 64  # keys of one metrics record kept from a probe (its last line)
MAX_REJECTED = 32  # refused claims one probe reports (each a bounded text); past it, one line counts the rest
EXIT_CODE_RANGE = (-(2**31), 2**31)  # an exit code is a C int: [low, high)


def finite(value: object, *, limit: float = MAX_METRIC_ABS) -> float | None:
    """``value`` as a float when it is a real number (not bool) that is finite and within ``limit``, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int):
        if value.bit_length() > 1023:
            return None
        value = float(value)
    if not math.isfinite(value) or abs(value) > limit:
        return None
    return value


def bounded_int(value: object, low: int, high: int) -> int | None:
    """``value`` when it is an int (not bool) with ``low <= value < high``, else None."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value < high:
        return None
    return value


def clamp_time(t: float, now: float) -> float:
    """A box's timestamp (already on the controller's clock) kept within ``TIME_WINDOW_S`` of ``now`` (NaN, which
    says nothing, is ``now``)."""
    if math.isnan(t):
        return now
    return min(max(t, now - TIME_WINDOW_S), now + TIME_WINDOW_S)


def bounded_block(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """``bounded_text`` for a text of lines (an error quoting stderr): newlines and tabs kept, the rest escaped."""
    shown = visible(text[: limit * 4], block=True)
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def bounded_text(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """A box's string, safe to store and show: control and bidi characters made visible, at most ``limit`` long."""
    shown = visible(text[: limit * 4])
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


# A JSON string, escapes included (unrolled so that a long string costs no backtracking), and any JSON bracket.
_JSON_STRING_RE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET_RE = re.compile(r"[^\[\]{}]+")


def json_depth(text: str, *, stop_past: int = MAX_JSON_DEPTH) -> int:
    """How deeply the arrays and objects of a JSON text nest, counted on its text before it is parsed (so a deep
    document can never reach the parser's recursion). Brackets inside strings do not count; an unterminated string
    counts its brackets (such a text is not JSON anyway). Counting stops once past ``stop_past``."""
    brackets = _NOT_BRACKET_RE.sub("", _JSON_STRING_RE.sub('""', text))
    depth = deepest = 0
    for c in brackets:
        if c in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > stop_past:
                    break
        else:
            depth -= 1
    return deepest


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


def strict_json(text: str, *, max_depth: int = MAX_JSON_DEPTH) -> tuple[Any, str | None]:
    """A JSON text from a box, parsed strictly: ``(value, None)``, or ``(None, problem)`` when it is not JSON, nests
    deeper than ``max_depth``, or carries ``NaN``/``Infinity`` or an integer too long to convert. Never raises.

    A float literal past a double's range (``1e400``) parses as an infinity: the caller's ``finite`` refuses it.
    """
    if json_depth(text, stop_past=max_depth) > max_depth:
        return None, f"nested deeper than {max_depth}"
    try:
        return json.loads(text, parse_constant=_no_constant), None
    except RecursionError:  # not reachable past the depth check; kept so that no text can make this raise
        return None, "nested too deeply"
    except ValueError as exc:  # JSONDecodeError, NaN/Infinity, an integer of more digits than Python converts
        return None, f"invalid JSON: {bounded_text(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, 120)}"
