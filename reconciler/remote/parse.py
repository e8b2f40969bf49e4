"""The controller's reading of what the probe (``reconciler/box/probe.py``) printed: ``parse_probe``.

The probe's document is untrusted text from a rented box (a stranger's machine, possibly hostile), so this is a
pure total function: any bytes give a ``BoxProbe``, never an exception. A document that cannot be used as a whole
(over its byte bound, not JSON, too deep, not an object, too many run directories, the probe failed) gives an
*unusable* probe (``reachable=False``, ``unusable="probe: <problem>"``): nothing is sent to the box on the strength
of it. Within a usable document each claim is checked on its own against ``reconciler.core.bounds``: a refused GPU or
run entry is left out and named in ``rejected``; a refused value of a run entry stays None and is named in that
entry's ``problem``. The box's claims are capped by what the provider lists (``gpus_listed``).

The box-side queue (``queued``: each entry's run id, attempt, slot mask, epoch and place) is read entry by entry,
at most ``MAX_QUEUE_ENTRIES``, a refused one named in ``rejected``; the fence (``epoch``) is an integer in
[0, ``MAX_EPOCH``) or None; ``draining`` is true only when the box says ``true``. A run the box started from its
queue carries launch's answer (``launched_pid``/``launched_start``) as ``RunDirState.pid``/``pid_started``, both
valid (``remote.launched``) or neither: a job can forge them, so kill.sh checks them again before any signal.

``last_activity_at`` is the box's own answer to "when did anything last happen here"
(``reconciler.box.boxlib.box_activity``, the rule its watchdog uses too): the controller's idle rule reads it as
reported and never recomputes it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from reconciler.core.bounds import (
    COMMAND_STDOUT_BYTES,
    EXIT_CODE_RANGE,
    MAX_ATTEMPT,
    MAX_EPOCH,
    MAX_GPU_MEMORY_MIB,
    MAX_GPUS,
    MAX_LIST_ENTRIES,
    MAX_METRIC_KEYS,
    MAX_OMITTED_RUNS,
    MAX_PROBE_RUNS,
    MAX_QUEUE_ENTRIES,
    MAX_REJECTED,
    PROBE_STDOUT_BYTES,
    TIME_WINDOW_S,
    bounded_int,
    bounded_text,
    finite,
    strict_json,
)
from reconciler.core.model import BoxProbe, GpuState, QueuedEntry, RunDirState, Scalar
from reconciler.remote.commands import SHA256_RE, is_safe_name
from reconciler.remote.launched import valid_pid, valid_start

__all__ = ["CheckpointUploaded", "parse_probe", "parse_upload", "unusable_probe"]

_COMMIT_RE = re.compile(r"[0-9a-f]{1,64}")  # a git object name, abbreviated or not (sha1 or sha256)
UPLOAD_MAX_BYTES = 1 << 50  # an object size a box may claim it uploaded (the store checks the size it holds)
UPLOAD_MAX_SKIPPED = 1 << 40  # files a harvest may say it skipped


@dataclass(frozen=True)
class CheckpointUploaded:
    """What a box says it uploaded for one checkpoint sync (untrusted: the store checks the size it holds); the
    answer of ``BoxControl.upload_checkpoint`` (``reconciler.ports``)."""

    size: int
    sha256: str
    complete: bool  # nothing under the checkpoint path was skipped (a partial sync never becomes the checkpoint)


def unusable_probe(instance_id: int, problem: str) -> BoxProbe:
    """The probe of a box that answered with something that cannot be used: ``problem`` says what (bounded)."""
    text = bounded_text(f"probe: {problem}")
    return BoxProbe(instance_id=instance_id, reachable=False, error=text, unusable=text)


def _shown(value: Any, limit: int = 60) -> str:
    """A refused value as a short escaped text (its repr, cut before it is made visible)."""
    if isinstance(value, str):
        return bounded_text(repr(value[: limit * 2]), limit)
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"  # no str(): it may be huge
    if isinstance(value, dict | list):
        return f"a JSON {'object' if isinstance(value, dict) else 'array'}"
    return bounded_text(repr(value), limit)


class _Rejected:
    """The claims refused while reading one probe: at most ``MAX_REJECTED`` texts, then a count of the rest."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.more = 0

    def add(self, text: str) -> None:
        if len(self.texts) < MAX_REJECTED:
            self.texts.append(bounded_text(text))
        else:
            self.more += 1

    def result(self) -> tuple[str, ...]:
        return (*self.texts, f"and {self.more} more refused") if self.more else tuple(self.texts)


