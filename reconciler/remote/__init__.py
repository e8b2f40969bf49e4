"""The run protocol on a box: the commands that run there, and the parser of what the probe prints.

Everything rigsync does on a rented box is one of five small programs kept as files beside this module: the probe
(``probe.py``, run by ``probe.sh``), launch (``launch.sh``, which installs and starts ``wrapper.sh``), kill
(``kill.sh``), bootstrap (``bootstrap.sh``, which installs and starts ``bootstrap_run.sh``) and ship-code
(``ship_code.sh``); and, when an attempt ends or its checkpoint is due, the harvest (``harvest.py``, run by
``harvest.sh``: a capped tar stream of the run directory's results on stdout) and, before a resumed launch,
``stage_resume.sh`` (a checkpoint tar from stdin into ``resume/``). The files are static: every parameter reaches
them as a shell-quoted positional argument, never as text formatted into a script. The one exception is a job's
environment (it may hold secrets, and every user of a box sees arguments in ``ps``): it arrives on the launch
command's stdin (``launch.sh``). The builders here are pure (no I/O beyond reading those package files), so the
unit tests run the commands with a local bash in a temporary HOME, and the SSH adapter stays a dumb pipe.
Each builder returns one command line that any POSIX login shell can execute, so it can be handed straight to
``Shell.run``: it exports ``RIGSYNC_ROOT`` (``ROOT``, the one place rigsync's directory on a box is named) and
``RIGSYNC_PYTHON_CANDIDATES``, then runs ``lib.sh`` followed by the script with ``exec bash -c``.

The sixth program is the box's own kill switch. At rent, ``watchdog_onstart`` is the instance's onstart: at every
boot it writes ``watchdog.py`` and its supervisor ``watchdog_run.sh`` under ``watchdog/`` (``watchdog_start.sh``)
and starts them detached, so they outlive any SSH session and the controller itself. The watchdog destroys its own
instance -- ``DELETE /api/v0/instances/$CONTAINER_ID/`` with ``CONTAINER_API_KEY``, the per-instance key the
provider sets in every container (never the account key), at ``RIGSYNC_API_URL``, which the Provider adapter sets
in the instance's environment from its own configured URL (never a value from desired/) -- and never stops it.
It destroys the box (``watchdog.decide``, a pure function; the state is read afresh at every check):

* ``ttl``: up for the fleet's ``ttl``, counted from the watchdog's first start on this disk, busy or not (a hung
  run ends here);
* ``orphan``: no controller for ``orphan_timeout``: the probe refreshes ``watchdog/touched`` every cycle (before
  the first probe the box's start counts);
* ``idle``: no run or bootstrap alive, nothing run-related for ``idle_timeout`` (a run directory created, started,
  heartbeat, ended; a bootstrap finished), counted from the latest of that, the box's start and the last probe,
  and no controller for at least ``CONTROLLER_GRACE_S`` (60 s). While a controller probes, idle boxes are its
  call (it keeps ``min_instances``, bootstraps before the first launch, harvests before it destroys); once it is
  gone, a box retires itself ``idle_timeout`` after its last run ends.

The API call is retried (1 s doubling to 60 s) until the box is gone; the watchdog logs to ``watchdog/watchdog.log``
and never writes the key. The limits are the fleet's at rent time. Like the probe it needs ``python3``; without
one ``watchdog_start.sh`` logs that the box has no watchdog.

Layout under ``$HOME/rigsync/``::

    code/<commit>/                       unpacked tree of a pinned commit (atomic rename into place)
    bootstrap/<hash>.sh|.run.sh|.log|.ok|.failed|.pid|.lock/
    runs/<run_id>.<attempt>/             meta.json, wrapper.sh, pid, started_at, heartbeat, stdout.log,
                                         stderr.log, exit_code, ended_at, killed_reason, metrics file,
                                         resume/ (the checkpoint it resumed from, if any)
    resume/<run_id>.<attempt>/           a checkpoint staged for an attempt about to launch (stage_resume.sh)
    watchdog/                            watchdog.py, run.sh, pid, started_at, touched, watchdog.log

The probe needs ``python3`` on the box (every Vast image has one); without it the probe prints a JSON document
with only ``error`` and ``box_now`` and ``parse_probe`` raises ``RemoteCommandFailed`` saying so.

A run's metrics file is resolved relative to its run directory (absolute paths are taken as they are); the
wrapper exports ``RIGSYNC_METRICS_FILE`` with the resolved path, because the command's working directory is the
shared code tree and a relative write there would mix runs.
"""

