"""The reconcile core on real parts: observe → plan → apply cycles against the emulator until a sweep is done.

Everything here is real: the emulator's boxes are OpenSSH sshd processes, the provider is the official ``vastai``
SDK behind ``VastProvider``, the shell is paramiko behind ``SshShell``, code ships as ``git archive`` of a real
fleet repository made from the example under desired/. Each scenario drives ``Reconciler.cycle()`` with a bound
on cycles and wall time (a stop, never an assertion on time) and then checks the outcome in the run archive and
in the emulator's own books.
"""

from __future__ import annotations

import contextlib
import io
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import world

from reconciler import remote
from reconciler.adapters.archive import ShardedRunArchive
from reconciler.apply import ApplyContext, apply
from reconciler.cli._common import load_local_desired, open_reconciler
from reconciler.core.actions import Launch, Plan
from reconciler.core.model import AttemptOutcome, AttemptRecord, Desired, DriftClass, Ownership
from reconciler.emulator import Emulator
from reconciler.errors import LaunchLockHeld
from reconciler.loop import CycleResult, Reconciler
from reconciler.plan.render import status_json

pytestmark = pytest.mark.integration

MAX_CYCLES = 300
MAX_WALL_S = 100.0
PAUSE_S = 0.3

SWEEP = """\
# yaml-language-server: $schema=../../schemas/sweep.schema.json
name: tdmpc
priority: 10
code: [experiments]
command: >-
  {{{{ python }}}} experiments/train.py --task {{{{ task }}}} --lr {{{{ lr }}}} --seed {{{{ seed }}}}
  --out {{{{ run_dir }}}}/metrics.jsonl --seconds {seconds} --evals 4
grid:
  task: [walker-walk]
  lr: [3.0e-4, 1.0e-3]
seeds: [1]
resources:
  gpus: 1
  min_gpu_ram_gib: 4
max_runtime: 5m
retries: 2
metrics:
  file: metrics.jsonl
  key: episode_reward
  goal: max
"""

TIMEOUTS = {"idle_timeout": "1s", "unreachable_grace": "3s", "heartbeat_stale": "8s", "boot_timeout": "1m"}


def fleet_repo(where: Path, emu: Emulator, fleet: str, *, seconds: float) -> Path:
    """The example fleet repo (with its bare remote) renamed to ``fleet``: 2 runs, short timeouts, committed."""
    repo = world.fleet_repo(where / "fleet")
    repo.edit_fleet(name=fleet, **TIMEOUTS)
    repo.write("desired/sweeps/tdmpc.yaml", SWEEP.format(seconds=seconds))
    repo.commit(f"test: fleet {fleet}, one seed, two cells", push=False)
    return repo.work


def owned_alive(emu: Emulator, fleet: str) -> list[int]:
    """Owned instances the emulator still has (any status): its own books, not rigsync's view."""
    out = []
    for iid in emu.instance_ids():
        own = Ownership.parse(str(emu.instance(iid).get("label") or ""))
        if own is not None and own.fleet == fleet:
            out.append(iid)
    return out


def successes(records: list[AttemptRecord]) -> Counter[str]:
    return Counter(r.run_id for r in records if r.phase is AttemptOutcome.SUCCEEDED)


def converged(rec: Reconciler, desired: Desired, emu: Emulator, res: CycleResult) -> bool:
    wanted = {r.id for r in desired.runs if r.promotion_threshold is None}
    done = set(successes(list(rec.history)))
    return (
        not res.plan.actions
        and wanted <= done
        and not rec.memory.in_flight
        and not owned_alive(emu, desired.fleet.name)
    )


def drive(
    rec: Reconciler, desired: Desired, emu: Emulator, hook: Callable[[CycleResult], None] | None = None
) -> list[CycleResult]:
    """Cycle until converged; a bounded number of cycles and wall time, then fail with what was seen."""
    results: list[CycleResult] = []
    deadline = time.monotonic() + MAX_WALL_S
    while len(results) < MAX_CYCLES and time.monotonic() < deadline:
        res = rec.cycle(desired)
        results.append(res)
        if hook is not None:
            hook(res)
        if converged(rec, desired, emu, res):
            return results
        time.sleep(PAUSE_S)
    last = results[-1]
    failed = [f"{o.action.kind.value} {o.action.target}: {o.detail}" for r in results if r.applied
              for o in r.applied.failures]
    pytest.fail(
        f"not converged after {len(results)} cycles: last plan {last.plan.counts()}, "
        f"history {[(h.run_id[:20], h.attempt, h.phase.value) for h in rec.history]}, "
        f"owned alive {owned_alive(emu, desired.fleet.name)}, failures {failed[-5:]}"
    )


