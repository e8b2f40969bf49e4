"""The box's kill switch (reconciler/box/watchdog.py): its decision as a pure function, what it reads on the box,
the one API call it makes, and the onstart that starts it -- run for real with a local bash against a local HTTP
server standing in for the provider.
"""

from __future__ import annotations

import ast
import base64
import contextlib
import dataclasses
import gzip
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeArchive, FakeClock, FakeWorld, code_tar, desired_state, offer

from reconciler import box, remote
from reconciler.apply import ApplyContext, apply
from reconciler.box import probe as probe_mod
from reconciler.box import watchdog as wd
from reconciler.box.boxlib import Activity, box_activity
from reconciler.box.watchdog import CONTROLLER_GRACE_S, decide
from reconciler.core.model import Controller, FleetMemory
from reconciler.observe import observe
from reconciler.plan import plan
from reconciler.remote import commands

PKG = Path(box.__file__).resolve().parent
KEY = "per-instance-key-" + "k" * 40

# ------------------------------------------------------------------------------------------- decide()

T0 = 1_000_000.0
LIMITS = {"ttl_s": 3600.0, "idle_timeout_s": 300.0, "orphan_timeout_s": 1800.0}


def _decide(now: float, **kw: Any) -> str | None:
    args: dict[str, Any] = {
        "started_at": T0, **LIMITS, "touched_at": None, "run_activity_at": None, "run_alive": False, **kw,
    }
    v = decide(now, **args)
    return None if v is None else v.reason


def test_a_fresh_box_is_kept() -> None:
    assert _decide(T0) is None
    assert _decide(T0 + 10, touched_at=T0 + 5) is None


def test_ttl_ends_the_box_busy_or_not_and_before_anything_else() -> None:
    assert _decide(T0 + 3599, run_alive=True, touched_at=T0 + 3598) is None
    assert _decide(T0 + 3600, run_alive=True, touched_at=T0 + 3599, run_activity_at=T0 + 3600) == "ttl"
    v = decide(T0 + 3700, started_at=T0, ttl_s=3600, idle_timeout_s=1, orphan_timeout_s=1, touched_at=None,
               run_activity_at=None, run_alive=False)
    assert v is not None and v.reason == "ttl" and "ttl 3600s" in v.text


def test_no_ttl_means_no_ttl_rule() -> None:
    assert _decide(T0 + 10 * 86400, ttl_s=None, run_alive=True, touched_at=T0 + 10 * 86400 - 1) is None


def test_orphan_counts_from_the_last_touch_or_the_box_start() -> None:
    # Never probed: the box's start is the last contact.
    assert _decide(T0 + 1799, run_alive=True) is None
    assert _decide(T0 + 1800, run_alive=True) == "orphan"
    # Probed at +1000: orphan at +2800, busy or not.
    assert _decide(T0 + 2799, run_alive=True, touched_at=T0 + 1000) is None
    assert _decide(T0 + 2800, run_alive=True, touched_at=T0 + 1000) == "orphan"
    # A touch older than the box's start (a file from before a restart) does not move the start back.
    assert _decide(T0 + 1800, run_alive=True, touched_at=T0 - 500) == "orphan"
    assert _decide(T0 + 1799, run_alive=True, touched_at=T0 - 500) is None


def test_idle_needs_no_live_run_quiet_for_idle_timeout_and_no_controller_for_the_grace() -> None:
    ran = T0 + 100  # the last run ended here
    # A live run is never idle, whatever the times say.
    assert _decide(T0 + 1000, run_activity_at=ran, touched_at=T0 + 100, run_alive=True) is None
    # Controller gone at +100: idle once both idle_timeout after the last activity and the grace have passed.
    assert _decide(ran + 299, run_activity_at=ran, touched_at=T0 + 100) is None
    assert _decide(ran + 300, run_activity_at=ran, touched_at=T0 + 100) == "idle"
    # A short idle_timeout still waits for the grace after the controller's last probe.
    short = {"idle_timeout_s": 5.0}
    assert _decide(T0 + 100 + CONTROLLER_GRACE_S - 1, run_activity_at=ran, touched_at=T0 + 100, **short) is None
    assert _decide(T0 + 100 + CONTROLLER_GRACE_S, run_activity_at=ran, touched_at=T0 + 100, **short) == "idle"


