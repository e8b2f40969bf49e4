"""The account's API key goes only to the provider URL configured on the controller: proven with logging servers.

Real parts only: the ``rigsync`` console script in a subprocess, the real ``vastai`` SDK inside it, the emulator,
real git remotes, and small ``ThreadingHTTPServer``s on loopback that log every request they get (method, path,
query, headers, body). What is shown:

* a pull request that names ``provider.api_url`` in desired/fleet.yaml is refused by the loader (exit 1, the
  message names the file and line) by `validate`, `plan` and `run --once`, and the URL it names gets nothing;
* the controller's own URL (``RIGSYNC_API_URL`` or ``--api-url``) is used, over plain http only because it is a
  loopback address: a logging proxy in front of the emulator sees every request, each with the key;
* a plain-http URL to a non-loopback host is refused before any connection: with ``HTTP_PROXY``/``HTTPS_PROXY``
  pointed at a logging server, any request the process tried would arrive there (the positive control shows the
  SDK left to itself would have sent the key), and nothing does;
* a loopback http URL is refused while a proxy from the environment would carry it (and the key) off the machine;
* a redirect from the configured URL to another origin is followed without the key (the SDK's session drops the
  Authorization header when scheme, host or port change);
* the key never appears in any committed file, commit message, the checkout, the state dir or the output.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from gitutil import git
from world import fleet_repo
from world import rigsync as console

from reconciler.emulator import Emulator

pytestmark = pytest.mark.integration

PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
REFUSED_URL = "http://example.com:8080"


@dataclass(frozen=True)
class Seen:
    method: str
    target: str  # the request line's target: a path, or an absolute URL when sent to a proxy
    path: str
    query: str
    headers: dict[str, str]
    body: bytes

    def text(self) -> str:
        head = "\n".join(f"{k}: {v}" for k, v in self.headers.items())
        return f"{self.method} {self.path}?{self.query}\n{head}\n\n{self.body.decode('utf-8', 'replace')}"


class LoggingServer:
    """An HTTP server on a loopback address that logs every request; it forwards to ``upstream`` (a logging
    proxy in front of the emulator), answers with a 307 to ``redirect_to`` + the path, or answers 404."""

    def __init__(
        self, host: str = "127.0.0.1", *, upstream: str | None = None, redirect_to: str | None = None
    ) -> None:
        self.requests: list[Seen] = []
        lock = threading.Lock()
        log = self.requests

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                parts = urlsplit(self.path)
                with lock:
                    log.append(Seen(self.command, self.path, parts.path, parts.query, dict(self.headers.items()), body))
                if redirect_to is not None:
                    self.send_response(307)
                    self.send_header("Location", redirect_to + self.path)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                elif upstream is not None:
                    self._forward(upstream, body)
                else:
                    reply = json.dumps({"success": False, "error": "not_found", "msg": "logging server"}).encode()
                    self.send_response(404)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(reply)))
                    self.end_headers()
                    self.wfile.write(reply)

            def _forward(self, to: str, body: bytes) -> None:
                target = urlsplit(to)
                conn = http.client.HTTPConnection(target.hostname or "", target.port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn.request(self.command, self.path, body=body or None, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length", "server", "date"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_CONNECT = _handle

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://{host}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="logging-server", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def servers() -> Iterator[list[LoggingServer]]:
    made: list[LoggingServer] = []
    yield made
    for s in made:
        s.close()


def serve(made: list[LoggingServer], host: str = "127.0.0.1", **kw: str) -> LoggingServer:
    s = LoggingServer(host, **kw)
    made.append(s)
    return s


@dataclass
class Fleet:
    repo: Path
    remote: Path
    state: Path
    outputs: list[str]


@pytest.fixture
def fleet(tmp_path: Path) -> Fleet:
    made = fleet_repo(tmp_path / "fleet")
    return Fleet(made.work, made.remote, tmp_path / "state", [])


def base_env(emu: Emulator, fleet: Fleet, **extra: str) -> dict[str, str]:
    """The parent's environment without any URL or proxy of its own, plus the key and ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if k not in (*PROXY_VARS, "NO_PROXY", "no_proxy", "RIGSYNC_API_URL", "VAST_URL")}
    return {**env, "VAST_API_KEY": emu.api_key, "RIGSYNC_STATE_DIR": str(fleet.state), **extra}


