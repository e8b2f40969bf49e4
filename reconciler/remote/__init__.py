"""The controller's side of the run protocol: the commands it runs on a box, and its reading of the probe's answer.

What runs on the box itself lives in ``reconciler.box`` (standard library only, shipped as text); here are the
pure builders of the command lines that carry it there (``commands``), the parser of what the probe prints
(``parse``) and the log reader's command and answer (``logs``). This module re-exports the first two, so callers
write ``from reconciler.remote import launch_script, parse_probe``; ``unusable_probe`` is the probe of a box whose
answer cannot be used.
"""

from __future__ import annotations

from reconciler.remote.commands import (
    DRAINING_EXIT,
    FENCED_EXIT,
    HEARTBEAT_INTERVAL_S,
    LAUNCH_LOCK_EXIT,
    NO_SUCH_RUN_EXIT,
    PROBE_FORMAT,
    PYTHON_CANDIDATES,
    ROOT,
    WATCHDOG_API_URL_ENV,
    bash_command,
    bootstrap_cache_uploaded,
    bootstrap_script,
    drain_script,
    harvest_script,
    harvested_script,
    is_cache_path,
    kill_script,
    launch_script,
    probe_script,
    ship_code_script,
    stage_resume_script,
    watchdog_onstart,
)
from reconciler.remote.parse import parse_probe, unusable_probe

__all__ = [
    "DRAINING_EXIT",
    "FENCED_EXIT",
    "HEARTBEAT_INTERVAL_S",
    "LAUNCH_LOCK_EXIT",
    "NO_SUCH_RUN_EXIT",
    "PROBE_FORMAT",
    "PYTHON_CANDIDATES",
    "ROOT",
    "WATCHDOG_API_URL_ENV",
    "bash_command",
    "bootstrap_cache_uploaded",
    "bootstrap_script",
    "drain_script",
    "harvest_script",
    "harvested_script",
    "is_cache_path",
    "kill_script",
    "launch_script",
    "parse_probe",
    "probe_script",
    "ship_code_script",
    "stage_resume_script",
    "unusable_probe",
    "watchdog_onstart",
]
