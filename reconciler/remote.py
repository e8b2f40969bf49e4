"""The run protocol on a box, as shell text and parsers of what it prints.

Everything rigsync does on a rented box is one of five small scripts built here: probe, launch, kill, bootstrap
and ship-code. Keeping them as pure string builders (no I/O) lets the unit tests run them with a local bash in a
temporary HOME, and lets the SSH adapter stay a dumb pipe. Each builder returns one command line that any POSIX
login shell can execute (``exec bash -c '<script>'``), so it can be handed straight to ``Shell.run``.

Layout under ``$HOME/rigsync/``::

    code/<commit>/                       unpacked tree of a pinned commit (atomic rename into place)
    bootstrap/<hash>.sh|.log|.ok|.failed|.pid|.lock/
    runs/<run_id>.<attempt>/             meta.json, wrapper.sh, pid, started_at, heartbeat, stdout.log,
                                         stderr.log, exit_code, ended_at, killed_reason, metrics file

The probe needs ``python3`` on the box (every Vast image has one); without it the probe prints a JSON document
with only ``error`` and ``box_now`` and ``parse_probe`` raises ``RemoteCommandFailed`` saying so.

A run's metrics file is resolved relative to its run directory (absolute paths are taken as they are); the
wrapper exports ``RIGSYNC_METRICS_FILE`` with the resolved path, because the command's working directory is the
shared code tree and a relative write there would mix runs.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from reconciler.errors import RemoteCommandFailed
from reconciler.model import BoxProbe, GpuState, RunDirState, Scalar, run_dir_name

ROOT = "$HOME/rigsync"
LAUNCH_LOCK_EXIT = 17
NO_SUCH_RUN_EXIT = 3
HEARTBEAT_INTERVAL_S = 2
PROBE_FORMAT = 1

_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+=-]{0,199}$")

# The candidates for "the best Python", most specific first; a candidate counts only if it actually runs.
PYTHON_CANDIDATES = ("$HOME/venv/bin/python", "/opt/conda/bin/python", "/venv/main/bin/python", "python3", "python")

_BEST_PYTHON_SH = (
    "_rs_best_python() {\n"
    "  for _p in "
    + " ".join(f'"{c}"' for c in PYTHON_CANDIDATES)
    + "; do\n"
    '    if "$_p" -c "import sys; sys.exit(0 if sys.version_info[0] >= 3 else 1)" >/dev/null 2>&1; then\n'
    '      command -v "$_p" 2>/dev/null || printf "%s\\n" "$_p"; return 0\n'
    "    fi\n"
    "  done\n"
    "  return 1\n"
    "}\n"
)

# Alive means "exists and is not a zombie": on a box whose PID 1 does not reap orphans, a finished wrapper
# lingers as a zombie and `kill -0` alone would call it alive forever.
_ALIVE_SH = (
    "_rs_alive() {\n"
    '  [ -n "$1" ] || return 1\n'
    '  kill -0 "$1" 2>/dev/null || return 1\n'
    '  _st=$(sed -e "s/.*) //" "/proc/$1/stat" 2>/dev/null | cut -c1)\n'
    '  [ "$_st" != "Z" ]\n'
    "}\n"
)


def _check_name(kind: str, value: str) -> str:
    if not _SAFE_NAME.match(value) or ".." in value:
        raise ValueError(f"{kind} {value!r} is not a safe file name (letters, digits, '_', '.', '-', '+', '=')")
    return value


def bash_command(script: str) -> str:
    """One command line that runs ``script`` with bash, whatever the login shell is; stdin passes through."""
    return "exec bash -c " + shlex.quote(script)


# ------------------------------------------------------------------------------------------------- probe

_PROBE_PY = r"""
import sys
if sys.version_info[0] < 3:
    sys.exit(3)
import json, math, os, subprocess, time

HOME = os.path.expanduser("~")
ROOT = os.path.join(HOME, "rigsync")


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    try:
        with open("/proc/%%d/stat" %% pid) as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True


