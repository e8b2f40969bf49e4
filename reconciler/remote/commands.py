"""The controller's side of the run protocol: the commands it runs on a box over SSH (pure builders).

Everything rigsync does on a rented box is one of a few small programs kept as files in ``reconciler.box`` (see
its docstring for the programs, the watchdog's rules and the layout on a box). The files are static: every
parameter reaches them as a shell-quoted positional argument, never as text formatted into a script. The one
exception is a job's environment (it may hold secrets, and every user of a box sees arguments in ``ps``): it
arrives on the launch command's stdin (``launch.sh``). The builders here are pure (no I/O beyond reading those
package files), so the unit tests run the commands with a local bash in a temporary HOME, and the SSH adapter stays
a dumb pipe. Each builder returns one command line that any POSIX login shell can execute, so it can be handed
straight to ``Shell.run``: it exports ``RIGSYNC_ROOT`` (``ROOT``, the one place rigsync's directory on a box is
named) and ``RIGSYNC_PYTHON_CANDIDATES``, then runs ``lib.sh`` followed by the script with ``exec bash -c``.

A box-side Python program travels as a bundle (``_program``): one self-contained text holding the program and the
``reconciler.box`` modules it imports (``boxlib.py``), which it registers under their own names before it runs the
program as ``__main__``. So the probe runs as ``python3 -c <bundle>`` and the watchdog's file on the box is the
bundle, with nothing but the standard library there.

The watchdog travels in the instance's onstart (``watchdog_onstart``): at every boot it writes ``watchdog.py`` and
its supervisor under ``watchdog/`` and starts them detached.
"""

from __future__ import annotations

import ast
import base64
import functools
import gzip
import json
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from importlib import resources

from reconciler.box.limits import PROBE_FORMAT
from reconciler.box.watchdog import API_URL_ENV as WATCHDOG_API_URL_ENV
from reconciler.core.model import Scalar, run_dir_name
from reconciler.remote.launched import valid_pid, valid_start

__all__ = [
    "DRAINING_EXIT",
    "FENCED_EXIT",
    "HEARTBEAT_INTERVAL_S",
    "LAUNCH_LOCK_EXIT",
    "NO_SUCH_RUN_EXIT",
    "PROBE_FORMAT",
    "PYTHON_CANDIDATES",
    "ROOT",
    "TRANSFER_EXITS",
    "UPLOAD_NO_RUN_EXIT",
    "WATCHDOG_API_URL_ENV",
    "bash_command",
    "bootstrap_cache_uploaded",
    "bootstrap_script",
    "drain_script",
    "fetch_resume_script",
    "harvest_script",
    "harvested_script",
    "is_cache_path",
    "is_run_file",
    "is_safe_name",
    "kill_script",
    "launch_script",
    "probe_script",
    "ship_code_script",
    "slot_name",
    "stage_resume_script",
    "upload_script",
    "url_lines",
    "watchdog_onstart",
]

ROOT = "$HOME/rigsync"
LAUNCH_LOCK_EXIT = 17
NO_SUCH_RUN_EXIT = 3
FENCED_EXIT = 18  # launch.sh, enqueue.sh: the launch's epoch is older than the box's fence
DRAINING_EXIT = 19  # enqueue.sh: the box is draining and takes no new entries
HEARTBEAT_INTERVAL_S = 2

_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+=-]{0,199}$")

# The candidates for "the best Python", most specific first; a candidate counts only if it actually runs.
PYTHON_CANDIDATES = ("$HOME/venv/bin/python", "/opt/conda/bin/python", "/venv/main/bin/python", "python3", "python")

# What the login shell runs before ``exec bash``: the values are expanded there (``$HOME``), once per command.
_ENV = f'export RIGSYNC_ROOT="{ROOT}" RIGSYNC_PYTHON_CANDIDATES="{":".join(PYTHON_CANDIDATES)}"; '


def is_safe_name(value: str) -> bool:
    """Whether ``value`` may name a file on a box (a run id, a commit, a bootstrap hash): no ``/``, no ``..``."""
    return _SAFE_NAME.fullmatch(value) is not None and ".." not in value