def _time(v: Any, what: str, problems: list[str]) -> float | None:
    """A timestamp or None: finite, else None and a problem (clamped onto the controller's clock by ``on_clock``)."""
    if v is None:
        return None
    t = finite(v)
    if t is None:
        problems.append(f"{what}: not a finite number: {_shown(v)}")
    return t


def _age(v: Any, what: str, problems: list[str]) -> float | None:
    """A duration the box measured (seconds), kept within [0, ``TIME_WINDOW_S``]."""
    t = _time(v, what, problems)
    return None if t is None else min(max(t, 0.0), TIME_WINDOW_S)


def _names(v: Any, what: str, ok: Any, rejected: _Rejected) -> tuple[str, ...]:
    """A list of names the probe reports (bootstrap hashes, commits): each of its shape, at most
    ``MAX_LIST_ENTRIES``, the others refused."""
    if v is None:
        return ()
    if not isinstance(v, list):
        rejected.add(f"{what}: not a list: {_shown(v)}")
        return ()
    if len(v) > MAX_LIST_ENTRIES:
        rejected.add(f"{what}: {len(v)} entries, only the first {MAX_LIST_ENTRIES} read")
    out: list[str] = []
    for x in v[:MAX_LIST_ENTRIES]:
        if isinstance(x, str) and ok(x):
            if x not in out:
                out.append(x)
        else:
            rejected.add(f"{what}: {_shown(x)}: not a name of its kind")
    return tuple(out)


def _is_commit(x: str) -> bool:
    return _COMMIT_RE.fullmatch(x) is not None


def _commit(v: Any, what: str, problems: list[str]) -> str | None:
    if v is None:
        return None
    if isinstance(v, str) and _is_commit(v):
        return v
    problems.append(f"{what}: not a commit: {_shown(v)}")
    return None


def _metric(v: Any, what: str, problems: list[str]) -> float | None:
    if v is None:
        return None
    m = finite(v)
    if m is None:
        problems.append(f"metrics: {what} out of range")
    return m


def _last_metrics(v: Any, problems: list[str]) -> tuple[tuple[str, Scalar], ...]:
    """The last metrics record as (key, scalar) pairs: at most ``MAX_METRIC_KEYS``, keys bounded, numbers finite
    and in range (others left out: the record is shown, never compared), strings bounded."""
    if v is None:
        return ()
    if not isinstance(v, dict):
        problems.append(f"metrics: last record is not an object: {_shown(v)}")
        return ()
    out: list[tuple[str, Scalar]] = []
    seen: set[str] = set()
    for k, x in v.items():
        if len(out) >= MAX_METRIC_KEYS:
            break
        key = bounded_text(k)  # a JSON object's keys are strings
        if key in seen:
            continue
        value: Scalar
        if isinstance(x, bool):
            value = x
        elif isinstance(x, int):
            if finite(x) is None:
                continue
            value = x
        elif isinstance(x, float):
            f = finite(x)
            if f is None:
                continue
            value = f
        elif isinstance(x, str):
            value = bounded_text(x)
        else:
            continue
        seen.add(key)
        out.append((key, value))
    return tuple(out)


def _gpu_mask(v: Any, gpu_limit: int, problems: list[str]) -> tuple[int, ...]:
    if v is None:
        return ()
    if isinstance(v, list) and len(v) <= gpu_limit:
        mask = [bounded_int(g, 0, gpu_limit) for g in v]
        if all(g is not None for g in mask) and len(set(mask)) == len(mask):
            return tuple(g for g in mask if g is not None)
    problems.append(f"gpu_mask: not distinct GPUs of the instance's {gpu_limit}: {_shown(v)}")
    return ()


