"""Learned throughput: rates from the archive, predictions by source, the work_per_dph score, exploration, and their
uses (forecast, runtimes, archive lines, observed/throughput.yaml)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
import yaml
from fakes import offer

from reconciler.core.model import AttemptOutcome, AttemptRecord, Progress, Ranking, RunDirState, Sweep
from reconciler.core.offers import normalize_gpu_name
from reconciler.core.throughput import (
    Rates,
    Sample,
    Source,
    archive_samples,
    exploration,
    learn,
    predict,
    progress_value,
    work_score,
)
from reconciler.observed.archive_lines import record_from_json, record_to_json
from reconciler.observed.codec import THROUGHPUT, dump_yaml
from reconciler.observed.throughput_file import HEADER, throughput_document
from reconciler.plan import plan
from reconciler.plan.forecast import forecast
from reconciler.plan.money import RuntimeSource, sweep_runtimes
from reconciler.plan.world import index_world

try:
    from .plan_case_io import load_case
except ImportError:
    from plan_case_io import load_case  # type: ignore[no-redef]

ROOT = Path(__file__).parents[2]
CASES = Path(__file__).parent / "plan_cases"
SWEEP = Sweep(name="s", command="python train.py", progress=Progress("step", 1000.0))


def rec(gpu: str, machine: int, progress: float | None, seconds: float, **kw: object) -> AttemptRecord:
    base = AttemptRecord(
        run_id=f"r{machine}-{seconds}", attempt=1, sweep="s", phase=AttemptOutcome.SUCCEEDED, gpu_name=gpu,
        machine_id=machine, started_at=1000.0, ended_at=1000.0 + seconds, progress=progress,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def rates_of(*records: AttemptRecord) -> Rates:
    return learn(archive_samples(records, normalize_gpu_name))


def test_learn_sums_units_over_seconds_per_model_and_machine() -> None:
    r = rates_of(
        rec("RTX 3090", 1, 1000, 100), rec("rtx_3090", 2, 1000, 300), rec("RTX 3060", 3, 500, 100),
        rec("RTX 3060", 3, 0, 100),  # no progress
        rec("RTX 3060", 3, 900, 0),  # no duration
        rec("RTX 3060", 3, 900, 100, resumed_from=1),  # its units are not its own
        rec("", 4, 900, 100),  # no GPU name
        rec("RTX 3060", 3, float("nan"), 100),
    )
    s = r.of("s")
    assert s is not None
    assert s.gpus["rtx 3090"].per_s == pytest.approx(2000 / 400) and s.gpus["rtx 3090"].attempts == 2
    assert s.gpus["rtx 3060"].per_s == pytest.approx(5.0) and s.gpus["rtx 3060"].attempts == 1
    assert s.machines[1].per_s == pytest.approx(10.0) and s.machines[3].attempts == 1
    pooled = s.pooled
    assert pooled is not None and pooled.per_s == pytest.approx(2500 / 500) and pooled.attempts == 3
    assert rates_of(rec("RTX 3060", 3, 0, 100)).of("s") is None


@pytest.mark.parametrize(
    "value", [True, "12", float("nan"), float("inf"), -1, 10**400, 1e16, None],
)
def test_progress_value_refuses_what_is_not_work_done(value: object) -> None:
    assert progress_value(SWEEP, (("step", value),)) is None  # type: ignore[arg-type]


def test_progress_value_reads_the_key_only_when_the_sweep_has_one() -> None:
    assert progress_value(SWEEP, (("step", 12),)) == 12.0
    assert progress_value(replace(SWEEP, progress=None), (("step", 12),)) is None
    assert progress_value(SWEEP, (("loss", 1.0),)) is None


def test_predict_prefers_machine_then_model_then_scaled_then_dlperf() -> None:
    r = rates_of(rec("RTX 3090", 1, 1000, 100), rec("RTX 3090", 2, 1000, 200), rec("A100 SXM4", 3, 4000, 100))
    dl = {"rtx 3090": 20.0, "a100 sxm4": 100.0, "rtx 4090": 40.0}
    on_machine = predict(r, "s", "rtx 3090", 1, dl)
    assert on_machine.source is Source.MACHINE and on_machine.per_s == pytest.approx(10.0)
    on_model = predict(r, "s", "rtx 3090", 9, dl)
    assert on_model.source is Source.GPU and on_model.per_s == pytest.approx(2000 / 300)
    scaled = predict(r, "s", "rtx 4090", 9, dl)  # nearest in DLPerf: the RTX 3090 (20), not the A100 (100)
    assert scaled.source is Source.SCALED and scaled.per_s == pytest.approx(2000 / 300 * 40 / 20)
    assert "scaled from rtx 3090" in scaled.basis
    own = predict(r, "s", "rtx 4090", 9, dl, gpu_dlperf=90.0)  # an offer's own DLPerf: nearest the A100
    assert own.source is Source.SCALED and own.per_s == pytest.approx(40.0 * 90 / 100)
    assert predict(r, "s", "tesla t4", 9, dl).source is Source.DLPERF  # its DLPerf unknown
    assert predict(r, "other", "rtx 3090", 1, dl).source is Source.DLPERF  # nothing measured for the sweep


def test_work_score_orders_as_dlperf_per_dph_until_something_is_measured() -> None:
    offers = [offer(1, dph=0.1), offer(2, dph=0.3), offer(3, dph=0.2, gpu_name="RTX 3060")]
    score = work_score(offers, [(SWEEP, 3.0)], Rates(), {}, normalize_gpu_name)
    by_value = sorted(offers, key=lambda o: -o.dlperf_per_dph)
    assert sorted(score, key=lambda i: -score[i]) == [o.id for o in by_value]


def test_work_score_follows_measured_work_per_dollar() -> None:
    r = rates_of(rec("RTX 3060", 50, 1000, 100), rec("RTX 3090", 60, 1000, 400))
    offers = [offer(1, dph=0.2), offer(2, dph=0.2, gpu_name="RTX 3060")]
    score = work_score(offers, [(SWEEP, 1.0)], r, {}, normalize_gpu_name)
    assert score[2] == pytest.approx(1.0) and score[1] == pytest.approx(0.25)


def test_work_score_weighs_sweeps_by_their_pending_runs() -> None:
    other = replace(SWEEP, name="t")
    r = rates_of(
        rec("RTX 3060", 50, 1000, 100), rec("RTX 3090", 60, 1000, 400),
        rec("RTX 3060", 51, 1000, 400, sweep="t"), rec("RTX 3090", 61, 1000, 100, sweep="t"),
    )
    offers = [offer(1, dph=0.2), offer(2, dph=0.2, gpu_name="RTX 3060")]
    mostly_t = work_score(offers, [(SWEEP, 1.0), (other, 9.0)], r, {}, normalize_gpu_name)
    assert mostly_t[1] > mostly_t[2]
    mostly_s = work_score(offers, [(SWEEP, 9.0), (other, 1.0)], r, {}, normalize_gpu_name)
    assert mostly_s[2] > mostly_s[1]


def _explore(share: float, held: list[tuple[str, int]], with_measured_option: bool = True) -> tuple[bool, bool, int]:
    r = rates_of(rec("RTX 3090", 60, 1000, 100))
    dl = {"rtx 3090": 20.0, "rtx 4090": 80.0}
    cand = replace(offer(7, dph=0.3, gpu_name="RTX 4090"), dlperf=80.0)  # predicted 4x the rate for 1.5x the price
    options = [cand, offer(8, dph=0.2)] if with_measured_option else [cand]
    v = exploration(cand, [SWEEP], r, held, share, options, dl, normalize_gpu_name)
    return v.explores, v.allowed, v.limit


def test_exploration_is_bounded_by_its_share() -> None:
    assert _explore(0.25, []) == (True, True, 1)  # at least one when share > 0
    assert _explore(0.25, [("RTX 4090", 9)]) == (True, False, 1)  # ceil(0.25 * 2) = 1 already held
    assert _explore(0.5, [("RTX 4090", 9), ("RTX 3090", 8), ("RTX 3090", 7)]) == (True, True, 2)
    assert _explore(0.0, []) == (True, False, 0)  # share 0: never
    assert _explore(0.25, [], with_measured_option=False)[:2] == (False, True)  # nothing to exploit instead


def test_exploration_is_not_an_unmeasured_offer_predicted_dearer_or_a_measured_one() -> None:
    r = rates_of(rec("RTX 3090", 60, 1000, 100))
    dl = {"rtx 3090": 20.0, "rtx 4090": 40.0}
    dear = replace(offer(7, dph=2.0, gpu_name="RTX 4090"), dlperf=40.0)
    measured = offer(8, dph=0.2)
    v = exploration(dear, [SWEEP], r, [], 0.25, [dear, measured], dl, normalize_gpu_name)
    assert not v.explores and v.allowed
    v = exploration(measured, [SWEEP], r, [], 0.25, [dear, measured], dl, normalize_gpu_name)
    assert not v.explores and v.allowed
    v = exploration(dear, [replace(SWEEP, name="unmeasured")], r, [], 0.25, [dear, measured], dl, normalize_gpu_name)
    assert not v.explores


def test_archive_line_keeps_queued_at_and_progress_and_is_schema_valid() -> None:
    schema = json.loads((ROOT / "schemas" / "archive-record.schema.json").read_text())
    r = rec("RTX 3090", 1, 1234.5, 100, queued_at=990.0)
    line = record_to_json(r)
    assert record_from_json(line) == r
    jsonschema.Draft202012Validator(schema).validate(json.loads(line))
    bare = record_to_json(rec("RTX 3090", 1, None, 100))
    assert '"progress"' not in bare and '"queued_at"' not in bare  # older lines stay as they were


def test_throughput_document_is_sorted_rounded_and_schema_valid() -> None:
    schema = json.loads((ROOT / "schemas" / "observed-throughput.schema.json").read_text())
    history = [rec("RTX 3090", 2, 1000, 300), rec("RTX 3060", 1, 1000, 3), rec("RTX 3090", 1, 1000, 100)]
    doc = throughput_document(history)
    jsonschema.Draft202012Validator(schema).validate(doc)
    (s,) = doc["sweeps"]
    assert [g["gpu_name"] for g in s["gpus"]] == ["rtx 3060", "rtx 3090"]
    assert [m["machine_id"] for m in s["machines"]] == [1, 2]
    assert s["gpus"][0]["units_per_s"] == 333.333
    assert dump_yaml(throughput_document(reversed(history)), HEADER) == dump_yaml(doc, HEADER)
    assert yaml.safe_load(dump_yaml(throughput_document([]), HEADER)) == {"format_version": 1, "sweeps": []}
    assert THROUGHPUT == "observed/throughput.yaml"


def test_forecast_and_runtimes_use_the_learned_rate() -> None:
    case = load_case(CASES / "stall_rate_within_learned.json")
    world, _ = index_world(case.desired, case.observed, case.controller, case.now)
    runtimes = sweep_runtimes(case.desired, case.observed, world.gpu_dlperf, world.learned)
    rt = runtimes["s"]
    assert rt.source is RuntimeSource.RATE and rt.hours == pytest.approx(1000 / 3600) and rt.samples == 1
    fc = forecast(world, runtimes)
    spec = world.runs["r1"]
    box = world.boxes[1]
    assert box.probe is not None
    rd: RunDirState = box.probe.runs[0]
    # the machine's rate: the archive's 1000 steps in 1000 s and the live attempt's 600 in 1800 s, together
    assert fc.rate(spec, "RTX 3090", 1) == pytest.approx(1600 / 2800)
    assert fc.run_s(spec, "RTX 3090", 1) == pytest.approx(1000 / (1600 / 2800))
    assert fc.remaining_s(spec, rd, box) == pytest.approx(400 / (1600 / 2800))
    plain = replace(spec, sweep=replace(spec.sweep, progress=None))
    assert fc.rate(plain, "RTX 3090", 1) is None


@pytest.mark.parametrize(
    ("name", "by_work", "by_dlperf"),
    [
        ("rank_measured_cheaper_card", "offer/102", "offer/101"),
        ("rank_unmeasured_scaled_by_dlperf", "offer/102", "offer/101"),
    ],
)
def test_ranking_cases_turn_on_work_per_dph(name: str, by_work: str, by_dlperf: str) -> None:
    case = load_case(CASES / f"{name}.json")
    assert case.desired.fleet.pools[0].ranking is Ranking.WORK_PER_DPH  # the default
    made = plan(case.desired, case.observed, case.controller, case.now)
    rents = [a.target for a in made.actions if a.kind.value == "rent"]
    assert rents == [by_work]
    pools = tuple(dataclasses.replace(p, ranking=Ranking.DLPERF_PER_DPH) for p in case.desired.fleet.pools)
    desired = replace(case.desired, fleet=replace(case.desired.fleet, pools=pools))
    made = plan(desired, case.observed, case.controller, case.now)
    rents = [a.target for a in made.actions if a.kind.value == "rent"]
    assert rents == [by_dlperf]


def test_live_progress_counts_in_the_plan_never_in_the_file() -> None:
    case = load_case(CASES / "stall_rate_within_learned.json")
    world, _ = index_world(case.desired, case.observed, case.controller, case.now)
    learned, live = world.learned.of("s"), world.rates.of("s")
    assert learned is not None and live is not None
    assert learned.machines[1].attempts == 1 and live.machines[1].attempts == 2
    doc = throughput_document(case.observed.history)
    assert doc["sweeps"][0]["machines"][0]["attempts"] == 1


def test_samples_ignore_unusable_values() -> None:
    assert learn([Sample("s", "rtx 3090", 1, float("inf"), 10.0), Sample("s", "rtx 3090", 1, 5.0, -1.0)]).sweeps == {}


def test_world_exploration_counts_the_fleets_rented_boxes_and_its_share() -> None:
    case = load_case(CASES / "rank_measured_cheaper_card.json")
    world, _ = index_world(case.desired, case.observed, case.controller, case.now)
    sweeps = [world.runs["r1"].sweep]
    dearer_3090 = next(o for o in world.pool_offers[case.desired.fleet.pools[0].name] if o.id == 101)
    v = world.exploration(dearer_3090, case.desired.fleet.pools[0].name, sweeps)
    assert not v.explores and v.allowed  # measured, and predicted dearer anyway
    a4000 = replace(offer(9, dph=0.05, gpu_name="RTX A4000"), dlperf=20.0)  # unmeasured, DLPerf like the 3060, cheap
    pool = case.desired.fleet.pools[0].name
    world = replace(world, pool_offers={pool: (*world.pool_offers[pool], a4000)}, gpu_dlperf={"rtx 3060": 20.0})
    v = world.exploration(a4000, pool, sweeps)
    assert v.explores and v.allowed and v.limit == 1 and "rtx a4000 unmeasured" in v.detail


def test_the_price_of_a_measured_sweep_is_each_card_at_its_own_rate() -> None:
    case = load_case(CASES / "rank_measured_cheaper_card.json")
    (est,) = plan(case.desired, case.observed, case.controller, case.now).estimates
    # pooled: 3000 steps in 600 s (5/s), so 1000 steps take 200 s; the RTX 3060 (10/s) at $0.20/h does them in
    # 100 s, the RTX 3090 (2.5/s) in 400 s
    assert est.runtime_source == "learned_rate" and est.runtime_samples == 3
    assert est.runtime_h == pytest.approx(200 / 3600, abs=1e-4)
    assert est.usd_low == pytest.approx(0.2 * 100 / 3600, abs=1e-4)
    assert est.usd_high == pytest.approx(0.2 * 400 / 3600, abs=1e-4)
