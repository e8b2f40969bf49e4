"""A secret in a sweep's env, end to end: `rigsync run` as a real process, the emulator's real sshd boxes, a real
bare git remote. A random token is planted in the controller's environment and listed in ``RIGSYNC_JOB_SECRETS``;
the job proves it arrived (its reward is a hash of the value, and that number reaches the archive in git) while the
value itself is searched for, and must be absent, everywhere else: every object of the remote and the checkout,
every file of the checkout and the state dir, the daemon's log at DEBUG (paramiko's included),
`status`/`diff`/`plan --json`, the box's files, and every process's argv on the machine while the job runs (the
boxes' processes are the host's too). Listed but without the variable, the sweep is held back with its reason in
`status` (``secret_missing``), and another sweep runs on. A sweep referencing ``${GITHUB_TOKEN}``, set on the
controller with a canary value but not listed, is held back (``secret_not_allowed``, in status, diff and the commit
message) and the canary is nowhere, while the listed secret of another sweep still reaches its job. A list naming a
store credential stops `rigsync run` at start, in one line.
"""

from __future__ import annotations

import hashlib
import secrets
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from test_run_daemon import (
    RIGSYNC,
    BoxRuns,
    World,
    git,
    log_text,
    run_ids_by_seed,
    validate_observed,
    world_factory,
)
from waiting import wait_for

from reconciler.core.jobenv import JOB_SECRETS_ENV

pytestmark = pytest.mark.integration
__all__ = ["world_factory"]

ENVHASH = '''\
"""Test job: proves WANDB_API_KEY arrived by reporting a hash of it as its reward, then stays alive a while."""
import argparse
import hashlib
import json
import os
import time

p = argparse.ArgumentParser()
p.add_argument("--out")
p.add_argument("--seconds", type=float)
a = p.parse_args()
digest = hashlib.sha256(os.environ.get("WANDB_API_KEY", "").encode()).hexdigest()
line = {"step": 1, "episode_reward": int(digest[:8], 16), "gl": int(os.environ.get("MUJOCO_GL") == "egl")}
with open(a.out, "a") as f:
    f.write(json.dumps(line) + "\\n")
time.sleep(a.seconds)
'''

SECRET_SWEEP = """\
name: tdmpc
priority: 10
code: [experiments]
command: "{{ python }} experiments/envhash.py --seconds 5 --out {{ run_dir }}/metrics.jsonl"
seeds: [1]
env:
  WANDB_API_KEY: ${WANDB_API_KEY}
  MUJOCO_GL: egl
max_runtime: 5m
retries: 0
metrics: {file: metrics.jsonl, key: episode_reward, goal: max}
"""

PLAIN_SWEEP = """\
name: plain
code: [experiments]
command: >-
  {{ python }} experiments/train.py --task walker-walk --lr 0.001 --seed {{ seed }} --seconds 1 --evals 2
  --out {{ run_dir }}/metrics.jsonl
seeds: [1]
max_runtime: 5m
retries: 0
metrics: {file: metrics.jsonl, key: episode_reward, goal: max}
"""


# Reads a token it should never get: GITHUB_TOKEN is not on the controller's allowlist, so this never launches.
GITHUB_SWEEP = """\
name: gh
priority: 20
code: [experiments]
command: "{{ python }} experiments/envhash.py --seconds 1 --out {{ run_dir }}/metrics.jsonl"
seeds: [1]
env:
  T: ${GITHUB_TOKEN}
max_runtime: 5m
retries: 0
metrics: {file: metrics.jsonl, key: episode_reward, goal: max}
"""


def _secret_world(make: Callable[..., World], name: str, *, plain: bool, github: bool = False) -> World:
    w = make(name, idle_timeout="10m")
    w.repo.edit_fleet(min=1)  # the box stays, to be searched after the run
    (w.work / "experiments" / "envhash.py").write_text(ENVHASH)
    (w.work / "desired" / "sweeps" / "tdmpc.yaml").write_text(SECRET_SWEEP)
    if plain:
        (w.work / "desired" / "sweeps" / "plain.yaml").write_text(PLAIN_SWEEP)
    if github:
        (w.work / "desired" / "sweeps" / "gh.yaml").write_text(GITHUB_SWEEP)
    git(w.work, "add", "-A")
    git(w.work, "commit", "-q", "-m", "sweep: report a hash of the W&B key")
    git(w.work, "push", "-q", "origin", "main")
    return w