def test_a_live_controller_keeps_its_idle_boxes() -> None:
    """Each probe restarts the idle window: retiring idle boxes is the controller's call while it is there."""
    for k in range(1, 20):
        now = T0 + k * 250
        assert _decide(now, ttl_s=None, touched_at=now - 30, run_activity_at=T0) is None


def test_a_run_that_started_after_the_idle_window_began_counts() -> None:
    # Idle since +100 (no controller, nothing ran); a run was created at +350 and ended at +390: the window
    # restarts at +390, so at +420 (where the window from +100 would have expired) the box is kept.
    assert _decide(T0 + 420, run_activity_at=None) == "idle"
    assert _decide(T0 + 420, run_activity_at=T0 + 390) is None
    assert _decide(T0 + 690, run_activity_at=T0 + 390) == "idle"


def test_a_box_never_probed_gets_the_grace_and_idle_timeout_from_its_start() -> None:
    short = {"idle_timeout_s": 1.0}
    assert _decide(T0 + CONTROLLER_GRACE_S - 1, **short) is None
    assert _decide(T0 + CONTROLLER_GRACE_S, **short) == "idle"


def test_times_in_the_future_never_destroy() -> None:
    """A clock that stepped back: negative ages are simply not due."""
    assert _decide(T0 + 10, touched_at=T0 + 5000, run_activity_at=T0 + 6000) is None


def test_check_interval_is_a_tenth_of_the_shortest_limit_within_1_and_30_s() -> None:
    assert wd.check_interval(None, 600, 1800) == 30.0
    assert wd.check_interval(43200, 120, 1800) == 12.0
    assert wd.check_interval(None, 5, 3) == 1.0


# ---------------------------------------------------------------------------------- what it reads


def test_run_activity_reads_run_directories_and_bootstrap_markers(tmp_path: Path) -> None:
    root = tmp_path / "rigsync"
    assert box_activity(str(root)) == Activity(False, None)
    done = root / "runs" / "a.0"
    done.mkdir(parents=True)
    (done / "pid").write_text("999999999\n")  # no such process
    (done / "started_at").write_text("1000.5\n")
    (done / "ended_at").write_text("1100.25\n")
    (done / "heartbeat").touch()
    os.utime(done / "heartbeat", (1090, 1090))
    os.utime(done, (1050, 1050))
    assert box_activity(str(root)) == Activity(False, 1100.25)

    fresh = root / "runs" / "b.0"  # just created by a launch: the directory's own mtime counts
    fresh.mkdir()
    act = box_activity(str(root))
    assert not act.alive and act.last_at is not None and act.last_at > 1100.25

    (fresh / "pid").write_text(f"{os.getpid()}\n")
    assert box_activity(str(root)).alive

    (fresh / "pid").unlink()
    boot = root / "bootstrap"
    boot.mkdir()
    (boot / "h1.pid").write_text(f"{os.getpid()}\n")
    assert box_activity(str(root)).alive, "a running bootstrap counts as alive"
    (boot / "h1.ok").touch()
    assert not box_activity(str(root)).alive, "a finished bootstrap's pid file is history"


def test_box_start_is_recorded_once(tmp_path: Path) -> None:
    assert wd.record_start(str(tmp_path), 500.0) == 500.0
    assert wd.record_start(str(tmp_path), 900.0) == 500.0


def test_the_probe_touches_the_file_the_watchdog_reads(tmp_path: Path) -> None:
    assert os.path.join(*probe_mod.WATCHDOG_TOUCH) == os.path.join(wd.DIR, wd.TOUCH_FILE)
    root = tmp_path / "rigsync"
    before = time.time() - 1
    res = subprocess.run(
        [sys.executable, "-S", "-c", commands._program("probe.py")], env={"HOME": str(tmp_path), "PATH": os.defpath,
                                                      "RIGSYNC_ROOT": str(root)},
        capture_output=True, timeout=60, check=False,
    )
    assert res.returncode == 0, res.stderr
    touched = root / wd.DIR / wd.TOUCH_FILE
    assert touched.stat().st_mtime >= before


