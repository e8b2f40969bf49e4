"""The ops tax on hand-made facts: each part is the money it names, and the parts with the succeeded work (and what
still runs) add up to the bill, whatever the facts."""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.core.model import AttemptOutcome, AttemptRecord, OverheadRecord
from reconciler.views.opstax import PARTS, LiveBox, ops_tax, tax_lines

T0 = 1_790_000_000.0
DPH = 3.6  # $0.001 a second: a second of a box is a tenth of a cent


def attempt(run: str, n: int, phase: AttemptOutcome, start: float, end: float, *, box: int = 1,
            reason: str = "", queued_at: float | None = None) -> AttemptRecord:
    return AttemptRecord(run_id=run, attempt=n, sweep="s", phase=phase, instance_id=box, dph=DPH,
                         started_at=T0 + start, ended_at=T0 + end, cost_usd=round((end - start) * DPH / 3600, 6),
                         reason=reason, queued_at=None if queued_at is None else T0 + queued_at)


def overhead(box: int, start: float, end: float, attempts: list[AttemptRecord], *, reachable: float | None,
             ready: float | None) -> OverheadRecord:
    billed = round((end - start) * DPH / 3600, 6)
    used = sum(a.cost_usd for a in attempts if a.instance_id == box)
    return OverheadRecord(instance_id=box, billed_usd=billed, attempts_usd=used, cost_usd=billed - used, dph=DPH,
                          num_gpus=1, gpu_name="RTX 3060", started_at=T0 + start, ended_at=T0 + end,
                          reachable_at=None if reachable is None else T0 + reachable,
                          ready_at=None if ready is None else T0 + ready)


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, abs_tol=1e-9)


def adds_up(tax: object) -> None:
    from reconciler.views.opstax import OpsTax

    assert isinstance(tax, OpsTax)
    assert close(tax.useful_usd + tax.running_usd + tax.tax_usd, tax.billed_usd)
    assert all(usd >= 0 for _, usd in tax.parts) and [p for p, _ in tax.parts] == list(PARTS)


S, F, L = AttemptOutcome.SUCCEEDED, AttemptOutcome.FAILED, AttemptOutcome.LOST


def test_one_ended_box_splits_into_boot_bootstrap_idle_lost_and_duplicate() -> None:
    # box 1 lives 0..1000 s: boot 0..100, bootstrap 100..150, then attempts with gaps, destroyed at 1000
    runs = [
        attempt("a", 1, S, 150, 350),  # the work wanted: 200 s
        attempt("b", 1, F, 350, 400),  # failed: 50 s lost
        attempt("b", 2, S, 400, 600),  # the work wanted: 200 s
        attempt("c", 1, L, 600, 630),  # lost: 30 s
        attempt("a", 2, S, 700, 800),  # a second success of a: 100 s duplicate
        attempt("d", 2, F, 800, 820, reason="duplicate: attempt 1 of this run is already running on instance/2"),
    ]
    tax = ops_tax(runs, [overhead(1, 0, 1000, runs, reachable=100, ready=150)])
    adds_up(tax)
    assert close(tax.billed_usd, 1.0)  # 1000 s at $0.001
    assert close(tax.boot_usd, 0.1) and close(tax.bootstrap_usd, 0.05)
    assert close(tax.lost_usd, 0.08) and close(tax.duplicate_usd, 0.12)
    assert close(tax.idle_usd, 1.0 - 0.4 - 0.08 - 0.12 - 0.15)  # 630..700 and 820..1000: 250 s
    assert close(tax.useful_usd, 0.4) and tax.running_usd == 0
    assert close(tax.share(tax.tax_usd), 0.6) and tax.boxes == 1 and tax.held == 0
    doc = tax.to_json()
    assert doc["parts"]["idle"] == {"usd": 0.25, "share": 0.25} and doc["tax_share"] == 0.6


def test_the_first_success_is_the_one_that_ended_first() -> None:
    runs = [attempt("a", 2, S, 0, 100, box=2), attempt("a", 1, S, 50, 300, box=1)]  # attempt 2 ended first
    tax = ops_tax(runs, [overhead(1, 0, 300, runs, reachable=0, ready=0), overhead(2, 0, 100, runs, reachable=0,
                                                                                  ready=0)])
    adds_up(tax)
    assert close(tax.useful_usd, 0.1) and close(tax.duplicate_usd, 0.25) and close(tax.idle_usd, 0.05)


def test_a_box_without_readiness_times_boots_until_its_first_attempt_or_for_its_whole_life() -> None:
    runs = [attempt("a", 1, S, 120, 220, box=1, queued_at=100)]
    tax = ops_tax(runs, [overhead(1, 0, 300, runs, reachable=None, ready=None),
                         overhead(2, 0, 50, [], reachable=None, ready=None)])
    adds_up(tax)
    assert close(tax.boot_usd, 0.1 + 0.05)  # box 1: to its first attempt's queueing; box 2 never ran anything
    assert close(tax.idle_usd, 0.3 - 0.1 - 0.1) and tax.bootstrap_usd == 0


