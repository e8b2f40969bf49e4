"""`rigsync run` against real parts: a bare git remote on disk, the emulator's real sshd boxes, real processes.

These tests are about the daemon's contract with git and with other reconcilers: no commit when nothing
changed, a human's concurrent push survives (never a force push), an invalid desired commit is reported and
not acted on, exactly one reconciler holds a fleet's lease (and a stale one can be taken over, on the record),
SIGTERM ends cleanly, and what rigsync commits under observed/ validates against its schemas.

The helpers at the top are shared with ``test_run_crash.py``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from gitutil import git
from waiting import wait_for
from world import FleetRepo, ShiftedClock, emulator_env, fleet_repo, remote_archive, remote_file

from reconciler.adapters.git import GitRepo
from reconciler.adapters.lease import LocalLock, lock_path
from reconciler.core.model import Ownership
from reconciler.daemon import DaemonConfig, FleetDaemon
from reconciler.emulator import Emulator

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RIGSYNC = [sys.executable, "-m", "reconciler"]
HUMAN = {
    "GIT_AUTHOR_NAME": "A Researcher",
    "GIT_AUTHOR_EMAIL": "researcher@example.invalid",
    "GIT_COMMITTER_NAME": "A Researcher",
    "GIT_COMMITTER_EMAIL": "researcher@example.invalid",
}
OBSERVED_SCHEMAS = {
    "observed/fleet.yaml": "observed-fleet",
    "observed/runs.yaml": "observed-runs",
    "observed/drift.yaml": "observed-drift",
    "observed/budget.yaml": "observed-budget",
    "observed/status.yaml": "observed-status",
    "observed/hosts.yaml": "observed-hosts",
    "observed/suggestions.yaml": "observed-suggestions",
}
LEASE_REF = "refs/heads/rigsync/lease/main"

SWEEP = """\
# yaml-language-server: $schema=../../schemas/sweep.schema.json
name: tdmpc
priority: 10
code: [experiments]
command: >-
  {{{{ python }}}} experiments/train.py --task {{{{ task }}}} --lr {{{{ lr }}}} --seed {{{{ seed }}}}
  --seconds {seconds} --evals 4 --out {{{{ run_dir }}}}/metrics.jsonl
grid:
  task: [walker-walk]
  lr: [1.0e-3]
seeds: [{seeds}]
resources:
  gpus: 1
max_runtime: 5m
retries: 1
metrics:
  file: metrics.jsonl
  key: episode_reward
  goal: max