def rigsync(fleet: Fleet, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    result = console(env, *args, cwd=fleet.repo)
    fleet.outputs += [result.stdout, result.stderr]
    return result


def assert_key_nowhere(fleet: Fleet, key: str) -> None:
    """Not in any committed file of any commit, in any commit message, in the checkout, the state dir, output."""
    for repo in (fleet.repo, fleet.remote):
        revs = git(repo, "rev-list", "--all").split()
        assert revs
        hit = subprocess.run(["git", "-C", str(repo), "grep", "-F", "-I", "-l", "-e", key, *revs],
                             capture_output=True, text=True, check=False)
        assert hit.returncode == 1 and not hit.stdout, hit.stdout
        assert key not in git(repo, "log", "--all", "--format=%B")
    for root in (fleet.repo, fleet.state):
        for path in root.rglob("*"):
            if path.is_file() and ".git" not in path.relative_to(root).parts:
                assert key.encode() not in path.read_bytes(), path
    for out in fleet.outputs:
        assert key not in out


# -------------------------------------------------------------------------------- a URL in desired/ is refused


def test_a_url_in_desired_is_refused_and_gets_nothing(
    emulator: Emulator, fleet: Fleet, servers: list[LoggingServer]
) -> None:
    pr = serve(servers)  # where a pull request would like the key to go
    fleet_file = fleet.repo / "desired" / "fleet.yaml"
    lines = fleet_file.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip() == "name: vast") + 1
    lines.insert(at, f"  api_url: {pr.url}")
    fleet_file.write_text("\n".join(lines) + "\n")
    git(fleet.repo, "-c", "user.name=pr", "-c", "user.email=pr@example.invalid", "commit", "-qam",
        "innocent-looking pull request")
    git(fleet.repo, "push", "-q", "origin", "main")
    where = f"desired/fleet.yaml:{at + 1}:3"
    env = base_env(emulator, fleet, RIGSYNC_API_URL=emulator.url)  # the controller is configured: the emulator

    result = rigsync(fleet, env, "validate")
    assert result.returncode == 1
    assert where in result.stdout and "moved out of desired/ to the controller" in result.stdout
    assert "RIGSYNC_API_URL or --api-url" in result.stdout and "pull request" in result.stdout

    for command in (["plan"], ["status"], ["apply", "--yes"]):
        result = rigsync(fleet, env, *command)
        assert result.returncode == 1, command
        assert where in result.stderr and "moved out of desired/" in result.stderr, (command, result.stderr)

    result = rigsync(fleet, env, "run", "--once")
    assert result.returncode == 1
    git(fleet.remote, "rev-parse", "main")
    status = git(fleet.remote, "show", "main:observed/status.yaml")
    assert "moved out of desired/" in status and f"fleet.yaml:{at + 1}" in status

    assert pr.requests == []
    assert_key_nowhere(fleet, emulator.api_key)


# ------------------------------------------------------------------------ the controller's URL, and only that


def test_the_controller_url_is_used_over_http_only_because_it_is_loopback(
    emulator: Emulator, fleet: Fleet, servers: list[LoggingServer]
) -> None:
    proxy = serve(servers, upstream=emulator.url)  # a logging proxy in front of the emulator
    key = emulator.api_key

    result = rigsync(fleet, base_env(emulator, fleet, RIGSYNC_API_URL=proxy.url), "plan", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["counts"].get("rent", 0) >= 1
    by_env = list(proxy.requests)
    assert by_env and all(r.path.startswith("/api/") for r in by_env)
    assert all(r.headers.get("Authorization") == f"Bearer {key}" for r in by_env)

    # the flag wins over the environment (here a URL that would be refused)
    env = base_env(emulator, fleet, RIGSYNC_API_URL=REFUSED_URL)
    result = rigsync(fleet, env, "status", "--json", "--api-url", proxy.url + "/")
    assert result.returncode == 0, result.stderr
    assert len(proxy.requests) > len(by_env)
    assert_key_nowhere(fleet, key)


def test_the_sdk_left_to_itself_would_send_the_key_through_the_proxy(servers: list[LoggingServer]) -> None:
    """The positive control for the refusal test: an unguarded request to ``REFUSED_URL`` reaches the detector."""
    detector = serve(servers)
    env = {k: v for k, v in os.environ.items() if k not in ("NO_PROXY", "no_proxy")}
    env.update({v: detector.url for v in PROXY_VARS})
    code = (
        "import contextlib, io\n"
        "from vastai import VastAI\n"
        f"sdk = VastAI(api_key='k-control', server_url={REFUSED_URL!r}, retry=1, quiet=True)\n"
        "with contextlib.suppress(Exception), contextlib.redirect_stdout(io.StringIO()):\n"
        "    sdk.show_instances()\n"
    )
    subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=60, check=False)
    assert detector.requests, "the detector must see an unguarded request, or the refusal test proves nothing"
    assert detector.requests[0].target.startswith("http://example.com:8080/api/")
    assert detector.requests[0].headers.get("Authorization") == "Bearer k-control"