def sdk(emu: Emulator) -> Any:
    from vastai import VastAI

    return VastAI(api_key=emu.api_key, server_url=emu.url, quiet=True)


def quietly(fn: Callable[[], Any]) -> Any:
    with contextlib.redirect_stdout(io.StringIO()):
        return fn()


# ------------------------------------------------------------------------------------------ a clean sweep


@dataclass
class Clean:
    repo: Path
    desired: Desired
    rec: Reconciler
    results: list[CycleResult]
    foreign_id: int
    lock_exit: int | None = None
    lock_outcome: str | None = None
    lock_ok: bool | None = None
    lock_target: str | None = None
    plans_after: list[Plan] = field(default_factory=list)
    fresh_plan: Plan | None = None
    status: dict[str, Any] = field(default_factory=dict)
    foreign_after: dict[str, Any] = field(default_factory=dict)


@pytest.fixture(scope="module")
def clean(emulator: Emulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clean]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VAST_API_KEY", emulator.api_key)
        tmp = tmp_path_factory.mktemp("clean")
        repo = fleet_repo(tmp, emulator, "itclean", seconds=1.0)
        desired = load_local_desired(repo)

        # Someone else's box on the same account: a 2-GPU offer the fleet's filters would never pick.
        client = sdk(emulator)
        offers = quietly(lambda: client.search_offers(query="num_gpus>=2 rentable=true", limit=5))
        reply = quietly(
            lambda: client.create_instance(
                id=offers[0]["id"], image="ubuntu:22.04", disk=10, label="someone-else:notebook", ssh=True, direct=True
            )
        )
        foreign_id = int(reply["new_contract"])

        rec = open_reconciler(repo, desired, str(tmp / "state"), emulator.url)
        out = Clean(repo, desired, rec, [], foreign_id)

        def duplicate_launch(res: CycleResult) -> None:
            """On the first cycle that launched: launch the same attempt again, by hand and through apply()."""
            if out.lock_target is not None or res.applied is None:
                return
            launched = [o.action for o in res.applied.outcomes if o.ok and isinstance(o.action, Launch)]
            if not launched:
                return
            action = launched[0]
            assert isinstance(action, Launch)
            out.lock_target = action.target
            inst = next(i for i in res.observed.instances if i.id == action.instance_id)
            assert inst.ssh is not None
            spec = desired.run(action.run_id)
            assert spec is not None
            script = remote.launch_script(
                run_id=action.run_id, attempt=action.attempt, gpu_mask=action.gpu_mask, command=action.command,
                code_commit=action.code_commit, desired_commit=desired.commit, metrics_file=spec.sweep.metrics_file,
                metric_key=spec.sweep.metric_key, metric_goal=spec.sweep.metric_goal.value,
                max_runtime_s=spec.sweep.max_runtime_s, sweep=spec.sweep.name, params=spec.params_dict, seed=spec.seed,
            )
            out.lock_exit = rec.shell.run(inst.ssh, script, timeout=30).exit_code
            ctx = ApplyContext(
                provider=rec.provider, boxes=rec.boxes, desired=desired, observed=res.observed,
                archive=rec.archive, code_tar=rec.code_tar, now=time.time,
            )
            again = apply(Plan(actions=(action,)), ctx)
            out.lock_ok = again.outcomes[0].ok
            out.lock_outcome = again.outcomes[0].detail

        try:
            out.results = drive(rec, desired, emulator, duplicate_launch)
            for _ in range(2):
                _, p, _ = rec.observe_and_plan(desired)
                out.plans_after.append(p)
            observed, _, _ = rec.observe_and_plan(desired)
            out.status = status_json(desired, observed)
            fresh = open_reconciler(repo, desired, str(tmp / "state"), emulator.url)
            try:  # a new process: nothing in memory, history from the archive, the world from the provider
                _, out.fresh_plan, _ = fresh.observe_and_plan(desired)
            finally:
                fresh.shell.close()
            out.foreign_after = emulator.instance(foreign_id)
            yield out
        finally:
            rec.shell.close()
            for iid in [*owned_alive(emulator, "itclean"), foreign_id]:
                if iid in emulator.instance_ids():
                    emulator.destroy_instance(iid)


