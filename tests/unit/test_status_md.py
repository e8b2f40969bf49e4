"""observed/STATUS.md: deterministic, laid out as documented, escaped, and rendered by every cycle beside the files."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pytest
import yaml
from fakes import (
    FakeArchive,
    FakeClock,
    FakeWorld,
    Work,
    desired_state,
    fake_reconciler,
    offer,
)

from reconciler.core.model import AttemptOutcome, AttemptRecord, Desired
from reconciler.desired import load_desired_from_dir
from reconciler.fleet import render_cycle
from reconciler.observed.codec import BUDGET, FLEET, RUNS, STATUS
from reconciler.observed.documents import ReconcilerStatus
from reconciler.observed.observed_tree import write_observed
from reconciler.observed.summary import describe_change
from reconciler.ports import LaunchJob
from reconciler.views import facts
from reconciler.views.status_md import STATUS_MD, render_status_md

ROOT = Path(__file__).parents[2]
T0 = dt.datetime(2026, 11, 3, 12, 0, tzinfo=dt.UTC).timestamp()
HOSTILE = "x | y\u202e `` ``` <b>"

def _run(phase: str, best: float | None, lr: float, task: str, seed: int, *, attempts: int = 1,
         instance: int | None = 17) -> dict[str, object]:
    return {"attempts": attempts, "best_metric": best, "instance": instance, "params": {"lr": lr, "task": task},
            "phase": phase, "seed": seed}


FILES = {
    FLEET: """\
boxes:
- dph: 0.0419
  gpu_name: RTX 3060
  gpus:
  - {index: 0, memory_total_mib: 12288, busy: true, run: tdmpc-aaa.1}
  id: 17
  num_gpus: 1
  reachable: true
  started_at: '2026-11-03T09:30:00Z'
  status: running
dph: 0.0419
fleet: demo
held: 1
""",
    RUNS: yaml.safe_dump({
        "counts": {"tdmpc": {"blocked": 1, "pending": 1, "retrying": 0, "running": 1, "succeeded": 2, "total": 5}},
        "sweeps": {"tdmpc": {
            "tdmpc-aaa": _run("running", None, 0.001, "walker-walk", 1),
            "tdmpc-bbb": _run("succeeded", 700.5, 0.001, "walker-walk", 2),
            "tdmpc-ccc": _run("succeeded", 410.0, 0.0003, "cheetah-run", 1),
            "tdmpc-ddd": _run("blocked", None, 0.0003, "walker-walk", 1, attempts=3),
            "tdmpc-eee": _run("pending", None, 0.0003, "walker-walk", 2, attempts=0, instance=None),
        }},
    }),
    BUDGET: """\
caps: {daily_usd: 5.0, max_fleet_dph: 0.45, max_instance_dph: 0.15, on_exceed: drain, total_usd: 20.0}
fleet_dph: 0.0419
spend: {as_of: '2026-11-03T12:00:00Z', credit_usd: 99.5, today_usd: 0.25, total_usd: 1.5}
""",
    STATUS: """\
desired_commit_applied: 9dec9ad1025a58ddbe3f9d376705c3821562f7d6
desired_errors: []
apply_errors: []
last_change_at: '2026-11-03T12:00:00Z'
last_plan:
  warnings: ['budget: the daily cap binds', 'secret missing: sweep tdmpc needs WANDB_API_KEY']