# ------------------------------------------------------------------------ a stand-in provider API


@dataclasses.dataclass
class FakeApi:
    """A local HTTP server answering the watchdog's DELETE; ``answers`` are popped per request (then 200)."""

    server: ThreadingHTTPServer
    requests: list[dict[str, Any]]
    answers: list[tuple[int, bytes]]

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"


@pytest.fixture
def api() -> Iterator[FakeApi]:
    state = FakeApi(None, [], [])  # type: ignore[arg-type]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_DELETE(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else b""
            state.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body,
                                   "at": time.time()})
            status, payload = state.answers.pop(0) if state.answers else (200, b'{"success": true}')
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.server = server
    # a short poll: shutdown() waits for serve_forever to notice it, up to one interval
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    t.start()
    yield state
    server.shutdown()
    server.server_close()


def test_destroy_sends_delete_with_the_instance_key_to_the_configured_url(api: FakeApi) -> None:
    ok, what = wd.destroy(api.url + "/", "42", KEY)
    assert ok and "destroy accepted" in what
    (req,) = api.requests
    assert req["path"] == "/api/v0/instances/42/" and req["auth"] == f"Bearer {KEY}" and req["body"] == b"{}"
    assert KEY not in what


@pytest.mark.parametrize(
    ("status", "payload", "done", "shown"),
    [
        (404, b'{"success": false, "error": "no_such_instance", "msg": "Instance 42 not found."}', True, "gone"),
        (200, b'{"success": false, "error": "no_such_instance"}', True, "gone"),
        (429, b"API requests too frequent", False, "HTTP 429: API requests too frequent"),
        (401, b'{"success": false, "error": "auth_error", "msg": "Invalid user key"}', False, "Invalid user key"),
        (500, b'{"success": false, "error": "server_error"}', False, "HTTP 500"),
        (200, b'{"success": false, "error": "invalid_args", "msg": "nope"}', False, "refused: nope"),
    ],
)
def test_destroy_answers(api: FakeApi, status: int, payload: bytes, done: bool, shown: str) -> None:
    api.answers.append((status, payload))
    ok, what = wd.destroy(api.url, "42", KEY)
    assert ok is done and shown in what and KEY not in what


def test_destroy_with_nothing_listening_is_retryable() -> None:
    ok, what = wd.destroy("http://127.0.0.1:9", "42", KEY, timeout=5)
    assert not ok and what and KEY not in what


# ---------------------------------------------------------------------------------- the shipped files


def test_the_watchdog_keeps_to_python_3_8_and_the_standard_library() -> None:
    tree = ast.parse((PKG / "watchdog.py").read_text(), feature_version=(3, 8))
    imported: set[str] = set()
    for node in ast.walk(tree):
        assert not isinstance(node, ast.Match)
        if isinstance(node, ast.Import):
            imported.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.module.startswith("reconciler.box."):
            imported.add(node.module.split(".")[0])
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


def _unpack(onstart: str) -> str:
    m = re.search(r"printf %s (\S+) \| base64 -d \| gzip -dc \| bash", onstart)
    assert m, onstart
    return gzip.decompress(base64.b64decode(m.group(1))).decode()


def test_the_onstart_carries_the_files_and_the_limits_and_no_secret() -> None:
    onstart = remote.watchdog_onstart(ttl_s=43200, idle_timeout_s=600, orphan_timeout_s=1800)
    assert len(onstart) < 10_000, "the onstart field is meant for a short script: keep it a few KiB"
    command = _unpack(onstart)
    assert command.startswith(commands._ENV)
    program, runner, start = "watchdog.py", "watchdog_run.sh", "watchdog_start.sh"
    for text in (commands._program(program), commands._text(runner), commands._script(start)):
        assert shlex.quote(text) in command
    assert command.endswith(" 43200.0 600.0 1800.0")
    assert "ttl 43200.0" in onstart and "orphan_timeout 1800.0" in onstart
    for word in ("CONTAINER_API_KEY=", "Bearer ", "http://", "https://"):
        assert word not in onstart.split("printf")[0]
    none = _unpack(remote.watchdog_onstart(ttl_s=None, idle_timeout_s=60, orphan_timeout_s=60))
    assert none.endswith(" none 60.0 60.0")
    with pytest.raises(ValueError, match="positive"):
        remote.watchdog_onstart(ttl_s=None, idle_timeout_s=60, orphan_timeout_s=0)