def _parse_run(r: Any, n: int, gpu_limit: int, rejected: _Rejected) -> RunDirState | None:
    if not isinstance(r, dict):
        rejected.add(f"run entry {n}: not an object")
        return None
    run_id, attempt = r.get("run_id"), r.get("attempt")
    number = bounded_int(attempt, 0, MAX_ATTEMPT + 1)
    if not isinstance(run_id, str) or not is_safe_name(run_id):
        shown = _shown(run_id if number is None or not isinstance(run_id, str) else f"{run_id}.{number}")
        rejected.add(f"run dir {shown}: not a run id")
        return None
    if number is None:
        rejected.add(f"run dir {_shown(run_id)}: attempt {_shown(attempt)} is not in [0, {MAX_ATTEMPT}]")
        return None
    problems: list[str] = []
    pid, pid_started = valid_pid(r.get("launched_pid")), valid_start(r.get("launched_start"))
    if (pid is None) != (pid_started is None) or (pid is None and r.get("launched_pid") is not None):
        problems.append(f"launched: not a pid and its start: {_shown(r.get('launched_pid'))}")
        pid, pid_started = None, None
    exit_code = r.get("exit_code")
    if exit_code is not None and bounded_int(exit_code, *EXIT_CODE_RANGE) is None:
        problems.append(f"exit_code: not an exit code: {_shown(exit_code)}")
        exit_code = None
    return RunDirState(
        run_id=run_id,
        attempt=number,
        gpu_mask=_gpu_mask(r.get("gpu_mask"), gpu_limit, problems),
        pid_alive=r.get("pid_alive") is True,
        started_at=_time(r.get("started_at"), "started_at", problems),
        heartbeat_age_s=_age(r.get("heartbeat_age_s"), "heartbeat_age_s", problems),
        exit_code=exit_code,
        ended_at=_time(r.get("ended_at"), "ended_at", problems),
        code_commit=_commit(r.get("code_commit"), "code_commit", problems),
        desired_commit=_commit(r.get("desired_commit"), "desired_commit", problems),
        last_metrics=_last_metrics(r.get("last_metrics"), problems),
        best_metric=_metric(r.get("best_metric"), "best_metric", problems),
        final_metric=_metric(r.get("final_metric"), "final_metric", problems),
        metrics_age_s=_age(r.get("metrics_age_s"), "metrics_age_s", problems),
        pid=pid,
        pid_started=pid_started,
        problem=bounded_text("; ".join(problems)) if problems else None,
    )


def _gpus(v: Any, gpu_limit: int, rejected: _Rejected) -> tuple[GpuState, ...]:
    """The GPUs the probe reports, only those the instance has: the first entry of each index in
    ``range(gpu_limit)``, with memory and utilisation in range; every other entry is refused."""
    if v is None:
        return ()
    if not isinstance(v, list):
        rejected.add(f"gpus: not a list: {_shown(v)}")
        return ()
    if len(v) > MAX_GPUS:
        rejected.add(f"gpus: {len(v)} entries, only the first {MAX_GPUS} read")
    gpus: dict[int, GpuState] = {}
    for n, g in enumerate(v[:MAX_GPUS]):
        if not isinstance(g, dict):
            rejected.add(f"gpu entry {n}: not an object")
            continue
        index = bounded_int(g.get("index"), 0, gpu_limit)
        if index is None:
            rejected.add(f"gpu {_shown(g.get('index'))}: not one of the instance's {gpu_limit} GPU(s)")
            continue
        if index in gpus:
            rejected.add(f"gpu {index}: reported twice")
            continue
        used = bounded_int(g.get("memory_used_mib"), 0, MAX_GPU_MEMORY_MIB + 1)
        total = bounded_int(g.get("memory_total_mib"), 0, MAX_GPU_MEMORY_MIB + 1)
        raw_util = g.get("utilization_pct")
        util = 0.0 if raw_util is None else finite(raw_util, limit=100.0)
        if used is None or total is None or util is None or util < 0:
            rejected.add(f"gpu {index}: memory or utilisation out of range")
            continue
        gpus[index] = GpuState(index=index, memory_used_mib=used, memory_total_mib=total, utilization_pct=util)
    return tuple(gpus[i] for i in sorted(gpus))


