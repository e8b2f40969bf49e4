"""`rigsync status` shows the ops tax: the console script against the emulator, on a fleet checkout whose archive is
hand-made (attempts of every outcome and the overhead lines of two ended boxes), so the figures are known."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from world import emulator_env, fleet_repo, rigsync

from reconciler.core.model import AttemptOutcome, AttemptRecord, OverheadRecord
from reconciler.emulator import Emulator
from reconciler.observed.archive_lines import entry_to_json

pytestmark = pytest.mark.integration

SCHEMA_PATH = Path(__file__).parents[2] / "schemas" / "cli-status.schema.json"
SCHEMA = Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))
T0 = 1_793_000_000.0  # 2026-10
DPH = 3.6  # $0.001 a second


def _attempt(run: str, n: int, phase: AttemptOutcome, a: float, b: float, box: int, reason: str = "") -> AttemptRecord:
    return AttemptRecord(run_id=run, attempt=n, sweep="tdmpc", phase=phase, instance_id=box, dph=DPH,
                         started_at=T0 + a, ended_at=T0 + b, cost_usd=round((b - a) * DPH / 3600, 6), reason=reason)


def test_status_prints_the_ops_tax_as_text_and_json(emulator: Emulator, tmp_path: Path) -> None:
    fleet = fleet_repo(tmp_path / "fleet")
    fleet.edit_fleet(name="ittax", max=0)
    attempts = [
        _attempt("tdmpc-aaa", 1, AttemptOutcome.SUCCEEDED, 100, 400, 1),
        _attempt("tdmpc-bbb", 1, AttemptOutcome.FAILED, 400, 500, 1),
        _attempt("tdmpc-aaa", 2, AttemptOutcome.SUCCEEDED, 420, 520, 2),  # a second success: duplicate
        _attempt("tdmpc-ccc", 2, AttemptOutcome.FAILED, 200, 250, 2, reason="duplicate: attempt 1 of this run is "
                 "already running on instance/1"),
    ]
    overheads = [
        OverheadRecord(instance_id=1, billed_usd=0.6, attempts_usd=0.4, cost_usd=0.2, dph=DPH, num_gpus=1,
                       started_at=T0, ended_at=T0 + 600),
        OverheadRecord(instance_id=2, billed_usd=0.5, attempts_usd=0.15, cost_usd=0.35, dph=DPH, num_gpus=1,
                       started_at=T0 + 50, ended_at=T0 + 550),
    ]
    fleet.write("observed/runs/2026-10.jsonl", "".join(entry_to_json(r) + "\n" for r in [*attempts, *overheads]))
    fleet.commit("test: a hand-made archive", push=False)
    env = emulator_env(emulator, state_dir=tmp_path / "state")

    text = rigsync(env, "status", "--repo", str(fleet.work))
    assert text.returncode == 0, text.stderr
    # billed $1.1: succeeded work $0.3 (aaa.1, the first to end); boot $0.25 (to each box's first attempt), idle
    # $0.3, lost $0.1 (bbb.1), duplicate $0.15 (aaa.2 and the killed ccc.2)
    assert "ops tax: $0.8000 of $1.1000 billed (72.7%) bought no succeeded work; succeeded work $0.3000" in text.stdout
    assert ("  boot $0.2500 (22.7%), bootstrap $0.0000 (0.0%), idle $0.3000 (27.3%), lost $0.1000 (9.1%), "
            "stopped_early $0.0000 (0.0%), duplicate $0.1500 (13.6%)") in text.stdout
    assert "runs: " in text.stdout and "queued 0" in text.stdout

    doc = json.loads(rigsync(env, "status", "--repo", str(fleet.work), "--json").stdout)
    assert [e.message for e in SCHEMA.iter_errors(doc)] == []
    tax = doc["ops_tax"]
    assert tax["billed_usd"] == 1.1 and tax["tax_usd"] == 0.8 and tax["boxes"] == 2 and tax["held"] == 0
    assert tax["parts"]["duplicate"] == {"usd": 0.15, "share": 0.1364}
    assert sum(p["usd"] for p in tax["parts"].values()) + tax["useful_usd"] == pytest.approx(tax["billed_usd"])
