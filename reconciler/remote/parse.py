"""The controller's reading of what the probe (``reconciler/box/probe.py``) printed: ``parse_probe``.

The probe's document is untrusted text from a rented box; this turns it into a ``BoxProbe`` or raises
``RemoteCommandFailed``. ``last_activity_at`` is the box's own answer to "when did anything last happen here"
(``reconciler.box.boxlib.box_activity``, the rule its watchdog uses too): the controller's idle rule reads it as
reported and never recomputes it.
"""

from __future__ import annotations

import json
import math
from typing import Any

from reconciler.errors import RemoteCommandFailed
from reconciler.model import BoxProbe, GpuState, RunDirState, Scalar

__all__ = ["parse_probe"]


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
        raise RemoteCommandFailed(f"instance {instance_id}: malformed probe output: {exc}") from exc
