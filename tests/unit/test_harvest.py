"""Harvest and resume, box side and store side: the real box programs with a local bash in a temporary HOME, the
real local store, and apply() over the in-memory box world for what the archive record says."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
import time
from dataclasses import replace
from pathlib import Path

import jsonschema
from fakes import FakeArchive, FakeClock, FakeWorld, code_tar, desired_state, observe_and_plan, offer

from reconciler import remote
from reconciler.adapters.store import LocalStore, attempt_dir, checkpoint_dir
from reconciler.apply import STDERR_TAIL_BYTES, ApplyContext, ApplyResult, _tail_text, apply, harvest_note
from reconciler.core.actions import Plan, ReasonCode, Requeue
from reconciler.core.curves import MAX_POINTS, downsample, points_from_metrics, render_curve
from reconciler.core.jobenv import JOB_SECRETS_ENV, ControllerEnv
from reconciler.core.model import AttemptOutcome, Desired, Observed
from reconciler.errors import HostUnreachable, StoreUnavailable
from reconciler.plan.executable import executable
from reconciler.ports import Harvested, HarvestStream


def _sh(home: Path, script: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {"HOME": str(home), "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    return subprocess.run(["bash", "-c", script], env=env, input=stdin, capture_output=True, timeout=60, check=False)


def _run_dir(home: Path, name: str) -> Path:
    d = home / "rigsync" / "runs" / name
    d.mkdir(parents=True)
    return d


def _names(tar: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
        return tf.getnames()


def test_harvest_takes_logs_meta_metrics_and_artifacts_inside_the_run_dir_only(tmp_path: Path) -> None:
    home = tmp_path / "home"
    d = _run_dir(home, "r1.1")
    (d / "stdout.log").write_text("out\n")
    (d / "stderr.log").write_text("err\n")
    (d / "meta.json").write_text("{}\n")
    (d / "metrics.jsonl").write_text('{"step": 1, "r": 2}\n')
    (d / "eval").mkdir()
    (d / "eval" / "a.json").write_text("1")
    (d / "eval" / "b.txt").write_text("2")
    (tmp_path / "secret").write_text("not yours")
    (d / "eval" / "link.json").symlink_to(tmp_path / "secret")
    res = _sh(home, remote.harvest_script(
        "r1", 1, what="run", patterns=["metrics.jsonl", "eval/*.json", "../*", "/etc/passwd"], cap_bytes=1 << 20
    ))
    assert res.returncode == 0, res.stderr
    names = _names(res.stdout)
    assert names == ["stderr.log", "stdout.log", "meta.json", "metrics.jsonl", "eval/a.json", ".rigsync-harvest.json"]
    store = LocalStore(tmp_path / "data" / "lab")
    got = store.put_attempt("r1", 1, res.stdout)
    assert [p for p, _ in got.files] == names[:-1]
    assert [(p, why) for p, _, why in got.skipped] == [("eval/link.json", "outside the run directory")]
    home_dir = attempt_dir(store.fleet_data, "r1", 1)
    assert (home_dir / "stderr.log").read_text() == "err\n" and (home_dir / "eval" / "a.json").read_text() == "1"
    # harvesting twice is harmless: the same directory, replaced whole
    (d / "stderr.log").write_text("err\nmore\n")
    again = _sh(home, remote.harvest_script("r1", 1, what="run", patterns=[], cap_bytes=1 << 20))
    store.put_attempt("r1", 1, again.stdout)
    assert (home_dir / "stderr.log").read_text() == "err\nmore\n"
    assert not (home_dir / "eval").exists()
    assert store.read_attempt("r1", 1, "stderr.log", tail=5) == b"more\n"
    assert store.read_attempt("r1", 1, "../../../etc/passwd") is None


def test_the_size_cap_keeps_the_logs_and_names_what_it_skipped(tmp_path: Path) -> None:
    home = tmp_path / "home"
    d = _run_dir(home, "r2.1")
    (d / "stderr.log").write_text("boom\n")
    (d / "big.bin").write_bytes(b"x" * 5000)
    (d / "small.bin").write_bytes(b"y" * 10)
    res = _sh(home, remote.harvest_script("r2", 1, what="run", patterns=["*.bin"], cap_bytes=1000))
    assert res.returncode == 0, res.stderr
    got = LocalStore(tmp_path / "data").put_attempt("r2", 1, res.stdout)
    assert [p for p, _ in got.files] == ["stderr.log", "small.bin"]
    assert got.skipped == (("big.bin", 5000, "over the size cap"),)
    note = harvest_note(got)
    assert note.startswith("partial: 2 file(s)") and "1000 B cap" in note
    assert "big.bin (4.9 KiB, over the size cap)" in note


def test_harvest_of_a_missing_run_dir_exits_no_such_run(tmp_path: Path) -> None:
    res = _sh(tmp_path, remote.harvest_script("nope", 1, what="run", patterns=[], cap_bytes=100))
    assert res.returncode == remote.NO_SUCH_RUN_EXIT and b"no run directory" in res.stderr


def test_checkpoint_sync_keeps_the_last_complete_one_and_resume_ships_it_into_the_next_attempt(tmp_path: Path) -> None:
    home = tmp_path / "home"
    d = _run_dir(home, "r3.1")
    (d / "ckpt").mkdir()
    (d / "ckpt" / "state.json").write_text('{"step": 40}')
    store = LocalStore(tmp_path / "data")
    res = _sh(home, remote.harvest_script("r3", 1, what="checkpoint", patterns=["ckpt"], cap_bytes=1 << 20))
    store.put_checkpoint("r3", 1, res.stdout, at=100.0)
    (d / "ckpt" / "state.json").write_text('{"step": 80}' + " " * 2000)  # over the cap: incomplete, not kept
    res = _sh(home, remote.harvest_script("r3", 1, what="checkpoint", patterns=["ckpt"], cap_bytes=1000))
    assert store.put_checkpoint("r3", 1, res.stdout, at=200.0).skipped
    ck = store.checkpoint("r3")
    assert ck is not None and (ck.attempt, ck.synced_at) == (1, 100.0)
    assert json.loads((checkpoint_dir(store.fleet_data, "r3") / "ckpt" / "state.json").read_text()) == {"step": 40}
    # the next attempt: staged, moved into its run directory at launch, named by RIGSYNC_RESUME_DIR
    staged = _sh(home, remote.stage_resume_script("r3", 2), stdin=ck.tar)
    assert staged.returncode == 0, staged.stderr
    launch = _sh(home, remote.launch_script(
        run_id="r3", attempt=2, gpu_mask=(0,), command='cat "$RIGSYNC_RESUME_DIR/ckpt/state.json" >resumed.txt; '
        'echo "$RIGSYNC_RESUME_DIR" >"$RIGSYNC_RUN_DIR/where"', code_commit=None, desired_commit=None,
        metrics_file="m.jsonl", metric_key=None, metric_goal="max", max_runtime_s=60, sweep="s", params={}, seed=1,
    ))
    assert launch.returncode == 0, launch.stderr
    run2 = home / "rigsync" / "runs" / "r3.2"
    deadline = time.monotonic() + 20
    while not (run2 / "exit_code").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (run2 / "where").read_text().strip() == str(run2 / "resume")
    assert json.loads((home / "resumed.txt").read_text()) == {"step": 40}
    assert not (home / "rigsync" / "resume" / "r3.2").exists()
    res = _sh(home, remote.harvest_script("r3", 2, what="run", patterns=[], cap_bytes=1 << 20))
    assert store.put_attempt("r3", 2, res.stdout).resumed_from == 1


def test_downsample_keeps_at_most_200_points_with_first_last_and_extremes() -> None:
    pts = [(float(i), float((i * 37) % 101) - (500.0 if i == 777 else 0.0) + (900.0 if i == 4242 else 0.0))
           for i in range(10_000)]
    out = downsample(pts)
    assert len(out) <= MAX_POINTS
    assert out[0] == pts[0] and out[-1] == pts[-1]
    assert pts[777] in out and pts[4242] in out
    assert out == sorted(out) and downsample(pts) == out
    assert downsample(pts[:50]) == pts[:50]


def test_curve_file_is_small_and_deterministic() -> None:
    text = b"\n".join(json.dumps({"step": i * 10, "episode_reward": i * 1.2345678}).encode() for i in range(1000))
    pts = points_from_metrics(text + b"\ngarbage{\n", "episode_reward")
    assert len(pts) == 1000 and pts[1] == (10.0, 1.2345678)
    a = render_curve(sweep="s", run_id="r", attempt=2, key="episode_reward", goal="max", points=pts, resumed_from=1)
    doc = json.loads(a)
    assert doc["points_total"] == 1000 and len(doc["points"]) <= MAX_POINTS and doc["resumed_from"] == 1
    assert doc["points"][0] == [0, 0] and doc["points"][-1] == [9990, 1233.33]
    assert a == render_curve(sweep="s", run_id="r", attempt=2, key="episode_reward", goal="max", points=pts,
                             resumed_from=1)
    assert len(a) < 8000
    schema = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "observed-curve.schema.json").read_text())
    jsonschema.validate(doc, schema)


def test_stderr_tail_is_at_most_4_kib_and_starts_at_a_line() -> None:
    raw = b"".join(f"line {i} \u2713\n".encode() for i in range(2000))[-STDERR_TAIL_BYTES:]
    tail = _tail_text(raw)
    assert tail is not None and len(tail.encode()) <= STDERR_TAIL_BYTES
    assert tail.startswith("line ") and tail.endswith("line 1999 \u2713")



def _apply(world: FakeWorld, desired: Desired, observed: Observed, p: Plan, archive: FakeArchive,
           data: Path, controller_env: ControllerEnv | None = None) -> ApplyResult:
    ctx = ApplyContext(
        provider=world.provider, boxes=world.box_control, desired=desired, observed=observed, archive=archive,
        code_tar=code_tar, now=world.clock.now, store=LocalStore(data),
        controller_env=controller_env or ControllerEnv(),
    )
    return apply(p, ctx)


def _one_run_launched(tmp_path: Path) -> tuple[Desired, FakeWorld, FakeArchive, Path]:
    """One run (no retries) launched on its one box: rent, then ship code and launch."""
    desired = desired_state(1, max_instances=1, retries=0)
    world = FakeWorld([offer(1, gpus=1)], clock=FakeClock(), boot_s=10.0)
    archive = FakeArchive()
    data = tmp_path / "data"
    for _ in range(3):
        observed, p = observe_and_plan(world, desired, archive)
        assert _apply(world, desired, observed, p, archive, data).failures == []
        world.clock.advance(11.0)
    return desired, world, archive, data


def test_harvest_note_wording() -> None:
    assert harvest_note(Harvested(files=(("stderr.log", 3),), skipped=(), bytes=3, cap=10)) == "ok: 1 file(s), 3 B"


def test_a_finished_attempt_is_harvested_before_its_box_goes(tmp_path: Path) -> None:
    """The record harvests; a box that stops answering mid-harvest fails the record (nothing archived), and the
    surplus box waits (harvest_pending) until the record is in the archive; then it is destroyed."""
    desired, world, archive, data = _one_run_launched(tmp_path)
    ((iid, run),) = world.live_runs()
    run.end(world.clock.now(), 3)
    observed, p = observe_and_plan(world, desired, archive)
    assert [a.kind.value for a in p.actions] == ["record"]
    assert [n.code for n in p.noops if n.target == f"instance/{iid}"] == [ReasonCode.HARVEST_PENDING]
    world.fail_next("harvest", HostUnreachable("connection dropped mid-stream"))
    first = _apply(world, desired, observed, p, archive, data)
    assert len(first.failures) == 1 and not first.archived  # the next cycle harvests again
    observed, p = observe_and_plan(world, desired, archive)
    assert [a.kind.value for a in p.actions] == ["record"]  # still waiting: nothing destroyed
    second = _apply(world, desired, observed, p, archive, data)
    (rec,) = second.archived
    assert rec.phase is AttemptOutcome.FAILED and rec.harvest == "ok: 2 file(s), 0 B"
    assert (attempt_dir(data, rec.run_id, rec.attempt) / "stderr.log").is_file()
    observed, p = observe_and_plan(world, desired, archive)
    assert [(a.kind.value, a.code) for a in p.actions] == [("destroy", ReasonCode.SURPLUS)]


class _DownStore(LocalStore):
    """A store that is down: every harvest it is handed fails as the object store's adapter says so."""

    def put_attempt(self, run_id: str, attempt: int, tar: HarvestStream) -> Harvested:
        raise StoreUnavailable("the store s3://b at http://127.0.0.1:9 does not answer (EndpointConnectionError)")