def test_every_run_succeeds_exactly_once(clean: Clean) -> None:
    records = list(ShardedRunArchive(clean.repo).records())
    wanted = {r.id for r in clean.desired.runs}
    assert len(wanted) == 2
    assert successes(records) == Counter({rid: 1 for rid in wanted})
    assert all(r.phase is AttemptOutcome.SUCCEEDED and r.exit_code == 0 for r in records)
    assert all(r.code_commit == clean.desired.code_commit for r in records)
    assert all(r.best_metric is not None and r.instance_id > 0 for r in records)


def test_no_owned_instance_left(clean: Clean, emulator: Emulator) -> None:
    assert owned_alive(emulator, "itclean") == []
    rented = {i for r in clean.results if r.applied for i in r.applied.rented}
    destroyed = {i for r in clean.results if r.applied for i in r.applied.destroyed}
    assert rented and rented == destroyed
    kinds = {e["type"] for e in emulator.ledger.events if e.get("instance_id") in rented}
    assert "destroy" in kinds and "stop" not in kinds


def test_two_plans_after_convergence_have_no_actions(clean: Clean) -> None:
    assert len(clean.plans_after) == 2
    for p in clean.plans_after:
        assert p.actions == ()
        assert not p.changes
        assert p.fleet_dph_before == p.fleet_dph_after == 0.0
    assert clean.plans_after[1].noops, "the idle plan still says what it considered"
    assert clean.fresh_plan is not None and clean.fresh_plan.actions == ()


def test_duplicate_launch_fails_on_the_lock(clean: Clean) -> None:
    assert clean.lock_target is not None, "no launch was ever applied"
    assert clean.lock_exit == remote.LAUNCH_LOCK_EXIT
    assert clean.lock_ok is False
    assert clean.lock_outcome is not None and clean.lock_outcome.startswith(LaunchLockHeld.__name__)
    # and the run the duplicates aimed at still ran once
    run_id = clean.lock_target.split("/", 1)[1].rsplit(".", 1)[0]
    assert successes(list(ShardedRunArchive(clean.repo).records()))[run_id] == 1


def test_foreign_instance_is_never_touched(clean: Clean, emulator: Emulator) -> None:
    fid = clean.foreign_id
    assert fid in emulator.instance_ids()
    assert clean.foreign_after["label"] == "someone-else:notebook"
    assert clean.foreign_after["actual_status"] == "running"
    touched = [e["type"] for e in emulator.ledger.events if e.get("instance_id") == fid]
    assert set(touched) <= {"create", "running"}, touched
    target = f"instance/{fid}"
    for res in clean.results:
        assert all(a.target != target for a in res.plan.actions)
        assert all(getattr(a, "instance_id", None) != fid for a in res.plan.actions)
    foreign_drift = [d for d in clean.results[-1].plan.drift if d.subject == target]
    assert [(d.cls, d.action) for d in foreign_drift] == [(DriftClass.FOREIGN, "none")]
    assert [f["id"] for f in clean.status["foreign"]] == [fid]
    assert clean.status["boxes"] == []
    assert clean.status["runs"]["succeeded"] == 2


# ------------------------------------------------------------------------------------ a box killed mid-run


