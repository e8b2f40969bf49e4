"""`rigsync demo`: the whole product on the built-in emulator, from a throwaway fleet repo to a summary.

It is the README's main job and an end-to-end check at once: it starts the emulator (real sshd boxes on
loopback), makes a fleet repository with a bare remote from the example under desired/, runs the same
``FleetDaemon`` cycle `rigsync run` uses until the sweep is done and every box is destroyed, and reports what
it cost according to the emulator's billing ledger. With ``--chaos`` it vanishes a box mid-run, hangs another
and throws a burst of 429s; the sweep must still finish with every run succeeded exactly once.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import reconciler
from reconciler.adapters.git import DEFAULT_AUTHOR_NAME, DEFAULT_BRANCH, DEFAULT_REMOTE
from reconciler.core.model import AttemptOutcome, Desired, InstanceStatus, Observed, owns, split_owned
from reconciler.core.runphase import count_phases, is_unfinished, run_phases
from reconciler.daemon import DaemonConfig, FleetDaemon, sleep_until
from reconciler.emulator.s3server import start_s3_server
from reconciler.errors import UserError
from reconciler.fleet import open_archive
from reconciler.settings.object_store import STORE_ENDPOINT_ENV, STORE_ENV, StoreConfig, store_config
from reconciler.views import dashboard
from reconciler.views.dashboard import open_hint
from reconciler.views.progress_display import LineProgress, ProgressDisplay, booting, describe

DEMO_TIMEOUTS = {
    "idle_timeout": "20s",
    "unreachable_grace": "8s",
    "heartbeat_stale": "12s",
    "boot_timeout": "2m",
}
DEMO_CHECKPOINT_EVERY = "1s"  # the demo's runs last seconds: sync their checkpoints every second


@dataclass
class DemoOptions:
    runs: int | None = None
    chaos: bool = False
    keep: Path | None = None
    seed: int = 7
    timeout_s: float = 600.0
    boot_delay_s: float = 1.0
    interval_s: float = 1.0
    say: Callable[[str], None] = print
    data_dir: Path | None = None  # where harvests and checkpoints go (None: a temporary directory, removed)
    store: bool = False  # keep them in a throwaway S3-compatible server on loopback instead (boxes upload to it)
    source: Path | None = None  # a fleet repository to run instead of the example (`rigsync demo --repo DIR`)
    # what the demo waits for (rent, boot, bootstrap, launch) and its cycle lines; None: plain lines through ``say``
    progress: ProgressDisplay | None = None


@dataclass
class DemoSummary:
    runs_total: int = 0
    runs_succeeded: int = 0
    runs_failed: int = 0
    attempts: int = 0
    instances_rented: int = 0
    instances_alive: int = 0
    cost_usd: float = 0.0
    wall_s: float = 0.0
    cycles: int = 0
    acting_cycles: int = 0  # cycles that rented, destroyed, launched or finished something (a run, a box's bill)
    commits: int = 0
    duplicate_successes: int = 0
    runs_resumed: int = 0  # runs that succeeded in an attempt resumed from an earlier attempt's checkpoint
    harvested: int = 0  # attempts whose results came home to the data dir (archive records with harvest ok/partial)
    chaos: list[str] = field(default_factory=list)
    repo: str | None = None
    timed_out: bool = False
    logs_command: str | None = None  # with --keep: how to read a finished run's output from the store
    dashboard: str | None = None  # the page of the fleet repo as it ended (``rigsync dashboard``'s file)
    store: str | None = None  # with --store: the throwaway object store the boxes uploaded to
    store_objects: int | None = None  # how many objects it held at the end (harvests, checkpoints, logs)

    @property
    def ok(self) -> bool:
        return (
            not self.timed_out
            and self.runs_total > 0
            and self.runs_succeeded == self.runs_total
            and self.instances_alive == 0
            and self.duplicate_successes == 0
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "runs_total": self.runs_total,
            "runs_succeeded": self.runs_succeeded,
            "runs_failed": self.runs_failed,
            "attempts": self.attempts,
            "instances_rented": self.instances_rented,
            "instances_alive": self.instances_alive,
            "cost_usd": round(self.cost_usd, 6),
            "wall_s": round(self.wall_s, 2),
            "cycles": self.cycles,
            "acting_cycles": self.acting_cycles,
            "commits": self.commits,
            "duplicate_successes": self.duplicate_successes,
            "runs_resumed": self.runs_resumed,
            "harvested": self.harvested,
            "chaos": self.chaos,
            "repo": self.repo,
            "timed_out": self.timed_out,
            "logs_command": self.logs_command,
            "dashboard": self.dashboard,
            "store": self.store,
            "store_objects": self.store_objects,
        }

    def text(self) -> str:
        verdict = "OK" if self.ok else "NOT OK"
        lines = [
            f"demo {verdict}: {self.runs_succeeded}/{self.runs_total} runs succeeded, {self.runs_failed} failed, "
            f"{self.attempts} attempts",
            f"  boxes rented {self.instances_rented}, alive at the end {self.instances_alive}, "
            f"spent ${self.cost_usd:.4f} (emulator ledger), wall {self.wall_s:.1f}s, "
            f"{self.cycles} cycles ({self.acting_cycles} rented, destroyed, launched or finished something), "
            f"{self.commits} observed commits",
            f"  {self.harvested} attempt(s) harvested, {self.runs_resumed} run(s) resumed from a checkpoint",
        ]
        if self.store:
            lines.append(f"  results in the object store {self.store}: {self.store_objects} object(s), uploaded by "
                         "the boxes themselves with presigned URLs (the store is removed with the demo)")
        if self.chaos:
            lines.append("  chaos: " + "; ".join(self.chaos))
        if self.repo:
            lines.append(f"  fleet repo kept at {self.repo}  (try: git -C {self.repo} log --stat)")
        if self.logs_command:
            lines.append(f"  a finished run's output: {self.logs_command}")
        elif not self.repo:
            lines.append("  (with --keep DIR the fleet repo and the harvests stay: rigsync logs RUN --repo DIR)")
        if self.dashboard:
            lines.append(f"  {open_hint(Path(self.dashboard))}")
        return "\n".join(lines)


def source_root() -> Path:
    root = Path(reconciler.__file__).resolve().parent.parent
    if not (root / "desired" / "fleet.yaml").is_file() or not (root / "experiments").is_dir():
        raise UserError(f"the demo needs rigsync's source checkout (desired/ and experiments/ under {root})")
    return root


def _git(cwd: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "demo researcher",
        "GIT_AUTHOR_EMAIL": "researcher@example.invalid",
        "GIT_COMMITTER_NAME": "demo researcher",
        "GIT_COMMITTER_EMAIL": "researcher@example.invalid",
    }
    proc = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise UserError(f"git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def _set_key(text: str, key: str, value: str) -> str:
    pattern = re.compile(rf"^(\s*)#?\s*{re.escape(key)}:.*$", re.M)
    if not pattern.search(text):
        raise UserError(f"the example fleet file has no {key!r} line to set for the demo")
    return pattern.sub(lambda m: f"{m.group(1)}{key}: {value}", text, count=1)


def make_fleet_repo(workdir: Path, runs: int | None, source: Path | None = None) -> tuple[Path, Path]:
    """The demo's (and the benches') working clone and its bare remote, holding the example fleet (or a copy of the
    fleet repository ``source``'s files) with the demo's short timeouts. The source itself is never changed.

    The emulator's URL is not written into it: the controller is pointed there (``FleetDaemon(api_url=...)``,
    ``RIGSYNC_API_URL`` or ``--api-url``), since desired/ never says where the account's key goes.
    """
    if source is not None and not (source / "desired" / "fleet.yaml").is_file():
        raise UserError(f"{source}: no desired/fleet.yaml (make one with `rigsync init {source}`)")
    remote = workdir.parent / f"{workdir.name}.remote.git"
    if remote.exists():
        raise UserError(f"{remote} already exists; choose another --keep directory")
    subprocess.run(["git", "init", "-q", "--bare", "-b", DEFAULT_BRANCH, str(remote)], check=True)
    workdir.mkdir(parents=True, exist_ok=True)
    if any(workdir.iterdir()):
        raise UserError(f"{workdir} is not empty")
    _git(workdir.parent, "clone", "-q", str(remote), str(workdir))
    _git(workdir, "checkout", "-q", "-b", DEFAULT_BRANCH)
    if source is not None:
        skip = shutil.ignore_patterns(".git", ".venv", "__pycache__")
        for item in sorted(source.iterdir()):
            if skip(str(source), [item.name]):
                continue
            if item.is_dir():
                shutil.copytree(item, workdir / item.name, ignore=skip)
            else:
                shutil.copy2(item, workdir / item.name)
    else:
        src = source_root()
        shutil.copytree(src / "desired", workdir / "desired")
        shutil.copytree(src / "experiments", workdir / "experiments", ignore=shutil.ignore_patterns("__pycache__"))
        schemas = src / "schemas"
        if schemas.is_dir():
            shutil.copytree(schemas, workdir / "schemas")
    _git(workdir, "add", "-A")
    _git(workdir, "commit", "-q", "-m", "example fleet: TD-MPC-shaped sweep on cheap consumer GPUs")
    fleet = workdir / "desired" / "fleet.yaml"
    text = fleet.read_text()
    for key, value in DEMO_TIMEOUTS.items():
        text = _set_key(text, key, value)
    fleet.write_text(text)
    msg = "demo: short timeouts, checkpoints synced every " + DEMO_CHECKPOINT_EVERY
    for sweep_file in sorted((workdir / "desired" / "sweeps").glob("*.yaml")):
        body = sweep_file.read_text()
        body = re.sub(r"(checkpoint: \{path: [^,]+, every: )[0-9dhms]+\}", rf"\g<1>{DEMO_CHECKPOINT_EVERY}}}", body)
        sweep_file.write_text(body)
    if runs is not None:
        for sweep_file in sorted((workdir / "desired" / "sweeps").glob("*.yaml")):
            body = sweep_file.read_text()
            cells = _grid_cells(body)
            seeds = max(1, math.ceil(runs / cells))
            body = _set_key(body, "seeds", "[" + ", ".join(str(s) for s in range(1, seeds + 1)) + "]")
            sweep_file.write_text(body)
        msg += f", about {runs} runs"
    _git(workdir, "commit", "-q", "-am", msg)
    _git(workdir, "push", "-q", DEFAULT_REMOTE, DEFAULT_BRANCH)
    return workdir, remote


def _grid_cells(sweep_text: str) -> int:
    import yaml

    doc = yaml.safe_load(sweep_text) or {}
    cells = 1
    for values in (doc.get("grid") or {}).values():
        cells *= max(1, len(values))
    return cells


class Chaos:
    """Injects the faults of ``--chaos`` once there is something to break: two boxes each running work."""

    def __init__(self, emu: Any, say: Callable[[str], None]) -> None:
        self.emu = emu
        self.say = say
        self.events: list[str] = []
        self.done = False
        self.hung: int | None = None
        self.hung_at = 0.0

    def step(self, busy_boxes: list[int], resumable: list[int] | None = None) -> None:
        """``resumable``: the busy boxes whose running attempt already has a checkpoint home (None: the sweep
        declares no checkpoint); the victim is one of them, so its run can show the resume."""
        candidates = busy_boxes if resumable is None else [b for b in busy_boxes if b in resumable]
        if not self.done and len(busy_boxes) >= 2 and candidates:
            victim = candidates[0]
            frozen = next(b for b in busy_boxes if b != victim)
            self.emu.fail_next("/api/", 4, 429)
            self.events.append("a burst of 4 HTTP 429s on the API")
            self.emu.vanish(victim)
            self.events.append(f"instance {victim} vanished mid-run")
            self.emu.hang(frozen)
            self.hung, self.hung_at = frozen, time.monotonic()
            self.events.append(f"instance {frozen} hung (SIGSTOP)")
            for e in self.events:
                self.say(f"  chaos: {e}")
            self.done = True


def run_demo(opts: DemoOptions) -> DemoSummary:
    from reconciler.emulator import Emulator

    started = time.monotonic()
    summary = DemoSummary()
    tmp = None
    if opts.keep is not None:
        workdir = opts.keep.resolve()
    else:
        tmp = tempfile.TemporaryDirectory(prefix="rigsync-demo-")
        workdir = Path(tmp.name) / "fleet"
    state = Path(tempfile.mkdtemp(prefix="rigsync-demo-state-"))
    # Harvests go where `rigsync logs --repo DIR` finds them when the repo is kept (the user's data dir, as for a
    # real fleet); otherwise to a temporary directory removed with everything else.
    data_is_temp = opts.data_dir is None and opts.keep is None
    data = opts.data_dir if not data_is_temp else Path(tempfile.mkdtemp(prefix="rigsync-demo-data-"))
    saved_env = {name: os.environ.get(name) for name in ("VAST_API_KEY", *STORE_ENV_NAMES)}
    with contextlib.ExitStack() as stack:
        try:
            emu = stack.enter_context(Emulator(seed=opts.seed, boot_delay=opts.boot_delay_s))
            os.environ["VAST_API_KEY"] = emu.api_key  # the key lives in the environment, never in the repo
            store = _demo_store(stack, opts) if opts.store else None
            opts.say(f"emulator at {emu.url}; fleet repo {workdir}")
            make_fleet_repo(workdir, opts.runs, opts.source)
            config = DaemonConfig(interval_s=opts.interval_s, lease_renew_s=30.0)
            daemon = FleetDaemon(
                workdir, config=config, state_dir=str(state), api_url=emu.url,
                data_dir=str(data) if data is not None else None, store=store,
            )
            opts.say(daemon.acquire())
            progress = opts.progress if opts.progress is not None else LineProgress(opts.say)
            daemon.on_action = lambda action: progress.update(describe(action))
            chaos = Chaos(emu, progress.note) if opts.chaos else None
            try:
                summary = _drive(daemon, emu, opts, progress, chaos, started)
            finally:
                progress.close()
                if daemon.reconciler is not None:
                    daemon.reconciler.shell.close()
                daemon.release()
            summary.instances_alive = len(emu.instance_ids())
            summary.cost_usd = emu.ledger.total_usd()
            summary.chaos = chaos.events if chaos else []
            summary.store = store.where() if store is not None else None
            summary.store_objects = _store_objects(daemon)
        finally:
            for name, value in saved_env.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            shutil.rmtree(state, ignore_errors=True)
            if data_is_temp and data is not None:
                shutil.rmtree(data, ignore_errors=True)
    archive = list(open_archive(workdir).records())
    successes = Counter(r.run_id for r in archive if r.phase is AttemptOutcome.SUCCEEDED)
    summary.attempts = len(archive)
    summary.runs_succeeded = len(successes)
    summary.duplicate_successes = sum(n - 1 for n in successes.values() if n > 1)
    summary.runs_resumed = len(
        {r.run_id for r in archive if r.phase is AttemptOutcome.SUCCEEDED and r.resumed_from is not None}
    )
    summary.harvested = sum(1 for r in archive if r.harvest and not r.harvest.startswith("lost"))
    summary.commits = int(_git(workdir, "rev-list", "--count", f"--author={DEFAULT_AUTHOR_NAME}", "HEAD") or 0)
    summary.wall_s = time.monotonic() - started
    if opts.keep is not None:
        summary.repo = str(workdir)
        done = sorted(r.run_id for r in archive if r.phase is AttemptOutcome.SUCCEEDED and r.harvest)
        if done and not opts.store:  # the throwaway store is gone with the demo
            where = f" --data-dir {shlex.quote(str(opts.data_dir))}" if opts.data_dir is not None else ""
            summary.logs_command = f"rigsync logs {done[0]} --repo {shlex.quote(str(workdir))}{where}"
    # the page of the fleet as it ended: in the kept repo's .git/, else in a directory of its own (the repo goes)
    out = None if opts.keep is not None else Path(tempfile.mkdtemp(prefix="rigsync-demo-dashboard-")) / "index.html"
    summary.dashboard = str(dashboard.write(workdir, out))
    if tmp is not None:
        tmp.cleanup()
    return summary


STORE_ENV_NAMES = (STORE_ENV, STORE_ENDPOINT_ENV, "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")


def _demo_store(stack: contextlib.ExitStack, opts: DemoOptions) -> StoreConfig:
    """Start a throwaway S3-compatible server on loopback (``emulator.s3server``) for ``--store``, with its
    endpoint and credentials in this process's environment as an operator would set them; its config."""
    try:
        server = stack.enter_context(start_s3_server(bucket="rigsync-demo"))
    except RuntimeError as exc:
        raise UserError(f"rigsync demo --store: cannot start the local object store: {exc}") from exc
    os.environ.update(server.env("demo"))
    opts.say(f"object store at {server.endpoint} (bucket {server.bucket}): the boxes upload their results to it")
    config = store_config(None, os.environ)
    assert config is not None
    return config