def test_a_store_that_is_down_keeps_the_finished_attempt_on_its_box_until_the_next_cycle(tmp_path: Path) -> None:
    """Transient, never lost: the record fails (nothing archived, the box is not marked harvested, so it is kept),
    and once the store answers again the next cycle harvests it whole."""
    desired, world, archive, data = _one_run_launched(tmp_path)
    ((_iid, run),) = world.live_runs()
    run.end(world.clock.now(), 0)
    observed, p = observe_and_plan(world, desired, archive)
    ctx = ApplyContext(provider=world.provider, boxes=world.box_control, desired=desired, observed=observed,
                       archive=archive, code_tar=code_tar, now=world.clock.now, store=_DownStore(data))
    down = apply(p, ctx)
    assert len(down.failures) == 1 and not down.archived and "does not answer" in down.failures[0].detail
    observed, p = observe_and_plan(world, desired, archive)
    assert [a.kind.value for a in p.actions] == ["record"]
    (rec,) = _apply(world, desired, observed, p, archive, data).archived
    assert rec.phase is AttemptOutcome.SUCCEEDED and rec.harvest is not None and rec.harvest.startswith("ok")


def test_a_lost_attempt_says_what_was_lost(tmp_path: Path) -> None:
    desired = desired_state(1, max_instances=1)
    world = FakeWorld([offer(1, gpus=1)], clock=FakeClock(), boot_s=10.0)
    archive = FakeArchive()
    for _ in range(3):
        observed, p = observe_and_plan(world, desired, archive)
        assert _apply(world, desired, observed, p, archive, tmp_path).failures == []
        world.clock.advance(11.0)
    ((iid, _run),) = world.live_runs()
    world.vanish(iid)
    observed, _ = observe_and_plan(world, desired, archive)
    run_id = desired.runs[0].id
    lost = Requeue(reason="box vanished", code=ReasonCode.BOX_VANISHED, run_id=run_id, attempt=1, instance_id=iid)
    (lost,) = executable(desired, observed, [lost])  # the planner's last phase: its box is not contacted, and why
    out = _apply(world, desired, observed, Plan(actions=(lost,)), archive, tmp_path)
    assert out.archived[0].harvest == "lost: box vanished"