def _check_name(kind: str, value: str) -> str:
    if not is_safe_name(value):
        raise ValueError(f"{kind} {value!r} is not a safe file name (letters, digits, '_', '.', '-', '+', '=')")
    return value


BOX_PACKAGE = "reconciler.box"


@functools.cache
def _text(name: str) -> str:
    """A file of the box-side package ``reconciler.box`` (``probe.py``, ``*.sh``), as it is in the source tree."""
    return resources.files(BOX_PACKAGE).joinpath(name).read_text(encoding="utf-8")


def _box_imports(source: str) -> list[str]:
    """The modules of ``reconciler.box`` that ``source`` imports (by their file names, ``boxlib.py``)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            if name.startswith(BOX_PACKAGE + ".") and name.count(".") == 2:
                found.append(name.rsplit(".", 1)[1] + ".py")
    return found


# The head of a bundle: a module registered from its text, before the program that imports it runs.
_BUNDLE_HEAD = """\
# rigsync: {name} with the reconciler.box modules it imports, for a box with only python3's standard library.
import sys
import types


def _rs_module(name, path, source, package=False):
    module = types.ModuleType(name)
    if package:
        module.__path__ = []
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)
    exec(compile(source, path, "exec"), module.__dict__)  # path: what a traceback names


"""


@functools.cache
def _program(name: str) -> str:
    """A box-side Python program (``probe.py``, ``watchdog.py``, ``harvest.py``) as shipped: one self-contained text
    that registers the ``reconciler.box`` modules it imports (``boxlib.py``) under their own names, then runs the
    program as ``__main__``."""
    main = _text(name)
    order: list[str] = []

    def need(module: str) -> None:
        for dep in _box_imports(_text(module)):
            if dep not in order:
                need(dep)
        if module not in order:
            order.append(module)

    for dep in _box_imports(main):
        need(dep)
    lines = [
        _BUNDLE_HEAD.format(name=name),
        "_rs_module('reconciler', 'reconciler/__init__.py', '', True)\n",
        f"_rs_module({BOX_PACKAGE!r}, 'reconciler/box/__init__.py', '', True)\n",  # its docstring is all it holds
        *(f"_rs_module({BOX_PACKAGE + '.' + m.removesuffix('.py')!r}, {'reconciler/box/' + m!r}, {_text(m)!r})\n"
          for m in order),
        f"_rs_module('__main__', {'reconciler/box/' + name!r}, {main!r})\n",
    ]
    return "".join(lines)


_PROC_SCRIPTS = frozenset({"kill.sh", "launch.sh", "wrapper.sh", "dequeue.sh"})  # they need proc.sh's functions
_QUEUE_SCRIPTS = frozenset({"launch.sh", "enqueue.sh", "dequeue.sh"})  # and queue.sh's (fence, slots)


def _script(name: str) -> str:
    """A box-side bash script: ``lib.sh`` (the shared functions; ``proc.sh`` too for the scripts that end or identify
    a run's processes, ``queue.sh`` for those that read the fence or the queue), then the named script."""
    proc = _text("proc.sh") + "\n" if name in _PROC_SCRIPTS else ""
    queue = _text("queue.sh") + "\n" if name in _QUEUE_SCRIPTS else ""
    return _text("lib.sh") + "\n" + proc + queue + _text(name)


def bash_command(script: str) -> str:
    """One command line that runs ``script`` with bash, whatever the login shell is; stdin passes through."""
    return "exec bash -c " + shlex.quote(script)


def _command(name: str, *args: str) -> str:
    """The command line running the packaged script ``name`` with ``args`` (each its own quoted word)."""
    words = [shlex.quote("rigsync-" + name.removesuffix(".sh")), *(shlex.quote(a) for a in args)]
    return _ENV + bash_command(_script(name)) + " " + " ".join(words)


# ------------------------------------------------------------------------------------------------- probe


def probe_script(epoch: int = 0) -> str:
    """A command printing one JSON document describing the box (see ``probe.py``).

    One Python process does all the work (plus one ``nvidia-smi`` query): the first candidate interpreter that
    runs it is also reported as the box's best Python. ``epoch``: the controller's lease epoch, which raises the
    box's fence (0: no lease, the fence is only read).
    """
    return _command("probe.sh", str(PROBE_FORMAT), _program("probe.py"), str(_epoch(epoch)))


def _epoch(epoch: int) -> int:
    if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch < 10**18:
        raise ValueError(f"a lease epoch must be an integer in [0, 10**18), not {epoch!r}")
    return epoch


def slot_name(gpu_mask: Sequence[int]) -> str:
    """The name of a GPU mask's queue on a box (``queue/<slot>/``): its GPUs joined by ``_``, ``cpu`` for none;
    launch.sh writes the same name into each run directory's ``slot`` file."""
    return "_".join(str(int(g)) for g in gpu_mask) or "cpu"


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
    epoch: int = 0,
    queued: bool = False,
) -> str:
    """A command that takes the launch lock (atomic mkdir), writes meta + wrapper, and starts it detached.

    ``env_records``: how many job environment records (``jobenv.JobEnv.stdin``) the command reads from its stdin;
    the values never appear in the command itself. ``epoch``: the sending controller's lease epoch (0: none).

    Exit 0 printing the wrapper's pid and start time, ``PID START`` (``remote.launched.parse_launch_answer``);
    exit ``LAUNCH_LOCK_EXIT`` (17) if this attempt's directory exists, ``FENCED_EXIT`` (18) if ``epoch`` is older
    than the box's fence.

    ``queued``: the attempt joins its GPU slot's queue on the box instead (``enqueue.sh``), printing ``queued``;
    the box starts it through this same launch when the slot frees. Also ``LAUNCH_LOCK_EXIT`` when it is queued
    already, ``DRAINING_EXIT`` (19) on a draining box.
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
    head = ("enqueue.sh", slot_name(gpu_mask), str(DRAINING_EXIT), _script("launch.sh"), _script("dequeue.sh"))
    return _command(
        *(head if queued else ("launch.sh",)),
        run_dir_name(run_id, attempt),
        str(LAUNCH_LOCK_EXIT),
        str(int(env_records)),
        str(_epoch(epoch)),
        str(FENCED_EXIT),
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


def kill_script(
    run_id: str,
    attempt: int,
    *,
    exit_code: int = 137,
    reason: str,
    pid: int | None = None,
    pid_started: int | None = None,
) -> str:
    """A command that ends an attempt and records ``exit_code`` and ``killed_reason``.

    ``pid``/``pid_started``: the attempt's process group as its launch recorded it (``InFlight``). ``kill.sh``
    signals that group only while the pid is alive with that start time and leads its session. Both travel only
    when both are valid (a pid an int > 1 and below the pid limit, a start an int >= 0): by construction no pid
    <= 1 is ever on a kill's command line. Without them the end is only recorded, and the box's wrapper ends its own
    command when it sees it.

    Idempotent: killing a finished attempt keeps its real exit code and only adds the reason. An attempt with no
    run directory gets a tombstone (the directory, holding the exit code and reason): a launch of it that is still
    on its way finds the launch lock taken and never starts.
    """
    _check_name("run id", run_id)
    name = run_dir_name(run_id, int(attempt))
    group, started = valid_pid(pid), valid_start(pid_started)
    identity = (str(group), str(started)) if group is not None and started is not None else ("", "")
    return _command("kill.sh", name, str(int(exit_code)), reason, str(NO_SUCH_RUN_EXIT), *identity)


# ------------------------------------------------------------------------------------------------- drain


def drain_script() -> str:
    """A command marking the box draining (``drain.sh``): no new queue entries; its watchdog destroys it once the
    queue is dry, nothing runs and every run directory is marked harvested. Prints ``draining``; idempotent."""
    return _command("drain.sh")


def harvested_script(run_id: str, attempt: int) -> str:
    """A command marking an attempt's run directory harvested (``harvested.sh``), once its harvest was stored."""
    return _command("harvested.sh", run_dir_name(_check_name("run id", run_id), int(attempt)))