def test_rent_installs_the_watchdog_with_the_fleets_limits() -> None:
    desired = desired_state(1, max_instances=1)
    fleet = dataclasses.replace(desired.fleet, ttl_s=7200.0, idle_timeout_s=120.0, orphan_timeout_s=900.0)
    desired = dataclasses.replace(desired, fleet=fleet)
    world = FakeWorld([offer(1)], clock=FakeClock(), boot_s=10.0)
    seen: list[dict[str, Any]] = []
    real = world.provider.create_instance

    def create(offer_id: int, **kw: Any) -> int:
        seen.append(kw)
        return real(offer_id, **kw)

    world.provider.create_instance = create  # type: ignore[method-assign]
    archive = FakeArchive()
    now = world.clock.now()
    observed, _ = observe(desired, world.provider, world.box_control, (), FleetMemory(), now)
    ctx = ApplyContext(provider=world.provider, boxes=world.box_control, desired=desired, observed=observed,
                       archive=archive, code_tar=code_tar, now=world.clock.now)
    assert apply(plan(desired, observed, Controller(), now), ctx).failures == []
    (kw,) = seen
    assert kw["onstart"] == remote.watchdog_onstart(ttl_s=7200.0, idle_timeout_s=120.0, orphan_timeout_s=900.0)


# ------------------------------------------------------------------- the onstart, run for real


@dataclasses.dataclass
class LocalBox:
    home: Path
    env: dict[str, str]

    @property
    def wdir(self) -> Path:
        return self.home / "rigsync" / "watchdog"

    def onstart(self, text: str) -> subprocess.CompletedProcess[str]:
        script = self.home / "onstart.sh"
        script.write_text(text)
        return subprocess.run(["bash", str(script)], env=self.env, capture_output=True, text=True, timeout=60,
                              check=False)

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.wdir / "watchdog.log").read_text()
        return ""

    def supervisor(self) -> int:
        return int((self.wdir / "pid").read_text())


def _wait(what: str, cond: Any, limit: float = 30.0) -> Any:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def local_box(tmp_path: Path, api: FakeApi) -> Iterator[LocalBox]:
    home = tmp_path / "home"
    home.mkdir()
    env = {
        "HOME": str(home), "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.defpath]),
        "CONTAINER_ID": "4242", "CONTAINER_API_KEY": KEY, remote.WATCHDOG_API_URL_ENV: api.url,
    }
    box = LocalBox(home, env)
    yield box
    # The supervisor runs in a session of its own: end that whole group.
    with contextlib.suppress(OSError, ValueError):
        os.killpg(box.supervisor(), signal.SIGKILL)


def test_the_onstart_starts_one_detached_watchdog_that_destroys_its_instance(local_box: LocalBox, api: FakeApi) -> None:
    res = local_box.onstart(remote.watchdog_onstart(ttl_s=None, idle_timeout_s=600, orphan_timeout_s=2))
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("started "), res.stdout
    sup = local_box.supervisor()
    assert os.getsid(sup) == sup, "the supervisor leads a session of its own (detached from the onstart)"
    assert (local_box.wdir / "watchdog.py").read_text() == commands._program("watchdog.py")
    again = local_box.onstart(remote.watchdog_onstart(ttl_s=None, idle_timeout_s=600, orphan_timeout_s=2))
    assert again.stdout.strip() == "running" and local_box.supervisor() == sup

    _wait("the DELETE", lambda: api.requests, 30)
    req = api.requests[0]
    assert req["path"] == "/api/v0/instances/4242/" and req["auth"] == f"Bearer {KEY}"
    log = _wait("the log line", lambda: "destroy 4242: HTTP 200" in local_box.log() and local_box.log())
    assert "orphan: no controller" in log and KEY not in log
    started = float((local_box.wdir / "started_at").read_text())
    assert req["at"] - started >= 2.0