def test_a_failed_attempts_stderr_tail_hides_its_secrets_values(tmp_path: Path) -> None:
    """A job that prints its own token: the tail committed to the archive shows ``${NAME}``, literals stay."""
    base = desired_state(1, max_instances=1, retries=0)
    env = (("WANDB_API_KEY", "${WANDB_API_KEY}"), ("MODE", "fast"))
    desired = replace(
        base,
        sweeps=tuple(replace(w, env=env) for w in base.sweeps),
        runs=tuple(replace(r, sweep=replace(r.sweep, env=env)) for r in base.runs),
    )
    secret = "tok-5f1c0d6e9a"
    controller = ControllerEnv({JOB_SECRETS_ENV: "WANDB_API_KEY", "WANDB_API_KEY": secret})
    world = FakeWorld([offer(1, gpus=1)], clock=FakeClock(), boot_s=10.0)
    archive = FakeArchive()
    for _ in range(3):
        observed, p = observe_and_plan(world, desired, archive, frozenset({"WANDB_API_KEY"}))
        assert _apply(world, desired, observed, p, archive, tmp_path, controller).failures == []
        world.clock.advance(11.0)
    ((_iid, run),) = world.live_runs()
    world.job_stderr[(desired.runs[0].id, 1)] = f"mode fast\nwandb: key {secret} rejected\n".encode()
    run.end(world.clock.now(), 1)
    observed, p = observe_and_plan(world, desired, archive, frozenset({"WANDB_API_KEY"}))
    (rec,) = _apply(world, desired, observed, p, archive, tmp_path, controller).archived
    assert rec.stderr_tail == "mode fast\nwandb: key ${WANDB_API_KEY} rejected"
    assert all(secret not in repr(r) for r in archive.records())