from __future__ import annotations

import base64
import functools
import gzip
import json
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

from reconciler.errors import RemoteCommandFailed
from reconciler.model import BoxProbe, GpuState, RunDirState, Scalar, run_dir_name
from reconciler.remote.probe import FORMAT as PROBE_FORMAT
from reconciler.remote.watchdog import API_URL_ENV as WATCHDOG_API_URL_ENV

__all__ = [
    "HEARTBEAT_INTERVAL_S",
    "LAUNCH_LOCK_EXIT",
    "NO_SUCH_RUN_EXIT",
    "PROBE_FORMAT",
    "PYTHON_CANDIDATES",
    "ROOT",
    "WATCHDOG_API_URL_ENV",
    "bash_command",
    "bootstrap_script",
    "harvest_script",
    "kill_script",
    "launch_script",
    "parse_probe",
    "probe_script",
    "ship_code_script",
    "stage_resume_script",
    "watchdog_onstart",
]

ROOT = "$HOME/rigsync"
LAUNCH_LOCK_EXIT = 17
NO_SUCH_RUN_EXIT = 3
HEARTBEAT_INTERVAL_S = 2

_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+=-]{0,199}$")

# The candidates for "the best Python", most specific first; a candidate counts only if it actually runs.
PYTHON_CANDIDATES = ("$HOME/venv/bin/python", "/opt/conda/bin/python", "/venv/main/bin/python", "python3", "python")

# What the login shell runs before ``exec bash``: the values are expanded there (``$HOME``), once per command.
_ENV = f'export RIGSYNC_ROOT="{ROOT}" RIGSYNC_PYTHON_CANDIDATES="{":".join(PYTHON_CANDIDATES)}"; '


def _check_name(kind: str, value: str) -> str:
    if not _SAFE_NAME.match(value) or ".." in value:
        raise ValueError(f"{kind} {value!r} is not a safe file name (letters, digits, '_', '.', '-', '+', '=')")
    return value


@functools.cache
def _text(name: str) -> str:
    """A file shipped with this package (``probe.py``, ``*.sh``)."""
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")


def _script(name: str) -> str:
    """A box-side bash script: ``lib.sh`` (the shared functions), then the named script."""
    return _text("lib.sh") + "\n" + _text(name)


def bash_command(script: str) -> str:
    """One command line that runs ``script`` with bash, whatever the login shell is; stdin passes through."""
    return "exec bash -c " + shlex.quote(script)


def _command(name: str, *args: str) -> str:
    """The command line running the packaged script ``name`` with ``args`` (each its own quoted word)."""
    words = [shlex.quote("rigsync-" + name.removesuffix(".sh")), *(shlex.quote(a) for a in args)]
    return _ENV + bash_command(_script(name)) + " " + " ".join(words)


# ------------------------------------------------------------------------------------------------- probe


def probe_script() -> str:
    """A command printing one JSON document describing the box (see ``probe.py``).

    One Python process does all the work (plus one ``nvidia-smi`` query): the first candidate interpreter that
    runs it is also reported as the box's best Python.
    """
    return _command("probe.sh", str(PROBE_FORMAT), _text("probe.py"))


def _opt_float(v: Any, what: str) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError(f"{what} is not a number: {v!r}")
    return float(v)


