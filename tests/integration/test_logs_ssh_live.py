"""`rigsync logs` and `rigsync ssh` as a user runs them: the console script against the emulator, with a real run.

The run is launched by `rigsync apply --yes` cycles onto a real sshd box; `logs` reads it there over SSH (once,
then with `--follow` until it ends), `ssh --print` gives an OpenSSH command that really logs in with rigsync's key
and the pinned host key, and after the box is destroyed `logs` reads the local result store. The harvest that fills
the store is another branch: this test places the files at ``store.attempt_dir`` itself, copied from the box
(through the `ssh --print` command) before destroying it, which is exactly the layout the harvest writes.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml
from waiting import wait_for
from world import RIGSYNC, emulator_env, fleet_repo, rigsync

from reconciler.adapters.store import attempt_dir, data_dir_for
from reconciler.core.model import Ownership
from reconciler.desired import load_desired_from_dir
from reconciler.emulator import Emulator

FLEET = "itlogs"
MAX_APPLIES = 40
OTHER_KEY = "AAAAC3NzaC1lZDI1NTE5AAAAIBQ1ciaXn6Ha0sKrTqDgMNmNcdiGMbxzMQtIPyDD7nl/"  # some ed25519 key, not the box's

pytestmark = pytest.mark.integration

# One run: an ESC sequence and a line on stderr first, the training script's lines, then it waits for the test to
# let it end (the file GO in the box's home: the test decides when the run is over, not a clock), a last stderr line.
GO = "go-logs"
SWEEP = f"""\
name: tdmpc
code: [experiments]
command: >-
  printf 'start \\033[31mred\\033[0m\\n'; echo warming-up >&2;
  {{{{ python }}}} experiments/train.py --task {{{{ task }}}} --lr {{{{ lr }}}} --seed {{{{ seed }}}}
  --out {{{{ run_dir }}}}/metrics.jsonl --seconds 2 --evals 6;
  until [ -e "$HOME/{GO}" ]; do sleep 0.1; done; echo finished >&2
grid:
  task: [walker-walk]
  lr: [1.0e-3]
seeds: [1]
max_runtime: 5m
metrics:
  file: metrics.jsonl
  key: episode_reward
  goal: max
"""
# min 1 and a long idle_timeout: the box stays up after the run until the test destroys it
TIMEOUTS = {"min": 1, "idle_timeout": "30m", "unreachable_grace": "3s", "heartbeat_stale": "8s",
            "boot_timeout": "1m"}


@pytest.fixture(scope="module")
def repo(emulator: Emulator, tmp_path_factory: pytest.TempPathFactory) -> Path:
    fleet = fleet_repo(tmp_path_factory.mktemp("logs") / "fleet")
    fleet.edit_fleet(name=FLEET, **TIMEOUTS)
    fleet.write("desired/sweeps/tdmpc.yaml", SWEEP)
    fleet.commit("test: one chatty run", push=False)
    return fleet.work


@pytest.fixture(scope="module")
def env(emulator: Emulator, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return emulator_env(emulator, state_dir=tmp_path_factory.mktemp("state"), data_dir=tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def run_id(repo: Path) -> str:
    runs = load_desired_from_dir(repo).runs
    assert len(runs) == 1
    return runs[0].id


def owned(emu: Emulator) -> list[int]:
    return [i for i in emu.instance_ids()
            if (o := Ownership.parse(str(emu.instance(i).get("label") or ""))) is not None and o.fleet == FLEET]


def run_entry(repo: Path, run_id: str) -> dict[str, object]:
    doc = yaml.safe_load((repo / "observed" / "runs.yaml").read_text())
    entry: dict[str, object] = doc["sweeps"]["tdmpc"][run_id]
    return entry


class Follower:
    """``rigsync logs RUN --follow`` running, what it printed so far read as it comes (``out``, line by line); its
    stderr goes to a file (``errs``), with Python's fault handler on to say where it is if it ever hangs."""

    def __init__(self, env: dict[str, str], run_id: str, repo: Path, errs: Path) -> None:
        self.errs = errs
        with open(errs, "wb") as err:
            self.proc = subprocess.Popen(
                [str(RIGSYNC), "logs", run_id, "--follow", "--repo", str(repo)],
                env={**env, "PYTHONFAULTHANDLER": "1"}, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                text=True,
            )
        self.out: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.out.append(line)

    def end(self) -> tuple[int, str, str]:
        """Its exit code, everything it printed and its stderr, once it ended."""
        try:
            code = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            masks = _signal_masks(f"/proc/{self.proc.pid}/status") + " (this test: " + _signal_masks(
                "/proc/thread-self/status") + ")"
            self.proc.send_signal(signal.SIGABRT)  # the fault handler prints every thread's stack
            self.proc.wait(timeout=30)
            stacks = self.errs.read_text(errors="replace")[-6000:]
            raise AssertionError(f"--follow did not end; its signals {masks}: {stacks}") from None
        self._reader.join(timeout=30)
        return code, "".join(self.out), self.errs.read_text()