# --------------------------------------------------------------------------------------------- bootstrap


def bootstrap_script(
    script_text: str,
    script_hash: str,
    *,
    cache_key: str | None = None,
    cache_paths: Sequence[str] = (),
    restore: tuple[int, str] | None = None,
    upload: bool = False,
) -> str:
    """A command that runs the fleet's bootstrap script once per box per hash, detached.

    Prints ``ok`` (already done), ``running`` (a live run holds the lock) or ``started <pid>``. A previous
    failure is retried: its ``.failed`` marker is removed when a new run starts.

    With ``cache_key`` (a bootstrap cache: ``identity.bootstrap_cache_key``), the runner first restores the cache
    object whose recorded (size, SHA-256) is ``restore`` instead of running the script, and with ``upload`` packs
    ``cache_paths`` after the script succeeds and uploads them. The command then reads its presigned URLs on stdin
    (``url_lines``: the download's when ``restore``, then the upload's when ``upload``) and answers ``ok cache SIZE
    SHA256`` once when the bootstrap that uploaded is first found done (``bootstrap_cache_uploaded``).
    """
    h = _check_name("bootstrap hash", script_hash)
    args = [h, script_text, _script("bootstrap_run.sh")]
    if cache_key is not None:
        size, sha = ("", "") if restore is None else (str(int(restore[0])), restore[1])
        if sha and not SHA256_RE.fullmatch(sha):
            raise ValueError("a bootstrap cache SHA-256 must be 64 lowercase hex digits")
        paths = [_check_cache_path(p) for p in cache_paths]
        key = _check_name("bootstrap cache key", cache_key)
        args += [_program("transfer.py"), key, size, sha, "put" if upload else "", *paths]
    return _command("bootstrap.sh", *args)


