"""rigsync's probe: everything the reconciler needs to know about a box, as one line of JSON on stdout.

This program runs on the box, under the first candidate interpreter that can run it (see ``probe.sh``), so it
uses the standard library only and keeps to Python 3.8 syntax; it travels with ``boxlib.py`` (a bundle built by
``reconciler.remote.commands``). The reconciler does not import it (its ``FORMAT`` is ``limits.PROBE_FORMAT``).

``last_activity_at`` is ``boxlib.box_activity``, the rule the watchdog uses too, from the box's start on as both
read it (``boxlib.box_started_at``: the watchdog's recorded start, else the kernel's boot).

It reads ``RIGSYNC_ROOT`` (rigsync's directory on the box, set by the command line) and ``RS_BEST_PY`` (the
interpreter running it, reported as the box's best Python). One ``nvidia-smi`` call per probe, started first so
that it overlaps the file-system scan. Any crash still prints a document, with ``error`` set.

Its writes: it refreshes ``watchdog/touched``, which tells the box's watchdog (``watchdog.py``) that a controller
was here (without it for ``orphan_timeout`` the box destroys itself); it raises the box's fence (``epoch``, under
the lock ``queue.sh`` takes) to the controller's lease epoch (``RS_EPOCH``; 0 only reads it); and before it reads
the runs it runs the dequeue (``bin/dequeue.sh``) of every slot with queue entries, the backstop for a wrapper that
died before it could start its slot's next attempt.

The box-side queue is reported as ``queued`` (each entry's run id, attempt, slot mask, epoch and place in its slot,
at most ``MAX_QUEUED``), the fence as ``epoch`` (null: never shown one), the drain marker as ``draining``, and a run
the dequeue started with launch's answer as its ``launched_pid``/``launched_start`` (from its ``launched`` file).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import selectors
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any, BinaryIO

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
from reconciler.box.limits import (
    GPU_INDEXES,
    MAX_LISTED,
    MAX_METRIC_KEYS,
    MAX_QUEUED,
    MAX_RUNS,
    META_BYTES,
    METRICS_INT_DIGITS,
    METRICS_LINE_BYTES,
    METRICS_READ_BYTES,
    PROBE_BYTES,
    PROBE_FORMAT,
    RUN_BYTES,
    SMI_BYTES,
    TEXT_CHARS,
    text,
)

FORMAT = PROBE_FORMAT
NVIDIA_SMI = (
    "nvidia-smi",
    "--query-gpu=index,memory.used,memory.total,utilization.gpu",
    "--format=csv,noheader,nounits",
)
SMI_TIMEOUT_S = 10
DEQUEUE_TIMEOUT_S = 20
EPOCH_DIGITS = 18
WATCHDOG_TOUCH = (WATCHDOG_DIR, "touched")  # under RIGSYNC_ROOT; watchdog.py's TOUCH_FILE


def smi_start() -> subprocess.Popen[bytes] | str:
    try:
        return subprocess.Popen(
            list(NVIDIA_SMI), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    except OSError as exc:
        return str(exc)


def _read_bounded(p: subprocess.Popen[bytes], limit: int, timeout: float) -> tuple[bytes, str | None, bool]:
    """At most ``limit`` bytes of ``p``'s output within ``timeout`` seconds, its error, and whether it was cut off
    at ``limit`` (then only its full lines are kept). Past either bound it is killed."""
    assert p.stdout is not None
    deadline = time.monotonic() + timeout
    out = bytearray()
    with selectors.DefaultSelector() as sel:
        sel.register(p.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                p.kill()
                p.wait()
                return bytes(out), "nvidia-smi timed out", False
            if not sel.select(left):
                continue
            chunk = os.read(p.stdout.fileno(), 65536)
            if not chunk:
                break
            out += chunk[: limit - len(out)]
            if len(out) >= limit:
                p.kill()  # more than any real GPU list: what was read is what counts, up to its last full line
                p.wait()
                return bytes(out[: out.rfind(b"\n") + 1]), None, True
    try:
        p.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        return bytes(out), "nvidia-smi timed out", False
    return bytes(out), None, False


def _amount(cell: str) -> float | None:
    """A finite number >= 0 written in an nvidia-smi cell; None for "[N/A]", negatives, inf, nan and the like."""
    v = num(cell[:64])
    return v if v is not None and v >= 0 else None


def smi_gpus(p: subprocess.Popen[bytes] | str) -> tuple[list[dict[str, Any]], str | None]:
    """The GPUs nvidia-smi reported (indexes 0..63, each once, numbers finite and >= 0), and its error if it failed."""
    if isinstance(p, str):
        return [], text(p)
    so, err, cut = _read_bounded(p, SMI_BYTES, SMI_TIMEOUT_S)
    if err:
        return [], err
    if p.returncode != 0 and not cut:  # one cut off was killed by us: its exit says nothing
        return [], text(so.decode("utf-8", "replace").strip()[-200:])
    gpus: list[dict[str, Any]] = []
    seen: set[int] = set()
    for line in so.decode("utf-8", "replace").splitlines():
        r = [c.strip() for c in line.split(",")]
        if len(r) < 3 or not r[0].isascii() or not r[0].isdigit() or len(r[0]) > 2:
            continue
        index = int(r[0])
        used, total = _amount(r[1]), _amount(r[2])
        if index >= GPU_INDEXES or index in seen or used is None or total is None:
            continue
        util = _amount(r[3]) if len(r) > 3 else None
        seen.add(index)
        gpus.append(
            {
                "index": index,
                "memory_used_mib": int(used),
                "memory_total_mib": int(total),
                "utilization_pct": util or 0.0,
            }
        )
    return gpus, None


def _lines(f: BinaryIO, limit: int) -> Iterator[bytes]:
    """Each line of ``f`` no longer than ``limit`` bytes; a longer one is skipped, never held whole."""
    while True:
        line = f.readline(limit + 1)
        if not line:
            return
        if len(line) > limit and not (len(line) == limit + 1 and line.endswith(b"\n")):
            while line and not line.endswith(b"\n"):
                line = f.readline(limit + 1)
            continue
        yield line


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a finite number")


def _finite_float(s: str) -> float:
    v = float(s)
    if not math.isfinite(v):
        raise ValueError(f"{s[:20]} is not a finite number")
    return v


def _bounded_int(s: str) -> int:
    if len(s.lstrip("-")) > METRICS_INT_DIGITS:
        raise ValueError("an integer too long to be a number")
    return int(s)


def _json_line(line: bytes) -> Any:
    """One JSON value from a metrics line; ValueError for non-finite numbers, too deep or invalid JSON."""
    try:
        return json.loads(line, parse_constant=_no_constant, parse_float=_finite_float, parse_int=_bounded_int)
    except RecursionError as exc:
        raise ValueError("nested too deep") from exc


def _scalar(v: Any) -> Any:
    """A metric value to report as it is (strings bounded), or None to leave it out."""
    if isinstance(v, str):
        return text(v)
    if isinstance(v, bool) or (isinstance(v, int) and abs(v) < 1 << 53):
        return v
    if isinstance(v, float) and math.isfinite(v):
        return v
    return None


def metrics(path: str, key: Any, goal: Any) -> tuple[dict[str, Any] | None, float | None, float | None]:
    """The last JSON object of a JSON-lines file, and the best and final values of ``key`` in it.

    Streamed with a bounded line buffer (``METRICS_LINE_BYTES``); of a file past ``METRICS_READ_BYTES`` only its
    tail is read. Lines too long, too deep, invalid or holding a non-finite number are skipped."""
    last: dict[str, Any] | None = None
    best: float | None = None
    final: float | None = None
    if not isinstance(key, str):
        key = None
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > METRICS_READ_BYTES:
                f.seek(size - METRICS_READ_BYTES)
                partial = f.readline(METRICS_LINE_BYTES + 1)  # the line the tail starts in, however long
                while partial and not partial.endswith(b"\n"):
                    partial = f.readline(METRICS_LINE_BYTES + 1)
            for raw in _lines(f, METRICS_LINE_BYTES):
                line = raw.strip()
                if not line.startswith(b"{"):
                    continue
                try:
                    obj = _json_line(line)
                except ValueError:
                    continue
                if not isinstance(obj, dict):
                    continue
                last = obj
                if key is None:
                    continue
                v = obj.get(key)
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    continue
                value = float(v)
                if not math.isfinite(value):
                    continue
                final = value
                if best is None or (final < best if goal == "min" else final > best):
                    best = final
    except (OSError, ValueError):  # ValueError: a path with a NUL byte
        pass
    if last is not None:
        kept: dict[str, Any] = {}
        for k, v in last.items():
            if len(kept) >= MAX_METRIC_KEYS:
                break
            value = _scalar(v)
            if value is not None:
                kept[k[:TEXT_CHARS]] = value
        last = kept
    return last, best, final


def bootstrap_state(bdir: str) -> dict[str, list[str]]:
    boot: dict[str, list[str]] = {"ok": [], "failed": [], "running": []}
    try:
        names = os.listdir(bdir)
    except OSError:
        names = []
    nameset = set(names)
    for n in sorted(n for n in names if _plain(n)):
        if n.endswith(".ok"):
            boot["ok"].append(n[:-3][:TEXT_CHARS])
        elif n.endswith(".failed"):
            boot["failed"].append(n[:-7][:TEXT_CHARS])
        elif n.endswith(".pid") and len(boot["running"]) < MAX_LISTED and bootstrap_running(bdir, n, nameset):
            boot["running"].append(n[:-4][:TEXT_CHARS])
    return {k: v[-MAX_LISTED:] for k, v in boot.items()}


def _plain(name: str) -> bool:
    """A file name that is text (not bytes the file system could not decode, which no JSON reader can store)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _meta(d: str) -> dict[str, Any]:
    """A run's meta.json (read bounded), or {} when it cannot be read as a JSON object."""
    try:
        with open(os.path.join(d, "meta.json"), "rb") as f:
            meta = json.loads(f.read(META_BYTES))
    except (OSError, ValueError, RecursionError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _exit_code(code: str | None) -> int | None:
    if not code or len(code) > 11 or not code.isascii() or not code.lstrip("-").isdigit():
        return None
    value = int(code)
    return value if -(1 << 31) <= value < 1 << 31 else None


def _launched(d: str) -> tuple[int | None, int | None]:
    """launch's answer ``PID START`` for a run the dequeue started (its ``launched`` file), as numbers or None."""
    words = (read(os.path.join(d, "launched"), 128) or "").split()
    if len(words) != 2 or not all(w.isascii() and w.isdigit() and len(w) <= 20 for w in words):
        return None, None
    return int(words[0]), int(words[1])


def run_state(d: str, run_id: str, attempt: int, now: float) -> dict[str, Any]:
    meta = _meta(d)
    launched_pid, launched_start = _launched(d)
    pid = read_pid(os.path.join(d, "pid"))
    try:
        hb_age: float | None = now - os.stat(os.path.join(d, "heartbeat")).st_mtime
    except OSError:
        hb_age = None
    mfile = text(meta.get("metrics_file")) or "metrics.jsonl"
    mpath = mfile if os.path.isabs(mfile) else os.path.join(d, mfile)
    last, best, final = metrics(mpath, meta.get("metric_key"), meta.get("metric_goal"))
    try:
        metrics_age: float | None = now - os.stat(mpath).st_mtime  # the stall clock: since the file last grew
    except (OSError, ValueError):
        metrics_age = None
    mask = meta.get("gpu_mask")
    mask = mask[:GPU_INDEXES] if isinstance(mask, list) else []
    gpu_mask = [g for g in mask if type(g) is int and 0 <= g < GPU_INDEXES]
    return {
        "run_id": run_id[:TEXT_CHARS],
        "attempt": attempt,
        "gpu_mask": gpu_mask,
        "pid": pid,
        "pid_alive": pid is not None and alive(pid),
        "started_at": num(read(os.path.join(d, "started_at"))),
        "heartbeat_age_s": hb_age,
        "exit_code": _exit_code(read(os.path.join(d, "exit_code"))),
        "ended_at": num(read(os.path.join(d, "ended_at"))),
        "code_commit": text(meta.get("code_commit")),
        "desired_commit": text(meta.get("desired_commit")),
        "killed_reason": text(read(os.path.join(d, "killed_reason"))),
        "last_metrics": last or {},
        "best_metric": best,
        "final_metric": final,
        "metrics_age_s": metrics_age,
        "launched_pid": launched_pid,
        "launched_start": launched_start,
    }


def _run_dirs(rdir: str) -> tuple[list[tuple[str, str, int]], int]:
    """The run directories to report (name, run id, attempt): at most ``MAX_RUNS``, every unfinished one first
    (no exit_code yet), then the newest finished, each group newest first by the directory's mtime; and how many
    run directories past ``MAX_RUNS`` were left out."""
    try:
        entries = os.listdir(rdir)
    except OSError:
        return [], 0
    unfinished: list[tuple[float, str, str, int]] = []
    finished: list[tuple[float, str, str, int]] = []
    for name in entries:
        run_id, _, att = name.rpartition(".")
        if not run_id or not att.isascii() or not att.isdigit() or len(att) > 9 or not _plain(name):
            continue
        d = os.path.join(rdir, name)
        try:
            st = os.stat(d)
        except (OSError, ValueError):
            continue
        if not os.path.isdir(d):
            continue
        row = (st.st_mtime, name, run_id, int(att))
        (finished if os.path.exists(os.path.join(d, "exit_code")) else unfinished).append(row)
    chosen = sorted(unfinished, reverse=True)[:MAX_RUNS]
    chosen += sorted(finished, reverse=True)[: MAX_RUNS - len(chosen)]
    return [(name, run_id, att) for _, name, run_id, att in chosen], len(unfinished) + len(finished) - len(chosen)


def _size(doc: Any) -> int:
    return len(json.dumps(doc, separators=(",", ":"), allow_nan=False)) + 1


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


def _epoch_text(t: str | None) -> int | None:
    if t is None or not t.isascii() or not t.isdigit() or len(t) > EPOCH_DIGITS:
        return None
    return int(t)


def raise_fence(root: str, epoch: int) -> int | None:
    """The box's fence after raising it to ``epoch`` (under ``epoch.lock``, as ``queue.sh``'s ``_rs_fence``); None
    when it was never shown an epoch. 0 never lowers it."""
    path = os.path.join(root, "epoch")
    try:
        with open(os.path.join(root, "epoch.lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            fence = _epoch_text(read(path, 64))
            if epoch > 0 and (fence is None or epoch > fence):
                with open(path + ".tmp", "w") as f:
                    f.write(f"{epoch}\n")
                os.replace(path + ".tmp", path)
                fence = epoch
            return fence
    except OSError:
        return _epoch_text(read(path, 64))


def _slots(root: str) -> list[str]:
    try:
        names = os.listdir(os.path.join(root, "queue"))
    except OSError:
        return []
    return sorted(n for n in names if n and n.isascii() and all(c.isdigit() or c in "_cpu" for c in n)
                  and os.path.isdir(os.path.join(root, "queue", n)))


def _entries(root: str, slot: str) -> list[str]:
    try:
        names = os.listdir(os.path.join(root, "queue", slot))
    except OSError:
        return []
    return sorted(n for n in names if n[:1].isdigit() and "-" in n and _plain(n))


def run_dequeues(root: str) -> None:
    """The dequeue of every slot that has entries (it starts the head only when nothing live holds the slot)."""
    program = os.path.join(root, "bin", "dequeue.sh")
    if not os.path.isfile(program):
        return
    for slot in _slots(root):
        if not _entries(root, slot):
            continue
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(["bash", program, slot], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=DEQUEUE_TIMEOUT_S, check=False)


def queue_state(root: str) -> list[dict[str, Any]]:
    """The queue entries, slot by slot in their start order, at most ``MAX_QUEUED``."""
    out: list[dict[str, Any]] = []
    for slot in _slots(root):
        mask = [int(g) for g in slot.split("_") if g.isdigit() and len(g) <= 2 and int(g) < GPU_INDEXES]
        for position, entry in enumerate(_entries(root, slot)):
            if len(out) >= MAX_QUEUED:
                return out
            run_id, _, att = entry.split("-", 1)[1].rpartition(".")
            if not run_id or not att.isascii() or not att.isdigit() or len(att) > 9:
                continue
            epoch = _epoch_text(read(os.path.join(root, "queue", slot, entry, "epoch"), 64))
            out.append({"run_id": run_id[:TEXT_CHARS], "attempt": int(att), "gpu_mask": mask,
                        "epoch": epoch or 0, "position": position})
    return out


def probe(root: str) -> dict[str, Any]:
    now = time.time()
    touch_watchdog(root)
    wanted = _epoch_text(os.environ.get("RS_EPOCH") or "0")
    fence = raise_fence(root, wanted or 0)
    run_dequeues(root)
    out: dict[str, Any] = {"v": FORMAT, "box_now": now, "python": text(os.environ.get("RS_BEST_PY") or sys.executable)}
    smi = smi_start()  # runs while the file system is read: on a real box it takes tens of milliseconds

    try:
        st = os.statvfs(os.path.expanduser("~"))
        out["disk_free_gb"] = st.f_bavail * st.f_frsize / 1e9
    except OSError:
        out["disk_free_gb"] = None

    out["bootstrap"] = bootstrap_state(os.path.join(root, "bootstrap"))

    cdir = os.path.join(root, "code")
    try:
        code = sorted(
            n for n in os.listdir(cdir) if ".tmp." not in n and _plain(n) and os.path.isdir(os.path.join(cdir, n))
        )
    except OSError:
        code = []
    out["code"] = [n[:TEXT_CHARS] for n in code[-MAX_LISTED:]]

    # The queue is read before the runs: a dequeue makes the run directory before it drops the entry, so an attempt
    # the box starts while this reads shows in one list or both, never in neither ("launch never happened").
    out["queued"] = queue_state(root)
    rdir = os.path.join(root, "runs")
    runs: list[tuple[str, dict[str, Any]]] = []
    listed, omitted = _run_dirs(rdir)
    budget = PROBE_BYTES - 64 * 1024  # what the rest of the document may take (GPUs, lists, errors: a few KiB)
    for name, run_id, att in listed:
        r = run_state(os.path.join(rdir, name), run_id, att, now)
        size = _size(r)
        if size > RUN_BYTES:  # its last metrics are what can be large: the run itself is still reported
            r["last_metrics"] = {}
            size = _size(r)
        if size > budget:
            omitted += 1
            continue
        budget -= size
        runs.append((name, r))
    out["runs"] = [r for _, r in sorted(runs, key=lambda nr: nr[0])]
    if omitted:
        out["runs_omitted"] = omitted
    out["last_activity_at"] = box_activity(root, box_started_at(root, now)).last_at
    out["epoch"] = fence
    out["draining"] = os.path.exists(os.path.join(root, "drain"))

    gpus, err = smi_gpus(smi)
    if err:
        out["gpu_error"] = err
    out["gpus"] = gpus
    # The box's clock as the answer leaves: the controller sets it against its own clock when the answer is in, so
    # the time this probe took (the queue's dequeues, nvidia-smi, a large run directory) is not read as skew.
    out["box_now"] = time.time()
    return out


def main() -> int:
    root = os.environ.get("RIGSYNC_ROOT")
    try:
        if not root:
            raise RuntimeError("RIGSYNC_ROOT is not set")
        doc = probe(root)
    except Exception as exc:
        doc = {"v": FORMAT, "box_now": time.time(), "error": text(f"probe crashed: {type(exc).__name__}: {exc}")}
    sys.stdout.write(json.dumps(doc, separators=(",", ":"), allow_nan=False))
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