"""


@dataclass
class BoxRuns:
    """Every run directory seen on any box (boxes vanish when destroyed, so a thread keeps looking)."""

    emu: Emulator
    fleet: str
    seen: dict[tuple[int, str], dict[str, str]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def scan(self) -> None:
        for iid in self.emu.instance_ids():
            try:
                own = Ownership.parse(self.emu.instance(iid).get("label"))
                if own is None or own.fleet != self.fleet:
                    continue
                runs = self.emu.host_root(iid) / "rigsync" / "runs"
                entries = list(runs.iterdir()) if runs.is_dir() else []
            except Exception:  # the box went away under us: it is simply not seen this round
                continue
            for d in entries:
                info = dict(self.seen.get((iid, d.name), {}))
                for f in ("started_at", "ended_at", "exit_code"):
                    with contextlib.suppress(OSError):
                        info[f] = (d / f).read_text().strip()
                self.seen[(iid, d.name)] = info

    def start(self) -> BoxRuns:
        def loop() -> None:
            while not self._stop.wait(0.25):
                self.scan()

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.scan()

    def dirs(self) -> set[str]:
        return {name for _, name in self.seen}

    def run_ids(self) -> set[str]:
        return {name.rsplit(".", 1)[0] for name in self.dirs()}


@dataclass
class World:
    """A fleet repository (rigsync's clone + its bare remote) pointed at the test emulator."""

    emu: Emulator
    tmp: Path
    name: str
    work: Path
    remote: Path
    state: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        # the controller is pointed at the emulator through its environment; desired/ never names a URL
        return emulator_env(self.emu, state_dir=self.state)

    @property
    def repo(self) -> FleetRepo:
        """rigsync's clone and the remote, to edit desired/ through YAML and commit as the researcher."""
        return FleetRepo(self.work, self.remote)

    # ---- the remote, as a human or a reviewer sees it
    def tip(self) -> str:
        return git(self.remote, "rev-parse", "refs/heads/main")

    def remote_file(self, path: str, rev: str = "refs/heads/main") -> str | None:
        return remote_file(self.remote, path, rev)

    def remote_yaml(self, path: str) -> Any:
        text = self.remote_file(path)
        return None if text is None else yaml.safe_load(text)

    def remote_lease(self) -> Any:
        """The fleet's lease as the remote has it: ``lease.yaml`` on its own ref (None when there is none)."""
        text = self.remote_file("lease.yaml", LEASE_REF)
        if text is not None:
            schema = json.loads((ROOT / "schemas" / "observed-lease.schema.json").read_text())
            jsonschema.Draft202012Validator(schema).validate(yaml.safe_load(text))
        return None if text is None else yaml.safe_load(text)

    def remote_archive_entries(self) -> list[dict[str, Any]]:
        """Every line of the archive at the remote tip: attempts and the boxes' overhead lines."""
        return remote_archive(self.remote)

    def remote_archive_lines(self) -> list[dict[str, Any]]:
        """The attempt lines of the archive at the remote tip (overhead lines are not attempts)."""
        return [r for r in self.remote_archive_entries() if r.get("kind") != "overhead"]

    def commit_count(self) -> int:
        return int(git(self.remote, "rev-list", "--count", "refs/heads/main"))

    def assert_never_forced(self) -> None:
        """Every update of the remote branch (its reflog) was a fast-forward."""
        log = (self.remote / "logs" / "refs" / "heads" / "main").read_text().splitlines()
        assert log, "the remote's reflog is empty: logAllRefUpdates did not take"
        for entry in log:
            old, new = entry.split()[:2]
            if set(old) == {"0"}:
                continue
            proc = subprocess.run(["git", "merge-base", "--is-ancestor", old, new], cwd=self.remote, check=False)
            assert proc.returncode == 0, f"non-fast-forward update of the remote: {entry}"

    # ---- a second clone, as a human
    def clone(self, name: str) -> Path:
        path = self.tmp / name
        git(self.tmp, "clone", "-q", str(self.remote), str(path))
        return path

    def human_push(self, clone: Path, edit: Callable[[Path], None], message: str) -> str:
        """Pull, edit, commit and push from ``clone`` (retrying a race with rigsync); return the pushed sha."""
        for _ in range(10):
            git(clone, "pull", "-q", "--rebase", "origin", "main")
            edit(clone)
            git(clone, "commit", "-q", "-am", message)
            proc = subprocess.run(
                ["git", "push", "-q", "origin", "HEAD:main"], cwd=clone, env={**os.environ, **HUMAN},
                capture_output=True, check=False,
            )
            if proc.returncode == 0:
                return git(clone, "rev-parse", "HEAD")
            git(clone, "reset", "-q", "--hard", "origin/main")
        raise AssertionError("the human could not push in 10 tries")

    # ---- rigsync processes
    def start(self, *args: str, repo: Path | None = None, tag: str = "run") -> tuple[subprocess.Popen[bytes], Path]:
        log = self.tmp / f"{tag}-{len(self.procs)}.log"
        with open(log, "wb") as fh:
            proc = subprocess.Popen(
                [*RIGSYNC, "run", "--repo", str(repo or self.work), *args], env=self.env, stdout=fh,
                stderr=subprocess.STDOUT, cwd=self.tmp,
            )
        self.procs.append(proc)
        return proc, log

    def run_once(self, *args: str, repo: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*RIGSYNC, "run", "--repo", str(repo or self.work), "--once", *args], env=self.env,
            capture_output=True, text=True, timeout=120, cwd=self.tmp, check=False,
        )

    def daemon(self, clock: ShiftedClock | None = None, **config: Any) -> FleetDaemon:
        cfg = DaemonConfig(**{"interval_s": 1.0, "lease_renew_s": 600.0, **config})
        return FleetDaemon(self.work, config=cfg, state_dir=str(self.state), api_url=self.emu.url, clock=clock)

    def owned_instances(self) -> list[int]:
        out = []
        for iid in self.emu.instance_ids():
            try:
                own = Ownership.parse(self.emu.instance(iid).get("label"))
            except Exception:
                continue
            if own is not None and own.fleet == self.name:
                out.append(iid)
        return out

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        for iid in self.owned_instances():  # never leave this test's boxes billing in the shared emulator
            with contextlib.suppress(Exception):
                self.emu.destroy_instance(iid)