def _signal_masks(status: str) -> str:
    """The signal lines of a /proc status file (SigPnd, SigBlk, SigIgn, SigCgt)."""
    with contextlib.suppress(OSError):
        return "; ".join(ln for ln in Path(status).read_text().splitlines() if ln.startswith(("Sig", "ShdPnd")))
    return "(gone)"


def test_logs_before_any_launch(repo: Path, env: dict[str, str], run_id: str) -> None:
    pending = rigsync(env, "logs", run_id[:10], "--repo", str(repo))
    assert pending.returncode == 1 and pending.stdout == ""
    assert pending.stderr == f"rigsync: error: run {run_id} has not been launched yet (pending)\n"
    typo = run_id[:-1] + ("0" if run_id[-1] != "0" else "1")
    unknown = rigsync(env, "logs", typo, "--repo", str(repo))
    assert unknown.returncode == 1
    assert unknown.stderr == f"rigsync: error: unknown run {typo!r}; did you mean {run_id}?\n"
    nobox = rigsync(env, "ssh", "99999999", "--repo", str(repo))
    assert nobox.returncode == 1
    assert nobox.stderr == "rigsync: error: box 99999999 is not in the provider's instance list (destroyed?)\n"


def test_logs_and_ssh_through_a_run_and_after_its_box(
    repo: Path, env: dict[str, str], run_id: str, emulator: Emulator, tmp_path: Path
) -> None:
    # launch it: one `apply --yes` per cycle (rent, boot, bootstrap, ship code, launch)
    for _ in range(MAX_APPLIES):
        applied = rigsync(env, "apply", "--repo", str(repo), "--yes")
        assert applied.returncode == 0, applied.stdout + applied.stderr
        if (repo / "observed" / "runs.yaml").is_file() and run_entry(repo, run_id)["phase"] == "running":
            break
        time.sleep(0.3)
    else:
        pytest.fail("the run was never launched")
    box = int(str(run_entry(repo, run_id)["instance"]))
    assert owned(emulator) == [box]
    name = f"{run_id}.1"

    # from the box while it runs: escaped by default, the bytes with --raw, stderr with --stderr
    def logs_now() -> subprocess.CompletedProcess[str] | None:
        now = rigsync(env, "logs", run_id[:12], "--repo", str(repo))
        assert now.returncode == 0, now.stderr
        return now if "training walker-walk" in now.stdout else None

    now = wait_for("the training's first line", logs_now, 30, every=0.5)
    assert now.stdout.startswith("start \\x1b[31mred\\x1b[0m\ntraining walker-walk lr=0.001 seed=1"), now.stdout
    raw = rigsync(env, "logs", run_id, "--raw", "--repo", str(repo))
    assert raw.stdout.startswith("start \x1b[31mred\x1b[0m\n")
    err = rigsync(env, "logs", name, "--stderr", "--repo", str(repo))
    assert err.returncode == 0 and err.stdout == "warming-up\n"

    # ssh --print: the same command for the box and for the run; it logs in with the pinned key, non-interactively
    by_box = rigsync(env, "ssh", str(box), "--print", "--repo", str(repo))
    by_run = rigsync(env, "ssh", run_id, "--print", "--repo", str(repo))
    assert by_box.returncode == 0 and by_run.returncode == 0, by_box.stderr + by_run.stderr
    assert by_box.stdout == by_run.stdout
    argv = shlex.split(by_box.stdout)
    state = Path(env["RIGSYNC_STATE_DIR"]) / FLEET
    assert argv[:3] == ["ssh", "-i", str(state / "id_ed25519")] and "StrictHostKeyChecking=yes" in argv
    batch = [argv[0], "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", *argv[1:]]
    ok = subprocess.run([*batch, "--", "echo", "ok"], capture_output=True, text=True, timeout=60,
                        stdin=subprocess.DEVNULL)
    assert (ok.returncode, ok.stdout) == (0, "ok\n"), ok.stderr
    # the pin is what is trusted, under the box's instance (HostKeyAlias), not its address: the same command with
    # another key pinned for that instance is refused
    pinned = (state / "known_hosts").read_text()
    alias = next(a.split("=", 1)[1] for a in argv if a.startswith("HostKeyAlias="))
    assert alias == f"vast-instance-{box}" and pinned.startswith(f"{alias} "), pinned
    other = tmp_path / "known_hosts"
    other.write_text(f"{alias} ssh-ed25519 {OTHER_KEY}\n")
    swapped = [f"UserKnownHostsFile={other}" if a.startswith("UserKnownHostsFile=") else a for a in batch]
    refused = subprocess.run([*swapped, "--", "echo", "ok"], capture_output=True, text=True, timeout=60,
                             stdin=subprocess.DEVNULL)
    assert refused.returncode == 255 and "Host key verification failed" in refused.stderr, refused.stderr

    # a state dir that never reached the box (rigsync's key, no pins): its first contact pins the key, as a probe does
    fresh = tmp_path / "fresh-state"
    (fresh / FLEET).mkdir(parents=True)
    shutil.copy2(state / "id_ed25519", fresh / FLEET / "id_ed25519")
    first = rigsync({**env, "RIGSYNC_STATE_DIR": str(fresh)}, "ssh", str(box), "--print", "--repo", str(repo))
    assert first.returncode == 0, first.stderr
    assert first.stderr == f"rigsync: pinned box {box}'s host key in {fresh / FLEET / 'known_hosts'} (first contact)\n"
    assert (fresh / FLEET / "known_hosts").read_text() == pinned
    fresh_argv = shlex.split(first.stdout)
    again = subprocess.run([fresh_argv[0], "-o", "BatchMode=yes", *fresh_argv[1:], "--", "echo", "ok"],
                           capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert (again.returncode, again.stdout) == (0, "ok\n"), again.stderr

    # Ctrl-C during --follow (once it printed what was there): a clean stop, no traceback
    interrupted = Follower(env, run_id, repo, tmp_path / "interrupted.err")
    wait_for("--follow to print the log so far", lambda: interrupted.out, 60)
    interrupted.proc.send_signal(signal.SIGINT)
    code, _, errs = interrupted.end()
    assert code == 130 and errs.endswith("rigsync: interrupted\n") and "Traceback" not in errs, errs

    # --follow until the attempt ends: every step, then the end said on stderr; it waits for the end (still following
    # when the run is let go) rather than printing what was there
    follower = Follower(env, run_id, repo, tmp_path / "followed.err")
    wait_for("--follow to print the sixth step", lambda: "step 6000 " in "".join(follower.out), 60)
    assert follower.proc.poll() is None, "--follow ended before the attempt did"
    (emulator.host_root(box) / GO).touch()
    code, out, errs = follower.end()
    assert code == 0, errs
    assert errs == f"rigsync: attempt {name} ended with exit code 0\n"
    steps = re.findall(r"^step (\d+) episode_reward", out, re.M)
    assert steps == [str(1000 * i) for i in range(1, 7)], out
    tail = rigsync(env, "logs", run_id, "--stderr", "--follow", "--tail", "1", "--repo", str(repo))
    assert (tail.stdout, tail.stderr) == ("finished\n", f"rigsync: attempt {name} ended with exit code 0\n")

    # what was on the box, for the store below (fetched with the `ssh --print` command)
    on_box = {}
    for f in ("stdout.log", "stderr.log", "exit_code"):
        got = subprocess.run([*batch, "--", "cat", f"rigsync/runs/{name}/{f}"], capture_output=True, timeout=60,
                             stdin=subprocess.DEVNULL)
        assert got.returncode == 0, got.stderr
        on_box[f] = got.stdout
    assert on_box["exit_code"] == b"0\n"

    # the next cycle archives the attempt; the box lives on (idle_timeout is long): logs still come from it
    applied = rigsync(env, "apply", "--repo", str(repo), "--yes")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert run_entry(repo, run_id)["phase"] == "succeeded" and owned(emulator) == [box]
    finished = rigsync(env, "logs", run_id, "--repo", str(repo))
    assert finished.returncode == 0 and finished.stdout == out
    not_running = rigsync(env, "ssh", run_id, "--repo", str(repo))
    assert not_running.returncode == 1
    assert not_running.stderr.startswith(f"rigsync: error: run {run_id} is not running (succeeded): its last attempt "
                                         f"{name} ran on box {box}; ")

    # the box is gone and nothing was harvested: one clear line
    emulator.destroy_instance(box)
    empty = tmp_path / "empty-store"
    gone = rigsync(env, "logs", run_id, "--repo", str(repo), "--data-dir", str(empty))
    assert gone.returncode == 1 and gone.stdout == ""
    assert gone.stderr.startswith(f"rigsync: error: box {box} was destroyed and its logs were not harvested "
                                  f"(attempt {name}: nothing at {empty / FLEET / 'runs' / name})"), gone.stderr
    no_box = rigsync(env, "ssh", str(box), "--repo", str(repo))
    assert no_box.returncode == 1 and "is not in the provider's instance list" in no_box.stderr

    # harvested: the store's copy is read, without the provider (no key, no URL needed)
    store = tmp_path / "store"
    where = attempt_dir(data_dir_for(FLEET, store), run_id, 1)
    where.mkdir(parents=True)
    for f, blob in on_box.items():
        (where / f).write_bytes(blob)
    offline = {k: v for k, v in env.items() if k not in ("VAST_API_KEY", "RIGSYNC_API_URL")}
    from_store = rigsync(offline, "logs", run_id, "--repo", str(repo), "--data-dir", str(store))
    assert (from_store.returncode, from_store.stdout) == (0, out), from_store.stderr
    last2 = rigsync(offline, "logs", name, "--tail", "2", "--repo", str(repo), "--data-dir", str(store))
    assert last2.stdout.splitlines() == out.splitlines()[-2:]
    stored_err = rigsync(offline, "logs", run_id, "--stderr", "--follow", "--repo", str(repo), "--data-dir",
                         str(store))
    assert (stored_err.stdout, stored_err.stderr) == (
        "warming-up\nfinished\n", f"rigsync: attempt {name} ended with exit code 0\n")
