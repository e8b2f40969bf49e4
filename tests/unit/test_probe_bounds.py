"""The probe's reading of a box's own files is bounded: an honest box with huge files still gives a usable probe.

The probe's functions run here on files in a temp dir (``reconciler.box.probe`` is plain Python); nvidia-smi is a
real subprocess printing what a broken or hostile one would. The box-side bounds (``reconciler.box.limits``) are
held to the controller's (``reconciler.core.bounds``).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.box import boxlib, limits, probe
from reconciler.core import bounds
from reconciler.remote import parse_probe

# ------------------------------------------------------------------------------------------------ the bounds


def test_each_box_side_bound_is_within_the_controllers() -> None:
    assert limits.METRICS_LINE_BYTES <= bounds.METRICS_LINE_BYTES
    assert limits.METRICS_READ_BYTES <= bounds.METRICS_FILE_BYTES
    assert limits.TEXT_CHARS <= bounds.MAX_TEXT_CHARS
    assert limits.GPU_INDEXES <= bounds.MAX_GPUS
    assert limits.MAX_RUNS < bounds.MAX_PROBE_RUNS
    assert limits.PROBE_BYTES <= bounds.PROBE_STDOUT_BYTES // 2  # well under what the controller reads
    assert limits.RUN_BYTES * 4 <= limits.PROBE_BYTES
    assert limits.META_BYTES <= bounds.COMMAND_STDOUT_BYTES
    assert boxlib.SMALL_FILE_BYTES <= limits.META_BYTES


# ------------------------------------------------------------------------------------------------- metrics


def _metrics(tmp_path: Path, lines: list[bytes], key: Any = "acc", goal: Any = "max") -> tuple[Any, Any, Any]:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return probe.metrics(str(path), key, goal)


def test_a_line_past_the_bound_is_skipped_without_being_held(tmp_path: Path) -> None:
    huge = b'{"acc": 99.0, "pad": "' + b"x" * (20 << 20) + b'"}'
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"acc": 0.5}\n' + huge + b'\n{"acc": 0.7, "step": 3}\n')
    tracemalloc.start()
    try:
        last, best, final = probe.metrics(str(path), "acc", "max")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (last, best, final) == ({"acc": 0.7, "step": 3}, 0.7, 0.7)
    assert peak < 4 * limits.METRICS_LINE_BYTES + (1 << 20), peak


def test_a_line_of_exactly_the_bound_is_read(tmp_path: Path) -> None:
    head = b'{"acc": 0.25, "pad": "'
    line = head + b"x" * (limits.METRICS_LINE_BYTES - len(head) - 2) + b'"}'
    assert len(line) == limits.METRICS_LINE_BYTES
    assert _metrics(tmp_path, [line])[1] == 0.25
    assert _metrics(tmp_path, [line[:-2] + b'x"}'])[1] is None  # one byte more: skipped


def test_deep_non_finite_and_huge_numbers_are_skipped(tmp_path: Path) -> None:
    lines = [
        b'{"acc": 0.5}',
        b'{"acc": 0.9, "deep": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"acc": NaN}',
        b'{"acc": Infinity}',
        b'{"acc": -Infinity}',
        b'{"acc": 1e400}',
        b'{"acc": ' + b"9" * 5000 + b"}",
        b'{"acc": true}',
        b'{"acc": "0.99"}',
        b'{"acc": 0.6, "step": 2}',
    ]
    last, best, final = _metrics(tmp_path, lines)
    assert (best, final) == (0.6, 0.6) and last == {"acc": 0.6, "step": 2}


def test_last_metrics_keeps_64_keys_and_bounded_strings(tmp_path: Path) -> None:
    obj: dict[str, Any] = {f"k{i:03d}": i for i in range(100)}
    obj["k000"] = "s" * 5000
    obj["long" * 300] = 1.0
    last, _, _ = _metrics(tmp_path, [json.dumps(obj).encode()], key="k001")
    assert len(last) == limits.MAX_METRIC_KEYS
    assert len(last["k000"]) == limits.TEXT_CHARS
    assert all(len(k) <= limits.TEXT_CHARS for k in last)


def test_of_a_huge_file_only_the_tail_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "METRICS_READ_BYTES", 4096)
    lines = [json.dumps({"acc": 0.99 if i == 0 else i / 10_000, "step": i}).encode() for i in range(2000)]
    last, best, final = _metrics(tmp_path, lines)
    assert last == {"acc": 0.1999, "step": 1999} and final == 0.1999
    assert best == 0.1999  # the 0.99 at the head is not read


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=2048), st.sampled_from(["acc", None, 3, ["x"]]), st.sampled_from(["min", "max", None]))
def test_any_metrics_file_gives_a_bounded_answer(tmp_path: Path, raw: bytes, key: Any, goal: Any) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(raw)
    last, best, final = probe.metrics(str(path), key, goal)
    assert last is None or (isinstance(last, dict) and len(last) <= limits.MAX_METRIC_KEYS)
    for v in (best, final):
        assert v is None or (isinstance(v, float) and v == v and abs(v) != float("inf"))
    json.dumps(last, allow_nan=False)


# --------------------------------------------------------------------------------------------- nvidia-smi


def _smi(script: str) -> tuple[list[dict[str, Any]], str | None]:
    p = subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return probe.smi_gpus(p)


def test_smi_keeps_indexes_0_to_63_once_with_finite_non_negative_numbers() -> None:
    rows = [
        "0, 12, 24564, 5",
        "-1, 0, 24564, 0",
        "100000000000000000000000, 0, 24564, 0",
        "1, inf, 24564, 0",
        "2, nan, 24564, 0",
        "3, -5, 24564, 0",
        "4, 1e400, 24564, 0",
        "0, 0, 24564, 0",
        "５, 0, 24564, 0",
        "6, 10, 24564, -3",
        "[N/A], 1, 2, 3",
        *[f"{i}, 0, 80000, 0" for i in range(7, 200)],
    ]
    gpus, err = _smi("printf '%s\\n' " + " ".join(f"'{r}'" for r in rows))
    assert err is None
    indexes = [g["index"] for g in gpus]
    assert indexes == [0, 6, *range(7, 64)]
    assert gpus[0] == {"index": 0, "memory_used_mib": 12, "memory_total_mib": 24564, "utilization_pct": 5.0}
    assert gpus[1]["utilization_pct"] == 0.0
    json.dumps(gpus, allow_nan=False)


def test_endless_smi_output_is_read_only_to_its_bound() -> None:
    started = time.monotonic()
    gpus, err = _smi("yes '0, 1, 2, 3'")
    assert time.monotonic() - started < 5
    assert err is None and [g["index"] for g in gpus] == [0]


def test_a_hung_smi_is_timed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "SMI_TIMEOUT_S", 0.5)
    started = time.monotonic()
    gpus, err = _smi("echo '0, 1, 2, 3'; exec sleep 30")
    assert time.monotonic() - started < 5
    assert gpus == [] and err == "nvidia-smi timed out"


def test_a_failing_smi_says_why_in_bounded_text() -> None:
    gpus, err = _smi("printf 'x%.0s' $(seq 1 3000); echo; echo 'NVIDIA-SMI has failed'; exit 9")
    assert gpus == [] and err is not None and err.endswith("NVIDIA-SMI has failed") and len(err) <= 200


# ------------------------------------------------------------------------------------------ run directories


def _run_dir(root: Path, name: str, *, finished: bool, mtime: float, meta: bytes | None = None) -> Path:
    d = root / "runs" / name
    d.mkdir(parents=True)
    (d / "meta.json").write_bytes(
        meta
        if meta is not None
        else json.dumps({"gpu_mask": [0], "metric_key": "acc", "code_commit": "c" * 40}).encode()
    )
    (d / "metrics.jsonl").write_text('{"acc": 0.5, "step": 10, "loss": 1.25}\n')
    if finished:
        (d / "exit_code").write_text("0\n")
        (d / "ended_at").write_text(f"{mtime}\n")
    os.utime(d, (mtime, mtime))
    return d


def test_at_most_512_run_dirs_every_unfinished_one_first_then_the_newest_finished(tmp_path: Path) -> None:
    root = tmp_path / "rigsync"
    now = time.time()
    for i in range(600):
        _run_dir(root, f"done{i:03d}.1", finished=True, mtime=now - 10_000 + i)
    for i in range(3):
        _run_dir(root, f"live{i}.1", finished=False, mtime=now - 50_000)  # oldest of all, still reported
    doc = probe.probe(str(root))
    names = {(r["run_id"], r["attempt"]) for r in doc["runs"]}
    assert len(doc["runs"]) == limits.MAX_RUNS
    assert {("live0", 1), ("live1", 1), ("live2", 1)} <= names
    finished = sorted(int(r["run_id"][4:]) for r in doc["runs"] if r["run_id"].startswith("done"))
    assert finished == list(range(600 - (limits.MAX_RUNS - 3), 600))  # the newest
    text = json.dumps(doc, separators=(",", ":"), allow_nan=False)
    assert len(text) < limits.PROBE_BYTES <= bounds.PROBE_STDOUT_BYTES // 2
    assert doc["runs_omitted"] == 603 - limits.MAX_RUNS  # said, so a missing attempt is not read as never launched
    parsed = parse_probe(7, text.encode() + b"\n", gpus_listed=1)
    assert parsed.reachable and len(parsed.runs) == limits.MAX_RUNS
    assert parsed.runs_omitted == 603 - limits.MAX_RUNS


def test_a_box_that_leaves_nothing_out_says_nothing_and_a_bad_count_is_read_as_some(tmp_path: Path) -> None:
    root = tmp_path / "rigsync"
    _run_dir(root, "r.1", finished=True, mtime=time.time())
    doc = probe.probe(str(root))
    assert "runs_omitted" not in doc
    assert parse_probe(7, json.dumps(doc).encode(), gpus_listed=1).runs_omitted == 0
    for bad in (-1, "3", 1.5, True, 10**20):
        parsed = parse_probe(7, json.dumps({**doc, "runs_omitted": bad}).encode(), gpus_listed=1)
        assert parsed.reachable and parsed.runs_omitted == 1, bad
        assert any(t.startswith("runs_omitted: not a count") for t in parsed.rejected), bad


def test_a_run_dirs_files_are_read_bounded_and_its_strings_truncated(tmp_path: Path) -> None:
    root = tmp_path / "rigsync"
    meta = json.dumps(
        {
            "code_commit": "c" * 5000,
            "desired_commit": 7,
            "gpu_mask": [0, -1, 64, 1, "2", True],
            "metric_key": "acc",
            "metrics_file": "m" * 5000,
        }
    ).encode()
    d = _run_dir(root, "r.1", finished=False, mtime=time.time(), meta=meta)
    (d / "exit_code").write_text("9" * 4000)
    (d / "pid").write_text("1\n")
    (d / "killed_reason").write_text("why " * 100_000)
    (d / "started_at").write_text("1e400")
    (root / "runs" / "deep.1").mkdir()
    (root / "runs" / "deep.1" / "meta.json").write_bytes(b"[" * 100_000)
    (root / "runs" / "big.1").mkdir()
    (root / "runs" / "big.1" / "meta.json").write_bytes(b'{"code_commit": "' + b"x" * (1 << 20) + b'"}')
    (root / "runs" / "big.١").mkdir()  # not an attempt number
    runs = {r["run_id"]: r for r in probe.probe(str(root))["runs"]}
    assert set(runs) == {"r", "deep", "big"}
    r = runs["r"]
    assert len(r["code_commit"]) == limits.TEXT_CHARS and r["desired_commit"] is None
    assert r["gpu_mask"] == [0, 1] and r["exit_code"] is None and r["pid"] is None and not r["pid_alive"]
    assert len(r["killed_reason"]) == limits.TEXT_CHARS and r["started_at"] is None
    assert runs["deep"]["code_commit"] is None and runs["big"]["code_commit"] is None


def test_a_run_with_huge_last_metrics_is_still_reported_without_them(tmp_path: Path) -> None:
    root = tmp_path / "rigsync"
    d = _run_dir(root, "wide.1", finished=False, mtime=time.time())
    (d / "metrics.jsonl").write_text(json.dumps({f"k{i}" + "x" * 500: "v" * 600 for i in range(64)}) + "\n")
    (run,) = probe.probe(str(root))["runs"]
    assert run["run_id"] == "wide" and run["last_metrics"] == {}


_FILES = ("meta.json", "exit_code", "pid", "started_at", "ended_at", "killed_reason", "metrics.jsonl", "heartbeat")
_JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(_FILES),
        st.binary(max_size=600) | _JSONISH.map(lambda v: json.dumps(v, allow_nan=True).encode()),
        max_size=len(_FILES),
    )
)
def test_any_run_directory_gives_a_bounded_strict_report(
    tmp_path_factory: pytest.TempPathFactory, files: dict[str, bytes]
) -> None:
    d = tmp_path_factory.mktemp("run")
    for name, raw in files.items():
        (d / name).write_bytes(raw)
    r = probe.run_state(str(d), "r", 1, time.time())
    json.dumps(r, allow_nan=False)
    assert r["pid"] is None or (type(r["pid"]) is int and r["pid"] > 1)
    assert r["exit_code"] is None or (type(r["exit_code"]) is int and -(1 << 31) <= r["exit_code"] < 1 << 31)
    assert all(0 <= g < limits.GPU_INDEXES for g in r["gpu_mask"])
    for key in ("code_commit", "desired_commit", "killed_reason"):
        assert r[key] is None or (isinstance(r[key], str) and len(r[key]) <= limits.TEXT_CHARS)
    assert len(r["last_metrics"]) <= limits.MAX_METRIC_KEYS
    for k, v in r["last_metrics"].items():
        assert len(k) <= limits.TEXT_CHARS and (not isinstance(v, str) or len(v) <= limits.TEXT_CHARS)


def test_a_metrics_file_name_with_a_nul_byte_is_no_file(tmp_path: Path) -> None:
    (tmp_path / "meta.json").write_text(json.dumps({"metrics_file": "a\u0000b", "metric_key": "acc"}))
    r = probe.run_state(str(tmp_path), "r", 1, time.time())
    assert r["last_metrics"] == {} and r["best_metric"] is None and r["metrics_age_s"] is None


def test_names_the_file_system_cannot_decode_are_left_out(tmp_path: Path) -> None:
    root = tmp_path / "rigsync"
    _run_dir(root, "ok.1", finished=True, mtime=time.time())
    os.mkdir(os.path.join(os.fsencode(root / "runs"), b"bad\xff.1"))
    os.makedirs(os.path.join(os.fsencode(root / "code"), b"c\xfe"))
    doc = probe.probe(str(root))
    assert [r["run_id"] for r in doc["runs"]] == ["ok"] and doc["code"] == []
    json.dumps(doc, allow_nan=False).encode("utf-8")


def test_a_pid_past_a_c_int_is_not_alive() -> None:
    """A box's pid file may say 2147483648: ``os.kill`` raises OverflowError for it, which is no process at all."""
    from reconciler.box.boxlib import alive

    assert alive(2147483648) is False and alive(9_999_999_999) is False