def _start(w: World, env: dict[str, str], tag: str) -> tuple[subprocess.Popen[bytes], Path]:
    log = w.tmp / f"{tag}.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [*RIGSYNC, "run", "--repo", str(w.work), "--interval", "1", "--log-level", "DEBUG"], env=env,
            stdout=fh, stderr=subprocess.STDOUT, cwd=w.tmp,
        )
    w.procs.append(proc)
    return proc, log


def _cli(w: World, env: dict[str, str], *args: str) -> str:
    proc = subprocess.run([*RIGSYNC, *args, "--repo", str(w.work)], env=env, capture_output=True, text=True,
                          timeout=120, cwd=w.tmp, check=False)
    assert proc.returncode in (0, 2), f"rigsync {args}: {proc.stderr[-2000:]}"
    return proc.stdout + proc.stderr


class ArgvWatch:
    """Reads every process's argv on this machine (what `ps` shows) until stopped; remembers any holding ``needle``."""

    def __init__(self, needle: bytes) -> None:
        self.needle = needle
        self.hits: list[str] = []
        self.scans = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit():
                    continue
                try:
                    argv = (entry / "cmdline").read_bytes()
                except OSError:
                    continue
                if self.needle in argv:
                    self.hits.append(argv.replace(b"\0", b" ").decode(errors="replace")[:200])
            self.scans += 1
            self._stop.wait(0.05)

    def __enter__(self) -> ArgvWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _files_holding(root: Path, needle: bytes) -> list[str]:
    found = []
    for path in root.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
                found.append(str(path))
        except OSError:
            continue
    return found


def _objects_holding(repo: Path, needle: bytes) -> bool:
    """Whether any object in ``repo`` (every blob, tree, commit and tag, reachable or not) contains ``needle``."""
    proc = subprocess.run(["git", "cat-file", "--batch-all-objects", "--batch"], cwd=repo, capture_output=True,
                          timeout=120, check=True)
    return needle in proc.stdout


def test_a_secret_reaches_the_job_and_nowhere_else(world_factory: Callable[..., World]) -> None:
    w = _secret_world(world_factory, "t-secret", plain=False)
    token = "rstok-" + secrets.token_hex(24)
    needle = token.encode()
    env = {**w.env, "WANDB_API_KEY": token, JOB_SECRETS_ENV: "WANDB_API_KEY"}
    (run_id,) = run_ids_by_seed(w).values()
    boxes = BoxRuns(w.emu, w.name).start()
    with ArgvWatch(needle) as watch:
        proc, log = _start(w, env, "secret")
        try:
            wait_for("the run to be launched", lambda: any(n.startswith(run_id) for n in boxes.dirs()), 90, every=0.05)
            scans_at_launch = watch.scans

            def archived() -> list[dict[str, object]]:
                return [r for r in w.remote_archive_lines() if r["run_id"] == run_id]

            (record,) = wait_for("the run to be archived", archived, 90, every=0.5)
            assert watch.scans - scans_at_launch >= 20, "the process list was hardly seen while the job ran"
            iid = next(i for i, name in boxes.seen if name.startswith(run_id))
            box_dir = w.emu.host_root(iid).parent
            assert box_dir.is_dir()
            box_files = _files_holding(box_dir, needle)
            run_dir = w.emu.host_root(iid) / "rigsync" / "runs" / f"{run_id}.1"
            metrics = (run_dir / "metrics.jsonl").read_text()
            outputs = {
                "status": _cli(w, env, "status", "--json"),
                "diff": _cli(w, env, "diff", "--json"),
                "plan": _cli(w, env, "plan", "--json"),
            }
        finally:
            boxes.stop()
            proc.terminate()
            proc.wait(timeout=60)

    # it arrived: the job's reward is a hash of the value, and that number is in the archive in git
    want = int(hashlib.sha256(needle).hexdigest()[:8], 16)
    assert record["phase"] == "succeeded", record
    assert record["best_metric"] == want, (record, metrics)
    assert '"gl": 1' in metrics
    # and it is nowhere else
    assert watch.hits == [], watch.hits
    assert box_files == [], box_files
    assert not _objects_holding(w.remote, needle), "the value is in an object of the remote"
    history = git(w.remote, "log", "-p", "--all")
    assert "WANDB_API_KEY" in history and token not in history  # the reference by name only
    assert not _objects_holding(w.work, needle), "the value is in an object of rigsync's checkout"
    assert _files_holding(w.work, needle) == []
    assert _files_holding(w.state, needle) == []
    daemon_log = log_text(log)
    assert "DEBUG paramiko" in daemon_log, "the log was not at DEBUG: it proves nothing about the levels"
    assert token not in daemon_log
    assert "Traceback" not in daemon_log
    for name, text in outputs.items():
        assert token not in text, name


