"""observed/*.yaml from a hostile box's answers (issue 20): strict, bounded, escaped, whatever the box claimed.

The honest world of ``test_observed_files`` with a probe that claims 100,000 GPUs (and GPU -1, and 10^23 MiB), huge
lists of control- and bidi-laden commit ids, an archive holding NaN/Infinity/1e308 metrics, and plan texts quoting a
box's stderr: every file still parses strictly, validates, stays small, and carries no raw control or bidi character.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace

import jsonschema
import yaml
from test_observed_files import ROOT, SCHEMAS, STATUS_OK, T0, a_plan, desired, world

from reconciler.core.model import AttemptOutcome, AttemptRecord, Desired, Drift, DriftClass, GpuState
from reconciler.observed.codec import FLEET, RUNS, STATUS, iso
from reconciler.observed.documents import ReconcilerStatus, render_observed

__all__ = ["desired"]  # the fixture, shared with test_observed_files

NASTY = "\x1b[31mred\x07\x9b2J\u202eevil\u2066\x00"
RAW_HAZARD = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


_RENDERED: dict[str | None, tuple[dict[str, str], int]] = {}


def _hostile(desired: Desired) -> tuple[dict[str, str], int]:
    """The files rendered from the hostile world (built once per process: 100,000 GPUs take a second)."""
    if desired.commit not in _RENDERED:
        _RENDERED[desired.commit] = _render_hostile(desired)
    return _RENDERED[desired.commit]


def _render_hostile(desired: Desired) -> tuple[dict[str, str], int]:
    honest = world(desired)
    (probe,) = honest.probes
    gpus = tuple(GpuState(index=i, memory_used_mib=0, memory_total_mib=12288) for i in range(100_000))
    gpus += (GpuState(index=-1, memory_used_mib=0, memory_total_mib=1), GpuState(0, 0, 10**23))
    probe = replace(
        probe,
        gpus=gpus,
        code_commits=tuple(f"{i:040x}{NASTY}" + "z" * 5000 for i in range(10_000)),
        bootstrap_hashes=tuple(f"h{i}{NASTY}" for i in range(10_000)),
    )
    run_id = honest.history[0].run_id
    forged = tuple(
        AttemptRecord(
            run_id=run_id,
            attempt=10 + i,
            sweep=honest.history[0].sweep,
            phase=AttemptOutcome.SUCCEEDED,
            best_metric=m,
            instance_id=11,
            ended_at=T0 - 50,
        )
        for i, m in enumerate((math.nan, math.inf, -math.inf, 1e308))
    )
    observed = replace(honest, probes=(probe,), history=honest.history + forged)
    plan = a_plan(desired)
    plan = replace(
        plan,
        drift=(*plan.drift, Drift(DriftClass.FOREIGN, f"instance/{NASTY}", NASTY * 20000, "none")),
        warnings=(f"box said {NASTY}" * 10_000,),
    )
    status = replace(STATUS_OK, apply_errors=(f"RemoteCommandFailed: exit 1: {NASTY}\nline two" * 10_000,))
    files = render_observed(desired=desired, observed=observed, plan=plan, status=status, now=T0)
    return files, len(gpus)


def test_observed_files_from_a_hostile_box_are_strict_bounded_and_escaped(desired: Desired) -> None:
    files, _ = _hostile(desired)
    for path, text in files.items():
        assert len(text.encode()) < 96 << 10, (path, len(text))
        assert RAW_HAZARD.search(text) is None, path
        doc = yaml.safe_load(text)
        json.dumps(doc, allow_nan=False, default=str)  # no NaN or Infinity anywhere
        assert ".nan" not in text.lower() and ".inf" not in text.lower(), path
        schema = json.loads((ROOT / "schemas" / f"{SCHEMAS[path]}.schema.json").read_text())
        jsonschema.Draft202012Validator(schema).validate(doc)


def test_fleet_yaml_lists_at_most_the_listed_gpus_and_counts_the_rest(desired: Desired) -> None:
    files, claimed = _hostile(desired)
    box = next(b for b in yaml.safe_load(files[FLEET])["boxes"] if b["id"] == 11)
    assert [g["index"] for g in box["gpus"]] == [0] and box["gpus"][0]["memory_total_mib"] == 12288
    assert box["gpus_unlisted"] == claimed - 1
    assert len(box["code_commits"]) <= 64 and all(len(c) <= 512 for c in box["code_commits"])
    assert all("\\x1b" in c for c in box["bootstrapped"])  # escaped, still visible


def test_runs_yaml_best_metric_ignores_non_finite_and_out_of_range(desired: Desired) -> None:
    files, _ = _hostile(desired)
    runs = yaml.safe_load(files[RUNS])["sweeps"]
    (entry,) = [r for s in runs.values() for rid, r in s.items() if r.get("attempts", 0) >= 10]
    assert entry["best_metric"] == 410.0


def test_status_yaml_keeps_error_lines_but_bounds_them(desired: Desired) -> None:
    files, _ = _hostile(desired)
    (err,) = yaml.safe_load(files[STATUS])["apply_errors"]
    assert "\nline two" in err and len(err) <= 2000 and "\\x1b[31m" in err


def test_a_time_past_year_9999_is_not_an_error() -> None:
    assert iso(1e12) is None and iso(math.inf) is None and iso(math.nan) is None and iso(T0) == "2026-11-03T12:00:00Z"


def test_honest_files_are_unchanged_by_the_bounds(desired: Desired) -> None:
    files = render_observed(desired=desired, observed=world(desired), plan=a_plan(desired), status=STATUS_OK, now=T0)
    fleet = yaml.safe_load(files[FLEET])
    assert all("gpus_unlisted" not in b for b in fleet["boxes"])
    assert ReconcilerStatus().apply_errors == ()
