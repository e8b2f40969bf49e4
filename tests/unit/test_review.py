"""``rigsync review``: the pure comparison and price (``plan.review``) as data, and the command as a user runs
it against a git repository with a base and a head commit (the real console script)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from gitutil import git as _git

from reconciler.cli._review_git import review
from reconciler.core.jobenv import JOB_SECRETS_ENV
from reconciler.core.model import AttemptOutcome, AttemptRecord, Desired, FleetMemory, Observed, Spend
from reconciler.desired import load_desired, read_desired_files
from reconciler.plan.review import MARKER, MAX_MARKDOWN, Side, compute_review, headline, markdown
from reconciler.plan.review import text as review_text

ROOT = Path(__file__).resolve().parents[2]
RIGSYNC = Path(sys.executable).parent / "rigsync"
SCHEMA = json.loads((ROOT / "schemas" / "review.schema.json").read_text())
NOW = 1_796_000_000.0


def _desired(tmp_path: Path, sweep_edit: tuple[str, str] | None = None, budget: str | None = None) -> Desired:
    repo = tmp_path / f"r{len(list(tmp_path.iterdir()))}"
    shutil.copytree(ROOT / "desired", repo / "desired")
    (repo / "experiments").mkdir()
    sweep = repo / "desired" / "sweeps" / "tdmpc.yaml"
    if sweep_edit:
        text = sweep.read_text()
        assert sweep_edit[0] in text
        sweep.write_text(text.replace(*sweep_edit))
    if budget is not None:
        (repo / "desired" / "budget.yaml").write_text(budget)
    return load_desired(read_desired_files(repo))


def _valid(doc: dict[str, Any]) -> dict[str, Any]:
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)
    return doc


def _review(base: Desired, head: Desired, observed: Observed | None = None, held: Any = ()) -> dict[str, Any]:
    return _valid(compute_review(Side("main", "a" * 40, base), Side("HEAD", "b" * 40, head),
                                 observed or Observed(), held, NOW))


ADD_LR = ("lr: [3.0e-4, 1.0e-3]", "lr: [3.0e-4, 1.0e-3, 3.0e-3]")
TOKEN_ENV = "env:\n  T: ${GITHUB_TOKEN}\n  WANDB_API_KEY: ${WANDB_API_KEY}\n  MUJOCO_GL: egl\n"


def test_added_grid_value_adds_its_runs_and_prices_them(tmp_path: Path) -> None:
    base = _desired(tmp_path)
    head = _desired(tmp_path, ADD_LR)
    doc = _review(base, head, held=[(0.10, 1, "RTX 3060"), (0.05, 1, "RTX 2060")])
    assert doc["totals"] == {"added": 6, "removed": 0, "changed": 0, "unchanged": 12}
    assert doc["sweeps"]["tdmpc"]["head_runs"] == 18 and doc["sweeps"]["tdmpc"]["base_runs"] == 12
    assert {r["params"]["lr"] for r in doc["added"]} == {3.0e-3}
    e = doc["estimate"]
    # 6 runs x 1 GPU x max_runtime 30m (no archive, no expected_runtime) = 3 GPU-h at $0.05-$0.10 per GPU-h
    assert e["runs"] == 6 and e["gpu_hours"] == pytest.approx(3.0)
    assert (e["usd_low"], e["usd_high"]) == (pytest.approx(0.15), pytest.approx(0.30))
    assert e["price_source"] == "held boxes" and not e["upper_bound"]
    # the tightest cap is the daily $5.00 with nothing spent
    assert e["budget"]["remaining"] == 5.0 and e["budget"]["fits"] == "yes"
    assert e["budget"]["left_low"] == pytest.approx(4.70) and e["budget"]["left_high"] == pytest.approx(4.85)
    assert headline(doc) == (
        "+6 run(s), -0, 0 changed, ~3.00 GPU-h, $0.1500-$0.3000, fits: $4.70-$4.85 of $5.00 left after it"
    )


def test_archive_runtimes_and_prices_are_used_and_spend_counts(tmp_path: Path) -> None:
    base, head = _desired(tmp_path), _desired(tmp_path, ADD_LR)
    history = tuple(
        AttemptRecord(f"tdmpc-{i:012x}", 1, "tdmpc", AttemptOutcome.SUCCEEDED, gpu_name="Titan V", dph=0.08,
                      started_at=NOW - 7200, ended_at=NOW - 7200 + 600)
        for i in range(3)
    )
    spent = FleetMemory(spend=Spend(today_usd=4.95, total_usd=19.0))
    doc = _review(base, head, Observed(history=history, memory=spent))
    e = doc["estimate"]
    assert e["sweeps"][0]["runtime_source"] == "archive" and e["sweeps"][0]["runtime_samples"] == 3
    assert e["gpu_hours"] == pytest.approx(1.0)  # 6 x 10 minutes
    assert e["usd_low"] == pytest.approx(0.08) and e["price_source"] == "3 archived attempt(s)"
    assert e["budget"]["remaining"] == pytest.approx(0.05)
    assert e["budget"]["fits"] == "no" and "does NOT fit" in headline(doc)
    assert any(w.startswith("budget: sweep tdmpc needs at least") for w in e["warnings"])


def test_without_prices_the_per_box_cap_is_an_upper_bound(tmp_path: Path) -> None:
    doc = _review(_desired(tmp_path), _desired(tmp_path, ADD_LR))
    e = doc["estimate"]
    assert e["price_source"] == "cap" and e["upper_bound"]
    assert e["usd_low"] == e["usd_high"] == pytest.approx(3.0 * 0.15)
    assert "at most $0.4500" in headline(doc)


def test_changed_command_is_a_changed_run_and_removed_seeds_are_removed(tmp_path: Path) -> None:
    base = _desired(tmp_path)
    head = _desired(tmp_path, ("--out {{ run_dir }}/metrics.jsonl", "--out {{ run_dir }}/metrics.jsonl --fast"))
    doc = _review(base, head)
    assert doc["totals"] == {"added": 0, "removed": 0, "changed": 12, "unchanged": 0}
    c = doc["changed"][0]
    assert c["base_id"] != c["head_id"] and c["head_command"].endswith("--fast")
    assert doc["estimate"]["runs"] == 12

    fewer = _review(base, _desired(tmp_path, ("seeds: [1, 2, 3]", "seeds: [1, 2]")))
    assert fewer["totals"] == {"added": 0, "removed": 4, "changed": 0, "unchanged": 8}
    assert fewer["estimate"]["runs"] == 0


def test_runs_that_already_succeeded_are_not_priced_again(tmp_path: Path) -> None:
    base, head = _desired(tmp_path), _desired(tmp_path, ADD_LR)
    first = _review(base, head)
    done = AttemptRecord(first["added"][0]["id"], 1, "tdmpc", AttemptOutcome.SUCCEEDED)  # a reverted revert
    doc = _review(base, head, Observed(history=(done,)))
    assert doc["estimate"]["runs"] == 5 and doc["estimate"]["already_done"] == 1


def test_invalid_head_is_data() -> None:
    error = {"file": "desired/sweeps/x.yaml", "line": 3, "column": 1, "pointer": "/seeds", "message": "bad"}
    head = Side("HEAD", "b" * 40, None, [error])
    doc = _valid(compute_review(Side("main", "a" * 40, None), head, Observed(), (), NOW))
    assert doc["valid"] is False and doc["errors"] == [error] and doc["estimate"] is None
    md = markdown(doc)
    assert "Validation failed" in md and "desired/sweeps/x.yaml:3:1: /seeds: bad" in md


def test_markdown_is_bounded_and_values_cannot_break_out(tmp_path: Path) -> None:
    base = _desired(tmp_path)
    doc = _review(base, _desired(tmp_path, ("seeds: [1, 2, 3]", "seeds: [" + ", ".join(map(str, range(1, 31))) + "]")))
    assert doc["totals"]["added"] == 108
    md = markdown(doc)
    assert md.startswith(MARKER) and len(md) < MAX_MARKDOWN
    assert "... and 58 more" in md
    hostile = _desired(tmp_path, ("task: [walker-walk, cheetah-run]", 'task: [walker-walk, "x`````</details>"]'))
    md = markdown(_review(base, hostile))
    added = md.split("<summary>Added runs (6)</summary>")[1]
    assert added.split("\n")[2] == "``````"  # the fence is longer than the value's backtick run
    assert added.count("``````") == 2


def test_huge_change_stays_under_the_comment_limit(tmp_path: Path) -> None:
    grid = "lr: [" + ", ".join(f"{i}.0e-6" for i in range(1, 400)) + "]"
    head = _desired(tmp_path, ("lr: [3.0e-4, 1.0e-3]", grid))
    doc = _review(_desired(tmp_path), head)
    assert doc["totals"]["added"] > 2000
    assert len(markdown(doc)) < MAX_MARKDOWN


# ---------------------------------------------------------------------------------------- the console script


def rigsync(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(RIGSYNC), *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    return proc


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fleet repository with this repository's example and observed/ as base, and heads on branches: ``add``,
    ``bad``; ``token`` gives tdmpc ``env: {T: ${GITHUB_TOKEN}, WANDB_API_KEY: ...}`` (two references added, one
    literal), ``swap`` (after ``token``) points T at another variable (a changed reference)."""
    repo = tmp_path_factory.mktemp("review") / "fleet"
    repo.mkdir()
    for d in ("desired", "experiments", "observed"):
        shutil.copytree(ROOT / d, repo / d, ignore=shutil.ignore_patterns("__pycache__"))
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    sweep = repo / "desired" / "sweeps" / "tdmpc.yaml"
    original = sweep.read_text()
    heads = {"add": original.replace(*ADD_LR), "bad": original.replace("seeds: [1, 2, 3]", "seeds: [1, x]")}
    for branch, text in heads.items():
        _git(repo, "checkout", "-q", "-b", branch, "main")
        sweep.write_text(text)
        _git(repo, "commit", "-qam", branch)
    _git(repo, "checkout", "-q", "-b", "token", "main")
    sweep.write_text(original + TOKEN_ENV)
    _git(repo, "commit", "-qam", "tdmpc: report to GitHub")
    _git(repo, "checkout", "-q", "-b", "swap")
    sweep.write_text((original + TOKEN_ENV).replace("${GITHUB_TOKEN}", "${GH_PAT}"))
    _git(repo, "commit", "-qam", "tdmpc: another token")
    _git(repo, "checkout", "-q", "main")
    return repo


