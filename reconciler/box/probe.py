"""rigsync's probe: everything the reconciler needs to know about a box, as one line of JSON on stdout.

This program runs on the box, under the first candidate interpreter that can run it (see ``probe.sh``), so it
uses the standard library only and keeps to Python 3.8 syntax; it travels with ``boxlib.py`` (a bundle built by
``reconciler.remote.commands``). The reconciler imports it only for ``FORMAT``.

``last_activity_at`` is ``boxlib.box_activity``, the rule the watchdog uses too, from the box's start on as both
read it (``boxlib.box_started_at``: the watchdog's recorded start, else the kernel's boot).

It reads ``RIGSYNC_ROOT`` (rigsync's directory on the box, set by the command line) and ``RS_BEST_PY`` (the
interpreter running it, reported as the box's best Python). One ``nvidia-smi`` call per probe, started first so
that it overlaps the file-system scan. Any crash still prints a document, with ``error`` set.

Its one write: it refreshes ``watchdog/touched``, which tells the box's watchdog (``watchdog.py``) that a controller
was here; without it for ``orphan_timeout`` the box destroys itself.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from typing import Any

from reconciler.box.boxlib import (
    WATCHDOG_DIR,
    alive,
    bootstrap_running,
    box_activity,
    box_started_at,
    num,
    read,
    read_pid,
)

FORMAT = 1
NVIDIA_SMI = (
    "nvidia-smi",
    "--query-gpu=index,memory.used,memory.total,utilization.gpu",
    "--format=csv,noheader,nounits",
)
SMI_TIMEOUT_S = 10
WATCHDOG_TOUCH = (WATCHDOG_DIR, "touched")  # under RIGSYNC_ROOT; watchdog.py's TOUCH_FILE


def smi_start() -> subprocess.Popen[bytes] | str:
    try:
        return subprocess.Popen(
            list(NVIDIA_SMI), stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
        )
    except OSError as exc:
        return str(exc)


def smi_gpus(p: subprocess.Popen[bytes] | str) -> tuple[list[dict[str, Any]], str | None]:
    """The GPUs nvidia-smi reported, and its error if it failed."""
    if isinstance(p, str):
        return [], p
    try:
        so, se = p.communicate(timeout=SMI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        return [], "nvidia-smi timed out"
    if p.returncode != 0:
        return [], (se or so).decode("utf-8", "replace").strip()[-200:]
    gpus: list[dict[str, Any]] = []
    for line in so.decode("utf-8", "replace").splitlines():
        r = [c.strip() for c in line.split(",")]
        if len(r) < 3:
            continue
        try:
            util = num(r[3]) if len(r) > 3 else None
            gpus.append({"index": int(r[0]), "memory_used_mib": int(float(r[1])),
                         "memory_total_mib": int(float(r[2])), "utilization_pct": util or 0.0})
        except ValueError:  # "[N/A]" and friends
            continue
    return gpus, None


def metrics(path: str, key: Any, goal: Any) -> tuple[dict[str, Any] | None, float | None, float | None]:
    """The last JSON object of a JSON-lines file, and the best and final values of ``key`` in it."""
    last: dict[str, Any] | None = None
    best: float | None = None
    final: float | None = None
    try:
        with open(path, "rb") as f:
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
    except OSError:
        pass
    if last is not None:
        last = {k: v for k, v in last.items()
                if isinstance(v, (str, bool, int)) or (isinstance(v, float) and math.isfinite(v))}
    return last, best, final


def bootstrap_state(bdir: str) -> dict[str, list[str]]:
    boot: dict[str, list[str]] = {"ok": [], "failed": [], "running": []}
    try:
        names = os.listdir(bdir)
    except OSError:
        names = []
    nameset = set(names)
    for n in sorted(names):
        if n.endswith(".ok"):
            boot["ok"].append(n[:-3])
        elif n.endswith(".failed"):
            boot["failed"].append(n[:-7])
        elif n.endswith(".pid") and bootstrap_running(bdir, n, nameset):
            boot["running"].append(n[:-4])
    return boot


def run_state(d: str, run_id: str, attempt: int, now: float) -> dict[str, Any]:
    try:
        with open(os.path.join(d, "meta.json")) as f:
            meta = json.load(f)
        if not isinstance(meta, dict):
            meta = {}
    except (OSError, ValueError):
        meta = {}
    pid = read_pid(os.path.join(d, "pid"))
    code = read(os.path.join(d, "exit_code"))
    try:
        hb_age: float | None = now - os.stat(os.path.join(d, "heartbeat")).st_mtime
    except OSError:
        hb_age = None
    mfile = meta.get("metrics_file") or "metrics.jsonl"
    mpath = mfile if os.path.isabs(mfile) else os.path.join(d, mfile)
    last, best, final = metrics(mpath, meta.get("metric_key"), meta.get("metric_goal"))
    try:
        metrics_age: float | None = now - os.stat(mpath).st_mtime  # the stall clock: since the file last grew
    except OSError:
        metrics_age = None
    mask = meta.get("gpu_mask")
    return {
        "run_id": run_id,
        "attempt": attempt,
        "gpu_mask": [int(g) for g in mask] if isinstance(mask, list) else [],
        "pid": pid,
        "pid_alive": pid is not None and alive(pid),
        "started_at": num(read(os.path.join(d, "started_at"))),
        "heartbeat_age_s": hb_age,
        "exit_code": int(code) if code and code.lstrip("-").isdigit() else None,
        "ended_at": num(read(os.path.join(d, "ended_at"))),
        "code_commit": meta.get("code_commit"),
        "desired_commit": meta.get("desired_commit"),
        "killed_reason": read(os.path.join(d, "killed_reason")),
        "last_metrics": last or {},
        "best_metric": best,
        "final_metric": final,
        "metrics_age_s": metrics_age,
    }


def touch_watchdog(root: str) -> None:
    """Tell the box's watchdog that the controller was here (the file's mtime is what it reads)."""
    path = os.path.join(root, *WATCHDOG_TOUCH)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a"):
            pass
        os.utime(path, None)
    except OSError:
        pass


def probe(root: str) -> dict[str, Any]:
    now = time.time()
    touch_watchdog(root)
    out: dict[str, Any] = {"v": FORMAT, "box_now": now, "python": os.environ.get("RS_BEST_PY") or sys.executable}
    smi = smi_start()  # runs while the file system is read: on a real box it takes tens of milliseconds

    try:
        st = os.statvfs(os.path.expanduser("~"))
        out["disk_free_gb"] = st.f_bavail * st.f_frsize / 1e9
    except OSError:
        out["disk_free_gb"] = None

    out["bootstrap"] = bootstrap_state(os.path.join(root, "bootstrap"))

    cdir = os.path.join(root, "code")
    try:
        out["code"] = sorted(n for n in os.listdir(cdir) if ".tmp." not in n and os.path.isdir(os.path.join(cdir, n)))
    except OSError:
        out["code"] = []

    runs: list[dict[str, Any]] = []
    rdir = os.path.join(root, "runs")
    try:
        entries = sorted(os.listdir(rdir))
    except OSError:
        entries = []
    for name in entries:
        d = os.path.join(rdir, name)
        run_id, _, att = name.rpartition(".")
        if not run_id or not att.isdigit() or not os.path.isdir(d):
            continue
        r = run_state(d, run_id, int(att), now)
        runs.append(r)
    out["runs"] = runs
    out["last_activity_at"] = box_activity(root, box_started_at(root, now)).last_at

    gpus, err = smi_gpus(smi)
    if err:
        out["gpu_error"] = err
    out["gpus"] = gpus
    return out


def main() -> int:
    root = os.environ.get("RIGSYNC_ROOT")
    try:
        if not root:
            raise RuntimeError("RIGSYNC_ROOT is not set")
        doc = probe(root)
    except Exception as exc:
        doc = {"v": FORMAT, "box_now": time.time(), "error": f"probe crashed: {type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps(doc, separators=(",", ":"), allow_nan=False))
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