def test_a_missing_secret_holds_its_sweep_back_and_the_others_run(world_factory: Callable[..., World]) -> None:
    w = _secret_world(world_factory, "t-nosecret", plain=True)
    env = {**{k: v for k, v in w.env.items() if k != "WANDB_API_KEY"}, JOB_SECRETS_ENV: "WANDB_API_KEY"}
    from reconciler.desired import load_desired_from_dir

    runs = load_desired_from_dir(w.work).runs
    held = {r.id for r in runs if r.sweep.name == "tdmpc"}
    (plain,) = [r.id for r in runs if r.sweep.name == "plain"]
    boxes = BoxRuns(w.emu, w.name).start()
    proc, log = _start(w, env, "nosecret")
    reason = "sweep tdmpc needs WANDB_API_KEY from the controller's environment; it is not set: 1 run(s) not launched"
    try:
        wait_for(
            "the plain sweep's run to succeed",
            lambda: any(r["run_id"] == plain and r["phase"] == "succeeded" for r in w.remote_archive_lines()),
            120, every=0.5,
        )

        def reported() -> object:
            st = w.remote_yaml("observed/status.yaml") or {}
            return st if f"secret missing: {reason}" in ((st.get("last_plan") or {}).get("warnings") or []) else None

        wait_for("status.yaml to give the reason", reported, 30)
        status = _cli(w, env, "status")
        assert f"BLOCKED: {reason} (secret_missing)" in status, status
        assert proc.poll() is None, "a missing secret must not stop the daemon"
        validate_observed(w)
    finally:
        boxes.stop()
        proc.terminate()
        proc.wait(timeout=60)
    assert boxes.run_ids() == {plain}, boxes.dirs()
    assert not held & {r["run_id"] for r in w.remote_archive_lines()}
    assert "Traceback" not in log_text(log)