def _store_objects(daemon: FleetDaemon) -> int | None:
    """How many objects the fleet left in the demo's object store (None: it used the data dir)."""
    from reconciler.adapters.s3store import S3Store

    store = daemon.reconciler.store if daemon.reconciler is not None else None
    return store.count_objects() if isinstance(store, S3Store) else None


def _drive(
    daemon: FleetDaemon, emu: Any, opts: DemoOptions, progress: ProgressDisplay, chaos: Chaos | None, started: float
) -> DemoSummary:
    summary = DemoSummary()
    rented: set[int] = set()
    deadline = started + opts.timeout_s
    last_line = ""
    while True:
        if time.monotonic() > deadline:
            summary.timed_out = True
            progress.note(f"demo: timed out after {opts.timeout_s:.0f}s")
            _destroy_everything(daemon, emu)
            break
        cyc = daemon.cycle()
        summary.cycles += 1
        res = cyc.result
        if res is None:
            raise UserError("the demo's desired state is invalid: " + "; ".join(cyc.desired_errors))
        fleet = res.desired.fleet.name
        owned, _ = split_owned(res.observed.instances, fleet)
        rented.update(i.id for i in owned)
        if res.applied:
            rented.update(res.applied.rented)
            a = res.applied
            if a.rented or a.destroyed or a.launched or a.archived or a.overheads:
                summary.acting_cycles += 1
        busy = sorted(
            p.instance_id for p in res.observed.probes if p.reachable and any(is_unfinished(r) for r in p.runs)
        )
        if chaos is not None:
            chaos.step(busy, _resumable(daemon, res.desired, res.observed))
            if chaos.hung is not None and time.monotonic() - chaos.hung_at > 30 and chaos.hung in emu.instance_ids():
                emu.resume(chaos.hung)
        after = daemon.reconciler.observed_after_apply(res.observed) if daemon.reconciler else res.observed
        phases = run_phases(res.desired.runs, after)
        counts = count_phases(phases)
        succeeded, blocked, running = counts["succeeded"], counts["blocked"], counts["running"]
        summary.runs_total = len(phases)
        summary.runs_failed = blocked
        line = (
            f"[{time.monotonic() - started:6.1f}s] boxes {len(owned)} (${sum(i.dph_total for i in owned):.3f}/h), "
            f"runs {succeeded}/{len(phases)} succeeded, {running} running, {blocked} failed"
        )
        acts = ", ".join(f"{v} {k}" for k, v in sorted(res.plan.counts().items()))
        if line != last_line or acts:
            progress.update(line + (f" | {acts}" if acts else ""))
            last_line = line
        for waiting in booting(owned, fleet):
            progress.update(waiting)
        alive = [i for i in owned if i.status is not InstanceStatus.EXITED]
        finished = all(p.finished for p in phases.values())
        if finished and not alive and not res.plan.actions:
            break
        time.sleep(sleep_until(res.plan.wake_at, daemon.clock.now(), opts.interval_s))  # as the daemon sleeps
    summary.instances_rented = len(rented)
    return summary


def _resumable(daemon: FleetDaemon, desired: Desired, observed: Observed) -> list[int] | None:
    """Busy boxes whose running attempt has a checkpoint home; None when no sweep declares a checkpoint."""
    rec = daemon.reconciler
    if rec is None or rec.store is None or not any(s.checkpoint for s in desired.sweeps):
        return None
    out = []
    for p in observed.probes:
        for r in p.runs:
            synced = rec.store.checkpoint_synced(r.run_id) if p.reachable and is_unfinished(r) else None
            if synced is not None and synced[0] == r.attempt:
                out.append(p.instance_id)
                break
    return out


def _destroy_everything(daemon: FleetDaemon, emu: Any) -> None:
    """On timeout the demo still must not leave boxes billing: destroy what the fleet owns."""
    rec = daemon.reconciler
    if rec is None:
        return
    for inst in rec.provider.list_instances():
        if daemon.last_valid is not None and owns(daemon.last_valid.fleet.name, inst.label):
            rec.provider.destroy_instance(inst.id)


def say_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