@pytest.mark.parametrize("via", ["flag", "environment"])
def test_plain_http_to_a_non_loopback_host_is_refused_before_any_connection(
    via: str, emulator: Emulator, fleet: Fleet, servers: list[LoggingServer]
) -> None:
    detector = serve(servers)  # every proxy variable points here: any request the process made would arrive
    proxies = {v: detector.url for v in PROXY_VARS}
    if via == "flag":
        env, flag, named = base_env(emulator, fleet, RIGSYNC_API_URL=emulator.url, **proxies), \
            ["--api-url", REFUSED_URL], "--api-url"
    else:
        env, flag, named = base_env(emulator, fleet, RIGSYNC_API_URL=REFUSED_URL, **proxies), [], \
            "the environment variable RIGSYNC_API_URL"
    before = git(fleet.remote, "rev-parse", "main")
    for command in (["plan"], ["status"], ["apply", "--yes"], ["run", "--once"]):
        result = rigsync(fleet, env, *command, *flag)
        assert result.returncode == 1, (command, result.stdout, result.stderr)
        assert result.stderr.startswith(f"rigsync: error: {named}: '{REFUSED_URL}' is not a usable provider URL"), \
            result.stderr
        assert "plain http is allowed only to a loopback host" in result.stderr
        assert result.stdout == ""
    assert detector.requests == []
    assert git(fleet.remote, "rev-parse", "main") == before  # run --once did not even take the lease
    assert_key_nowhere(fleet, emulator.api_key)


def test_loopback_http_is_refused_when_a_proxy_would_carry_the_key_off_the_machine(
    emulator: Emulator, fleet: Fleet, servers: list[LoggingServer]
) -> None:
    detector = serve(servers)  # stands for a proxy elsewhere: plain http through it would show it the key
    local = serve(servers, upstream=emulator.url)
    env = base_env(emulator, fleet, RIGSYNC_API_URL=local.url, HTTP_PROXY=detector.url)
    result = rigsync(fleet, env, "plan")
    assert result.returncode == 1
    assert "would carry the API key to that proxy in clear text: add 127.0.0.1 to NO_PROXY" in result.stderr
    assert detector.requests == [] and local.requests == []
    result = rigsync(fleet, {**env, "NO_PROXY": "127.0.0.1"}, "plan")  # the way out the message names
    assert result.returncode == 0, result.stderr
    assert detector.requests == [] and local.requests
    assert_key_nowhere(fleet, emulator.api_key)


def test_a_redirect_to_another_origin_does_not_carry_the_key(
    emulator: Emulator, fleet: Fleet, servers: list[LoggingServer]
) -> None:
    elsewhere = serve(servers, host="127.0.0.2")
    configured = serve(servers, redirect_to=elsewhere.url)
    result = rigsync(fleet, base_env(emulator, fleet), "plan", "--api-url", configured.url)
    assert result.returncode == 1 and result.stderr.startswith("rigsync: error: ")
    assert configured.requests and all(
        r.headers.get("Authorization") == f"Bearer {emulator.api_key}" for r in configured.requests
    )
    assert elsewhere.requests, "the redirect was followed (else this proves nothing about the header)"
    for r in elsewhere.requests:
        assert "Authorization" not in r.headers and emulator.api_key not in r.text()
    assert_key_nowhere(fleet, emulator.api_key)