def read(path):
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return None


def num(text):
    if text is None or text == "":
        return None
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def smi_start(query):
    try:
        return subprocess.Popen(["nvidia-smi", query, "--format=csv,noheader,nounits"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    except OSError as exc:
        return str(exc)


def smi_rows(p):
    if isinstance(p, str):
        return None, p
    try:
        so, se = p.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        return None, "nvidia-smi timed out"
    if p.returncode != 0:
        return None, (se or so).decode("utf-8", "replace").strip()[-200:]
    rows = []
    for line in so.decode("utf-8", "replace").splitlines():
        if line.strip():
            rows.append([c.strip() for c in line.split(",")])
    return rows, None


def metrics(path, key, goal):
    last, best, final = None, None, None
    try:
        f = open(path, "rb")
    except OSError:
        return last, best, final
    with f:
        for raw in f:
            line = raw.strip()
            if not line.startswith(b"{"):
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if not isinstance(obj, dict):
                continue
            last = obj
            if key is None:
                continue
            v = obj.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                continue
            final = float(v)
            if best is None or (final < best if goal == "min" else final > best):
                best = final
    if last is not None:
        last = {k: v for k, v in last.items()
                if isinstance(v, (str, bool, int)) or (isinstance(v, float) and math.isfinite(v))}
    return last, best, final


def main():
    now = time.time()
    out = {"v": %(version)d, "box_now": now, "python": os.environ.get("RS_BEST_PY") or sys.executable}
    # Both nvidia-smi queries run at once: on a real box each call takes tens of milliseconds.
    p_gpu = smi_start("--query-gpu=index,memory.used,memory.total,utilization.gpu")
    p_app = smi_start("--query-compute-apps=pid,used_memory,gpu_uuid")

    try:
        st = os.statvfs(HOME)
        out["disk_free_gb"] = st.f_bavail * st.f_frsize / 1e9
    except OSError:
        out["disk_free_gb"] = None

    activity = []
    try:
        with open("/proc/uptime") as f:
            activity.append(now - float(f.read().split()[0]))
    except (OSError, ValueError, IndexError):
        pass

    boot = {"ok": [], "failed": [], "running": []}
    bdir = os.path.join(ROOT, "bootstrap")
    try:
        names = os.listdir(bdir)
    except OSError:
        names = []
    nameset = set(names)
    for n in sorted(names):
        if n.endswith(".ok"):
            boot["ok"].append(n[:-3])
            try:
                activity.append(os.stat(os.path.join(bdir, n)).st_mtime)
            except OSError:
                pass
        elif n.endswith(".failed"):
            boot["failed"].append(n[:-7])
        elif n.endswith(".pid"):
            h = n[:-4]
            if h + ".ok" in nameset or h + ".failed" in nameset:
                continue
            pid = read(os.path.join(bdir, n))
            if pid and pid.isdigit() and alive(int(pid)):
                boot["running"].append(h)
    out["bootstrap"] = boot

    try:
        out["code"] = sorted(n for n in os.listdir(os.path.join(ROOT, "code"))
                             if ".tmp." not in n and os.path.isdir(os.path.join(ROOT, "code", n)))
    except OSError:
        out["code"] = []

    runs = []
    rdir = os.path.join(ROOT, "runs")
    try:
        entries = sorted(os.listdir(rdir))
    except OSError:
        entries = []
    for name in entries:
        d = os.path.join(rdir, name)
        run_id, _, att = name.rpartition(".")
        if not run_id or not att.isdigit() or not os.path.isdir(d):
            continue
        try:
            with open(os.path.join(d, "meta.json")) as f:
                meta = json.load(f)
            if not isinstance(meta, dict):
                meta = {}
        except (OSError, ValueError):
            meta = {}
        pid = read(os.path.join(d, "pid"))
        started = num(read(os.path.join(d, "started_at")))
        ended = num(read(os.path.join(d, "ended_at")))
        code = read(os.path.join(d, "exit_code"))
        try:
            hb_age = now - os.stat(os.path.join(d, "heartbeat")).st_mtime
        except OSError:
            hb_age = None
        mfile = meta.get("metrics_file") or "metrics.jsonl"
        mpath = mfile if os.path.isabs(mfile) else os.path.join(d, mfile)
        last, best, final = metrics(mpath, meta.get("metric_key"), meta.get("metric_goal"))
        mask = meta.get("gpu_mask")
        runs.append({
            "run_id": run_id,
            "attempt": int(att),
            "gpu_mask": [int(g) for g in mask] if isinstance(mask, list) else [],
            "pid": int(pid) if pid and pid.isdigit() else None,
            "pid_alive": bool(pid and pid.isdigit() and alive(int(pid))),
            "started_at": started,
            "heartbeat_age_s": hb_age,
            "exit_code": int(code) if code and code.lstrip("-").isdigit() else None,
            "ended_at": ended,
            "code_commit": meta.get("code_commit"),
            "desired_commit": meta.get("desired_commit"),
            "killed_reason": read(os.path.join(d, "killed_reason")),
            "last_metrics": last or {},
            "best_metric": best,
            "final_metric": final,
        })
        activity.extend(t for t in (started, ended) if t is not None)
    out["runs"] = runs
    out["last_activity_at"] = max(activity) if activity else None

    gpus = []
    rows, err = smi_rows(p_gpu)
    if err:
        out["gpu_error"] = err
    for r in rows or []:
        if len(r) < 3:
            continue
        try:
            util = num(r[3]) if len(r) > 3 else None
            gpus.append({"index": int(r[0]), "memory_used_mib": int(float(r[1])),
                         "memory_total_mib": int(float(r[2])), "utilization_pct": util or 0.0})
        except ValueError:
            continue
    out["gpus"] = gpus
    apps, _ = smi_rows(p_app)
    out["gpu_processes"] = len(apps) if apps is not None else None
    return out


try:
    doc = main()
except Exception as exc:
    doc = {"v": %(version)d, "box_now": time.time(), "error": "probe crashed: %%s: %%s" %% (type(exc).__name__, exc)}
sys.stdout.write(json.dumps(doc, separators=(",", ":"), allow_nan=False))
sys.stdout.write("\n")
"""


def probe_script() -> str:
    """A command printing one JSON document describing the box (see the module docstring for the layout).

    One Python process does all the work (plus the two ``nvidia-smi`` queries, run in parallel): the first
    candidate interpreter that runs it is also reported as the box's best Python.
    """
    prog = _PROBE_PY % {"version": PROBE_FORMAT}
    body = (
        f"_rs_prog={shlex.quote(prog)}\n"
        + "for _p in " + " ".join(f'"{c}"' for c in PYTHON_CANDIDATES) + "; do\n"
        + '  _path=$(command -v "$_p" 2>/dev/null) || continue\n'
        + '  RS_BEST_PY=$_path "$_path" -c "$_rs_prog" 2>/dev/null && exit 0\n'
        + "done\n"
        + 'printf \'{"v":%d,"box_now":%s,"error":"no python3 on the box: the probe needs one"}\\n\' '
        + f'{PROBE_FORMAT} "$(date +%s)"\n'
    )
    return bash_command(body)


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


def _wrapper_text(*, run_dir: str, code_dir: str, command: str, attempt: int, run_id: str,
                  gpu_mask: Sequence[int], metrics_path: str, max_runtime_s: float) -> str:
    q = shlex.quote
    max_s = max(0, math.ceil(max_runtime_s)) if math.isfinite(max_runtime_s) else 0
    return (
        "#!/bin/bash\n"
        "# rigsync run wrapper: generated by reconciler/remote.py, one per attempt.\n"
        + _BEST_PYTHON_SH
        + _ALIVE_SH
        + f"RUN_DIR={run_dir}\n"
        + 'cd "$RUN_DIR" || exit 1\n'
        + 'printf "%s\\n" "$$" > pid.tmp && mv -f pid.tmp pid\n'
        + 'date +%s.%N > started_at.tmp && mv -f started_at.tmp started_at\n'
        + ': > heartbeat\n'
        + 'export RIGSYNC_RUN_DIR="$RUN_DIR"\n'
        + f"export RIGSYNC_CODE_DIR={code_dir}\n"
        + 'RIGSYNC_PYTHON=$(_rs_best_python) || RIGSYNC_PYTHON=python3\n'
        + "export RIGSYNC_PYTHON\n"
        + f"export RIGSYNC_ATTEMPT={q(str(attempt))}\n"
        + f"export RIGSYNC_RUN_ID={q(run_id)}\n"
        + f"export RIGSYNC_METRICS_FILE={metrics_path}\n"
        + f"export CUDA_VISIBLE_DEVICES={q(','.join(str(g) for g in gpu_mask))}\n"
        + 'if cd "$RIGSYNC_CODE_DIR"; then\n'
        + f"  bash -c {q(command)} >\"$RUN_DIR/stdout.log\" 2>\"$RUN_DIR/stderr.log\" </dev/null &\n"
        + "  CMD=$!\n"
        + "else\n"
        + '  echo "rigsync: code directory $RIGSYNC_CODE_DIR is missing" > "$RUN_DIR/stderr.log"\n'
        + "  CMD=\n"
        + "fi\n"
        # The heartbeat loop is also the box-side max-runtime guard: it still fires if the reconciler is down.
        + "(\n"
        + "  _start=$(date +%s)\n"
        + "  while :; do\n"
        + '    touch "$RUN_DIR/heartbeat"\n'
        + f'    if [ {max_s} -gt 0 ] && [ -n "$CMD" ] && [ $(( $(date +%s) - _start )) -ge {max_s} ]; then\n'
        + f'      echo "max_runtime_s {max_s} exceeded" > "$RUN_DIR/killed_reason"\n'
        + '      kill -TERM "$CMD" 2>/dev/null; sleep 10; kill -KILL "$CMD" 2>/dev/null; break\n'
        + "    fi\n"
        + f"    sleep {HEARTBEAT_INTERVAL_S}\n"
        + "  done\n"
        + ") >/dev/null 2>&1 </dev/null &\n"
        + "HB=$!\n"
        + 'if [ -n "$CMD" ]; then wait "$CMD"; code=$?; else code=127; fi\n'
        + 'kill "$HB" 2>/dev/null\n'
        + 'date +%s.%N > "$RUN_DIR/ended_at.tmp" && mv -f "$RUN_DIR/ended_at.tmp" "$RUN_DIR/ended_at"\n'
        + 'if [ ! -e "$RUN_DIR/exit_code" ]; then\n'
        + '  printf "%s\\n" "$code" > "$RUN_DIR/exit_code.tmp" && mv -f "$RUN_DIR/exit_code.tmp" "$RUN_DIR/exit_code"\n'
        + "fi\n"
        + 'touch "$RUN_DIR/heartbeat"\n'
    )


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
) -> str:
    """A command that takes the launch lock (atomic mkdir), writes meta + wrapper, and starts it detached.

    Exit 0 printing the wrapper's pid; exit ``LAUNCH_LOCK_EXIT`` (17) if this attempt's directory exists.
    """
    _check_name("run id", run_id)
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
        raise ValueError(f"attempt must be a non-negative integer, not {attempt!r}")
    if code_commit is not None:
        _check_name("commit", code_commit)
    name = run_dir_name(run_id, attempt)
    run_dir = f'"$HOME/rigsync/runs/"{shlex.quote(name)}'
    code_dir = f'"$HOME/rigsync/code/"{shlex.quote(code_commit)}' if code_commit else '"$HOME"'
    if metrics_file.startswith("/"):
        metrics_path = shlex.quote(metrics_file)
    else:
        metrics_path = f'"$RUN_DIR/"{shlex.quote(metrics_file)}'
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
    wrapper = _wrapper_text(
        run_dir=run_dir, code_dir=code_dir, command=command, attempt=attempt, run_id=run_id,
        gpu_mask=gpu_mask, metrics_path=metrics_path, max_runtime_s=max_runtime_s,
    )
    body = (
        f"RUN_DIR={run_dir}\n"
        'mkdir -p "$HOME/rigsync/runs" || exit 1\n'
        'if ! mkdir "$RUN_DIR" 2>/dev/null; then\n'
        f'  echo "launch lock held: run directory runs/{name} already exists" >&2\n'
        f"  exit {LAUNCH_LOCK_EXIT}\n"
        "fi\n"
        f'printf "%s\\n" {shlex.quote(json.dumps(meta, sort_keys=True))} > "$RUN_DIR/meta.json" || exit 1\n'
        f'printf "%s" {shlex.quote(wrapper)} > "$RUN_DIR/wrapper.sh" || exit 1\n'
        'cd "$RUN_DIR" || exit 1\n'
        'setsid nohup bash "$RUN_DIR/wrapper.sh" >/dev/null 2>&1 </dev/null &\n'
        "_spawned=$!\n"
        # The wrapper records its own pid (the session leader, which setsid may have forked); wait for it briefly.
        "for _i in $(seq 1 50); do [ -s \"$RUN_DIR/pid\" ] && break; sleep 0.02; done\n"
        'if [ -s "$RUN_DIR/pid" ]; then cat "$RUN_DIR/pid"; else printf "%s\\n" "$_spawned"; fi\n'
    )
    return bash_command(body)


# -------------------------------------------------------------------------------------------------- kill


def kill_script(run_id: str, attempt: int, *, exit_code: int = 137, reason: str) -> str:
    """A command that ends an attempt's whole process group and records ``exit_code`` and ``killed_reason``.

    Idempotent: killing a finished attempt keeps its real exit code and only adds the reason; a missing run
    directory exits ``NO_SUCH_RUN_EXIT`` (3).
    """
    _check_name("run id", run_id)
    name = run_dir_name(run_id, int(attempt))
    code = int(exit_code)
    body = (
        _ALIVE_SH
        + f'RUN_DIR="$HOME/rigsync/runs/"{shlex.quote(name)}\n'
        + 'if [ ! -d "$RUN_DIR" ]; then\n'
        + f'  echo "no run directory runs/{name} on this box" >&2; exit {NO_SUCH_RUN_EXIT}\n'
        + "fi\n"
        + 'pid=$(cat "$RUN_DIR/pid" 2>/dev/null)\n'
        + 'case "$pid" in ""|*[!0-9]*) pid= ;; esac\n'
        + 'if [ -n "$pid" ] && _rs_alive "$pid"; then\n'
        + '  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null\n'
        + "  for _i in $(seq 1 30); do _rs_alive \"$pid\" || break; sleep 0.1; done\n"
        + '  kill -KILL -- "-$pid" 2>/dev/null\n'
        + "  for _i in $(seq 1 20); do _rs_alive \"$pid\" || break; sleep 0.1; done\n"
        + "fi\n"
        + 'if [ -n "$pid" ]; then kill -KILL -- "-$pid" 2>/dev/null; fi\n'
        + 'if [ ! -e "$RUN_DIR/exit_code" ]; then\n'
        + f'  printf "%s\\n" {code} > "$RUN_DIR/exit_code.tmp" && mv -f "$RUN_DIR/exit_code.tmp" "$RUN_DIR/exit_code"\n'
        + "fi\n"
        + 'if [ ! -e "$RUN_DIR/ended_at" ]; then\n'
        + '  date +%s.%N > "$RUN_DIR/ended_at.tmp" && mv -f "$RUN_DIR/ended_at.tmp" "$RUN_DIR/ended_at"\n'
        + "fi\n"
        + f'printf "%s\\n" {shlex.quote(reason)} > "$RUN_DIR/killed_reason"\n'
        + 'cat "$RUN_DIR/exit_code"\n'
    )
    return bash_command(body)


# --------------------------------------------------------------------------------------------- bootstrap


def bootstrap_script(script_text: str, script_hash: str) -> str:
    """A command that runs the fleet's bootstrap script once per box per hash, detached.

    Prints ``ok`` (already done), ``running`` (a live run holds the lock) or ``started <pid>``. A previous
    failure is retried: its ``.failed`` marker is removed when a new run starts.
    """
    h = _check_name("bootstrap hash", script_hash)
    runner = (
        "#!/bin/bash\n"
        'B="$HOME/rigsync/bootstrap"\n'
        f'H={shlex.quote(h)}\n'
        'printf "%s\\n" "$$" > "$B/$H.pid"\n'
        'cd "$HOME"\n'
        'bash "$B/$H.sh" > "$B/$H.log" 2>&1 </dev/null\n'
        "c=$?\n"
        'if [ "$c" -eq 0 ]; then\n'
        '  date +%s.%N > "$B/$H.ok.tmp" && mv -f "$B/$H.ok.tmp" "$B/$H.ok"\n'
        "else\n"
        '  printf "%s\\n" "$c" > "$B/$H.failed.tmp" && mv -f "$B/$H.failed.tmp" "$B/$H.failed"\n'
        "fi\n"
        'rm -rf "$B/$H.lock"\n'
    )
    body = (
        _ALIVE_SH
        + 'B="$HOME/rigsync/bootstrap"\n'
        + f"H={shlex.quote(h)}\n"
        + 'mkdir -p "$B" || exit 1\n'
        + 'if [ -e "$B/$H.ok" ]; then echo ok; exit 0; fi\n'
        + 'if ! mkdir "$B/$H.lock" 2>/dev/null; then\n'
        + '  if _rs_alive "$(cat "$B/$H.pid" 2>/dev/null)"; then echo running; exit 0; fi\n'
        + '  rm -rf "$B/$H.lock"\n'
        + '  mkdir "$B/$H.lock" 2>/dev/null || { echo running; exit 0; }\n'
        + "fi\n"
        + 'rm -f "$B/$H.failed" "$B/$H.pid"\n'
        + f'printf "%s" {shlex.quote(script_text)} > "$B/$H.sh.tmp" && mv -f "$B/$H.sh.tmp" "$B/$H.sh" || exit 1\n'
        + f'printf "%s" {shlex.quote(runner)} > "$B/$H.run.sh" || exit 1\n'
        + 'setsid nohup bash "$B/$H.run.sh" >/dev/null 2>&1 </dev/null &\n'
        + "_spawned=$!\n"
        + "for _i in $(seq 1 50); do [ -s \"$B/$H.pid\" ] && break; sleep 0.02; done\n"
        + 'echo "started $(cat "$B/$H.pid" 2>/dev/null || echo "$_spawned")"\n'
    )
    return bash_command(body)


# --------------------------------------------------------------------------------------------- ship code


def ship_code_script(commit: str) -> str:
    """A command that unpacks a tar stream from stdin into ``code/<commit>/`` atomically (idempotent)."""
    c = _check_name("commit", commit)
    body = (
        'C="$HOME/rigsync/code"\n'
        f"D=\"$C/\"{shlex.quote(c)}\n"
        'mkdir -p "$C" || exit 1\n'
        'if [ -d "$D" ]; then cat >/dev/null; echo present; exit 0; fi\n'
        'T="$D.tmp.$$"\n'
        'rm -rf "$T"; mkdir -p "$T" || exit 1\n'
        'if ! tar -x -C "$T" -f -; then rm -rf "$T"; echo "unpacking the code tar failed" >&2; exit 1; fi\n'
        'if ! mv -T "$T" "$D" 2>/dev/null; then\n'
        '  rm -rf "$T"\n'
        '  [ -d "$D" ] || { echo "could not move the code tree into place" >&2; exit 1; }\n'
        "fi\n"
        "echo unpacked\n"
    )
    return bash_command(body)