_CACHE_PATH = re.compile(r"^(/[A-Za-z0-9_.+@=-]+)+$")  # as fleet.schema.json's bootstrap.cache items


def is_cache_path(path: str) -> bool:
    """Whether ``path`` may be a bootstrap cache path: absolute, plain parts, none of them ``.`` or ``..``."""
    return _CACHE_PATH.fullmatch(path) is not None and not any(part in (".", "..") for part in path.split("/"))


def _check_cache_path(path: str) -> str:
    if not is_cache_path(path):
        raise ValueError(f"bootstrap cache path {path!r} is not an absolute path without '.' or '..' parts")
    return path


def bootstrap_cache_uploaded(answer: str) -> tuple[int, str] | None:
    """(size, SHA-256) when a bootstrap command's answer says the runner uploaded the cache (``ok cache SIZE
    SHA256``); None for every other answer, or one that does not parse (the box's word: untrusted, the store checks
    the object's size before it records it)."""
    parts = answer.split()
    size = parts[2] if len(parts) == 4 else ""
    # ASCII digits only (``"²".isdigit()`` is true and ``int`` refuses it), and a size that fits 2**53
    if parts[:2] != ["ok", "cache"] or not (size.isascii() and size.isdigit() and len(size) <= 15):
        return None
    if not SHA256_RE.fullmatch(parts[3]):
        return None
    return int(parts[2]), parts[3]


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
    args = _harvest_args(run_id, attempt, what, patterns, cap_bytes, NO_SUCH_RUN_EXIT)
    return _command("harvest.sh", _program("harvest.py"), *args)


def _harvest_args(
    run_id: str, attempt: int, what: str, patterns: Sequence[str], cap_bytes: int, missing_exit: int
) -> list[str]:
    """harvest.py's arguments (after its program): the attempt's directory, what, the cap, the patterns, the exit."""
    if what not in ("run", "checkpoint"):
        raise ValueError(f"harvest what must be 'run' or 'checkpoint', not {what!r}")
    name = run_dir_name(_check_name("run id", run_id), int(attempt))
    return [name, what, str(max(0, int(cap_bytes))), json.dumps(list(patterns)), str(missing_exit)]


def stage_resume_script(run_id: str, attempt: int) -> str:
    """A command unpacking a checkpoint tar from stdin into ``resume/<run_id>.<attempt>/``, which ``launch.sh``
    moves into the attempt's run directory (``resume/``) and the wrapper names in ``RIGSYNC_RESUME_DIR``."""
    return _command("stage_resume.sh", run_dir_name(_check_name("run id", run_id), int(attempt)))


# -------------------------------------------------------------------------------------- direct transfers