def make_world(
    tmp: Path,
    emu: Emulator,
    name: str,
    *,
    seeds: str = "1",
    seconds: float = 2.0,
    max_instances: int = 1,
    suspend: bool = False,
    idle_timeout: str = "4s",
) -> World:
    """A fleet repo with a one-cell sweep (``seeds`` as YAML list items) of ``seconds``-long runs."""
    repo = fleet_repo(tmp / "rigsync")
    git(repo.remote, "config", "core.logAllRefUpdates", "true")
    # no receive.denyNonFastForwards: each lease write replaces the lease ref (a compare-and-swap, never a
    # fast-forward); the reflog check proves main itself is never forced
    repo.edit_fleet(name=name, max=max_instances, suspend=suspend, idle_timeout=idle_timeout)
    repo.write("desired/sweeps/tdmpc.yaml", SWEEP.format(seconds=seconds, seeds=seeds))
    repo.commit(f"test fleet {name}")
    state = tmp / "state"
    state.mkdir()
    return World(emu=emu, tmp=tmp, name=name, work=repo.work, remote=repo.remote, state=state)


@pytest.fixture
def world_factory(
    tmp_path: Path, emulator: Emulator, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., World]]:
    made: list[World] = []
    monkeypatch.setenv("VAST_API_KEY", emulator.api_key)

    def make(name: str, **kw: Any) -> World:
        w = make_world(tmp_path, emulator, name, **kw)
        made.append(w)
        return w

    yield make
    for w in made:
        w.close()


