"""`rigsync plan / apply / status` as a user runs them: the console script in a subprocess, against the emulator.

The fleet repository is a real git checkout made from the example under desired/, the boxes are real sshd
hosts, and the commands find the API key only in the environment (``VAST_API_KEY``) and keep their SSH key in
``RIGSYNC_STATE_DIR``. What the commands print and their exit codes are the contract checked here.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pty
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from gitutil import git
from jsonschema import Draft202012Validator
from world import RIGSYNC, dump, emulator_env, fleet_repo, rigsync

from reconciler.adapters.archive import ShardedRunArchive
from reconciler.adapters.git import GitRepo
from reconciler.adapters.lease import LeaseState, LocalLock, lock_path, to_yaml
from reconciler.core.model import AttemptOutcome, Ownership
from reconciler.emulator import Emulator

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration

PLAN_SCHEMA = Draft202012Validator(json.loads((REPO / "schemas" / "plan.schema.json").read_text()))
FLEET = "itcli"
MAX_APPLIES = 40

# Each run trains, then waits until the test lets it end (the file GO in its box's home), once a status has shown
# it on its box with its progress: how long a run lasts is the test's decision, not a race with its CLI calls.
GO = "go-cli"
SWEEP = f"""\
name: tdmpc
code: [experiments]
command: >-
  {{{{ python }}}} experiments/train.py --task {{{{ task }}}} --lr {{{{ lr }}}} --seed {{{{ seed }}}}
  --out {{{{ run_dir }}}}/metrics.jsonl --seconds 2 --evals 4;
  until [ -e "$HOME/{GO}" ]; do sleep 0.1; done
grid:
  task: [walker-walk]
  lr: [3.0e-4, 1.0e-3]
seeds: [1]
max_runtime: 5m
progress: {{key: step, total: 4000}}
metrics:
  file: metrics.jsonl
  key: episode_reward
  goal: max
"""
TIMEOUTS = {"idle_timeout": "1s", "unreachable_grace": "3s", "heartbeat_stale": "8s", "boot_timeout": "1m"}


@pytest.fixture(scope="module")
def repo(emulator: Emulator, tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("cli")
    fleet = fleet_repo(where / "fleet")
    fleet.edit_fleet(name=FLEET, **TIMEOUTS)
    fleet.write("desired/sweeps/tdmpc.yaml", SWEEP)
    fleet.commit("test: two short runs", push=False)
    return fleet.work


@pytest.fixture(scope="module")
def env(emulator: Emulator, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    state = tmp_path_factory.mktemp("state")
    # the controller is pointed at the emulator; desired/ never names a URL
    return emulator_env(emulator, state_dir=state)


def rigsync_on_a_terminal(env: dict[str, str], *args: str) -> bytes:
    """The console script with stdin, stdout and stderr on a pseudo-terminal; everything it wrote there."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([str(RIGSYNC), *args], env=env, stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    out = b""
    try:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the last holder of the terminal's other end exited
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(master)
        proc.wait(timeout=180)
    assert b"Traceback" not in out, out[-2000:]
    return out


def owned(emu: Emulator) -> dict[int, str]:
    """Instance id -> label of this fleet's boxes, from the emulator's own books."""
    out = {}
    for iid in emu.instance_ids():
        label = str(emu.instance(iid).get("label") or "")
        own = Ownership.parse(label)
        if own is not None and own.fleet == FLEET:
            out[iid] = label
    return out


def plan_doc(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(result.stdout)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in PLAN_SCHEMA.iter_errors(doc)]
    assert errors == [], errors
    return doc


def head(repo: Path) -> str:
    return git(repo, "rev-parse", "HEAD")


