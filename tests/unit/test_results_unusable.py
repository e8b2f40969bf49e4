"""What leaves a box for git, held to issue 20: a harvested metrics file is read totally and under its bounds, the
committed curve is strict JSON that counts its drops, and the record path settles an attempt whatever its box wrote
(bad metrics, an exception from reading them, ``Record.skip_harvest``), with notes that name no controller path."""

from __future__ import annotations

import io
import json
import math
import tarfile
import tempfile
import tracemalloc
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from fakes import FakeArchive, FakeClock, FakeWorld, desired_state, observe_and_plan, offer
from hypothesis import given
from hypothesis import strategies as st
from tarutil import tar_of

from reconciler import apply as apply_module
from reconciler.adapters.store import MANIFEST, LocalStore, _manifest
from reconciler.apply import ApplyContext, ApplyResult, apply
from reconciler.core.actions import Plan, Record
from reconciler.core.bounds import MAX_METRIC_ABS, MAX_TEXT_CHARS, METRICS_LINE_BYTES, TIME_WINDOW_S
from reconciler.core.curves import read_metrics, render_curve
from reconciler.core.model import Desired, Observed
from reconciler.errors import StoreError
from reconciler.observed.archive_lines import record_to_json

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "observed-curve.schema.json").read_text())


def _strict(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise AssertionError(f"non-strict JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


# ------------------------------------------------------------------------------------------- read_metrics


@given(st.binary(max_size=4096), st.sampled_from(["reward", "loss", "step"]))
def test_read_metrics_is_total_finite_and_bounded_for_any_bytes(data: bytes, key: str) -> None:
    got = read_metrics(data, key, max_line=256, max_file=2048)
    assert isinstance(got.points, list) and got.total >= len(got.points)
    assert len(got.points) <= data.count(b"\n") + 1 and got.dropped <= data.count(b"\n") + 1
    for x, y in got.points:
        assert isinstance(x, float) and isinstance(y, float)
        assert math.isfinite(x) and math.isfinite(y) and abs(y) <= MAX_METRIC_ABS
    assert got.problem is None or (isinstance(got.problem, str) and len(got.problem) <= 512)


@given(
    st.lists(
        st.one_of(
            st.floats(allow_nan=True, allow_infinity=True),
            st.integers(min_value=-(10**400), max_value=10**400),
            st.text(max_size=5),
            st.none(),
            st.booleans(),
        ),
        max_size=30,
    )
)
def test_read_metrics_keeps_exactly_the_finite_in_range_values(values: list[Any]) -> None:
    lines = [json.dumps({"step": i, "reward": v}).encode() for i, v in enumerate(values)]
    got = read_metrics(b"\n".join(lines), "reward")
    numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    good = [v for v in numbers if abs(v) <= MAX_METRIC_ABS and (not isinstance(v, float) or math.isfinite(v))]
    assert [y for _, y in got.points] == [float(v) for v in good]
    assert got.dropped == len(numbers) - len(good)


def test_hostile_lines_are_dropped_counted_and_the_first_named() -> None:
    deep = b'{"reward": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    text = b"\n".join(
        [
            b'{"step": 1, "reward": 0.5}',
            b'{"step": 2, "reward": 1e308}',
            b'{"step": 1' + b"0" * 400 + b', "reward": 1}',
            b'{"step": 4, "reward": NaN}',
            b'{"step": 5, "reward": -Infinity}',
            deep,
            b'{"reward": ' + b"1" * 5000 + b"}",  # past Python's int-from-string limit
            b'{"step": 8, "reward": 2.5}',
            b"garbage{",
        ]
    )
    got = read_metrics(text, "reward")
    assert got.points == [(1.0, 0.5), (8.0, 2.5)]
    assert got.dropped == 5 and got.problem == "line 2: number out of range"


def test_an_overlong_line_is_skipped_without_being_held(tmp_path: Path) -> None:
    """A 200 MB line (sparse, so it costs no disk): read past in pieces, memory stays near one line's bound."""
    path = tmp_path / "metrics.jsonl"
    with path.open("wb") as fh:
        fh.write(b'{"step": 0, "reward": 1}\n{"reward": "')
        fh.truncate(200 << 20)
        fh.seek(0, io.SEEK_END)
        fh.write(b'"}\n{"step": 9, "reward": 3}\n')
    tracemalloc.start()
    with path.open("rb") as fh:
        got = read_metrics(fh, "reward", max_file=400 << 20)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert got.points == [(0.0, 1.0), (9.0, 3.0)] and got.dropped == 1 and got.problem == "line 2: line too long"
    assert peak < 4 * METRICS_LINE_BYTES + (1 << 20)


def test_only_the_file_bound_is_read() -> None:
    text = b"".join(json.dumps({"step": i, "reward": i}).encode() + b"\n" for i in range(1000))
    got = read_metrics(text, "reward", max_file=len(text) // 2)
    assert 0 < len(got.points) < 1000 and got.problem is not None and "first" in got.problem


def test_many_points_are_thinned_while_read_but_counted_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("reconciler.core.curves.MAX_READ_POINTS", 1 << 11)  # 1/16 of it: the same rule, 16x faster
    text = b"".join(b'{"reward": %d}\n' % (i % 977) for i in range(12_500))
    got = read_metrics(text, "reward")
    assert got.total == 12_500 and len(got.points) < 4_375
    assert max(y for _, y in got.points) == 976.0 and min(y for _, y in got.points) == 0.0


def test_the_curve_file_is_strict_and_counts_what_was_dropped() -> None:
    pts = [(0.0, 1.0), (1.0, math.nan), (2.0, math.inf), (3.0, 2.0)]
    doc = _strict(render_curve(sweep="s", run_id="r", attempt=1, key="k", goal="max", points=pts, dropped=3))
    assert doc["points"] == [[0, 1], [3, 2]] and doc["points_dropped"] == 5 and doc["points_total"] == 2
    jsonschema.validate(doc, SCHEMA)
    honest = _strict(render_curve(sweep="s", run_id="r", attempt=1, key="k", goal="max", points=[(0.0, 1.0)]))
    assert "points_dropped" not in honest


# ----------------------------------------------------------------------------------------------- the store


def test_store_errors_name_no_controller_path(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "secret-data-dir" / "lab")
    for tar in (b"not a tar at all", tar_of({"stderr.log": b"x"}), tar_of({".rigsync-harvest.json": b"[" * 100_000})):
        with pytest.raises(StoreError) as exc:
            store.put_attempt("r1", 1, tar)
        assert "secret-data-dir" not in str(exc.value) and str(tmp_path) not in str(exc.value)


def test_a_malformed_manifest_keeps_what_it_can(tmp_path: Path) -> None:
    manifest = {
        "files": [["a", 1], ["b", -1], ["c", "9" * 5000], "x", ["d\x1b[31m", 2], ["e", 10**30]],
        "skipped": [{"path": "fifo\u202e", "size": None, "why": "not a regular file"}, 7, {"size": True}],
        "bytes": 1e308,
        "cap": "big",
        "resumed_from": -3,
    }
    (tmp_path / ".rigsync-harvest.json").write_text(json.dumps(manifest))
    h = _manifest(tmp_path)
    assert h.files == (("a", 1), ("d\\x1b[31m", 2))
    assert h.skipped == (("fifo\\u202e", None, "not a regular file"), ("None", None, ""))
    assert (h.bytes, h.cap, h.resumed_from) == (0, 0, None)


# ------------------------------------------------------------------------------------------- the record path


def _apply(
    world: FakeWorld, desired: Desired, observed: Observed, p: Plan, archive: FakeArchive, data: Path
) -> ApplyResult:
    ctx = ApplyContext(
        provider=world.provider,
        boxes=world.box_control,
        desired=desired,
        observed=observed,
        archive=archive,
        code_tar=lambda commit, paths: b"",
        now=world.clock.now,
        store=LocalStore(data),
    )
    return apply(p, ctx)


def _finished(tmp_path: Path, exit_code: int = 0) -> tuple[FakeWorld, Desired, FakeArchive, Any]:
    desired = desired_state(1, max_instances=1, retries=0)
    world = FakeWorld([offer(1, gpus=1)], clock=FakeClock(), boot_s=10.0)
    archive = FakeArchive()
    for _ in range(3):
        observed, p = observe_and_plan(world, desired, archive)
        assert _apply(world, desired, observed, p, archive, tmp_path).failures == []
        world.clock.advance(11.0)
    ((_iid, run),) = world.live_runs()
    run.end(world.clock.now(), exit_code)
    return world, desired, archive, run


def test_hostile_metrics_settle_the_attempt_once_with_a_named_problem(tmp_path: Path) -> None:
    world, desired, archive, run = _finished(tmp_path)
    world.job_files[(run.run_id, run.attempt)] = {
        "metrics.jsonl": b"\n".join(
            [
                b'{"step": 1, "reward": 1}',
                b'{"step": 2, "reward": 2}',
                b'{"step": 3, "reward": 1e308}',
                b'{"step": 1' + b"0" * 400 + b', "reward": 5}',
                b'{"step": 5, "reward": NaN}',
                b'{"step": 6, "reward": 4}',
            ]
        )
    }
    observed, p = observe_and_plan(world, desired, archive)
    assert [a.kind.value for a in p.actions] == ["record"]
    res = _apply(world, desired, observed, p, archive, tmp_path)
    assert res.failures == [] and len(res.archived) == 1
    (rec,) = res.archived
    assert "unusable metrics: line 3: number out of range (3 line(s) dropped)" in (rec.harvest or "")
    (curve,) = res.curves.values()
    doc = _strict(curve)
    assert doc["points"] == [[1, 1], [2, 2], [6, 4]] and doc["points_dropped"] == 3
    jsonschema.validate(doc, SCHEMA)
    _strict(record_to_json(rec))
    observed, p = observe_and_plan(world, desired, archive)
    assert not [a for a in p.actions if a.kind.value == "record"]  # settled: not tried again


def test_an_exception_from_reading_results_still_settles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    world, desired, archive, run = _finished(tmp_path, exit_code=1)
    world.job_files[(run.run_id, run.attempt)] = {"metrics.jsonl": b'{"reward": 1}\n'}
    world.job_stderr[(run.run_id, run.attempt)] = b"boom\n"

    def explode(*args: Any, **kwargs: Any) -> Any:
        raise MemoryError

    monkeypatch.setattr(apply_module, "read_metrics", explode)
    monkeypatch.setattr(apply_module, "_tail_text", lambda raw: (_ for _ in ()).throw(RecursionError()))
    observed, p = observe_and_plan(world, desired, archive)
    res = _apply(world, desired, observed, p, archive, tmp_path)
    assert res.failures == [] and len(res.archived) == 1
    note = res.archived[0].harvest or ""
    assert "unusable stderr.log: RecursionError" in note and "unusable metrics: MemoryError" in note
    assert str(tmp_path) not in note


def test_a_record_that_skips_its_harvest_never_asks_the_box(tmp_path: Path) -> None:
    world, desired, archive, _run = _finished(tmp_path)
    observed, p = observe_and_plan(world, desired, archive)
    (rec_action,) = [a for a in p.actions if isinstance(a, Record)]
    skipping = replace(p, actions=(replace(rec_action, skip_harvest="probe: run dir answer unusable\x1b[2J"),))
    world.calls.clear()
    res = _apply(world, desired, observed, skipping, archive, tmp_path)
    assert res.failures == [] and not [c for c in world.calls if c.startswith("harvest")]
    assert res.archived[0].harvest == "not tried: probe: run dir answer unusable\\x1b[2J"


def test_a_box_s_forged_numbers_and_times_do_not_stop_the_record(tmp_path: Path) -> None:
    world, desired, archive, run = _finished(tmp_path)
    run.best_metric, run.final_metric = math.inf, 1e308
    run.ended_at = 1e12  # the year 33658
    run.started_at = math.nan
    run.code_commit = "c0ffee\x1b]8;;http://x\x07" + "a" * 5000
    observed, p = observe_and_plan(world, desired, archive)
    res = _apply(world, desired, observed, p, archive, tmp_path)
    assert res.failures == [] and len(res.archived) == 1
    (rec,) = res.archived
    assert rec.best_metric is None and rec.final_metric is None
    now = world.clock.now()
    assert rec.ended_at is not None and rec.ended_at <= now + TIME_WINDOW_S
    assert rec.code_commit is not None and len(rec.code_commit) <= 512 and "\x1b" not in rec.code_commit
    line = record_to_json(rec)
    _strict(line)


# ------------------------------------------------------------------------------------- harvest: special files


def test_a_fifo_and_a_socket_in_a_harvest_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import socket
    import subprocess

    from reconciler import remote
    from reconciler.apply import harvest_note

    home = tmp_path / "home"
    d = home / "rigsync" / "runs" / "r5.1"
    (d / "eval").mkdir(parents=True)
    (d / "stderr.log").write_text("err\n")
    os.mkfifo(d / "eval" / "pipe.json")
    sock = socket.socket(socket.AF_UNIX)
    monkeypatch.chdir(d / "eval")  # a socket's path is at most 108 bytes: bound relative to its directory
    sock.bind("sock.json")
    (d / "eval" / "gone.json").symlink_to(d / "nothing-here")
    (d / "eval" / "ok.json").write_text("{}")
    env = {"HOME": str(home), "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    res = subprocess.run(
        ["bash", "-c", remote.harvest_script("r5", 1, what="run", patterns=["eval/*"], cap_bytes=1 << 20)],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    sock.close()
    assert res.returncode == 0, res.stderr
    got = LocalStore(tmp_path / "data").put_attempt("r5", 1, res.stdout)
    assert [p for p, _ in got.files] == ["stderr.log", "eval/ok.json"]
    assert sorted((p, why) for p, _, why in got.skipped) == [
        ("eval/gone.json", "a symlink to nothing readable"),
        ("eval/pipe.json", "not a regular file (fifo)"),
        ("eval/sock.json", "not a regular file (socket)"),
    ]
    note = harvest_note(got)
    assert "eval/pipe.json (?, not a regular file (fifo))" in note and "eval/sock.json" in note


# --------------------------------------------------------------------------------------------- log answers


@given(st.binary(max_size=512), st.binary(max_size=64))
def test_parse_log_slice_is_total(banner: bytes, header: bytes) -> None:
    from reconciler.errors import RemoteCommandFailed
    from reconciler.remote.logs import MAX_SLICE_BYTES, LogSlice, parse_log_slice

    for answer in (banner, b"rigsync-log " + header + b"\n" + banner, banner + b"\nrigsync-log - 1 0 3 3\nabc"):
        try:
            got = parse_log_slice(answer)
        except RemoteCommandFailed as exc:
            assert len(str(exc)) < 400 and "\x1b" not in str(exc)
            continue
        assert isinstance(got, LogSlice) and got.start <= got.end <= got.size
        assert len(got.data) == got.end - got.start <= MAX_SLICE_BYTES


def test_parse_log_slice_refuses_absurd_headers() -> None:
    from reconciler.errors import RemoteCommandFailed
    from reconciler.remote.logs import parse_log_slice

    for bad in (
        b"rigsync-log " + b"9" * 5000 + b" 1 0 0 0\n",
        b"rigsync-log - 1 0 3 2\nabc",
        b"rigsync-log - 1 0 " + b"9" * 30 + b" " + b"9" * 30 + b"\n",
    ):
        with pytest.raises(RemoteCommandFailed):
            parse_log_slice(bad)


def test_the_store_names_what_it_refuses_to_unpack_and_keeps_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import reconciler.adapters.store as store_module
    from reconciler.apply import harvest_note

    monkeypatch.setattr(store_module, "MAX_HARVEST_FILES", 4)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, kind in (("pipe", tarfile.FIFOTYPE), ("dev", tarfile.CHRTYPE), ("link", tarfile.SYMTYPE)):
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = "/etc/passwd" if kind == tarfile.SYMTYPE else ""
            tf.addfile(info)
        for name in ("../../escape.txt", "/etc/cron.d/x", "stderr.log", "a", "b", "c", "d"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tf.addfile(info, io.BytesIO(b"x"))
        blob = json.dumps({"files": [["stderr.log", 1]], "skipped": [], "bytes": 1, "cap": 10}).encode()
        info = tarfile.TarInfo(".rigsync-harvest.json")
        info.size = len(blob)
        tf.addfile(info, io.BytesIO(blob))
    data = tmp_path / "data-dir-secret"
    got = LocalStore(data).put_attempt("r1", 1, buf.getvalue())
    why = {p: w for p, _, w in got.skipped}
    assert why["pipe"] == "not a regular file (fifo)" and why["dev"] == "not a regular file (character device)"
    assert why["link"] == "not a regular file (symlink)"
    assert why["../../escape.txt"] == "refused (outside the run directory)"
    assert "/etc/cron.d/x" not in why  # the data filter takes it as etc/cron.d/x, inside the attempt's directory
    assert why["d"] == "past 4 files"
    assert not (tmp_path / "escape.txt").exists() and not list(tmp_path.rglob("escape.txt"))
    note = harvest_note(got)
    assert "pipe (?, not a regular file (fifo))" in note and "data-dir-secret" not in note and str(tmp_path) not in note


def test_a_harvest_error_note_names_no_controller_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from reconciler.errors import RemoteCommandFailed

    monkeypatch.setenv("HOME", str(tmp_path / "home-of-the-controller"))
    world, desired, archive, _run = _finished(tmp_path)
    world.fail_next("harvest", RemoteCommandFailed(f"exit 2: {tmp_path}/home-of-the-controller/.ssh/id: denied"))
    observed, p = observe_and_plan(world, desired, archive)
    res = _apply(world, desired, observed, p, archive, tmp_path)
    (rec,) = res.archived
    assert rec.harvest == "lost: RemoteCommandFailed: exit 2: ~/.ssh/id: denied"


@pytest.mark.parametrize("exc", [ValueError("bad stream"), RecursionError(), OverflowError(), MemoryError()])
def test_an_unusable_harvest_stream_settles_the_attempt(tmp_path: Path, exc: Exception) -> None:
    world, desired, archive, _run = _finished(tmp_path)
    world.fail_next("harvest", exc)
    observed, p = observe_and_plan(world, desired, archive)
    res = _apply(world, desired, observed, p, archive, tmp_path)
    assert res.failures == [] and [r.harvest for r in res.archived] == [f"lost: unusable harvest: {type(exc).__name__}"]


def test_a_hostile_stderr_tail_is_stored_escaped_bounded_and_keeps_its_end(tmp_path: Path) -> None:
    world, desired, archive, run = _finished(tmp_path, exit_code=1)
    world.job_stderr[(run.run_id, run.attempt)] = b"\x1b[2J\x07\xc2\x9b\xe2\x80\xae\n" * 2000 + b"the last line\n"
    observed, p = observe_and_plan(world, desired, archive)
    (rec,) = _apply(world, desired, observed, p, archive, tmp_path).archived
    tail = rec.stderr_tail or ""
    assert len(tail) <= 4096 and tail.endswith("\nthe last line") and tail.startswith("…")
    assert "\x1b" not in tail and "\u202e" not in tail and "\\x1b[2J\\x07\\u009b\\u202e" in tail


def test_what_the_probe_could_not_use_is_said_in_the_record(tmp_path: Path) -> None:
    world, desired, archive, _run = _finished(tmp_path)
    observed, p = observe_and_plan(world, desired, archive)
    (probe,) = [pr for pr in observed.probes if pr.runs]
    flagged = replace(probe, runs=tuple(replace(r, problem="metrics: best_metric out of range") for r in probe.runs))
    observed = replace(observed, probes=tuple(flagged if pr is probe else pr for pr in observed.probes))
    (rec,) = _apply(world, desired, observed, p, archive, tmp_path).archived
    assert (rec.harvest or "").endswith("; unusable metrics: best_metric out of range"), rec.harvest


def test_a_note_names_special_files_before_what_the_cap_left() -> None:
    from reconciler.apply import harvest_note
    from reconciler.ports import Harvested

    capped = tuple((f"big{i}.bin", 1 << 20, "over the size cap") for i in range(8))
    got = Harvested(
        files=(("stderr.log", 3),), skipped=(*capped, ("eval/pipe", None, "not a regular file (fifo)")), bytes=3, cap=10
    )
    note = harvest_note(got)
    assert note.startswith("partial: 1 file(s), 3 B kept within the 10 B cap; skipped eval/pipe (?, not a regular")
    assert note.endswith("and 4 more")
    only = harvest_note(
        Harvested(files=(), skipped=(("dev", None, "not a regular file (character device)"),), bytes=0, cap=10)
    )
    assert only == "partial: 0 file(s), 0 B; skipped dev (?, not a regular file (character device))"


def test_the_store_s_tail_looks_only_at_the_log_s_last_window(tmp_path: Path) -> None:
    from reconciler.cli.logs_cmd import _last_lines_start
    from reconciler.remote.logs import TAIL_WINDOW_BYTES

    path = tmp_path / "stderr.log"
    with path.open("wb") as fh:
        fh.truncate(1 << 30)  # sparse: a 1 GiB line with no newline
        fh.seek(0, io.SEEK_END)
        fh.write(b"a\nb\n")
    size = path.stat().st_size
    with path.open("rb") as fh:
        assert _last_lines_start(fh, size, 1) == size - 2
        assert _last_lines_start(fh, size, 2) == size - TAIL_WINDOW_BYTES  # its start is 1 GiB back: not looked for


_JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=30,
)


@given(
    raw=st.one_of(
        st.binary(max_size=2000),
        _JSONISH.map(lambda d: json.dumps(d).encode()),
        st.fixed_dictionaries(
            {"files": _JSONISH, "skipped": _JSONISH, "bytes": _JSONISH, "cap": _JSONISH, "resumed_from": _JSONISH}
        ).map(lambda d: json.dumps(d).encode()),
        st.integers(1, 100).map(lambda n: b"[" * n + b"]" * n),
    )
)
def test_any_manifest_reads_as_a_bounded_harvest_or_a_store_error(raw: bytes) -> None:
    """The harvest's manifest is a box's text: any bytes read as a ``Harvested`` of bounded, escaped entries, or as
    ``StoreError`` (which the record path turns into a note); never another exception."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / MANIFEST).write_bytes(raw)
        try:
            got = _manifest(Path(tmp))
        except StoreError:
            return
    assert all(isinstance(p, str) and len(p) <= MAX_TEXT_CHARS and isinstance(n, int) for p, n in got.files)
    assert all(len(p) <= MAX_TEXT_CHARS and len(why) <= MAX_TEXT_CHARS for p, _n, why in got.skipped)
    assert isinstance(got.bytes, int) and isinstance(got.cap, int)