def test_boot_and_bootstrap_never_exceed_what_the_box_was_billed_beyond_its_attempts() -> None:
    # the overhead line says less than the spans would cost (an estimate, a short bill): boot first, then bootstrap
    runs = [attempt("a", 1, S, 100, 200)]
    line = overhead(1, 0, 300, runs, reachable=100, ready=150)
    short = OverheadRecord(**{**line.__dict__, "cost_usd": 0.12, "billed_usd": 0.22})
    tax = ops_tax(runs, [short])
    adds_up(tax)
    assert close(tax.boot_usd, 0.1) and close(tax.bootstrap_usd, 0.02) and tax.idle_usd == 0
    negative = OverheadRecord(**{**line.__dict__, "cost_usd": -0.01})
    tax = ops_tax(runs, [negative])
    adds_up(tax)
    assert tax.tax_usd == 0 and close(tax.useful_usd, 0.09)


def test_a_held_box_is_billed_to_the_snapshot_with_its_running_attempts_apart() -> None:
    runs = [attempt("a", 1, S, 200, 400, box=7)]
    live = LiveBox(7, DPH, T0, T0 + 1000, reachable_at=T0 + 100, ready_at=T0 + 200, running_usd=0.3,
                   first_launch_at=T0 + 700)
    tax = ops_tax(runs, [], [live])
    adds_up(tax)
    assert close(tax.billed_usd, 1.0) and close(tax.running_usd, 0.3) and close(tax.useful_usd, 0.2)
    assert close(tax.boot_usd, 0.1) and close(tax.bootstrap_usd, 0.1) and close(tax.idle_usd, 0.3)
    assert tax.boxes == 1 and tax.held == 1
    # a held box that also has an overhead line has ended: it is billed once, by its line
    ended = ops_tax(runs, [overhead(7, 0, 500, runs, reachable=100, ready=200)], [live])
    adds_up(ended)
    assert close(ended.billed_usd, 0.5) and ended.held == 0 and ended.running_usd == 0


def test_nothing_billed_says_so_and_the_lines_name_every_part() -> None:
    empty = ops_tax([], [])
    assert empty.billed_usd == 0 and empty.share(0.0) == 0 and tax_lines(empty) == ["ops tax: nothing billed yet"]
    runs = [attempt("a", 1, F, 100, 200)]
    head, parts = tax_lines(ops_tax(runs, [overhead(1, 0, 200, runs, reachable=50, ready=100)]))
    assert head.startswith("ops tax: $0.2000 of $0.2000 billed (100.0%) bought no succeeded work")
    assert parts == "  boot $0.0500 (25.0%), bootstrap $0.0500 (25.0%), idle $0.0000 (0.0%), lost $0.1000 (50.0%), " \
                    "stopped_early $0.0000 (0.0%), duplicate $0.0000 (0.0%)"


def test_an_attempt_stopped_early_is_its_own_part_not_lost() -> None:
    runs = [replace(attempt("a", 1, F, 100, 200), phase=AttemptOutcome.STOPPED_EARLY)]
    tax = ops_tax(runs, [overhead(1, 0, 200, runs, reachable=50, ready=100)])
    assert tax.lost_usd == 0 and math.isclose(tax.stopped_early_usd, 0.1)
    assert dict(tax.parts)["stopped_early"] == tax.stopped_early_usd


times = st.floats(min_value=0, max_value=5000, allow_nan=False)
odd = st.one_of(times, st.none(), st.just(math.nan), st.just(math.inf), st.just(-1e300))


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 3), st.sampled_from([S, F, L]), times, times,
                       st.integers(1, 3)), max_size=8),
    st.lists(st.tuples(st.integers(1, 3), times, times, odd, odd, st.floats(-1, 5, allow_nan=False)), max_size=3),
    st.lists(st.tuples(st.integers(1, 5), times, times, odd, odd, st.floats(0, 2, allow_nan=False)), max_size=2),
)
def test_the_parts_always_add_up_to_the_bill(
    raw: list[tuple[str, int, AttemptOutcome, float, float, int]],
    lines: list[tuple[int, float, float, float | None, float | None, float]],
    held: list[tuple[int, float, float, float | None, float | None, float]],
) -> None:
    runs = list({(r, n): attempt(r, n, p, min(a, b), max(a, b), box=box) for r, n, p, a, b, box in raw}.values())
    overheads = [
        OverheadRecord(instance_id=box, billed_usd=0.0, attempts_usd=0.0, cost_usd=cost, dph=DPH, started_at=T0 + a,
                       ended_at=T0 + b, reachable_at=r, ready_at=ready)
        for box, a, b, r, ready, cost in lines
    ]
    live = [LiveBox(box, DPH, T0 + a, T0 + b, r, ready, running) for box, a, b, r, ready, running in held]
    adds_up(ops_tax(runs, overheads, live))
