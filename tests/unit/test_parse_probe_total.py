"""``remote.parse_probe`` is total and bounded: whatever bytes a box prints, a ``BoxProbe`` within the bounds.

A rented box is a stranger's machine: its probe's answer is untrusted input. The properties feed the parser any
bytes, any JSON-ish document (non-finite and huge numbers, control characters, nesting) and nearly valid probe
documents with hostile field values, and check that it never raises and that what it returns stays within
``reconciler.core.bounds``. The examples pin each named rule (issue 20).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from reconciler import remote
from reconciler.adapters.box_control import ShellBoxes
from reconciler.core.bounds import (
    MAX_GPUS,
    MAX_PROBE_RUNS,
    MAX_REJECTED,
    MAX_TEXT_CHARS,
    PROBE_STDOUT_BYTES,
    TIME_WINDOW_S,
    clamp_time,
)
from reconciler.core.model import BoxProbe, Endpoint, Instance, InstanceStatus, RunDirState
from reconciler.errors import HostUnreachable, OutputOverBound
from reconciler.ports import CommandResult

NOW = 1_760_000_000.0
YEAR_33658 = 1_000_000_000_000.0  # seconds since 1970: some time in the year 33658


def _strings(p: BoxProbe) -> list[str]:
    out = [s for s in (p.error, p.unusable, p.python) if s is not None]
    out += [*p.bootstrap_hashes, *p.bootstrap_failed, *p.bootstrap_running, *p.code_commits, *p.rejected]
    for r in p.runs:
        out += [s for s in (r.run_id, r.code_commit, r.desired_commit, r.problem) if s is not None]
        out += [k for k, _ in r.last_metrics] + [v for _, v in r.last_metrics if isinstance(v, str)]
    return out


def _floats(p: BoxProbe) -> list[float]:
    out = [t for t in (p.disk_free_gb, p.last_activity_at, p.box_now) if t is not None]
    out += [g.utilization_pct for g in p.gpus]
    for r in p.runs:
        times = (r.started_at, r.heartbeat_age_s, r.ended_at, r.best_metric, r.final_metric, r.metrics_age_s)
        out += [t for t in times if t is not None]
        out += [v for _, v in r.last_metrics if isinstance(v, float)]
    return out


def _check(p: object, gpus_listed: int) -> BoxProbe:
    """Everything a parsed probe promises, whatever the box printed."""
    assert isinstance(p, BoxProbe)
    limit = min(gpus_listed, MAX_GPUS) if gpus_listed > 0 else MAX_GPUS
    assert all(math.isfinite(x) for x in _floats(p))
    assert all(isinstance(s, str) and len(s) <= MAX_TEXT_CHARS for s in _strings(p))
    assert len(p.gpus) <= limit and all(0 <= g.index < limit for g in p.gpus)
    assert len({g.index for g in p.gpus}) == len(p.gpus)
    assert len(p.runs) <= MAX_PROBE_RUNS and len(p.rejected) <= MAX_REJECTED + 1
    for r in p.runs:
        assert isinstance(r, RunDirState) and "/" not in r.run_id and ".." not in r.run_id
        assert all(0 <= g < limit for g in r.gpu_mask) and len(set(r.gpu_mask)) == len(r.gpu_mask)
        assert r.exit_code is None or -(2**31) <= r.exit_code < 2**31
        for age in (r.heartbeat_age_s, r.metrics_age_s):
            assert age is None or 0 <= age <= TIME_WINDOW_S
    if p.unusable is not None:
        assert not p.reachable and p.error == p.unusable and p.unusable.startswith("probe: ")
        assert p.runs == () and p.gpus == ()
    moved = p.on_clock(NOW, clamp=clamp_time)
    for r in moved.runs:
        for t in (r.started_at, r.ended_at):
            assert t is None or abs(t - NOW) <= TIME_WINDOW_S
    assert moved.last_activity_at is None or abs(moved.last_activity_at - NOW) <= TIME_WINDOW_S
    return p


def _parse(doc: Any, gpus_listed: int = 1) -> BoxProbe:
    raw = doc if isinstance(doc, bytes) else json.dumps(doc, allow_nan=True).encode()
    return _check(remote.parse_probe(9, raw, gpus_listed=gpus_listed), gpus_listed)


def _run(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "run_id": "s-0123456789ab",
        "attempt": 1,
        "gpu_mask": [0],
        "pid": 4242,
        "pid_alive": True,
        "started_at": NOW - 60,
        "heartbeat_age_s": 1.5,
        "exit_code": None,
        "ended_at": None,
        "code_commit": "c" * 40,
        "desired_commit": "d" * 40,
        "killed_reason": None,
        "last_metrics": {"step": 10, "loss": 0.5, "tag": "ok", "done": False},
        "best_metric": 0.5,
        "final_metric": 0.5,
        "metrics_age_s": 2.0,
    }
    return base | fields


def _doc(runs: Sequence[dict[str, Any]] = (), **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "v": 1,
        "box_now": NOW,
        "python": "/usr/bin/python3",
        "disk_free_gb": 40.5,
        "bootstrap": {"ok": ["0123456789abcdef"], "failed": [], "running": []},
        "code": ["c" * 40],
        "runs": list(runs),
        "last_activity_at": NOW - 5,
        "gpus": [{"index": 0, "memory_used_mib": 3, "memory_total_mib": 24564, "utilization_pct": 0.0}],
    }
    return base | fields


# ------------------------------------------------------------------------------------------------ properties

_huge = st.sampled_from([10**23, -(10**23), 10**400, 2**63, -(2**31) - 1, 2**31, 1 << 24 | 1])
_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    _huge,
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, -1e308, 1e16, 5e-324]),
    st.text(max_size=40),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=600),
    st.sampled_from(["../../tmp/x", "a/b", "..", "\x1b[31mred", "\u202eevil", "r1\n", ""]),
)
_jsonish = st.recursive(
    _leaf,
    lambda kids: st.lists(kids, max_size=5) | st.dictionaries(st.text(max_size=10), kids, max_size=5),
    max_leaves=30,
)


@given(st.binary(max_size=4096), st.integers(min_value=-3, max_value=200))
def test_any_bytes_give_a_bounded_probe(raw: bytes, gpus_listed: int) -> None:
    _check(remote.parse_probe(1, raw, gpus_listed=gpus_listed), gpus_listed)


@given(_jsonish, st.integers(min_value=0, max_value=8))
def test_any_json_document_gives_a_bounded_probe(doc: Any, gpus_listed: int) -> None:
    _parse(doc, gpus_listed)
    _parse(json.dumps({"runs": [doc], "gpus": [doc], "box_now": doc}, allow_nan=True).encode(), gpus_listed)


_hostile = st.one_of(_leaf, st.lists(_leaf, max_size=4), st.dictionaries(st.text(max_size=5), _leaf, max_size=3))
_run_keys = list(_run())
_doc_keys = [k for k in _doc() if k != "runs"]


@st.composite
def _nearly_valid(draw: st.DrawFn) -> dict[str, Any]:
    runs = []
    for _ in range(draw(st.integers(0, 4))):
        run = _run(run_id=draw(st.one_of(st.sampled_from(["r1", "s-0123456789ab", "../../tmp/x"]), _hostile)))
        for key in draw(st.lists(st.sampled_from(_run_keys), max_size=4)):
            run[key] = draw(_hostile)
        runs.append(run)
    gpus = [
        {
            "index": draw(st.one_of(st.integers(-2, 5), _hostile)),
            "memory_used_mib": draw(st.one_of(st.just(0), _hostile)),
            "memory_total_mib": 24564,
            "utilization_pct": draw(st.one_of(st.just(1.0), _hostile)),
        }
        for _ in range(draw(st.integers(0, 6)))
    ]
    doc = _doc(runs, gpus=gpus)
    for key in draw(st.lists(st.sampled_from(_doc_keys), max_size=3)):
        doc[key] = draw(_hostile)
    return doc


@given(_nearly_valid(), st.integers(min_value=0, max_value=4))
def test_nearly_valid_probe_documents_with_hostile_values_give_a_bounded_probe(doc: Any, gpus_listed: int) -> None:
    _parse(doc, gpus_listed)


# -------------------------------------------------------------------------------------------------- examples


def test_an_honest_probe_is_read_as_it_is() -> None:
    p = _parse(_doc([_run()]))
    assert p.reachable and p.unusable is None and p.rejected == ()
    (r,) = p.runs
    assert (r.run_id, r.attempt, r.gpu_mask, r.pid_alive, r.started_at, r.exit_code) == (
        "s-0123456789ab",
        1,
        (0,),
        True,
        NOW - 60,
        None,
    )
    assert r.last_metrics == (("step", 10), ("loss", 0.5), ("tag", "ok"), ("done", False)) and r.problem is None
    assert p.code_commits == ("c" * 40,) and p.bootstrap_hashes == ("0123456789abcdef",) and p.disk_free_gb == 40.5


def test_nan_and_infinity_literals_make_the_probe_unusable() -> None:
    for literal in (b"NaN", b"Infinity", b"-Infinity"):
        p = _parse(b'{"v": 1, "runs": [{"run_id": "r1", "attempt": 1, "best_metric": %s}]}' % literal)
        assert p.unusable is not None and "is not a number" in p.unusable


def test_metrics_past_their_range_are_refused_and_named() -> None:
    (r,) = _parse(_doc([_run(best_metric=1e308, final_metric=10**400)])).runs
    assert r.best_metric is None and r.final_metric is None
    assert r.problem == "metrics: best_metric out of range; metrics: final_metric out of range"
    (r,) = _parse(b'{"runs": [{"run_id": "r1", "attempt": 1, "best_metric": 1e400}]}').runs  # parses as inf
    assert r.best_metric is None and r.problem == "metrics: best_metric out of range"


def test_a_step_of_ten_to_the_400_is_left_out_of_the_last_metrics() -> None:
    (r,) = _parse(_doc([_run(last_metrics={"step": 10**400, "loss": 1.0, "x": 1e300})])).runs
    assert r.last_metrics == (("loss", 1.0),)


def test_an_integer_too_long_to_convert_makes_the_probe_unusable() -> None:
    p = _parse(b'{"runs": [], "disk_free_gb": ' + b"9" * 5000 + b"}")
    assert p.unusable is not None and p.unusable.startswith("probe: invalid JSON")


def test_a_hundred_thousand_gpus_on_a_one_gpu_box_are_one_gpu() -> None:
    gpus = [{"index": i, "memory_used_mib": 0, "memory_total_mib": 24564, "utilization_pct": 0} for i in range(100_000)]
    assert _parse(_doc(gpus=gpus), gpus_listed=1).unusable == f"probe: output over {PROBE_STDOUT_BYTES} bytes"
    gpus = [{"index": i % 7, "memory_used_mib": 0, "memory_total_mib": 1} for i in range(15_000)]  # within the bound
    p = _parse(_doc(gpus=gpus), gpus_listed=1)
    assert [g.index for g in p.gpus] == [0]
    assert p.rejected[0] == f"gpus: 15000 entries, only the first {MAX_GPUS} read"
    assert "gpu 1: not one of the instance's 1 GPU(s)" in p.rejected
    assert len(p.rejected) == MAX_REJECTED + 1 and p.rejected[-1].endswith("more refused")


def test_gpus_minus_one_and_ten_to_the_23_are_refused() -> None:
    gpus = [{"index": i, "memory_used_mib": 0, "memory_total_mib": 24564} for i in (-1, 10**23, 0, 0)]
    p = _parse(_doc(gpus=gpus), gpus_listed=2)
    assert [g.index for g in p.gpus] == [0]
    assert p.rejected == (
        "gpu -1: not one of the instance's 2 GPU(s)",
        "gpu 100000000000000000000000: not one of the instance's 2 GPU(s)",
        "gpu 0: reported twice",
    )


def test_a_gpu_with_memory_or_utilisation_out_of_range_is_refused() -> None:
    gpus = [
        {"index": 0, "memory_used_mib": -5, "memory_total_mib": 24564},
        {"index": 1, "memory_used_mib": 0, "memory_total_mib": 1 << 40},
        {"index": 2, "memory_used_mib": 0, "memory_total_mib": 100, "utilization_pct": 250},
        {"index": 3, "memory_used_mib": 7, "memory_total_mib": 100, "utilization_pct": None},
    ]
    p = _parse(_doc(gpus=gpus), gpus_listed=4)
    assert [(g.index, g.memory_used_mib, g.utilization_pct) for g in p.gpus] == [(3, 7, 0.0)]
    assert len(p.rejected) == 3 and all("out of range" in t for t in p.rejected)


def test_an_unknown_gpu_count_is_capped_at_max_gpus() -> None:
    gpus = [{"index": i, "memory_used_mib": 0, "memory_total_mib": 1} for i in range(MAX_GPUS + 1)]
    assert len(_parse(_doc(gpus=gpus), gpus_listed=0).gpus) == MAX_GPUS


def test_deep_nesting_is_unusable_without_recursion() -> None:
    for raw in (b"[" * 100_000, b'{"runs": ' + b"[" * 5000 + b"]" * 5000 + b"}", b"{" * 300_000):
        p = _parse(raw)
        assert p.unusable == "probe: nested deeper than 16"


def test_a_traversing_run_id_is_refused_and_named() -> None:
    p = _parse(_doc([_run(run_id="../../tmp/x"), _run(run_id="ok/../x"), _run(run_id="r1")]))
    assert [r.run_id for r in p.runs] == ["r1"]
    assert p.rejected == ("run dir '../../tmp/x.1': not a run id", "run dir 'ok/../x.1': not a run id")


def test_an_attempt_out_of_range_is_refused() -> None:
    p = _parse(_doc([_run(attempt=10_001), _run(attempt=-1), _run(attempt="2"), _run(attempt=True)]))
    assert p.runs == () and len(p.rejected) == 4 and all("attempt" in t for t in p.rejected)


def test_a_run_reported_twice_is_read_once() -> None:
    p = _parse(_doc([_run(exit_code=0), _run(exit_code=1)]))
    assert [r.exit_code for r in p.runs] == [0] and p.rejected == ("run dir 's-0123456789ab'.1: reported twice",)


def test_more_run_directories_than_the_bound_make_the_probe_unusable() -> None:
    runs = [{"run_id": f"r{i}", "attempt": 1} for i in range(MAX_PROBE_RUNS + 1)]
    assert _parse(_doc(runs)).unusable == f"probe: {MAX_PROBE_RUNS + 1} run directories, more than {MAX_PROBE_RUNS}"


def test_a_garbage_exit_code_is_none_with_a_problem() -> None:
    (r,) = _parse(_doc([_run(exit_code=2**40)])).runs
    assert r.exit_code is None and r.problem == "exit_code: not an exit code: 1099511627776"
    (r,) = _parse(_doc([_run(exit_code=-(2**31))])).runs
    assert r.exit_code == -(2**31) and r.problem is None


def test_a_gpu_mask_outside_the_instance_keeps_the_entry_with_a_problem() -> None:
    for mask in ([5], [0, 0], [-1], "0", [True]):
        (r,) = _parse(_doc([_run(gpu_mask=mask)]), gpus_listed=2).runs
        assert r.gpu_mask == () and r.problem is not None and r.problem.startswith("gpu_mask: ")


def test_commits_and_hashes_must_have_their_shape() -> None:
    p = _parse(
        _doc(
            [_run(code_commit="../x", desired_commit="ABC")],
            code=["c" * 40, "../etc", 7],
            bootstrap={"ok": ["h1", "../h"], "failed": "x"},
        )
    )
    (r,) = p.runs
    assert r.code_commit is None and r.desired_commit is None and "code_commit: not a commit" in (r.problem or "")
    assert p.code_commits == ("c" * 40,) and p.bootstrap_hashes == ("h1",)
    assert len(p.rejected) == 4


def test_strings_are_escaped_and_bounded() -> None:
    (r,) = _parse(
        _doc([_run(last_metrics={"\x1b[2J" + "k" * 2000: "\u202e" + "v" * 5000})], python="\x07" * 10_000)
    ).runs
    ((key, value),) = r.last_metrics
    assert key.startswith("\\x1b[2J") and isinstance(value, str) and value.startswith("\\u202e")
    assert len(key) == len(value) == MAX_TEXT_CHARS


def test_a_probe_that_failed_on_the_box_is_unusable_with_its_error_escaped() -> None:
    p = _parse({"v": 1, "box_now": NOW, "error": "probe crashed: \x1b[31mOSError" + "!" * 1000})
    assert p.unusable is not None and p.unusable.startswith("probe: failed on the box: probe crashed: \\x1b[31m")


def test_output_over_the_bound_is_unusable() -> None:
    assert _parse(b" " * (PROBE_STDOUT_BYTES + 1)).unusable == f"probe: output over {PROBE_STDOUT_BYTES} bytes"


def test_ages_are_clamped_to_the_window() -> None:
    (r,) = _parse(_doc([_run(heartbeat_age_s=-50.0, metrics_age_s=1e12)])).runs
    assert r.heartbeat_age_s == 0.0 and r.metrics_age_s == TIME_WINDOW_S


def test_a_box_clock_in_the_year_33658_lands_nothing_outside_the_window() -> None:
    far = _parse(
        _doc([_run(started_at=YEAR_33658, ended_at=YEAR_33658)], box_now=YEAR_33658, last_activity_at=YEAR_33658)
    )
    moved = far.on_clock(NOW, clamp=clamp_time)
    (r,) = moved.runs
    assert r.started_at == r.ended_at == moved.last_activity_at == NOW + TIME_WINDOW_S and moved.box_now == NOW


def test_a_sane_box_clock_moves_its_times_and_far_ones_are_clamped() -> None:
    fast = _parse(_doc([_run(started_at=NOW + 300 - 60, ended_at=YEAR_33658)], box_now=NOW + 300))
    (r,) = fast.on_clock(NOW, clamp=clamp_time).runs
    assert r.started_at == NOW - 60 and r.ended_at == NOW + TIME_WINDOW_S


# ------------------------------------------------------------------------------- the probe path (ShellBoxes)


class _AnsweringShell:
    """A ``Shell`` whose ``run_many`` answers each box as told, and keeps the bound it was asked to read under."""

    def __init__(self, answers: dict[int, CommandResult | Exception]) -> None:
        self.answers = answers
        self.max_stdout: int | None = None

    def run(
        self,
        endpoint: Endpoint,
        command: str,
        *,
        stdin: bytes | None = None,
        timeout: float = 30.0,
        max_stdout: int | None = None,
    ) -> CommandResult:
        raise AssertionError("the probe path runs through run_many")

    def run_many(
        self, targets: dict[int, tuple[Endpoint, str]], *, timeout: float = 10.0, max_stdout: int | None = None
    ) -> dict[int, CommandResult | Exception]:
        self.max_stdout = max_stdout
        return {k: self.answers[k] for k in targets}

    def forget(self, endpoint: Endpoint) -> None: ...

    def close(self) -> None: ...


def _instance(iid: int, gpus: int) -> Instance:
    return Instance(
        id=iid,
        label="rigsync:lab:x-1",
        status=InstanceStatus.RUNNING,
        gpu_name="RTX 3090",
        num_gpus=gpus,
        gpu_ram_mib=24564,
        dph_total=0.2,
        start_date=0.0,
        direct=Endpoint(f"b{iid}", 22),
    )


def test_probe_many_reads_under_the_probe_bound_and_tells_unusable_from_unreachable() -> None:
    gpus = [{"index": i, "memory_used_mib": 0, "memory_total_mib": 1} for i in range(8)]
    shell = _AnsweringShell(
        {
            1: OutputOverBound("b1:22: output over 1048576 bytes; stopped reading"),
            2: HostUnreachable("b2:22: no answer within 5s"),
            3: CommandResult(0, json.dumps(_doc(gpus=gpus)).encode(), b""),
            4: CommandResult(0, b"{" * 100, b""),
        }
    )
    over, down, capped, deep = ShellBoxes(shell).probe_many([_instance(i, 2) for i in (1, 2, 3, 4)], timeout=5)
    assert shell.max_stdout == PROBE_STDOUT_BYTES
    assert not over.reachable and over.unusable == over.error == f"probe: output over {PROBE_STDOUT_BYTES} bytes"
    assert not down.reachable and down.unusable is None and down.error == "HostUnreachable: b2:22: no answer within 5s"
    assert capped.reachable and [g.index for g in capped.gpus] == [0, 1], "the instance lists 2 GPUs"
    assert deep.unusable == "probe: nested deeper than 16"


def test_without_a_box_clock_times_are_only_clamped() -> None:
    p = _parse(_doc([_run(started_at=NOW - 60, ended_at=YEAR_33658)], box_now=None, last_activity_at=-1e9))
    assert p.box_now is None
    moved = p.on_clock(NOW, clamp=clamp_time)
    (r,) = moved.runs
    assert (r.started_at, r.ended_at, moved.last_activity_at, moved.box_now) == (
        NOW - 60,
        NOW + TIME_WINDOW_S,
        NOW - TIME_WINDOW_S,
        None,
    )


def test_the_skew_is_read_against_when_the_answer_came_not_the_cycles_start() -> None:
    # The cycle started at NOW and spent 4.4 s (an offer search waiting out a rate limit) before this box answered;
    # the box's clock is right. Against the cycle's start its run would have started 4.4 s before it really did.
    answered = NOW + 4.4
    probe = _parse(_doc([_run(started_at=answered - 1.5, ended_at=None)], box_now=answered))
    shell = _AnsweringShell({3: CommandResult(0, json.dumps(_doc([_run(started_at=answered - 1.5, ended_at=None)],
                                                                  box_now=answered)).encode(), b"", answered)})
    (via_shell,) = ShellBoxes(shell).probe_many([_instance(3, 1)], timeout=5)
    assert via_shell.answered_at == answered and probe.answered_at is None
    (r,) = via_shell.on_clock(NOW, clamp=clamp_time).runs
    assert r.started_at is not None and math.isclose(r.started_at, answered - 1.5)
    (unknown,) = probe.on_clock(NOW, clamp=clamp_time).runs  # no answer time: the cycle's start, as before
    assert unknown.started_at is not None and math.isclose(unknown.started_at, NOW - 1.5)