def _opt_int(v: Any, what: str) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{what} is not an integer: {v!r}")
    return v


def _str_tuple(v: Any, what: str) -> tuple[str, ...]:
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ValueError(f"{what} is not a list of strings")
    return tuple(v)


def _scalar_pairs(v: Any) -> tuple[tuple[str, Scalar], ...]:
    if not isinstance(v, dict):
        return ()
    out: list[tuple[str, Scalar]] = []
    for k, x in v.items():
        if isinstance(x, str | bool | int) or (isinstance(x, float) and math.isfinite(x)):
            out.append((str(k), x))
    return tuple(out)


def _parse_run(r: Any) -> RunDirState:
    if not isinstance(r, dict):
        raise ValueError("a run entry is not an object")
    run_id = r.get("run_id")
    attempt = r.get("attempt")
    if not isinstance(run_id, str) or isinstance(attempt, bool) or not isinstance(attempt, int):
        raise ValueError("a run entry lacks run_id/attempt")
    mask = r.get("gpu_mask") or []
    if not isinstance(mask, list) or not all(isinstance(g, int) and not isinstance(g, bool) for g in mask):
        raise ValueError(f"run {run_id}.{attempt}: gpu_mask is not a list of integers")
    cc, dc = r.get("code_commit"), r.get("desired_commit")
    return RunDirState(
        run_id=run_id,
        attempt=attempt,
        gpu_mask=tuple(mask),
        pid_alive=bool(r.get("pid_alive")),
        started_at=_opt_float(r.get("started_at"), "started_at"),
        heartbeat_age_s=_opt_float(r.get("heartbeat_age_s"), "heartbeat_age_s"),
        exit_code=_opt_int(r.get("exit_code"), "exit_code"),
        ended_at=_opt_float(r.get("ended_at"), "ended_at"),
        code_commit=cc if isinstance(cc, str) else None,
        desired_commit=dc if isinstance(dc, str) else None,
        last_metrics=_scalar_pairs(r.get("last_metrics")),
        best_metric=_opt_float(r.get("best_metric"), "best_metric"),
        final_metric=_opt_float(r.get("final_metric"), "final_metric"),
        metrics_age_s=_opt_float(r.get("metrics_age_s"), "metrics_age_s"),
    )