UPLOAD_NO_RUN_EXIT = 20  # upload.sh: no such run directory (3 is transfer.py's "refused")
TRANSFER_EXITS = {
    2: "usage", 3: "refused by the store", 4: "the store did not answer", 5: "size or SHA-256 mismatch",
    UPLOAD_NO_RUN_EXIT: "no such run directory",
}
SHA256_RE = re.compile(r"[0-9a-f]{64}")  # a SHA-256 as boxes and the store say it (``fullmatch``)
_RUN_FILE = re.compile(r"[A-Za-z0-9_.+=][A-Za-z0-9_.+=/-]{0,499}")  # never an option (-x), never absolute


def is_run_file(name: str) -> bool:
    """Whether ``name`` names a file of a run directory by a relative path that stays inside it (``stdout.log``,
    ``.rigsync-harvest.json``, ``out/m.jsonl``): safe parts, none ``.`` or ``..``, never absolute, never an option."""
    return _RUN_FILE.fullmatch(name) is not None and not any(p in ("", ".", "..") for p in name.split("/"))


def _run_file(name: str) -> str:
    if not is_run_file(name):
        raise ValueError(f"run file {name[:80]!r} is not a relative path of safe names")
    return name


def upload_script(
    run_id: str, attempt: int, *, what: str, patterns: Sequence[str], cap_bytes: int, files: Sequence[str] = ()
) -> str:
    """A command that harvests the attempt on the box (as ``harvest_script``, into a temporary file) and uploads it
    itself (``upload.sh``, ``transfer.py``): the tar to the first URL on its stdin (``url_lines``), then each of
    ``files`` (run-directory files as the harvest took them; ``.rigsync-harvest.json`` is its manifest) to the next
    ones, skipping a file the harvest did not take. Prints harvest.py's counts line, then transfer.py's
    ``{"size", "sha256"}`` line for the tar (``parse.parse_upload``). Exits with a ``TRANSFER_EXITS`` code when an
    upload failed, ``UPLOAD_NO_RUN_EXIT`` without the run directory."""
    return _command(
        "upload.sh", _program("harvest.py"), _program("transfer.py"),
        *_harvest_args(run_id, attempt, what, patterns, cap_bytes, UPLOAD_NO_RUN_EXIT), *(_run_file(f) for f in files),
    )


def fetch_resume_script(run_id: str, attempt: int, *, size: int, sha256: str) -> str:
    """A command that downloads a checkpoint tar from the URL on its stdin (``url_lines``), checks it is ``size``
    bytes with SHA-256 ``sha256``, and stages it as ``stage_resume_script`` stages a streamed one
    (``fetch_resume.sh``). Exits with a ``TRANSFER_EXITS`` code when the download failed or did not match."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"a checkpoint size must be a non-negative integer, not {size!r}")
    if not SHA256_RE.fullmatch(sha256):
        raise ValueError("a checkpoint SHA-256 must be 64 lowercase hex digits")
    name = run_dir_name(_check_name("run id", run_id), int(attempt))
    return _command(
        "fetch_resume.sh", _program("transfer.py"), _script("stage_resume.sh"), name, str(size), sha256
    )


_URL = re.compile(r"^https?://[\x21-\x7e]+$")  # printable ASCII, no space: one line, and nothing a shell splits


def url_lines(urls: Sequence[str]) -> bytes:
    """Presigned URLs as a transfer command reads them from its stdin: one a line, in order. ``ValueError`` (which
    never quotes a URL: it is a credential) for one that is not a printable http(s) URL on one line."""
    for n, url in enumerate(urls):
        if not _URL.fullmatch(url):
            raise ValueError(f"presigned URL #{n + 1} is not a printable http(s) URL on one line")
    return "".join(url + "\n" for url in urls).encode("ascii")


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
        "watchdog_start.sh", _program("watchdog.py"), _text("watchdog_run.sh"), ttl, _seconds(idle_timeout_s),
        _seconds(orphan_timeout_s),
    )
    blob = base64.b64encode(gzip.compress(command.encode(), mtime=0)).decode()
    return (
        "# rigsync: start this box's watchdog (rigsync's reconciler/box/watchdog.py), which destroys the\n"
        f"# instance past ttl {ttl}, idle_timeout {_seconds(idle_timeout_s)} or orphan_timeout "
        f"{_seconds(orphan_timeout_s)} (seconds).\n"
        f"printf %s {blob} | base64 -d | gzip -dc | bash\n"
    )