def test_cli_json_from_git_alone(fleet: Path) -> None:
    proc = rigsync("review", "--base", "main", "--head", "add", "--json", cwd=fleet)
    assert proc.returncode == 0, proc.stderr
    doc = _valid(json.loads(proc.stdout))
    assert doc["totals"]["added"] == 6 and doc["changed_files"] == ["desired/sweeps/tdmpc.yaml"]
    # observed/ at the base has 20 succeeded attempts: their runtime and the boxes they ran on price the work
    assert doc["estimate"]["sweeps"][0]["runtime_source"] == "archive"
    assert "archived attempt" in doc["estimate"]["price_source"]
    assert doc["estimate"]["budget"]["fits"] == "yes"


def test_cli_markdown_and_text(fleet: Path) -> None:
    md = rigsync("review", "--repo", str(fleet), "--base", "main", "--head", "add", "--markdown", cwd=ROOT)
    assert md.returncode == 0 and md.stdout.startswith(MARKER)
    assert "| tdmpc | 6 | 0 | 0 | 12 | 18 |" in md.stdout
    text = rigsync("review", "--base", "main", "--head", "add", cwd=fleet)
    assert text.stdout.splitlines()[0].startswith("+6 run(s), -0, 0 changed, ")


def test_cli_invalid_head_exits_1_with_the_errors(fleet: Path) -> None:
    proc = rigsync("review", "--base", "main", "--head", "bad", "--json", cwd=fleet)
    assert proc.returncode == 1
    doc = _valid(json.loads(proc.stdout))
    assert doc["valid"] is False and doc["estimate"] is None
    assert doc["sweeps"] == {} and doc["removed"] == []  # nothing is compared with a head that does not load
    assert [(e["file"], e["pointer"]) for e in doc["errors"]] == [("desired/sweeps/tdmpc.yaml", "/seeds/1")]