def parse_probe(instance_id: int, stdout: bytes) -> BoxProbe:
    """Turn the probe's output into a ``BoxProbe``; raise ``RemoteCommandFailed`` on anything malformed."""
    text = stdout.decode("utf-8", "replace").strip()
    # Login banners or a chatty .bashrc may print before us: the document is the last non-empty line.
    line = text.splitlines()[-1] if text else ""
    try:
        doc = json.loads(line)
    except ValueError:
        shown = line[:120] if line else "(no output)"
        raise RemoteCommandFailed(f"instance {instance_id}: probe printed no JSON document: {shown!r}") from None
    if not isinstance(doc, dict):
        raise RemoteCommandFailed(f"instance {instance_id}: probe output is not a JSON object")
    if doc.get("error"):
        raise RemoteCommandFailed(f"instance {instance_id}: probe failed on the box: {doc['error']}")
    try:
        gpus: list[GpuState] = []
        for g in doc.get("gpus") or []:
            if not isinstance(g, dict):
                raise ValueError("a gpu entry is not an object")
            gpus.append(
                GpuState(
                    index=int(g["index"]),
                    memory_used_mib=int(g["memory_used_mib"]),
                    memory_total_mib=int(g["memory_total_mib"]),
                    utilization_pct=float(g.get("utilization_pct") or 0.0),
                )
            )
        boot = doc.get("bootstrap") or {}
        if not isinstance(boot, dict):
            raise ValueError("bootstrap is not an object")
        runs = tuple(_parse_run(r) for r in doc.get("runs") or [])
        py = doc.get("python")
        return BoxProbe(
            instance_id=instance_id,
            reachable=True,
            gpus=tuple(sorted(gpus, key=lambda g: g.index)),
            disk_free_gb=_opt_float(doc.get("disk_free_gb"), "disk_free_gb"),
            python=py if isinstance(py, str) and py else None,
            bootstrap_hashes=_str_tuple(boot.get("ok"), "bootstrap.ok"),
            bootstrap_failed=_str_tuple(boot.get("failed"), "bootstrap.failed"),
            bootstrap_running=_str_tuple(boot.get("running"), "bootstrap.running"),
            code_commits=_str_tuple(doc.get("code"), "code"),
            runs=tuple(sorted(runs, key=lambda r: (r.run_id, r.attempt))),
            last_activity_at=_opt_float(doc.get("last_activity_at"), "last_activity_at"),
            box_now=_opt_float(doc.get("box_now"), "box_now"),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise RemoteCommandFailed(f"instance {instance_id}: malformed probe output: {exc}") from None


# ------------------------------------------------------------------------------------------------ launch


def launch_script(
    *,
    run_id: str,
    attempt: int,
    gpu_mask: Sequence[int],
    command: str,
    code_commit: str | None,
    desired_commit: str | None,
    metrics_file: str,
    metric_key: str | None,
    metric_goal: str,
    max_runtime_s: float,
    sweep: str,
    params: Mapping[str, Scalar],
    seed: int,
    env_records: int = 0,
) -> str:
    """A command that takes the launch lock (atomic mkdir), writes meta + wrapper, and starts it detached.

    ``env_records``: how many job environment records (``jobenv.JobEnv.stdin``) the command reads from its stdin;
    the values never appear in the command itself.

    Exit 0 printing the wrapper's pid; exit ``LAUNCH_LOCK_EXIT`` (17) if this attempt's directory exists.
    """
    _check_name("run id", run_id)
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
        raise ValueError(f"attempt must be a non-negative integer, not {attempt!r}")
    if code_commit is not None:
        _check_name("commit", code_commit)
    meta = {
        "format": PROBE_FORMAT,
        "run_id": run_id,
        "attempt": attempt,
        "gpu_mask": [int(g) for g in gpu_mask],
        "command": command,
        "code_commit": code_commit,
        "desired_commit": desired_commit,
        "metrics_file": metrics_file,
        "metric_key": metric_key,
        "metric_goal": str(metric_goal),
        "max_runtime_s": max_runtime_s if math.isfinite(max_runtime_s) else None,
        "sweep": sweep,
        "params": dict(params),
        "seed": seed,
    }
    max_s = max(0, math.ceil(max_runtime_s)) if math.isfinite(max_runtime_s) else 0
    return _command(
        "launch.sh",
        run_dir_name(run_id, attempt),
        str(LAUNCH_LOCK_EXIT),
        str(int(env_records)),
        json.dumps(meta, sort_keys=True),
        _script("wrapper.sh"),
        # wrapper.sh's arguments after the run directory:
        code_commit or "",
        metrics_file,
        run_id,
        str(attempt),
        ",".join(str(int(g)) for g in gpu_mask),
        str(max_s),
        str(HEARTBEAT_INTERVAL_S),
        command,
    )


# -------------------------------------------------------------------------------------------------- kill


def kill_script(run_id: str, attempt: int, *, exit_code: int = 137, reason: str) -> str:
    """A command that ends an attempt's whole process group and records ``exit_code`` and ``killed_reason``.

    Idempotent: killing a finished attempt keeps its real exit code and only adds the reason. An attempt with no
    run directory gets a tombstone (the directory, holding the exit code and reason): a launch of it that is still
    on its way finds the launch lock taken and never starts.
    """
    _check_name("run id", run_id)
    name = run_dir_name(run_id, int(attempt))
    return _command("kill.sh", name, str(int(exit_code)), reason, str(NO_SUCH_RUN_EXIT))


# --------------------------------------------------------------------------------------------- bootstrap


def bootstrap_script(script_text: str, script_hash: str) -> str:
    """A command that runs the fleet's bootstrap script once per box per hash, detached.

    Prints ``ok`` (already done), ``running`` (a live run holds the lock) or ``started <pid>``. A previous
    failure is retried: its ``.failed`` marker is removed when a new run starts.
    """
    h = _check_name("bootstrap hash", script_hash)
    return _command("bootstrap.sh", h, script_text, _script("bootstrap_run.sh"))


# --------------------------------------------------------------------------------------------- ship code


def ship_code_script(commit: str) -> str:
    """A command that unpacks a tar stream from stdin into ``code/<commit>/`` atomically (idempotent)."""
    return _command("ship_code.sh", _check_name("commit", commit))


# ----------------------------------------------------------------------------------------------- harvest


def harvest_script(run_id: str, attempt: int, *, what: str, patterns: Sequence[str], cap_bytes: int) -> str:
    """A command writing a tar stream of the attempt's results (``what="run"``: logs, ``meta.json`` and the files
    ``patterns`` match) or of its checkpoint (``what="checkpoint"``: the files under ``patterns``) to stdout, at
    most ``cap_bytes`` of file data, ending with the ``.rigsync-harvest.json`` manifest (``harvest.py``). A missing
    run directory exits ``NO_SUCH_RUN_EXIT`` (3)."""
    if what not in ("run", "checkpoint"):
        raise ValueError(f"harvest what must be 'run' or 'checkpoint', not {what!r}")
    name = run_dir_name(_check_name("run id", run_id), int(attempt))
    return _command(
        "harvest.sh", _text("harvest.py"), name, what, str(max(0, int(cap_bytes))), json.dumps(list(patterns)),
        str(NO_SUCH_RUN_EXIT),
    )


def stage_resume_script(run_id: str, attempt: int) -> str:
    """A command unpacking a checkpoint tar from stdin into ``resume/<run_id>.<attempt>/``, which ``launch.sh``
    moves into the attempt's run directory (``resume/``) and the wrapper names in ``RIGSYNC_RESUME_DIR``."""
    return _command("stage_resume.sh", run_dir_name(_check_name("run id", run_id), int(attempt)))


# ---------------------------------------------------------------------------------------------- watchdog


def _seconds(value: float) -> str:
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"a watchdog limit must be a positive number of seconds, not {value!r}")
    return repr(float(value))