""",
}


def _failure(attempt: int, ended: float, tail: str) -> AttemptRecord:
    return AttemptRecord(
        run_id="tdmpc-ddd", attempt=attempt, sweep="tdmpc", phase=AttemptOutcome.FAILED, exit_code=1,
        instance_id=17, ended_at=ended, reason=f"exited with code 1 ({HOSTILE})", stderr_tail=tail,
    )


HISTORY = [
    AttemptRecord(run_id="tdmpc-bbb", attempt=1, sweep="tdmpc", phase=AttemptOutcome.SUCCEEDED, instance_id=17,
                  ended_at=T0 - 600, best_metric=700.5, params=(("lr", 0.001), ("task", "walker-walk"))),
    _failure(1, T0 - 3000, "Traceback\nValueError: old"),
    _failure(2, T0 - 2000, "Traceback\nValueError: nan loss\n" + HOSTILE),
    _failure(3, T0 - 1000, "CUDA out of memory"),
]


@pytest.fixture(scope="module")
def desired() -> Desired:
    return load_desired_from_dir(ROOT)


def test_the_same_facts_render_the_same_bytes(desired: Desired) -> None:
    first = render_status_md(FILES, HISTORY, desired)
    facts._document.cache_clear()  # parsed afresh, not the memo of the first render
    second = render_status_md(dict(FILES), list(reversed(HISTORY)), desired)
    assert first == second


def test_sections_in_order_with_the_facts_they_summarise(desired: Desired) -> None:
    text = render_status_md(FILES, HISTORY, desired)
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings == ["Fleet", "Queue", "Spend", "Ops tax", "Best cell per sweep", "Top configurations", "Promotions",
                        "Recent failures"]
    # the box: its age measured to the snapshot's own time (2h30m after its start), never to the wall clock
    assert "| 17 | 1x RTX 3060 | 0.0419 | running | 2h 30m | - | tdmpc\\-aaa\\.1 | \\- | 4 |" in text
    assert "| tdmpc | 1 | 1 | 2 | 0 | 1 | 0 | 0 | 5 |" in text
    assert "| spent today | $0.2500 | $5.0000 |" in text and "| fleet $/h | $0.0419/h | $0.4500/h |" in text
    assert "Account credit: $99.50." in text
    assert "- budget\\: the daily cap binds" in text  # the last plan's words, escaped like any value
    assert "- held back\\: sweep tdmpc needs WANDB\\_API\\_KEY" in text
    assert "Blocked in tdmpc (no retries left):" in text
    best = text.split("## Best cell per sweep")[1].split("##")[0]
    assert "lr\\=0\\.001 task\\=walker\\-walk" in best and "700.5" in best
    promotions = text.split("## Promotions")[1].split("##")[0]
    assert "**promoted**" not in promotions and "best - >= 380? not yet" in promotions
    # a base seed of a cell reaches the thresholds: its promotions are met (the one rule: reconciler.core.promotion)
    base = next(r for r in desired.runs if r.promotion_threshold is None and dict(r.params) == {
        "lr": 0.001, "task": "walker-walk"})
    good = AttemptRecord(run_id=base.id, attempt=1, sweep="tdmpc", phase=AttemptOutcome.SUCCEEDED, best_metric=550.0)
    promotions = render_status_md(FILES, [*HISTORY, good], desired).split("## Promotions")[1].split("##")[0]
    cell = [line for line in promotions.splitlines() if "lr\\=0\\.001 task\\=walker\\-walk" in line]
    assert [("**promoted**" in line) for line in cell] == [True, True, False], cell  # 380 and 500 yes, 600 not yet
    failures = text.split("## Recent failures")[1]
    # newest first, each with its stderr tail in a fence nothing in it can close
    assert failures.index("attempt 3") < failures.index("attempt 2") < failures.index("attempt 1")
    assert "CUDA out of memory" in failures


def test_values_from_the_world_cannot_break_the_markdown(desired: Desired) -> None:
    text = render_status_md(FILES, HISTORY, desired)
    assert "\u202e" not in text and "\\u202e" in text
    assert "<b>" not in text.split("## Recent failures")[0]  # outside fences every punctuation is escaped
    assert "x \\| y" in text  # a pipe cannot end a table cell
    fence = re.search(r"^(`{4,})\n(?:.*\n)*?.*ValueError: nan loss", text, re.M)
    assert fence is not None, "the tail holding ``` is fenced with more backticks than it holds"


def test_every_cycle_renders_it_and_an_unchanged_world_renders_it_unchanged(tmp_path: Path) -> None:
    def work(job: LaunchJob) -> Work:
        if job.run_id == "r1" and job.attempt == 1:
            return Work(seconds=60.0, exit_code=1)
        return Work(seconds=100.0, best_metric=float(job.run_id[1:]))

    desired = desired_state(3, max_instances=1)
    world = FakeWorld([offer(1, gpus=2, dph=0.2)], clock=FakeClock(), work=work)
    archive = FakeArchive()
    rec = fake_reconciler(world, archive)
    pages = []
    for _ in range(60):
        res = rec.cycle(desired)
        _, files = render_cycle(rec, desired, res.observed, res.plan, ReconcilerStatus(), tmp_path)
        write_observed(tmp_path, files, {})
        pages.append(files[STATUS_MD])
        done = {r.run_id for r in archive.records() if r.phase is AttemptOutcome.SUCCEEDED}
        if len(done) == 3 and not world.rentals and not res.plan.actions:
            break
        world.clock.advance(20.0)
    else:
        pytest.fail("the fake fleet did not finish")
    assert "### r1 attempt 1" in pages[-1] and "| s | 0 | 0 | 3 | 0 | 0 | 0 | 0 | 3 |" in pages[-1]
    assert "No boxes held." in pages[-1] and "No boxes held." not in pages[len(pages) // 2]
    # the world is still: hours pass, cycles run, the page stays byte-identical (no commit on noise)
    for _ in range(3):
        world.clock.advance(3600.0)
        res = rec.cycle(desired)
        previous, files = render_cycle(rec, desired, res.observed, res.plan, ReconcilerStatus(), tmp_path)
        assert previous[STATUS_MD] == files[STATUS_MD] == pages[-1]  # compared as committed: no "update STATUS.md"
        assert describe_change(previous, files) is None  # nothing meaningful changed: no commit
        write_observed(tmp_path, files, {})