def test_cli_bad_ref_is_one_line(fleet: Path, tmp_path: Path) -> None:
    proc = rigsync("review", "--base", "nope", cwd=fleet)
    assert proc.returncode == 1
    assert proc.stderr.strip() == "rigsync: error: --base 'nope' names no commit in ."
    proc = rigsync("review", "--base", "main", "--repo", str(tmp_path), cwd=fleet)
    assert proc.returncode == 1 and "is not a git checkout" in proc.stderr


def test_review_function_is_the_json_document_and_spend_rolls_over_midnight(fleet: Path) -> None:
    """``review_git.review`` (what an MCP tool calls) returns what ``--json`` prints; the committed spend anchor
    (observed/budget.yaml: $0.002717 today, as of 2026-12-01T09:20:56Z) counts for the day it was spent on only."""
    from reconciler.cli._review_git import review

    same_day = _valid(review(fleet, "main", "add", now=1_796_122_800.0))  # 2026-12-01 11:00 UTC
    assert same_day["estimate"]["budget"]["remaining"] == pytest.approx(5.0 - 0.002717, abs=1e-4)
    next_day = _valid(review(fleet, "main", "add", now=1_796_122_800.0 + 86_400))
    assert next_day["estimate"]["budget"]["remaining"] == pytest.approx(5.0)
    assert json.loads(json.dumps(next_day)) == next_day