def watchdog_onstart(*, ttl_s: float | None, idle_timeout_s: float, orphan_timeout_s: float) -> str:
    """The instance's onstart script: start the box's watchdog (``watchdog.py``) at every boot.

    The command that writes and starts it (``watchdog_start.sh`` with the program, its supervisor and the fleet's
    limits as quoted arguments) travels gzipped and base64-encoded, so the onstart stays a few KiB and needs only
    ``base64``, ``gzip`` and ``bash`` besides the watchdog's own ``python3``. It names no key and no URL: the
    watchdog reads ``CONTAINER_ID``/``CONTAINER_API_KEY`` (set by the provider) and ``RIGSYNC_API_URL`` (set in the
    instance's environment by the Provider adapter) from its environment.
    """
    ttl = "none" if ttl_s is None or math.isinf(ttl_s) else _seconds(ttl_s)
    command = _command(
        "watchdog_start.sh", _text("watchdog.py"), _text("watchdog_run.sh"), ttl, _seconds(idle_timeout_s),
        _seconds(orphan_timeout_s),
    )
    blob = base64.b64encode(gzip.compress(command.encode(), mtime=0)).decode()
    return (
        "# rigsync: start this box's watchdog (rigsync's reconciler/remote/watchdog.py), which destroys the\n"
        f"# instance past ttl {ttl}, idle_timeout {_seconds(idle_timeout_s)} or orphan_timeout "
        f"{_seconds(orphan_timeout_s)} (seconds).\n"
        f"printf %s {blob} | base64 -d | gzip -dc | bash\n"
    )