def test_plan_json_validates_against_the_schema(repo: Path, env: dict[str, str]) -> None:
    result = rigsync(env, "plan", "--repo", str(repo), "--json")
    assert result.returncode == 0, result.stderr
    doc = plan_doc(result)
    assert doc["desired_commit"] == head(repo)
    rents = [a for a in doc["actions"] if a["kind"] == "rent"]
    assert len(rents) == 2 and doc["counts"] == {"rent": 2}
    assert all(a["label"].startswith(f"rigsync:{FLEET}:") and a["reason"] for a in rents)
    assert doc["fleet_dph_after"] == pytest.approx(sum(a["dph"] for a in rents))


def test_detailed_exitcode_is_2_with_changes(repo: Path, env: dict[str, str]) -> None:
    result = rigsync(env, "plan", "--repo", str(repo), "--detailed-exitcode")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "+ rent" in result.stdout and "Plan: 2 to rent." in result.stdout


def test_missing_api_key_is_a_clear_error(repo: Path, env: dict[str, str], tmp_path: Path,
                                          emulator: Emulator) -> None:
    bare = {k: v for k, v in env.items() if k != "VAST_API_KEY"}
    bare |= {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    for args in (["plan"], ["apply", "--yes"], ["status"]):
        result = rigsync(bare, *args, "--repo", str(repo))
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        assert result.stderr.startswith("rigsync: error: no Vast API key found: set VAST_API_KEY"), result.stderr
        assert emulator.api_key not in result.stdout + result.stderr
    assert owned(emulator) == {}


def test_invalid_desired_names_file_and_line(repo: Path, env: dict[str, str], tmp_path: Path,
                                             emulator: Emulator) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(repo, bad)
    fleet = bad / "desired" / "fleet.yaml"
    lines = fleet.read_text().splitlines()
    n = next(i for i, line in enumerate(lines) if line.strip().startswith("max:"))
    lines[n] = "  max: -3"
    fleet.write_text("\n".join(lines) + "\n")
    for args in (["plan", "--json"], ["apply", "--yes"], ["status", "--json"]):
        result = rigsync(env, *args, "--repo", str(bad))
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        assert f"desired/fleet.yaml:{n + 1}:" in result.stderr, result.stderr
        assert "/instances/max" in result.stderr and result.stdout == ""
    assert owned(emulator) == {}


def test_not_a_git_checkout_fails_before_the_provider_is_contacted(
    repo: Path, env: dict[str, str], tmp_path: Path, emulator: Emulator
) -> None:
    plain = tmp_path / "plain"
    shutil.copytree(repo, plain, ignore=shutil.ignore_patterns(".git"))
    keys = emulator.ssh_keys()
    fresh = {**env, "RIGSYNC_STATE_DIR": str(tmp_path / "state")}  # a provider call would add this key
    for args in (["plan"], ["apply", "--yes"], ["status"]):
        result = rigsync(fresh, *args, "--repo", str(plain))
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        assert f"{plain} is not a git checkout" in result.stderr
    assert emulator.ssh_keys() == keys and owned(emulator) == {}
    assert not (tmp_path / "state").exists()


def test_apply_without_yes_and_no_tty_refuses(repo: Path, env: dict[str, str], emulator: Emulator) -> None:
    result = rigsync(env, "apply", "--repo", str(repo))
    assert result.returncode == 1
    assert "refusing to apply without confirmation: pass --yes" in result.stderr
    assert "+ rent" in result.stdout  # it showed what it would have done
    assert owned(emulator) == {}


def test_apply_refused_while_a_reconciler_acts_on_the_fleet(
    repo: Path, env: dict[str, str], emulator: Emulator
) -> None:
    with LocalLock(lock_path(repo)):  # what `rigsync run` holds for its whole life
        result = rigsync(env, "apply", "--repo", str(repo), "--yes")
    assert result.returncode == 1
    assert "another rigsync holds the local lock" in result.stderr, result.stderr
    # the fleet's lease, on its own ref of the remote, as another machine's `rigsync run` holds it
    g = GitRepo(repo)
    now = time.time()
    version = g.swap_lease(None, to_yaml(LeaseState(holder="rigsync@ci:/srv/fleet", host="ci", pid=42,
                                                     acquired_at=now, heartbeat_at=now)), "lease: held by ci")
    try:
        result = rigsync(env, "apply", "--repo", str(repo), "--yes")
    finally:
        g.swap_lease(version, None, "lease: released")
    assert result.returncode == 1
    assert "the fleet's lease is held by rigsync@ci:/srv/fleet on ci (pid 42)" in result.stderr, result.stderr
    assert owned(emulator) == {}


def test_plan_and_apply_refuse_a_dirty_tree_naming_the_files(
    repo: Path, env: dict[str, str], emulator: Emulator
) -> None:
    fleet_file = repo / "desired" / "fleet.yaml"
    committed = fleet_file.read_text()
    stray = repo / "experiments" / "scratch.py"
    suspended = dump({**yaml.safe_load(committed), "suspend": True})
    fleet_file.write_text(suspended)  # an uncommitted edit that would change the plan
    stray.write_text("print('not committed')\n")  # and an untracked file under a sweep's code path
    try:
        for command in (("plan",), ("plan", "--json"), ("apply", "--yes")):
            refused = rigsync(env, *command, "--repo", str(repo))
            assert refused.returncode == 1, refused.stdout + refused.stderr
            assert f"refusing to {command[0]} uncommitted changes" in refused.stderr, refused.stderr
            assert "desired/fleet.yaml (modified)" in refused.stderr and "--allow-dirty" in refused.stderr
            assert refused.stdout == ""
        # the sweeps' code paths count too, untracked files included
        fleet_file.write_text(committed)
        refused = rigsync(env, "plan", "--repo", str(repo))
        assert refused.returncode == 1 and "experiments/scratch.py (untracked)" in refused.stderr, refused.stderr
        assert "desired/fleet.yaml" not in refused.stderr
        fleet_file.write_text(suspended)

        dirty = rigsync(env, "plan", "--repo", str(repo), "--json", "--allow-dirty")
        assert dirty.returncode == 0, dirty.stderr
        doc = plan_doc(dirty)
        assert doc["dirty"] == ["desired/fleet.yaml (modified)", "experiments/scratch.py (untracked)"]
        assert doc["suspended"] is True and doc["actions"] == []  # the uncommitted desired state was planned
        text = rigsync(env, "plan", "--repo", str(repo), "--allow-dirty")
        assert text.returncode == 0 and text.stdout.startswith("DIRTY: planned from uncommitted changes"), text.stdout
        # a plan that puts nothing on a box may be applied dirty (here: nothing to do); launches never are
        applied = rigsync(env, "apply", "--repo", str(repo), "--yes", "--allow-dirty")
        assert applied.returncode == 0, applied.stdout + applied.stderr
        assert applied.stdout.startswith("DIRTY:")
    finally:
        fleet_file.write_text(committed)
        stray.unlink()
        subprocess.run(["git", "-C", str(repo), "clean", "-fdq", "--", "observed"], check=False, capture_output=True)
    clean = rigsync(env, "plan", "--repo", str(repo), "--json")
    assert clean.returncode == 0 and "dirty" not in plan_doc(clean)
    assert owned(emulator) == {}


def test_stale_saved_plan_is_refused(repo: Path, env: dict[str, str], emulator: Emulator, tmp_path: Path) -> None:
    saved = tmp_path / "plan.json"
    made = rigsync(env, "plan", "--repo", str(repo), "--out", str(saved))
    assert made.returncode == 0, made.stderr
    doc = json.loads(saved.read_text())
    offer = next(a["offer_id"] for a in doc["actions"] if a["kind"] == "rent")
    from vastai import VastAI

    client = VastAI(api_key=emulator.api_key, server_url=emulator.url, quiet=True)
    with contextlib.redirect_stdout(io.StringIO()):
        reply = client.create_instance(id=offer, image="ubuntu:22.04", disk=10, label="someone-else", ssh=True)
    taker = int(reply["new_contract"])
    try:
        events = len(emulator.ledger.events)
        result = rigsync(env, "apply", "--repo", str(repo), "--plan", str(saved))
        assert result.returncode == 1
        assert "the saved plan no longer holds" in result.stderr
        assert f"offer {offer} is no longer on the market" in result.stderr
        assert owned(emulator) == {}
        assert [e for e in emulator.ledger.events[events:] if e["type"] in ("create", "destroy", "label")] == []
    finally:
        emulator.destroy_instance(taker)


def test_unusable_saved_plan_or_out_path_is_a_clear_error(
    repo: Path, env: dict[str, str], emulator: Emulator, tmp_path: Path
) -> None:
    cases = {
        "garbage.json": ("{not json", "not a rigsync plan: not JSON"),
        "future.json": ('{"format_version": 3, "actions": []}', "plan format_version 3 is not 2"),
        "stop.json": (
            json.dumps({"format_version": 2, "desired_commit": None, "suspended": False, "fleet_dph_before": 0,
                        "fleet_dph_after": 0, "counts": {}, "noops": [], "warnings": [], "drift": [],
                        "actions": [{"kind": "stop", "target": "instance/1", "reason": "x", "code": "surplus",
                                     "instance_id": 1}]}),
            "not a rigsync plan: /actions/0:",
        ),
    }
    for name, (text, message) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        result = rigsync(env, "apply", "--repo", str(repo), "--plan", str(path))
        assert result.returncode == 1, (name, result.stdout, result.stderr)
        assert result.stderr.startswith(f"rigsync: error: {path}: {message}"), result.stderr
    missing = rigsync(env, "apply", "--repo", str(repo), "--plan", str(tmp_path / "nope.json"))
    assert missing.returncode == 1 and "cannot read saved plan: No such file or directory" in missing.stderr
    out = tmp_path / "no-such-dir" / "plan.json"
    unsaved = rigsync(env, "plan", "--repo", str(repo), "--out", str(out))
    assert unsaved.returncode == 1 and f"{out}: cannot save the plan" in unsaved.stderr
    assert owned(emulator) == {}


def test_saved_plan_applies_exactly_then_apply_converges(
    repo: Path, env: dict[str, str], emulator: Emulator, tmp_path: Path
) -> None:
    saved = tmp_path / "plan.json"
    made = rigsync(env, "plan", "--repo", str(repo), "--out", str(saved))
    assert made.returncode == 0, made.stderr
    doc = json.loads(saved.read_text())
    assert PLAN_SCHEMA.is_valid(doc)
    want_labels = sorted(a["label"] for a in doc["actions"] if a["kind"] == "rent")
    assert len(want_labels) == 2 and len(doc["actions"]) == 2

    applied = rigsync(env, "apply", "--repo", str(repo), "--plan", str(saved))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "Applied: 2 ok, 0 failed" in applied.stdout
    # what apply waited for, off a terminal: one plain line per action on stderr; stdout keeps the plan alone
    assert [line.split("/")[0] for line in applied.stderr.splitlines()] == ["rent: offer", "rent: offer"]
    assert not any(line.startswith("rent: ") for line in applied.stdout.splitlines())
    boxes = owned(emulator)
    assert sorted(boxes.values()) == want_labels

    again = rigsync(env, "apply", "--repo", str(repo), "--plan", str(saved))  # the same plan twice: refused
    assert again.returncode == 1
    assert "the saved plan no longer holds" in again.stderr and "the fleet now costs" in again.stderr
    for label in want_labels:
        assert f"offer {label.rsplit('-', 1)[1]} is no longer on the market" in again.stderr
    assert owned(emulator) == boxes

    status = rigsync(env, "status", "--repo", str(repo), "--json")
    assert status.returncode == 0, status.stderr
    first = json.loads(status.stdout)
    assert sorted(b["id"] for b in first["boxes"]) == sorted(boxes)
    assert first["runs"]["pending"] + first["runs"]["running"] == 2 and first["runs"]["succeeded"] == 0

    # Now let `apply --yes` do the rest, one CLI call per cycle; memory lives only in the observed/ files.
    snapshots: list[dict[str, Any]] = []
    refused_dirty = False
    live = b""  # these applies run on a terminal (a pty): what they wait for is one line rewritten in place
    for _ in range(MAX_APPLIES):
        check = rigsync(env, "plan", "--repo", str(repo), "--detailed-exitcode")
        assert check.returncode in (0, 2), check.stderr
        if check.returncode == 0 and not owned(emulator):
            break
        if not refused_dirty and any(a["kind"] in ("bootstrap", "ship_code", "launch")
                                     for a in plan_doc(rigsync(env, "plan", "--repo", str(repo), "--json"))["actions"]):
            # with uncommitted code, even --allow-dirty never ships or launches: the whole apply is refused
            stray = repo / "experiments" / "uncommitted.py"
            stray.write_text("print('never shipped')\n")
            try:
                dirty = rigsync(env, "apply", "--repo", str(repo), "--yes", "--allow-dirty")
            finally:
                stray.unlink()
            assert dirty.returncode == 1, dirty.stdout + dirty.stderr
            assert "refusing to apply: the plan has" in dirty.stderr and "nothing was applied" in dirty.stderr
            assert "experiments/uncommitted.py (untracked)" in dirty.stderr and dirty.stdout.startswith("DIRTY:")
            refused_dirty = True
        live += rigsync_on_a_terminal(env, "apply", "--repo", str(repo), "--yes")
        snap = rigsync(env, "status", "--repo", str(repo), "--json")
        assert snap.returncode == 0, snap.stderr
        snapshots.append(json.loads(snap.stdout))
        if any(f > 0 for s in snapshots for b in s["boxes"] if b["runs"] for f in b["progress"].values()):
            for iid in owned(emulator):  # seen at work: the runs may end (and a box rented later finds it at once)
                (emulator.host_root(iid) / GO).touch()
    else:
        pytest.fail(f"not converged after {MAX_APPLIES} applies; last status {snapshots[-1:]}")

    assert refused_dirty, "no plan shipped code or launched: the dirty apply was never tried"
    assert re.search(rb"\rbootstrap: instance/\d+\x1b\[K", live), live[-2000:]
    assert re.search(rb"\rlaunch: run/tdmpc-[0-9a-f]+\.1@\d+\x1b\[K", live), live[-2000:]

    busy = [(s, b) for s in snapshots for b in s["boxes"] if b["runs"]]
    assert busy, "no status showed a run on a box"
    snap, box = busy[0]
    assert snap["runs"]["running"] >= len(box["runs"]) and box["reachable"] is True
    assert box["status"] == "running" and box["dph"] > 0
    # the sweep's progress (step of 20000): the fraction done of a live run, read from its box's metrics
    done = [(r, f) for _, b in busy for r, f in b["progress"].items()]
    assert done and all(r in b["runs"] for _, b in busy for r in b["progress"]), busy
    assert all(0.0 <= f <= 1.0 for _, f in done) and any(f > 0 for _, f in done), done

    final = json.loads(rigsync(env, "status", "--repo", str(repo), "--json").stdout)
    assert final["boxes"] == [] and final["runs"]["succeeded"] == 2 and final["runs"]["pending"] == 0
    records = list(ShardedRunArchive(repo).records())
    assert sorted(r.phase for r in records) == [AttemptOutcome.SUCCEEDED, AttemptOutcome.SUCCEEDED]
    budget = (repo / "observed" / "budget.yaml").read_text()
    total = float(re.search(r"total_usd: ([0-9.e-]+)", budget).group(1))  # type: ignore[union-attr]
    assert total > 0, budget
    done = rigsync(env, "plan", "--repo", str(repo), "--detailed-exitcode")
    assert done.returncode == 0 and "no changes" in done.stdout