TWO_POOLS = """\
name: two
provider: {name: vast}
instances: {min: 0, max: 4}
pools:
  - name: cheap
    instances: {max: 3}
    offers: {gpu_names: ["RTX 3060"], max_dph: 0.05}
  - name: big
    instances: {max: 1}
    offers: {gpu_names: ["A100 SXM4"], max_dph: 2.00}
"""

BIG_SWEEP = """\
name: bigsweep
pool: big
command: "{{ python }} experiments/train.py --seed {{ seed }}"
seeds: [1, 2, 3, 4]
max_runtime: 10m
"""


def test_cli_prices_a_sweep_at_its_own_pools_cap(tmp_path: Path) -> None:
    """Two pools of different per-box caps, the cheap one first: a sweep on ``big`` gaining 4 runs of 10 min is
    priced at big's cap on big's one box (4 x 10m x $2.00 = $1.33, 40m on 1 GPU), never at cheap's cap on the
    fleet's GPUs ($0.0333, 20m on 3 GPUs): the per-box cap is the pool's (``offers.box_cap_dph``)."""
    repo = tmp_path / "fleet"
    shutil.copytree(ROOT / "desired", repo / "desired")
    shutil.copytree(ROOT / "experiments", repo / "experiments", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "desired" / "fleet.yaml").write_text(TWO_POOLS)
    (repo / "desired" / "bootstrap.sh").unlink()
    (repo / "desired" / "sweeps" / "tdmpc.yaml").unlink()
    small = BIG_SWEEP.replace("bigsweep", "small").replace("big", "cheap")
    (repo / "desired" / "sweeps" / "small.yaml").write_text(small)
    (repo / "desired" / "budget.yaml").write_text("max_daily_usd: 50\nmax_total_usd: 100\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    _git(repo, "checkout", "-q", "-b", "big")
    (repo / "desired" / "sweeps" / "bigsweep.yaml").write_text(BIG_SWEEP)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "a sweep on the big pool")
    proc = rigsync("review", "--base", "main", "--head", "big", "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    e = _valid(json.loads(proc.stdout))["estimate"]
    assert e["runs"] == 4 and e["gpu_hours"] == pytest.approx(4 * 10 / 60, abs=1e-3)
    assert e["price_source"] == "cap" and e["upper_bound"]
    assert e["usd_high"] == pytest.approx(4 * 10 / 60 * 2.00, abs=1e-3)
    [sweep] = e["sweeps"]
    assert sweep["sweep"] == "bigsweep" and sweep["fleet_gpus"] == 1
    assert sweep["eta_h"] == pytest.approx(4 * 10 / 60, abs=1e-3)
    text = rigsync("review", "--base", "main", "--head", "big", cwd=repo)
    assert "at most $1.33" in text.stdout.splitlines()[0], text.stdout


# ------------------------------------------------------------------------------ secrets a change sends to boxes


def _review_cli(repo: Path, *args: str, allowlist: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != JOB_SECRETS_ENV}
    if allowlist is not None:
        env[JOB_SECRETS_ENV] = allowlist
    proc = subprocess.run([str(RIGSYNC), "review", "--repo", str(repo), *args], capture_output=True, text=True,
                          timeout=120, env=env, check=False)
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert proc.returncode == 0, proc.stderr
    return proc


def test_cli_lists_every_secret_reference_first_marking_those_off_the_allowlist(fleet: Path) -> None:
    text = _review_cli(fleet, "--base", "main", "--head", "token", allowlist="WANDB_API_KEY").stdout
    lines = text.splitlines()
    assert lines[0].startswith("2 SECRET reference(s) added or changed (1 NOT ALLOWED here), +0 run(s)"), lines[0]
    assert lines[1].startswith("secrets this change sends to rented boxes")
    assert lines[2] == (
        "  sweep tdmpc: T = ${GITHUB_TOKEN} (added): NOT in RIGSYNC_JOB_SECRETS here, held back (secret_not_allowed)"
    )
    assert lines[3] == "  sweep tdmpc: WANDB_API_KEY = ${WANDB_API_KEY} (added): allowed here (RIGSYNC_JOB_SECRETS)"
    assert lines[4].startswith("base main ")
    assert "MUJOCO_GL" not in text  # a literal is in git for all to read: not a secret

    doc = _valid(json.loads(_review_cli(fleet, "--base", "main", "--head", "token", "--json",
                                        allowlist="WANDB_API_KEY").stdout))
    md = markdown(doc)  # what --markdown prints of that document
    assert md.startswith(MARKER)
    warning = md.index("> [!WARNING]")
    assert warning < md.index("base main")  # before everything else but the title
    assert "T = ${GITHUB_TOKEN} (added): NOT in RIGSYNC_JOB_SECRETS here" in md[warning:md.index("base main")]
    assert doc["secrets_allowlist_known"] is True
    assert doc["secrets"] == [
        {"sweep": "tdmpc", "variable": "T", "reference": "GITHUB_TOKEN", "change": "added", "allowed": False},
        {"sweep": "tdmpc", "variable": "WANDB_API_KEY", "reference": "WANDB_API_KEY", "change": "added",
         "allowed": True},
    ]


def test_cli_a_changed_reference_and_an_unknown_allowlist(fleet: Path) -> None:
    doc = _valid(json.loads(_review_cli(fleet, "--base", "token", "--head", "swap", "--json", allowlist=None).stdout))
    assert doc["secrets_allowlist_known"] is False
    assert doc["secrets"] == [
        {"sweep": "tdmpc", "variable": "T", "reference": "GH_PAT", "change": "changed", "allowed": None}
    ]
    lines = review_text(doc).splitlines()  # what the command prints without --json
    assert lines[0].startswith("1 SECRET reference(s) added or changed, +0 run(s)")
    assert lines[2] == "  sweep tdmpc: T = ${GH_PAT} (changed)"
    assert "allowlist is not known here" in lines[3]
    # nothing added or changed: nothing said (the unchanged WANDB_API_KEY is not listed again)
    same = review(fleet, "swap", "swap", allowed_secrets=frozenset())
    assert same["secrets"] == [] and "SECRET" not in review_text(same) and "secrets this change" not in markdown(same)


def test_cli_a_bad_allowlist_is_one_line(fleet: Path) -> None:
    env = {**os.environ, JOB_SECRETS_ENV: "HF_TOKEN,VAST_API_KEY"}
    proc = subprocess.run([str(RIGSYNC), "review", "--repo", str(fleet), "--base", "main"],
                          capture_output=True, text=True, timeout=120, env=env, check=False)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "RIGSYNC_JOB_SECRETS lists VAST_API_KEY" in proc.stderr, proc.stderr