def test_box_vanished_mid_run_is_requeued_and_finished_elsewhere(
    emulator: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VAST_API_KEY", emulator.api_key)
    repo = fleet_repo(tmp_path, emulator, "itvanish", seconds=6.0)
    desired = load_local_desired(repo)
    rec = open_reconciler(repo, desired, str(tmp_path / "state"), emulator.url)
    victim: dict[str, Any] = {}

    def vanish_a_busy_box(res: CycleResult) -> None:
        if victim:
            return
        for probe in res.observed.probes:
            live = [r for r in probe.runs if r.exit_code is None and r.pid_alive]
            if probe.reachable and live:
                emulator.vanish(probe.instance_id)
                victim.update(instance_id=probe.instance_id, run_id=live[0].run_id, attempt=live[0].attempt)
                return

    try:
        drive(rec, desired, emulator, vanish_a_busy_box)
    finally:
        rec.shell.close()
        for iid in owned_alive(emulator, "itvanish"):
            emulator.destroy_instance(iid)

    assert victim, "no run was ever seen live on a box"
    records = list(ShardedRunArchive(repo).records())
    mine = [r for r in records if r.run_id == victim["run_id"]]
    lost = [r for r in mine if r.phase is AttemptOutcome.LOST]
    assert [(r.attempt, r.instance_id) for r in lost] == [(victim["attempt"], victim["instance_id"])]
    won = [r for r in mine if r.phase is AttemptOutcome.SUCCEEDED]
    assert len(won) == 1
    assert won[0].attempt > victim["attempt"]
    assert won[0].instance_id != victim["instance_id"]
    # every run of the sweep still succeeded exactly once, and the dead box is not left billing storage
    assert successes(records) == Counter({r.id: 1 for r in desired.runs})
    assert owned_alive(emulator, "itvanish") == []
    kinds = [e["type"] for e in emulator.ledger.events if e.get("instance_id") == victim["instance_id"]]
    assert "vanish" in kinds and "destroy" in kinds


# ------------------------------------------------------------------------------ a box whose host key changed


def test_host_key_changed_box_is_destroyed_never_trusted_and_its_run_requeued(
    emulator: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reconciler.core.actions import Destroy, ReasonCode

    monkeypatch.setenv("VAST_API_KEY", emulator.api_key)
    repo = fleet_repo(tmp_path, emulator, "itrekey", seconds=6.0)
    desired = load_local_desired(repo)
    rec = open_reconciler(repo, desired, str(tmp_path / "state"), emulator.url)
    victim: dict[str, Any] = {}
    after: list[CycleResult] = []

    def rekey_a_busy_box(res: CycleResult) -> None:
        if victim:
            after.append(res)
            return
        for probe in res.observed.probes:
            live = [r for r in probe.runs if r.exit_code is None and r.pid_alive]
            if probe.reachable and live:
                emulator.rekey(probe.instance_id)  # the real sshd now answers with another host key
                rec.shell.close()  # open connections drop (as a reinstall would drop them): the next one sees it
                victim.update(instance_id=probe.instance_id, run_id=live[0].run_id, attempt=live[0].attempt)
                return

    try:
        drive(rec, desired, emulator, rekey_a_busy_box)
    finally:
        rec.shell.close()
        for iid in owned_alive(emulator, "itrekey"):
            emulator.destroy_instance(iid)

    assert victim, "no run was ever seen live on a box"
    iid = victim["instance_id"]
    subject = f"instance/{iid}"
    # The very next cycle saw it: host_key_changed (not merely unreachable), destroyed at once, without grace.
    first = after[0]
    probe = first.observed.probe(iid)
    assert probe is not None and probe.host_key_changed and not probe.reachable
    assert "HostKeyMismatch" in (probe.error or "")
    assert [(d.cls, d.action) for d in first.plan.drift if d.subject == subject] == [
        (DriftClass.HOST_KEY_CHANGED, f"destroy {subject}")
    ]
    destroys = [a for a in first.plan.actions if isinstance(a, Destroy) and a.instance_id == iid]
    assert [a.code for a in destroys] == [ReasonCode.HOST_KEY_CHANGED]
    assert first.applied is not None
    assert [o.ok for o in first.applied.outcomes if o.action in destroys] == [True]
    assert any(w.startswith(f"host key changed on {subject}") for w in first.plan.warnings)
    # Nothing but the destroy was ever aimed at the box again: no launch, kill, bootstrap or code shipment (closing
    # its bill, once it is gone, is bookkeeping in the archive: nothing is sent to the box).
    for res in after:
        for a in res.plan.actions:
            assert getattr(a, "instance_id", None) != iid or isinstance(a, Destroy) or a.kind.value in (
                "requeue", "close_bill"), a
    # Its attempt was requeued as lost and the run finished once, elsewhere.
    records = list(ShardedRunArchive(repo).records())
    mine = [r for r in records if r.run_id == victim["run_id"]]
    lost = [r for r in mine if r.phase is AttemptOutcome.LOST]
    assert [(r.attempt, r.instance_id) for r in lost] == [(victim["attempt"], iid)]
    assert "host key changed" in lost[0].reason
    won = [r for r in mine if r.phase is AttemptOutcome.SUCCEEDED]
    assert len(won) == 1 and won[0].instance_id != iid
    assert successes(records) == Counter({r.id: 1 for r in desired.runs})
    kinds = [e["type"] for e in emulator.ledger.events if e.get("instance_id") == iid]
    assert "rekey" in kinds and "destroy" in kinds
