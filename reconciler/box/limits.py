"""The box side's bounds: how much the probe reads of a box's files and reports, so that an honest box with huge
files (a 200 MB metrics line, a thousand run directories, a chatty nvidia-smi) still gives a usable probe.

Each is at most the controller's bound for the same thing in ``reconciler/core/bounds.py`` (a unit test holds them to
it); the box cannot import that module (standard library only), so these are the box's own. Kept apart from
``boxlib.py`` because the watchdog's bundle carries ``boxlib.py`` in the instance's onstart, which stays small.
"""

from __future__ import annotations

# The probe's document format (its ``v``). Kept here, with nothing to run, so the controller's command builders
# (``reconciler.remote.commands``, which the planner uses for a box's onstart) read it without importing the probe.
PROBE_FORMAT = 1
META_BYTES = 64 << 10  # a run's meta.json (launch writes a few hundred bytes)
METRICS_LINE_BYTES = 64 << 10  # one line of a metrics file; a longer one is skipped without being held
METRICS_READ_BYTES = 16 << 20  # of a larger metrics file only its tail is read (best/final are over that tail)
METRICS_INT_DIGITS = 300  # an integer in a metrics line longer than this is no number (it would not fit a float)
MAX_METRIC_KEYS = 64  # last_metrics keeps at most this many keys
TEXT_CHARS = 512  # every string the probe reports (ids, commits, reasons, metric keys and values, errors)
SMI_BYTES = 64 << 10  # of nvidia-smi's output
GPU_INDEXES = 64  # GPU indexes 0..63 only
MAX_RUNS = 512  # run directories one probe reports: every unfinished one first, then the newest finished
MAX_LISTED = 256  # code commits, and each bootstrap list
MAX_QUEUED = 256  # queue entries one probe reports (all slots together, each slot's in order)
RUN_BYTES = 16 << 10  # one run's report: past this its last_metrics are left out
PROBE_BYTES = 512 << 10  # the probe's whole document: runs past this are left out (``runs_omitted``)
# A harvest (``harvest.py``) looks at no more than this many files, and takes none once this many seconds passed
# since it started: what is left is named in its manifest, and a directory of 200,000 files costs a cycle seconds,
# not a minute. The file bound is at most the controller's (``bounds.MAX_HARVEST_FILES``).
HARVEST_FILES = 10_000
HARVEST_SECONDS = 30.0


def text(value: object) -> str | None:
    """A string to report, at most ``TEXT_CHARS`` long; None for anything that is not a string."""
    return value[:TEXT_CHARS] if isinstance(value, str) else None