@pytest.mark.integration  # a real watchdog process waited on for seconds: CI's tier, not the fast loop
def test_the_api_call_is_retried_until_it_succeeds(local_box: LocalBox, api: FakeApi) -> None:
    api.answers += [(429, b"API requests too frequent"), (502, b"{}")]
    res = local_box.onstart(remote.watchdog_onstart(ttl_s=1, idle_timeout_s=600, orphan_timeout_s=600))
    assert res.returncode == 0, res.stderr
    _wait("three tries", lambda: len(api.requests) >= 3, 30)
    log = _wait("the success", lambda: "destroy accepted" in local_box.log() and local_box.log())
    assert "HTTP 429" in log and "HTTP 502" in log and "ttl: up" in log
    assert log.count("destroying instance 4242: ttl") == 1, "the verdict is logged once, the tries each"


@pytest.mark.integration  # a real watchdog process waited on for seconds: CI's tier, not the fast loop
def test_a_killed_watchdog_is_restarted_by_its_supervisor(local_box: LocalBox) -> None:
    res = local_box.onstart(remote.watchdog_onstart(ttl_s=None, idle_timeout_s=600, orphan_timeout_s=600))
    assert res.returncode == 0, res.stderr
    _wait("the first start", lambda: local_box.log().count("watching instance 4242") == 1)
    kids = Path(f"/proc/{local_box.supervisor()}/task/{local_box.supervisor()}/children").read_text().split()
    os.kill(int(kids[0]), signal.SIGKILL)
    _wait("the restart", lambda: local_box.log().count("watching instance 4242") == 2, 20)
    assert "exited with 137; restarting" in local_box.log()


def test_without_its_settings_it_says_what_is_missing(local_box: LocalBox) -> None:
    del local_box.env[remote.WATCHDOG_API_URL_ENV]
    res = local_box.onstart(remote.watchdog_onstart(ttl_s=1, idle_timeout_s=600, orphan_timeout_s=600))
    assert res.returncode == 0, res.stderr
    log = _wait("the complaint", lambda: "cannot destroy: missing RIGSYNC_API_URL" in local_box.log() and
                local_box.log())
    assert KEY not in log


def test_without_python_the_onstart_says_so(local_box: LocalBox, tmp_path: Path) -> None:
    bare = tmp_path / "bin"  # bash, base64, gzip and coreutils, but no python
    bare.mkdir()
    for tool in ("bash", "base64", "gzip", "mkdir", "mv", "date", "cat", "tr", "grep", "rm", "seq", "sleep", "setsid",
                 "nohup"):
        for d in os.defpath.split(os.pathsep):
            if (Path(d) / tool).exists():
                (bare / tool).symlink_to(Path(d) / tool)
                break
    local_box.env["PATH"] = str(bare)
    res = subprocess.run(
        [str(bare / "bash"), "-c", remote.watchdog_onstart(ttl_s=None, idle_timeout_s=600, orphan_timeout_s=600)],
        env=local_box.env, capture_output=True, text=True, timeout=60, check=False,
    )
    assert res.returncode == 1 and "no python3" in res.stderr
    assert "not started: no python3 on this box" in local_box.log()
    assert not (local_box.wdir / "pid").exists()


def test_bad_arguments_are_logged_not_crashed(tmp_path: Path) -> None:
    env = {"RIGSYNC_ROOT": str(tmp_path / "rigsync"), "PATH": os.defpath}
    res = subprocess.run([sys.executable, "-S", "-c", commands._program("watchdog.py"), "none", "0", "60"], env=env,
                         capture_output=True, text=True, timeout=30, check=False)
    assert res.returncode == 2
    assert "not started: bad arguments" in (tmp_path / "rigsync" / wd.DIR / wd.LOG_FILE).read_text()