def validate_observed(w: World) -> None:
    """Every observed/ file at the remote tip validates against its schema; archive lines too."""
    checked = 0
    for path, schema_name in OBSERVED_SCHEMAS.items():
        text = w.remote_file(path)
        if text is None:
            continue
        schema = json.loads((ROOT / "schemas" / f"{schema_name}.schema.json").read_text())
        jsonschema.Draft202012Validator(schema).validate(yaml.safe_load(text))
        checked += 1
    record_schema = json.loads((ROOT / "schemas" / "archive-record.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(record_schema)
    for rec in w.remote_archive_entries():
        validator.validate(rec)
    assert checked >= 4, "observed/ at the remote holds too few of the rendered files"


def run_ids_by_seed(w: World) -> dict[int, str]:
    from reconciler.desired import load_desired_from_dir

    return {r.seed: r.id for r in load_desired_from_dir(w.work).runs}


def log_text(log: Path) -> str:
    return log.read_text(errors="replace")


# --------------------------------------------------------------------------------------------- the tests


def test_unchanged_cycles_make_no_commit(world_factory: Callable[..., World]) -> None:
    w = world_factory("t-quiet", suspend=True)
    legacy = w.work / "observed" / "lease.yaml"  # where an older rigsync kept the lease, on the branch itself
    legacy.parent.mkdir()
    legacy.write_text("holder: rigsync@old:/fleet\nheartbeat_at: 2026-01-01T00:00:00Z\n")
    git(w.work, "add", "observed/lease.yaml")
    git(w.work, "commit", "-q", "-m", "lease: an older rigsync's")
    git(w.work, "push", "-q", "origin", "main")
    d = w.daemon()
    d.acquire()
    try:
        first = d.cycle()
        assert first.commit is not None, "the first cycle writes observed/ for the first time"
        assert not first.acted
        assert w.remote_file("observed/lease.yaml") is None, "the stale lease file left the branch with that commit"
        tip = w.tip()
        count = w.commit_count()
        for _ in range(4):
            cyc = d.cycle()
            assert cyc.commit is None, f"an unchanged cycle committed: {cyc.line()}"
        assert w.tip() == tip
        assert w.commit_count() == count
        validate_observed(w)
    finally:
        d.release()
    assert w.remote_lease() is None, "release deletes the lease at the remote"
    w.assert_never_forced()


def test_human_push_during_a_cycle_survives_and_is_applied_next(world_factory: Callable[..., World]) -> None:
    w = world_factory("t-race", seeds="1", seconds=1.0)
    human = w.clone("human")
    d = w.daemon()
    d.acquire()
    pushed: list[str] = []
    original_push = d.git.push

    def push_after_a_human(max_tries: int = 6, lease: tuple[str | None, str, str] | None = None) -> str | None:
        # The human pushes between rigsync's sync and its push: rigsync's push must rebase, not force.
        if not pushed:
            pushed.append(w.human_push(human, add_seed_2, "sweep: one more seed"))
        return original_push(max_tries, lease)

    def add_seed_2(clone: Path) -> None:
        p = clone / "desired" / "sweeps" / "tdmpc.yaml"
        p.write_text(p.read_text().replace("seeds: [1]", "seeds: [1, 2]"))

    try:
        before = d.cycle()
        d.git.push = push_after_a_human  # type: ignore[method-assign]
        # cycles without a change worth a commit push nothing: the race is with the next one that commits
        racing = wait_for("a cycle that commits", lambda: (lambda c: c if c.commit else None)(d.cycle()), 60, 0.3)
        assert pushed and racing.commit is not None
        h = pushed[0]
        tip = w.tip()
        assert git(w.remote, "merge-base", "--is-ancestor", h, tip) == ""
        on_top = git(w.remote, "log", "--format=%an %s", f"{h}..{tip}").splitlines()
        assert on_top and all(line.startswith("rigsync ") for line in on_top), on_top
        assert git(w.remote, "log", "-1", "--format=%an", h) == "A Researcher"
        assert before.desired_commit != h
        assert racing.desired_commit == before.desired_commit, "the racing cycle ran on what it had read"

        nxt = d.cycle()
        assert nxt.desired_commit == h
        assert w.remote_yaml("observed/status.yaml")["desired_commit_applied"] == h
        ids = run_ids_by_seed(w)

        def both_succeeded() -> bool:
            d.cycle()
            done = {r["run_id"] for r in w.remote_archive_lines() if r["phase"] == "succeeded"}
            return {ids[1], ids[2]} <= done

        wait_for("both seeds to succeed", both_succeeded, timeout=90, every=0.5)
        validate_observed(w)
    finally:
        d.release()
    w.assert_never_forced()


def test_invalid_desired_is_reported_and_not_acted_on(world_factory: Callable[..., World]) -> None:
    w = world_factory("t-invalid", seeds="1", seconds=6.0)
    ids_before = run_ids_by_seed(w)
    valid = git(w.work, "rev-parse", "HEAD")
    boxes = BoxRuns(w.emu, w.name).start()
    proc, log = w.start("--interval", "1")
    try:
        wait_for("seed 1 to be launched", lambda: any(n.startswith(ids_before[1]) for n in boxes.dirs()), 60)
        human = w.clone("human")

        def break_it(clone: Path) -> None:
            p = clone / "desired" / "sweeps" / "tdmpc.yaml"
            text = p.read_text().replace("seeds: [1]", "seeds: [1, 2, 3]")
            p.write_text(text.replace("retries: 1", "retries: lots"))

        broken = w.human_push(human, break_it, "sweep: more seeds (and a typo)")
        line = next(
            i for i, t in enumerate(Path(human / "desired/sweeps/tdmpc.yaml").read_text().splitlines(), 1)
            if t.startswith("retries:")
        )

        def reported() -> Any:
            st = w.remote_yaml("observed/status.yaml") or {}
            return st if st.get("desired_errors") else None

        status = wait_for("status.yaml to report the invalid desired commit", reported, 30)
        assert any(f"desired/sweeps/tdmpc.yaml:{line}" in e for e in status["desired_errors"]), status
        assert status["desired_commit_applied"] == valid
        assert status["last_valid_desired_commit"] == valid
        assert status.get("desired_valid") is False
        out = log_text(log)
        # A restart knows no "last valid" in memory: it must take it from status.yaml, not stop acting.
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        proc, log = w.start("--interval", "1")
        # The last valid revision keeps going: its run finishes and is archived.
        wait_for(
            "seed 1 to succeed under the last valid revision",
            lambda: any(r["run_id"] == ids_before[1] and r["phase"] == "succeeded" for r in w.remote_archive_lines()),
            60,
        )
        out += log_text(log)
        assert f"desired {broken[:12]} is invalid" in out and "desired error(s)" in out, out[-2000:]
        assert (w.remote_yaml("observed/status.yaml") or {}).get("desired_commit_applied") == valid
        # Only seed 1 ever ran: the broken revision's seeds 2 and 3 were never launched.
        boxes.scan()
        assert boxes.run_ids() == {ids_before[1]}, boxes.dirs()
        assert {r["run_id"] for r in w.remote_archive_lines()} == {ids_before[1]}
        assert proc.poll() is None, "an invalid desired commit must not stop the daemon"
        validate_observed(w)
    finally:
        boxes.stop()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert "Traceback" not in log_text(log)
    w.assert_never_forced()


def test_only_one_reconciler_acts_and_a_stale_lease_is_taken_over(world_factory: Callable[..., World]) -> None:
    w = world_factory("t-lease", suspend=True)
    other = w.clone("other")
    first, log = w.start("--interval", "1")
    holder = f"rigsync@{os.uname().nodename}:{w.work}"
    wait_for("the first daemon's lease", lambda: (w.remote_lease() or {}).get("holder"))
    assert w.remote_lease()["holder"] == holder

    second = w.run_once(repo=other)
    assert second.returncode != 0
    assert holder in second.stderr, second.stderr
    assert "Traceback" not in second.stderr
    assert first.poll() is None, "the holder keeps running"
    assert w.remote_lease()["holder"] == holder, "the refused reconciler wrote nothing"

    first.send_signal(signal.SIGKILL)  # dies holding the lease: it goes stale
    first.wait(timeout=10)
    age_the_lease(other, LEASE_AGE_S)  # its clock driven, not waited for
    third = w.run_once(repo=other)  # the default --lease-stale (5 minutes): a whole fencing window for its cycle
    assert third.returncode == 0, third.stdout + third.stderr
    lease = w.remote_lease()
    assert lease["holder"] == f"rigsync@{os.uname().nodename}:{other}"
    assert holder in lease["taken_over_from"]
    message = git(w.remote, "log", "-1", "--format=%B", LEASE_REF)  # the takeover is on the record of the lease ref
    assert "taken over from" in message and holder in message, message
    on_main = git(w.remote, "log", "--format=%s", "refs/heads/main").splitlines()
    assert not [s for s in on_main if s.startswith("lease")], f"lease commits on main: {on_main}"
    assert "Traceback" not in log_text(log)
    w.assert_never_forced()


LEASE_AGE_S = 3600.0  # how far a holder's lease (and its clock) is moved past its heartbeat instead of waiting


def age_the_lease(clone: Path, seconds: float) -> None:
    """The lease at the remote as its holder left it, written ``seconds`` older: its heartbeat (and acquisition) moved
    into the past, so a taker sees a stale lease at once and keeps a whole fencing window for its own cycle."""
    from reconciler.adapters.lease import from_yaml, to_yaml

    repo = GitRepo(clone)
    sha, text = repo.read_lease()
    state = from_yaml(text or "")
    assert sha is not None and state is not None, "no lease at the remote to age"
    older = replace(state, acquired_at=state.acquired_at - seconds, heartbeat_at=state.heartbeat_at - seconds)
    repo.swap_lease(sha, to_yaml(older), f"test: the holder's lease, {seconds:.0f}s older")


def test_sigterm_to_the_process_exits_0_and_leaves_a_consistent_record(world_factory: Callable[..., World]) -> None:
    w = world_factory("t-term", seeds="1, 2", seconds=20.0, max_instances=2)
    ids = run_ids_by_seed(w)
    boxes = BoxRuns(w.emu, w.name).start()
    proc, log = w.start("--interval", "0.5")
    try:
        wait_for("a box to be bootstrapped", lambda: "bootstrap;" in log_text(log) or boxes.dirs(), 60, every=0.05)
        time.sleep(0.6)  # aim the signal at the next cycle (ship code, launch); any moment must end cleanly
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    finally:
        boxes.stop()
    out = log_text(log)
    assert code == 0, out[-3000:]
    assert "Traceback" not in out
    assert w.remote_lease() is None, "the lease is released at the remote"
    lock = LocalLock(lock_path(w.work)).acquire()  # and the local lock is free
    lock.release()
    # Whatever it launched before stopping is recorded at the remote, and still running: a stop never kills runs.
    runs = w.remote_yaml("observed/runs.yaml") or {}
    recorded = {f"{r['run_id']}.{r['attempt']}" for r in runs.get("in_flight") or []}
    assert boxes.dirs() <= recorded, (boxes.dirs(), recorded)
    assert boxes.run_ids() <= set(ids.values())
    assert all(not info.get("exit_code") for info in boxes.seen.values()), boxes.seen
    status = w.remote_yaml("observed/status.yaml")
    assert status["apply_errors"] == [], "actions skipped because of the stop are not errors"
    w.assert_never_forced()


def test_sigterm_mid_action_finishes_it_and_starts_no_other(world_factory: Callable[..., World]) -> None:
    w = world_factory("t-term2", seeds="1", seconds=20.0)
    d = w.daemon()
    signalled: list[str] = []
    original_archive = d.git.archive

    def archive_then_sigterm(commit: str, paths: Any) -> bytes:
        # The signal arrives while the ship_code action is under way; the launch after it must not start.
        data = original_archive(commit, paths)
        if not signalled:
            signalled.append(commit)
            os.kill(os.getpid(), signal.SIGTERM)
        return data

    d.git.archive = archive_then_sigterm  # type: ignore[method-assign]
    lines: list[str] = []
    code = d.run_forever(on_cycle=lambda c: lines.append(c.line()))
    assert code == 0, lines
    assert signalled, "the cycle never shipped code"
    assert "ship_code" in lines[-1] and "launch" in lines[-1], lines
    [iid] = w.owned_instances()
    root = w.emu.host_root(iid) / "rigsync"
    assert any((root / "code").iterdir()), "the action under way when the signal came was finished"
    assert not (root / "runs").exists() or not any((root / "runs").iterdir()), "no launch after the signal"
    assert w.remote_lease() is None
    status = w.remote_yaml("observed/status.yaml")
    assert status["apply_errors"] == []
    assert signal.getsignal(signal.SIGTERM) is not None
    w.assert_never_forced()


def test_a_holder_past_its_lease_deadline_stops_acting_and_the_taker_launches_each_run_once(
    world_factory: Callable[..., World], caplog: pytest.LogCaptureFixture
) -> None:
    """Fencing: A's apply stalls (a slow code shipment) past its lease; B takes the lease over and acts; A, back,
    does no further action (its launch is skipped, not attempted), commits nothing, and exits with LeaseLost."""
    from reconciler.errors import LeaseLost

    w = world_factory("t-fence", seeds="1", seconds=20.0)
    other = w.clone("other")
    clock = ShiftedClock()
    a = w.daemon(clock=clock)
    boxes = BoxRuns(w.emu, w.name).start()
    taken: dict[str, Any] = {}
    original_archive = a.git.archive

    def slow_archive(commit: str, paths: Any) -> bytes:
        data = original_archive(commit, paths)
        if taken:
            return data
        # A is stuck in this action past its lease (its clock driven past the deadline, the lease at the remote aged
        # as much); meanwhile B takes the fleet over and acts, with a whole fencing window of its own.
        clock.advance(LEASE_AGE_S)
        age_the_lease(other, LEASE_AGE_S)
        b = w.run_once(repo=other)
        taken.update(code=b.returncode, out=b.stdout + b.stderr, tip=w.tip())
        return data

    a.git.archive = slow_archive  # type: ignore[method-assign]
    lines: list[str] = []
    try:
        with caplog.at_level(logging.ERROR, logger="rigsync"), pytest.raises(LeaseLost):
            a.run_forever(on_cycle=lambda c: lines.append(c.line()))
    finally:
        boxes.stop()

    assert taken, f"A never shipped code: {lines}"
    assert taken["code"] == 0, taken["out"]
    assert "taken over" in taken["out"]
    ids = set(run_ids_by_seed(w).values())
    # B launched the run; A, after its deadline, launched nothing: one run directory per run, attempt 1.
    assert boxes.run_ids() == ids
    assert sorted(boxes.dirs()) == sorted(f"{i}.1" for i in ids)
    skipped = [r.getMessage() for r in caplog.records if "lease lost before launch" in r.getMessage()]
    assert skipped, [r.getMessage() for r in caplog.records]
    # A committed nothing after B took over, and never removed B's lease.
    assert w.tip() == taken["tip"]
    assert w.remote_lease()["holder"] == f"rigsync@{os.uname().nodename}:{other}"
    lock = LocalLock(lock_path(w.work)).acquire()  # A's local lock is free again
    lock.release()
    w.assert_never_forced()


def test_a_takeover_racing_our_commit_is_lease_lost_and_none_of_ours_lands(
    world_factory: Callable[..., World],
) -> None:
    """Another reconciler's takeover lands on the lease ref between our commit and our push: our push of main carries
    a heartbeat in the same atomic push, so it fails as a whole; the daemon exits with LeaseLost naming the new holder
    and drops what it committed."""
    from reconciler.adapters.lease import LeaseState, to_yaml
    from reconciler.errors import LeaseLost

    w = world_factory("t-race", suspend=True)
    human = w.clone("human")
    a = w.daemon(lease_stale_s=600.0)
    taker: dict[str, str] = {}
    original_push = a.git.push

    def racing_push(max_tries: int = 6, lease: tuple[str | None, str, str] | None = None) -> str | None:
        if "desired" in taker and "sha" not in taker:
            now = time.time()
            b = LeaseState(holder="rigsync@elsewhere:/b", host="elsewhere", pid=7, acquired_at=now, heartbeat_at=now)
            other = GitRepo(human)
            taker["sha"] = str(other.swap_lease(other.read_lease()[0], to_yaml(b), "lease: taken over"))
        return original_push(max_tries, lease)

    def after_cycle(c: Any) -> None:
        if "desired" not in taker:  # a change worth a commit in the next cycle: a new desired revision
            def note(clone: Path) -> None:
                (clone / "desired" / "fleet.yaml").write_text((clone / "desired" / "fleet.yaml").read_text() + "\n")

            taker["desired"] = w.human_push(human, note, "desired: a blank line")

    a.git.push = racing_push  # type: ignore[method-assign]
    with pytest.raises(LeaseLost, match=r"taken over by rigsync@elsewhere:/b on elsewhere \(pid 7\)"):
        a.run_forever(on_cycle=after_cycle)
    assert "sha" in taker, "no cycle after the first one pushed"
    assert w.tip() == taker["desired"], "nothing of ours landed after the takeover"
    assert w.remote_lease()["holder"] == "rigsync@elsewhere:/b"
    assert git(w.work, "rev-parse", "HEAD") == taker["desired"], "our unpushed commits were dropped"
    w.assert_never_forced()
