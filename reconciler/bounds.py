"""How much of a rented box's word the controller takes: byte bounds per source, and the checks of its values.

A box is a stranger's machine: everything it sends back (the probe's document, nvidia-smi's numbers, a run's
metrics, logs, harvest manifests) is untrusted input. Each source is read under the byte bound named here, and
never past it; each value read from it passes one of the checks below before it is stored or compared. These are
the one home of those bounds and checks: parsers (``remote.parse``, ``remote.logs``, ``curves``), the planner
and writers (``observed``, ``views``) import them and never restate a number.
"""

from __future__ import annotations

import math

from reconciler.textsafe import visible

__all__ = [
    "COMMAND_STDERR_BYTES",
    "COMMAND_STDOUT_BYTES",
    "MAX_GPUS",
    "MAX_JSON_DEPTH",
    "MAX_METRIC_ABS",
    "MAX_PROBE_RUNS",
    "MAX_REPORTED_CLAIMS",
    "MAX_TEXT_CHARS",
    "METRICS_FILE_BYTES",
    "METRICS_LINE_BYTES",
    "PROBE_STDOUT_BYTES",
    "TIME_WINDOW_S",
    "bounded_text",
    "clamp_time",
    "finite",
]

PROBE_STDOUT_BYTES = 1 << 20  # the probe's whole answer; an honest one is a few KiB per run directory
COMMAND_STDOUT_BYTES = 64 << 10  # launch, kill, bootstrap, ship-code, stage-resume: each prints a line or two
COMMAND_STDERR_BYTES = 64 << 10  # every command's stderr: only its tail is kept past this
MAX_JSON_DEPTH = 16  # nesting of any JSON document from a box (the probe's is 4 deep)
MAX_PROBE_RUNS = 1024  # run directories one probe may report (the box reports its newest first)
MAX_GPUS = 64  # GPU entries one probe may report; the instance's listed count caps it further
MAX_REPORTED_CLAIMS = 8  # foreign run directories and refused claims reported one by one per box; the rest counted
MAX_TEXT_CHARS = 512  # any one string from a box that is stored (ids, commits, metric keys, reasons, errors)
METRICS_LINE_BYTES = 64 << 10  # one line of a metrics.jsonl; a longer line is unusable, not read into memory
METRICS_FILE_BYTES = 64 << 20  # a harvested metrics.jsonl read for its curve
MAX_METRIC_ABS = 1e15  # a metric that promotes, ranks or stops runs is finite and at most this in magnitude
TIME_WINDOW_S = 7 * 86400.0  # a box's times are clamped to this window around the controller's clock


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


def clamp_time(t: float, now: float) -> float:
    """A box's timestamp (already on the controller's clock) kept within ``TIME_WINDOW_S`` of ``now``."""
    return min(max(t, now - TIME_WINDOW_S), now + TIME_WINDOW_S)


def bounded_text(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """A box's string, safe to store and show: control and bidi characters made visible, at most ``limit`` long."""
    shown = visible(text[: limit * 4])
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"
