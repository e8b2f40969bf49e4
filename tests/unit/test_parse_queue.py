"""``remote.parse_probe`` reads the box-side queue, the fence, the drain marker and a dequeued run's launch identity
totally and bounded: any values for those keys give a ``BoxProbe`` (never an exception) whose queue entries are
safe run ids, attempts in range, masks of the instance's GPUs and epochs in [0, ``MAX_EPOCH``), at most
``MAX_QUEUE_ENTRIES``, and whose launch identities are a valid pid and start together or neither."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from reconciler import remote
from reconciler.core.bounds import MAX_ATTEMPT, MAX_EPOCH, MAX_QUEUE_ENTRIES, MAX_REJECTED
from reconciler.core.model import BoxProbe, QueuedEntry
from reconciler.remote.commands import is_safe_name
from reconciler.remote.launched import PID_LIMIT

GPUS = 2


def _doc(**extra: Any) -> bytes:
    doc = {"v": 1, "box_now": 1_760_000_000.0, "gpus": [], "runs": [], **extra}
    return json.dumps(doc).encode()


def _parse(raw: bytes) -> BoxProbe:
    return remote.parse_probe(7, raw, gpus_listed=GPUS)


def _run(**extra: Any) -> dict[str, Any]:
    return {"run_id": "r", "attempt": 1, "gpu_mask": [0], "pid_alive": True, "exit_code": None, **extra}


def _checked(p: BoxProbe) -> BoxProbe:
    assert len(p.queued) <= MAX_QUEUE_ENTRIES
    assert len(p.rejected) <= MAX_REJECTED + 1
    assert len({(q.run_id, q.attempt) for q in p.queued}) == len(p.queued)
    for q in p.queued:
        assert is_safe_name(q.run_id) and 0 <= q.attempt <= MAX_ATTEMPT
        assert all(0 <= g < GPUS for g in q.gpu_mask) and len(set(q.gpu_mask)) == len(q.gpu_mask)
        assert 0 <= q.epoch < MAX_EPOCH and 0 <= q.position < MAX_QUEUE_ENTRIES
    assert p.epoch is None or 0 <= p.epoch < MAX_EPOCH
    assert isinstance(p.draining, bool)
    for r in p.runs:
        assert (r.pid is None) == (r.pid_started is None)
        assert r.pid is None or 1 < r.pid < PID_LIMIT
        assert r.pid_started is None or 0 <= r.pid_started < 1 << 64
    return p


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
entries = st.fixed_dictionaries(
    {},
    optional={
        "run_id": st.one_of(st.sampled_from(["r", "run-2", "../x", "", "a" * 300]), json_values),
        "attempt": st.one_of(st.integers(-2, MAX_ATTEMPT + 2), json_values),
        "gpu_mask": st.one_of(st.lists(st.integers(-1, 3), max_size=3), json_values),
        "epoch": st.one_of(st.integers(-1, MAX_EPOCH + 1), json_values),
        "position": st.one_of(st.integers(-1, MAX_QUEUE_ENTRIES + 1), json_values),
    },
)


@given(
    queued=st.one_of(st.lists(st.one_of(entries, json_values), max_size=8), json_values),
    epoch=st.one_of(st.integers(-1, MAX_EPOCH + 1), json_values),
    draining=json_values,
    pid=st.one_of(st.integers(-2, PID_LIMIT + 1), json_values),
    start=st.one_of(st.integers(-1, 1 << 65), json_values),
)
def test_any_queue_fence_drain_and_launch_identity_parse_within_bounds(
    queued: Any, epoch: Any, draining: Any, pid: Any, start: Any
) -> None:
    raw = _doc(queued=queued, epoch=epoch, draining=draining, runs=[_run(launched_pid=pid, launched_start=start)])
    p = _checked(_parse(raw))
    assert p.reachable
    assert p.draining is (draining is True)


def test_examples() -> None:
    p = _checked(_parse(_doc(
        queued=[
            {"run_id": "a", "attempt": 2, "gpu_mask": [1], "epoch": 7, "position": 0},
            {"run_id": "a", "attempt": 2, "gpu_mask": [1], "epoch": 7, "position": 1},  # twice
            {"run_id": "../etc", "attempt": 1, "gpu_mask": [0], "epoch": 0, "position": 0},
            {"run_id": "b", "attempt": 1, "gpu_mask": [5], "epoch": 0, "position": 0},  # not its GPU
            {"run_id": "c", "attempt": 1, "gpu_mask": [0], "epoch": -1, "position": 0},
        ],
        epoch=9, draining=True,
        runs=[_run(launched_pid=4321, launched_start=99), _run(run_id="s", launched_pid=1, launched_start=5),
              _run(run_id="t", launched_pid=4321)],
    )))
    assert p.queued == (QueuedEntry("a", 2, (1,), 7, 0),)
    assert len(p.rejected) == 4 and p.epoch == 9 and p.draining
    by_id = {r.run_id: r for r in p.runs}
    assert (by_id["r"].pid, by_id["r"].pid_started) == (4321, 99)
    assert by_id["s"].pid is None and by_id["s"].problem and by_id["t"].pid is None and by_id["t"].problem
    assert _parse(_doc()).epoch is None and _parse(_doc()).queued == () and not _parse(_doc()).draining
    over = _checked(_parse(_doc(queued=[{"run_id": f"q{i}", "attempt": 1, "gpu_mask": [0], "epoch": 0,
                                         "position": i % 200} for i in range(MAX_QUEUE_ENTRIES + 5)])))
    assert len(over.queued) == MAX_QUEUE_ENTRIES and any("only the first" in r for r in over.rejected)
    assert _parse(_doc(epoch=10**18)).epoch is None and _parse(_doc(epoch=True)).epoch is None


def test_the_box_reports_no_more_entries_than_the_controller_reads() -> None:
    from reconciler.box import limits

    assert limits.MAX_QUEUED <= MAX_QUEUE_ENTRIES
