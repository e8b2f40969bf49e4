"""A sweep's job environment: resolution, redaction, identity, and the box side of the launch with a real bash.

The box-side tests run the real launch command (``remote.launch_script``) with a local bash in a temporary HOME,
feeding the environment on stdin as ``ShellBoxes.launch`` does over SSH, and then look where a secret must not
be: the run directory's files and every process's argv while the job runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import signal
import subprocess
import time
from pathlib import Path

import pytest
from fakes import flat_run_spec  # tests/unit is on sys.path (not a package)

from reconciler import remote
from reconciler.adapters.box_control import ShellBoxes
from reconciler.apply import ApplyContext, apply
from reconciler.core import jobenv
from reconciler.core.actions import Launch, Plan, ReasonCode
from reconciler.core.jobenv import ControllerEnv, JobEnv
from reconciler.core.model import Budget, Desired, Endpoint, Fleet, Instance, InstanceStatus, MetricGoal, Observed
from reconciler.desired import errors_of, load_desired, read_desired_files
from reconciler.desired.expand import run_id
from reconciler.errors import DesiredStateInvalid, SecretMissing
from reconciler.ports import CommandResult, LaunchJob

WANDB = (("WANDB_API_KEY", "${WANDB_API_KEY}"), ("MUJOCO_GL", "egl"))
ALLOW = {jobenv.JOB_SECRETS_ENV: "WANDB_API_KEY,HF_TOKEN"}  # the operator's allowlist (tests/unit/test_job_secrets.py)


# --------------------------------------------------------------------------------------------- the rules


def test_reference_is_the_whole_value_only() -> None:
    assert jobenv.reference("${WANDB_API_KEY}") == "WANDB_API_KEY"
    for text in ("x${WANDB_API_KEY}", "${WANDB_API_KEY}x", "$WANDB_API_KEY", "${lower}", "${}", "egl"):
        assert jobenv.reference(text) is None
    assert jobenv.references((*WANDB, ("ALSO", "${WANDB_API_KEY}"))) == ("WANDB_API_KEY",)


def test_names_rigsync_sets_or_that_change_how_the_shell_starts_are_refused() -> None:
    for name in ("RIGSYNC_RESUME_DIR", "CUDA_VISIBLE_DEVICES", "PATH", "HOME", "BASH_ENV", "LD_PRELOAD", "IFS", "UID"):
        assert jobenv.name_problem(name) is not None, name
    for name in ("WANDB_API_KEY", "MUJOCO_GL", "OMP_NUM_THREADS", "_X", "TOKENIZERS_PARALLELISM"):
        assert jobenv.name_problem(name) is None, name
    assert jobenv.name_problem("lower") is not None and jobenv.name_problem("1X") is not None


def test_a_secret_looking_literal_is_refused_without_quoting_it() -> None:
    why = jobenv.value_problem("HF_TOKEN", "hf_leakedvalue")
    assert why is not None and "${NAME}" in why and "hf_leakedvalue" not in why
    assert jobenv.value_problem("HF_TOKEN", "${HF_TOKEN}") is None
    assert jobenv.value_problem("TOKENIZERS_PARALLELISM", "false") is None  # a word part, not a prefix
    assert jobenv.value_problem("X", "${VAST_API_KEY}") is not None  # rigsync's own key never goes to a job
    leaked = "ghp_" + "a1B2" * 9  # a GitHub token's shape, under an innocent name
    why = jobenv.value_problem("CONFIG", leaked)
    assert why is not None and "credential" in why and leaked not in why
    assert jobenv.value_problem("CONFIG", "sk-learn") is None
    assert jobenv.value_problem("X", "${RIGSYNC_API_URL}") is not None


def test_a_command_that_expands_the_secret_itself_is_named() -> None:
    assert jobenv.expands_reference("python t.py --key $WANDB_API_KEY", ["WANDB_API_KEY"]) == "WANDB_API_KEY"
    assert jobenv.expands_reference("python t.py --key ${WANDB_API_KEY}", ["WANDB_API_KEY"]) == "WANDB_API_KEY"
    assert jobenv.expands_reference("echo $WANDB_API_KEY_ID", ["WANDB_API_KEY"]) is None
    assert jobenv.expands_reference("python t.py", ["WANDB_API_KEY"]) is None


def test_resolution_reads_the_controller_env_and_names_what_is_missing() -> None:
    env = ControllerEnv({**ALLOW, "WANDB_API_KEY": "s3cr3t-value"})
    job = env.resolve("tdmpc", WANDB)
    assert job.items() == (("WANDB_API_KEY", "s3cr3t-value"), ("MUJOCO_GL", "egl"))
    assert env.available(["WANDB_API_KEY", "HF_TOKEN"]) == frozenset({"WANDB_API_KEY"})
    with pytest.raises(SecretMissing) as caught:
        ControllerEnv({**ALLOW, "WANDB_API_KEY": ""}).resolve("tdmpc", WANDB)  # empty counts as not set
    assert str(caught.value) == (
        "sweep tdmpc needs WANDB_API_KEY from the controller's environment; it is not set"
    )


def test_a_job_env_never_shows_its_values() -> None:
    job = JobEnv([("WANDB_API_KEY", "s3cr3t-value"), ("MUJOCO_GL", "egl")])
    for shown in (repr(job), str(job), f"{job}", repr(LaunchJob(
        run_id="r", attempt=1, gpu_mask=(0,), command="true", code_commit=None, desired_commit=None, sweep="s",
        params=(), seed=0, metrics_file="m", metric_key=None, metric_goal=MetricGoal.MAX, max_runtime_s=1.0,
        env=job,
    )), repr(ControllerEnv({"WANDB_API_KEY": "s3cr3t-value"}))):
        assert "s3cr3t-value" not in shown
    assert "WANDB_API_KEY" in repr(job)
    assert job.redact("401: key s3cr3t-value refused") == "401: key ${WANDB_API_KEY} refused"
    assert job.stdin() == b"WANDB_API_KEY=s3cr3t-value\0MUJOCO_GL=egl\0"
    with pytest.raises(ValueError) as caught:
        JobEnv([("X", "a\0b")])
    assert "a\0b" not in str(caught.value)


def test_the_env_as_written_is_part_of_the_run_id_and_the_value_never_is() -> None:
    plain = run_id("s", [("lr", 1)], 1, "cmd")
    assert plain == run_id("s", [("lr", 1)], 1, "cmd", ())  # sweeps without env keep their ids
    with_env = run_id("s", [("lr", 1)], 1, "cmd", WANDB)
    assert with_env != plain
    assert run_id("s", [("lr", 1)], 1, "cmd", (("MUJOCO_GL", "osmesa"), WANDB[0])) != with_env  # a literal
    assert run_id("s", [("lr", 1)], 1, "cmd", tuple(reversed(WANDB))) == with_env  # order does not matter


# ------------------------------------------------------------------------------------------- apply side


class _RecordingShell:
    """A Shell that answers every command with a fixed result and keeps what it was given (no SSH here: the
    SSH adapter is proven by the integration test; this checks what ShellBoxes hands to it)."""

    def __init__(self, result: CommandResult) -> None:
        self.result = result
        self.calls: list[tuple[str, bytes | None]] = []

    def run(self, endpoint: Endpoint, command: str, *, stdin: bytes | None = None, timeout: float = 30.0
            ) -> CommandResult:
        self.calls.append((command, stdin))
        return self.result

    def run_many(self, targets: dict[int, tuple[Endpoint, str]], *, timeout: float = 10.0,
                 max_stdout: int | None = None) -> dict[int, CommandResult | Exception]:
        return {}

    def forget(self, endpoint: Endpoint) -> None:
        pass

    def close(self) -> None:
        pass


def _world(env: tuple[tuple[str, str], ...]) -> tuple[Desired, Observed, Plan]:
    spec = flat_run_spec(
        id="s-1", sweep="s", cell="c", params=(), seed=0, command="python t.py", priority=0, sweep_order=0, gpus=1,
        min_gpu_ram_mib=0, max_runtime_s=60.0, retries=0, metrics_file="m.jsonl", metric_key=None,
        metric_goal=MetricGoal.MAX, env=env,
    )
    desired = Desired(fleet=Fleet(name="lab"), budget=Budget(total_usd=1.0), sweeps=(), runs=(spec,))
    inst = Instance(id=5, label="rigsync:lab:x-1", status=InstanceStatus.RUNNING, gpu_name="RTX 3090", num_gpus=1,
                    gpu_ram_mib=24576, dph_total=0.1, start_date=0.0, direct=Endpoint("127.0.0.1", 22))
    launch = Launch(reason="pending", code=ReasonCode.PENDING_RUN, instance_id=5, run_id="s-1", attempt=1,
                    gpu_mask=(0,), command="python t.py", code_commit=None, sweep="s")
    return desired, Observed(instances=(inst,)), Plan(actions=(launch,))


def _ctx(shell: _RecordingShell, environ: dict[str, str], env: tuple[tuple[str, str], ...]) -> ApplyContext:
    desired, observed, _ = _world(env)
    return ApplyContext(
        provider=None,  # type: ignore[arg-type]  # a launch never calls the provider
        boxes=ShellBoxes(shell), desired=desired, observed=observed, archive=None,  # type: ignore[arg-type]
        code_tar=lambda c, p: b"", now=lambda: 100.0, controller_env=ControllerEnv({**ALLOW, **environ}),
    )


def test_launch_sends_the_env_on_stdin_and_never_in_the_command() -> None:
    value = "tok-" + secrets.token_hex(16)
    shell = _RecordingShell(CommandResult(0, b"4242\n", b""))
    result = apply(_world(WANDB)[2], _ctx(shell, {"WANDB_API_KEY": value}, WANDB))
    assert [o.ok for o in result.outcomes] == [True]
    (command, stdin), = shell.calls
    assert value not in command
    assert stdin == f"WANDB_API_KEY={value}\0MUJOCO_GL=egl\0".encode()


def test_launch_without_the_secret_fails_naming_it_and_contacts_nothing() -> None:
    shell = _RecordingShell(CommandResult(0, b"1\n", b""))
    result = apply(_world(WANDB)[2], _ctx(shell, {}, WANDB))
    assert shell.calls == []
    (outcome,) = result.outcomes
    assert not outcome.ok and "needs WANDB_API_KEY from the controller's environment" in outcome.detail


def test_an_error_echoing_the_value_is_redacted_before_it_becomes_an_outcome() -> None:
    value = "tok-" + secrets.token_hex(16)
    shell = _RecordingShell(CommandResult(1, b"", f"bash: {value}: command not found".encode()))
    result = apply(_world(WANDB)[2], _ctx(shell, {"WANDB_API_KEY": value}, WANDB))
    (outcome,) = result.outcomes
    assert not outcome.ok and value not in outcome.detail and "${WANDB_API_KEY}" in outcome.detail


# --------------------------------------------------------------------------------------------- box side


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    (h / "rigsync" / "code" / "c0ffee").mkdir(parents=True)
    return h


def _box_env(home: Path) -> dict[str, str]:
    return {"HOME": str(home), "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


def _launch(home: Path, command: str, stdin: bytes, records: int) -> subprocess.CompletedProcess[bytes]:
    script = remote.launch_script(
        run_id="r1", attempt=1, gpu_mask=(0,), command=command, code_commit="c0ffee", desired_commit=None,
        metrics_file="metrics.jsonl", metric_key=None, metric_goal="max", max_runtime_s=60.0, sweep="s",
        params={}, seed=0, env_records=records,
    )
    return subprocess.run(["bash", "-c", script], env=_box_env(home), input=stdin, capture_output=True,
                          timeout=30, check=False)


def _argv_of_every_process() -> list[bytes]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                out.append((entry / "cmdline").read_bytes())
    return out


def test_the_box_gives_the_value_to_the_job_only(home: Path) -> None:
    value = "tok-" + secrets.token_hex(16)
    want = hashlib.sha256(value.encode()).hexdigest()
    # the job proves the value arrived by writing its hash, then waits so its process list can be searched
    command = (
        'python3 -c "import hashlib,os; print(hashlib.sha256(os.environ[\'WANDB_API_KEY\'].encode()).hexdigest())"'
        ' > "$RIGSYNC_RUN_DIR/hash"; echo "$MUJOCO_GL" > "$RIGSYNC_RUN_DIR/gl"; sleep 2'
    )
    res = _launch(home, command, JobEnv([("WANDB_API_KEY", value), ("MUJOCO_GL", "egl")]).stdin(), 2)
    assert res.returncode == 0, res.stderr
    run_dir = home / "rigsync" / "runs" / "r1.1"
    pid = int((run_dir / "pid").read_text())
    try:
        deadline = time.monotonic() + 20
        while not (run_dir / "hash").exists() or not (run_dir / "hash").read_text().strip():
            assert time.monotonic() < deadline, "the job never wrote its hash"
            time.sleep(0.05)
        assert not any(value.encode() in argv for argv in _argv_of_every_process())
        wrapper_env = Path(f"/proc/{pid}/environ").read_bytes()
        assert value.encode() not in wrapper_env  # only the command's own process exports it
        deadline = time.monotonic() + 20
        while not (run_dir / "exit_code").exists():
            assert time.monotonic() < deadline, "the run never ended"
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    assert (run_dir / "hash").read_text().strip() == want
    assert (run_dir / "gl").read_text().strip() == "egl"
    assert (run_dir / "exit_code").read_text().strip() == "0"
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert value.encode() not in path.read_bytes(), path


def test_the_box_refuses_a_bad_record_before_the_lock_and_without_echoing_it(home: Path) -> None:
    for stdin, records in ((b"bad name=hunter2-value\0", 1), (b"NOEQUALS-hunter2-value\0", 1),
                           (b"A=hunter2-value\0", 2)):
        res = _launch(home, "true", stdin, records)
        assert res.returncode == 1
        assert b"hunter2-value" not in res.stderr + res.stdout and b"launch: " in res.stderr
        assert not (home / "rigsync" / "runs" / "r1.1").exists()


def test_without_records_the_launch_never_reads_its_stdin(home: Path) -> None:
    script = remote.launch_script(
        run_id="r2", attempt=1, gpu_mask=(0,), command="true", code_commit="c0ffee", desired_commit=None,
        metrics_file="metrics.jsonl", metric_key=None, metric_goal="max", max_runtime_s=60.0, sweep="s",
        params={}, seed=0,
    )
    read_end, write_end = os.pipe()  # a stdin that never ends: reading it would hang the launch
    try:
        res = subprocess.run(["bash", "-c", script], env=_box_env(home), stdin=read_end, capture_output=True,
                             timeout=30, check=False)
    finally:
        os.close(read_end)
        os.close(write_end)
    assert res.returncode == 0, res.stderr
    run_dir = home / "rigsync" / "runs" / "r2.1"
    deadline = time.monotonic() + 20
    while not (run_dir / "exit_code").exists():
        assert time.monotonic() < deadline, "the run never ended"
        time.sleep(0.05)


# ------------------------------------------------------------------------------------------------ loader

REPO = Path(__file__).resolve().parents[2]
CASES = Path(__file__).resolve().parent / "loader_cases"


def _with_sweep(text: str) -> dict[str, bytes]:
    files = dict(read_desired_files(REPO))
    files["desired/sweeps/tdmpc.yaml"] = text.encode()
    return files


SWEEP = """\
name: tdmpc
code: [experiments]
command: "{{ python }} experiments/train.py --seed {{ seed }}"
seeds: [1, 2]
"""


def test_a_valid_env_loads_as_written_and_joins_the_run_ids() -> None:
    plain = load_desired(_with_sweep(SWEEP))
    desired = load_desired(_with_sweep(SWEEP + "env:\n  WANDB_API_KEY: ${WANDB_API_KEY}\n  OMP_NUM_THREADS: 4\n"))
    (sweep,) = desired.sweeps
    assert sweep.env == (("WANDB_API_KEY", "${WANDB_API_KEY}"), ("OMP_NUM_THREADS", "4"))
    assert all(r.sweep.env == sweep.env for r in desired.runs)
    assert {r.id for r in desired.runs}.isdisjoint({r.id for r in plain.runs})


@pytest.mark.parametrize("case", ["env_secret_literal", "env_schema"])
def test_loader_errors_never_quote_an_env_value(case: str) -> None:
    text = (CASES / case / "desired" / "sweeps" / "tdmpc.yaml").read_text()
    with pytest.raises(DesiredStateInvalid) as caught:
        load_desired(_with_sweep(text))
    shown = str(caught.value) + "\n".join(str(e) for e in errors_of(caught.value))
    assert "0123456789abcdef" not in shown and "s3cr3t" not in shown