def _queued(v: Any, gpu_limit: int, rejected: _Rejected) -> tuple[QueuedEntry, ...]:
    """The queue entries the probe reports: at most ``MAX_QUEUE_ENTRIES``, each a run id, an attempt, a mask of
    the instance's GPUs, an epoch and a place, reported once; every other entry is refused."""
    if v is None:
        return ()
    if not isinstance(v, list):
        rejected.add(f"queued: not a list: {_shown(v)}")
        return ()
    if len(v) > MAX_QUEUE_ENTRIES:
        rejected.add(f"queued: {len(v)} entries, only the first {MAX_QUEUE_ENTRIES} read")
    out: list[QueuedEntry] = []
    seen: set[tuple[str, int]] = set()
    for n, q in enumerate(v[:MAX_QUEUE_ENTRIES]):
        if not isinstance(q, dict):
            rejected.add(f"queue entry {n}: not an object")
            continue
        run_id, attempt = q.get("run_id"), bounded_int(q.get("attempt"), 0, MAX_ATTEMPT + 1)
        epoch = bounded_int(q.get("epoch"), 0, MAX_EPOCH)
        position = bounded_int(q.get("position"), 0, MAX_QUEUE_ENTRIES)
        problems: list[str] = []
        mask = _gpu_mask(q.get("gpu_mask"), gpu_limit, problems)
        if not isinstance(run_id, str) or not is_safe_name(run_id) or attempt is None:
            rejected.add(f"queue entry {n}: {_shown(run_id)}: not a run id and attempt")
            continue
        if epoch is None or position is None or problems:
            rejected.add(f"queue entry {_shown(run_id)}.{attempt}: epoch, place or GPU mask out of range")
            continue
        if (run_id, attempt) in seen:
            rejected.add(f"queue entry {_shown(run_id)}.{attempt}: reported twice")
            continue
        seen.add((run_id, attempt))
        out.append(QueuedEntry(run_id=run_id, attempt=attempt, gpu_mask=mask, epoch=epoch, position=position))
    return tuple(out)


def _omitted(v: Any, problems: list[str]) -> int:
    """``runs_omitted``: a count; one that is not is read as "some were left out" (1), never as "none were"."""
    if v is None:
        return 0
    count = bounded_int(v, 0, MAX_OMITTED_RUNS)
    if count is None:
        problems.append(f"runs_omitted: not a count: {_shown(v)}")
        return 1
    return count


def _fence(v: Any, problems: list[str]) -> int | None:
    if v is None:
        return None
    fence = bounded_int(v, 0, MAX_EPOCH)
    if fence is None:
        problems.append(f"epoch: not a lease epoch: {_shown(v)}")
    return fence


def _read(instance_id: int, doc: dict[str, Any], gpu_limit: int) -> BoxProbe:
    rejected = _Rejected()
    raw_runs = doc.get("runs")
    if raw_runs is None:
        raw_runs = []
    if not isinstance(raw_runs, list):
        return unusable_probe(instance_id, f"runs is not a list: {_shown(raw_runs)}")
    if len(raw_runs) > MAX_PROBE_RUNS:
        return unusable_probe(instance_id, f"{len(raw_runs)} run directories, more than {MAX_PROBE_RUNS}")
    runs: dict[tuple[str, int], RunDirState] = {}
    for n, r in enumerate(raw_runs):
        state = _parse_run(r, n, gpu_limit, rejected)
        if state is None:
            continue
        key = (state.run_id, state.attempt)
        if key in runs:
            rejected.add(f"run dir {_shown(state.run_id)}.{state.attempt}: reported twice")
            continue
        runs[key] = state
    boot = doc.get("bootstrap")
    if boot is not None and not isinstance(boot, dict):
        rejected.add(f"bootstrap: not an object: {_shown(boot)}")
        boot = None
    boot = boot or {}
    problems: list[str] = []  # box-wide values refused: reported as ``rejected`` texts
    disk = doc.get("disk_free_gb")
    disk_free = None if disk is None else finite(disk)
    if disk is not None and (disk_free is None or disk_free < 0):
        problems.append(f"disk_free_gb: not a size: {_shown(disk)}")
        disk_free = None
    py = doc.get("python")
    probe = BoxProbe(
        instance_id=instance_id,
        reachable=True,
        gpus=_gpus(doc.get("gpus"), gpu_limit, rejected),
        disk_free_gb=disk_free,
        python=bounded_text(py) if isinstance(py, str) and py else None,
        bootstrap_hashes=_names(boot.get("ok"), "bootstrap.ok", is_safe_name, rejected),
        bootstrap_failed=_names(boot.get("failed"), "bootstrap.failed", is_safe_name, rejected),
        bootstrap_running=_names(boot.get("running"), "bootstrap.running", is_safe_name, rejected),
        code_commits=_names(doc.get("code"), "code", _is_commit, rejected),
        runs=tuple(runs[k] for k in sorted(runs)),
        runs_omitted=_omitted(doc.get("runs_omitted"), problems),
        last_activity_at=_time(doc.get("last_activity_at"), "last_activity_at", problems),
        box_now=_time(doc.get("box_now"), "box_now", problems),
        queued=_queued(doc.get("queued"), gpu_limit, rejected),
        epoch=_fence(doc.get("epoch"), problems),
        draining=doc.get("draining") is True,
    )
    for p in problems:
        rejected.add(p)
    return replace(probe, rejected=rejected.result())