def test_a_reference_off_the_allowlist_is_held_and_its_value_is_nowhere(world_factory: Callable[..., World]) -> None:
    w = _secret_world(world_factory, "t-allow", plain=False, github=True)
    canary = "ghcanary-" + secrets.token_hex(20)  # set on the controller, never listed: it must go nowhere
    token = "rstok-" + secrets.token_hex(24)  # listed: it still reaches its job
    env = {**w.env, "GITHUB_TOKEN": canary, "WANDB_API_KEY": token, JOB_SECRETS_ENV: "WANDB_API_KEY, HF_TOKEN"}
    from reconciler.desired import load_desired_from_dir

    runs = load_desired_from_dir(w.work).runs
    (held,) = [r.id for r in runs if r.sweep.name == "gh"]
    (listed,) = [r.id for r in runs if r.sweep.name == "tdmpc"]
    reason = (
        "sweep gh references GITHUB_TOKEN from the controller's environment; RIGSYNC_JOB_SECRETS does not list it, "
        "so the controller never reads or hands it to a job: 1 run(s) not launched"
    )
    boxes = BoxRuns(w.emu, w.name).start()
    with ArgvWatch(canary.encode()) as watch:
        proc, log = _start(w, env, "allow")
        try:
            (record,) = wait_for(
                "the listed sweep's run to be archived",
                lambda: [r for r in w.remote_archive_lines() if r["run_id"] == listed], 120, every=0.5,
            )

            def reported() -> object:
                st = w.remote_yaml("observed/status.yaml") or {}
                warnings = (st.get("last_plan") or {}).get("warnings") or []
                return st if f"secret not allowed: {reason}" in warnings else None

            wait_for("status.yaml to give the reason", reported, 30)
            outputs = {
                "status": _cli(w, env, "status"),
                "status --json": _cli(w, env, "status", "--json"),
                "diff": _cli(w, env, "diff"),
                "diff --json": _cli(w, env, "diff", "--json"),
                "plan --json": _cli(w, env, "plan", "--json"),
            }
            assert proc.poll() is None, "a reference off the list must not stop the daemon"
            iid = next(i for i, name in boxes.seen if name.startswith(listed))
            box_files = _files_holding(w.emu.host_root(iid).parent, canary.encode())
            validate_observed(w)
        finally:
            boxes.stop()
            proc.terminate()
            proc.wait(timeout=60)

    # held: never launched anywhere, its reason (code, sweep, variable, the allowlist's name) where people look
    assert held not in boxes.run_ids() and held not in {r["run_id"] for r in w.remote_archive_lines()}
    assert f"BLOCKED: {reason} (secret_not_allowed)" in outputs["status"], outputs["status"]
    assert f"BLOCKED: {reason} (secret_not_allowed) (as of the last cycle)" in outputs["diff"], outputs["diff"]
    for name in ("status --json", "diff --json"):
        assert f"{reason} (secret_not_allowed)" in outputs[name], (name, outputs[name])
    assert '"code": "secret_not_allowed"' in outputs["plan --json"] and "sweep/gh" in outputs["plan --json"]
    messages = git(w.remote, "log", "--format=%B", "refs/heads/main")
    assert f"held back: {reason} (secret_not_allowed)" in messages, messages
    # the listed secret still reached its job (its reward is a hash of the value)
    assert record["phase"] == "succeeded", record
    assert record["best_metric"] == int(hashlib.sha256(token.encode()).hexdigest()[:8], 16), record
    # and the canary is nowhere: git (every object, the history), observed files, the state dir, the daemon's log at
    # DEBUG, the box's files, the CLI's outputs, any process's argv
    assert watch.hits == [] and watch.scans > 20, watch.hits
    assert box_files == [], box_files
    for repo in (w.remote, w.work):
        assert not _objects_holding(repo, canary.encode()), f"the canary is in an object of {repo}"
    assert canary not in git(w.remote, "log", "-p", "--all")
    assert _files_holding(w.work, canary.encode()) == []
    assert _files_holding(w.state, canary.encode()) == []
    daemon_log = log_text(log)
    assert "DEBUG paramiko" in daemon_log, "the log was not at DEBUG: it proves nothing about the levels"
    assert canary not in daemon_log and "Traceback" not in daemon_log
    for name, text in outputs.items():
        assert canary not in text, name


def test_a_store_credential_on_the_list_stops_the_controller_at_start(world_factory: Callable[..., World]) -> None:
    w = _secret_world(world_factory, "t-badlist", plain=False)
    env = {**w.env, JOB_SECRETS_ENV: "WANDB_API_KEY,AWS_SECRET_ACCESS_KEY"}
    proc = subprocess.run([*RIGSYNC, "run", "--once", "--repo", str(w.work)], env=env, capture_output=True,
                          text=True, timeout=120, cwd=w.tmp, check=False)
    assert proc.returncode == 1, proc
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "RIGSYNC_JOB_SECRETS lists AWS_SECRET_ACCESS_KEY" in proc.stderr
    assert "rigsync/lease" not in git(w.remote, "for-each-ref"), "a lease was taken before the list was checked"