def parse_probe(instance_id: int, stdout: bytes, *, gpus_listed: int) -> BoxProbe:
    """The probe's output as a ``BoxProbe``; never raises. ``gpus_listed`` is how many GPUs the provider lists for
    the instance (0 when it does not say: then ``MAX_GPUS`` caps the box's claims)."""
    if len(stdout) > PROBE_STDOUT_BYTES:
        return unusable_probe(instance_id, f"output over {PROBE_STDOUT_BYTES} bytes")
    gpu_limit = min(gpus_listed, MAX_GPUS) if gpus_listed > 0 else MAX_GPUS
    text = stdout.decode("utf-8", "replace").strip()
    # Login banners or a chatty .bashrc may print before us: the document is the last non-empty line.
    line = text.splitlines()[-1] if text else ""
    if not line:
        return unusable_probe(instance_id, "printed no JSON document: (no output)")
    doc, problem = strict_json(line)
    if problem is not None:
        if not line.lstrip().startswith(("{", "[")):
            return unusable_probe(instance_id, f"printed no JSON document: {_shown(line, 120)}")
        return unusable_probe(instance_id, problem)
    if not isinstance(doc, dict):
        return unusable_probe(instance_id, "output is not a JSON object")
    error = doc.get("error")
    if error:
        shown = bounded_text(error, 300) if isinstance(error, str) else _shown(error)
        return unusable_probe(instance_id, f"failed on the box: {shown}")
    return _read(instance_id, doc, gpu_limit)


def parse_upload(raw: bytes) -> tuple[CheckpointUploaded | None, str | None]:
    """What ``upload.sh`` printed: harvest.py's counts line (``{"bytes", "files", "skipped"}``), then transfer.py's
    line for the tar (``{"size", "sha256"}``). Untrusted and total: ``(answer, None)``, or ``(None, problem)`` for
    anything else (over ``COMMAND_STDOUT_BYTES``, not two JSON objects, a value out of its bounds). ``complete``:
    the harvest skipped nothing."""
    if len(raw) > COMMAND_STDOUT_BYTES:
        return None, f"upload: answer over {COMMAND_STDOUT_BYTES} bytes"
    lines = raw.decode("utf-8", "replace").strip().splitlines()
    if len(lines) != 2:
        return None, f"upload: {len(lines)} lines where the counts and the upload's two were expected"
    (counts, problem), (sent, sent_problem) = strict_json(lines[0]), strict_json(lines[1])
    if problem or sent_problem or not isinstance(counts, dict) or not isinstance(sent, dict):
        return None, bounded_text(f"upload: not two JSON objects ({problem or sent_problem or 'another JSON type'})")
    skipped = bounded_int(counts.get("skipped"), 0, UPLOAD_MAX_SKIPPED)
    size = bounded_int(sent.get("size"), 0, UPLOAD_MAX_BYTES)
    sha256 = sent.get("sha256")
    if skipped is None or size is None or not isinstance(sha256, str) or not SHA256_RE.fullmatch(sha256):
        return None, "upload: a count, the size or the SHA-256 is missing or out of bounds"
    return CheckpointUploaded(size=size, sha256=sha256, complete=skipped == 0), None
