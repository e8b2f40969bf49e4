"""box/transfer.py against a real HTTP server on 127.0.0.1 (http.server in a thread): what it sends, what it
retries, what it refuses, what a download must match, and that no message ever carries the URL's query."""

from __future__ import annotations

import hashlib
import io
import json
import socket
import subprocess
import sys
import tarfile
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from reconciler.adapters.box_control import ShellBoxes
from reconciler.box import transfer
from reconciler.core.model import Endpoint, Instance, InstanceStatus
from reconciler.errors import RemoteCommandFailed
from reconciler.ports import ATTEMPT_TAR, CheckpointUploaded, CommandResult, Download, Upload
from reconciler.remote import commands, parse

SECRET = "X-Amz-Signature=deadbeef0123456789sig"


class _Quiet(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that stops reading (a download past its size) breaks the pipe: expected


class Server:
    """Answers each request with the next planned (status, body), then 200; records what it was sent."""

    def __init__(self) -> None:
        self.plan: list[tuple[int, bytes]] = []
        self.requests: list[dict[str, Any]] = []
        self.body = b""  # what a GET serves once the plan is used up
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                status, body = outer.plan.pop(0) if outer.plan else (200, outer.body if self.command == "GET" else b"")
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_PUT(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                outer.requests.append({"method": "PUT", "path": self.path, "headers": dict(self.headers),
                                       "body": self.rfile.read(length)})
                self._answer()

            def do_GET(self) -> None:
                outer.requests.append({"method": "GET", "path": self.path, "headers": dict(self.headers)})
                self._answer()

        self.httpd = _Quiet(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/bucket/runs/r.1/harvest.tar?{SECRET}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


FAST = {"tries": 3, "backoff_s": 0.001, "budget_s": 5.0}


def _main(args: list[str], url: str, **options: Any) -> int:
    return transfer.main(["transfer.py", *args], stdin=io.BytesIO(url.encode() + b"\n"), **{**FAST, **options})


def _no_secret(text: str) -> None:
    assert "deadbeef" not in text and "X-Amz-Signature" not in text and "?" not in text


def test_put_sends_the_file_with_a_content_length_and_prints_its_size_and_sha256(
    server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = b"checkpoint bytes " * 1000
    (tmp_path / "f").write_bytes(data)
    assert _main(["put", str(tmp_path / "f")], server.url) == 0
    (req,) = server.requests
    assert req["body"] == data and req["headers"]["Content-Length"] == str(len(data))
    assert "Transfer-Encoding" not in req["headers"]
    assert req["path"] == f"/bucket/runs/r.1/harvest.tar?{SECRET}"  # the URL as given, query and all
    assert json.loads(capsys.readouterr().out) == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_put_retries_5xx_and_429_then_succeeds_naming_only_the_path(
    server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "f").write_bytes(b"x")
    server.plan = [(503, b""), (429, b"")]
    assert _main(["put", str(tmp_path / "f")], server.url) == 0
    assert len(server.requests) == 3
    err = capsys.readouterr().err
    assert "put /bucket/runs/r.1/harvest.tar: HTTP 503" in err and "HTTP 429" in err
    _no_secret(err)


def test_put_refused_is_exit_3_with_the_store_error_code_and_is_not_retried(
    server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "f").write_bytes(b"x")
    server.plan = [(403, b"<Error><Code>SignatureDoesNotMatch</Code><StringToSign>" + SECRET.encode() + b"</StringTo")]
    assert _main(["put", str(tmp_path / "f")], server.url) == transfer.REFUSED
    assert len(server.requests) == 1
    err = capsys.readouterr().err
    assert "HTTP 403 SignatureDoesNotMatch" in err
    _no_secret(err)


def test_put_gives_up_after_its_tries_with_exit_4(
    server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "f").write_bytes(b"x")
    server.plan = [(500, b"")] * 5
    assert _main(["put", str(tmp_path / "f")], server.url) == transfer.TRANSIENT
    assert len(server.requests) == FAST["tries"]
    with socket.socket() as s:  # a port nobody listens on: connection refused, retried, then given up
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}/bucket/k?{SECRET}"
    assert _main(["put", str(tmp_path / "f")], closed) == transfer.TRANSIENT
    err = capsys.readouterr().err
    assert "ConnectionRefusedError" in err and "gave up after 3 tries" in err
    _no_secret(err)


def test_get_checks_size_and_sha256_before_the_file_is_there(server: Server, tmp_path: Path) -> None:
    data = b"a checkpoint tar"
    server.body = data
    dest = tmp_path / "ck.tar"
    sha = hashlib.sha256(data).hexdigest()
    assert _main(["get", str(dest), str(len(data)), sha], server.url) == 0
    assert dest.read_bytes() == data and not (tmp_path / "ck.tar.part").exists()
    dest.unlink()
    wrong = hashlib.sha256(b"other").hexdigest()
    assert _main(["get", str(dest), str(len(data)), wrong], server.url) == transfer.MISMATCH
    assert list(tmp_path.iterdir()) == []  # neither the file nor its part


def test_get_stops_reading_past_the_recorded_size(server: Server, tmp_path: Path) -> None:
    server.body = b"y" * (4 << 20)
    dest = tmp_path / "ck.tar"
    sha = hashlib.sha256(b"y" * 10).hexdigest()
    assert _main(["get", str(dest), "10", sha], server.url) == transfer.MISMATCH
    assert list(tmp_path.iterdir()) == []


def test_usage_and_a_url_that_is_not_http_are_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _main([], "http://x/") == transfer.USAGE
    assert _main(["get", "d", "10", "not-a-sha"], "http://x/") == transfer.USAGE
    assert _main(["put", str(tmp_path / "missing")], "http://127.0.0.1:1/k") == transfer.USAGE
    assert _main(["put", __file__], f"file:///etc/passwd?{SECRET}") == transfer.USAGE
    _no_secret(capsys.readouterr().err)


def test_the_shipped_bundle_reads_its_url_from_stdin_without_site_packages(server: Server, tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"z" * 100)
    res = subprocess.run(
        [sys.executable, "-S", "-c", commands._program("transfer.py"), "put", str(tmp_path / "f")],
        input=server.url.encode() + b"\n", capture_output=True, timeout=30, check=False,
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["size"] == 100 and server.requests[0]["body"] == b"z" * 100


# ----------------------------------------------------------------- the box commands, run with a local bash


def _box(tmp_path: Path, command: str, stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    return subprocess.run(["bash", "-c", command], input=stdin, env=env, capture_output=True, timeout=60, check=False)


def _url(server: Server, key: str) -> str:
    return server.url.replace("runs/r.1/harvest.tar", key)


def test_the_upload_command_puts_the_harvest_then_each_file_it_took(server: Server, tmp_path: Path) -> None:
    run = tmp_path / "rigsync" / "runs" / "r.1"
    run.mkdir(parents=True)
    (run / "stdout.log").write_bytes(b"out\n")
    (run / "metrics.jsonl").write_bytes(b'{"loss": 1}\n')
    files = ["stdout.log", "missing.log", ".rigsync-harvest.json", "metrics.jsonl"]
    cmd = commands.upload_script("r", 1, what="run", patterns=["metrics.jsonl"], cap_bytes=1 << 20, files=files)
    urls = [_url(server, "t"), *(_url(server, f) for f in files)]
    res = _box(tmp_path, cmd, commands.url_lines(urls))
    assert res.returncode == 0, res.stderr
    got = {r["path"].split("?")[0].rsplit("/", 1)[1]: r["body"] for r in server.requests}
    assert set(got) == {"t", "stdout.log", ".rigsync-harvest.json", "metrics.jsonl"}  # missing.log: not written
    assert got["stdout.log"] == b"out\n" and got["metrics.jsonl"] == b'{"loss": 1}\n'
    manifest = json.loads(got[".rigsync-harvest.json"])
    assert manifest["files"] == [["stdout.log", 4], ["metrics.jsonl", 12]]
    with tarfile.open(fileobj=io.BytesIO(got["t"])) as tar:
        assert tar.getnames() == ["stdout.log", "metrics.jsonl", ".rigsync-harvest.json"]
    answer, problem = parse.parse_upload(res.stdout)
    assert problem is None and answer is not None and answer.size == len(got["t"]) and answer.complete
    assert list((tmp_path / "rigsync" / "tmp").iterdir()) == []  # its temporary files are gone
    assert _box(tmp_path, cmd, commands.url_lines(urls[:2])).returncode == transfer.USAGE  # a URL short


def test_the_fetch_command_stages_a_download_only_when_it_matches(server: Server, tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("ckpt/state.json")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"{}"))
    server.body = buf.getvalue()
    size, sha = len(server.body), hashlib.sha256(server.body).hexdigest()
    staged = tmp_path / "rigsync" / "resume" / "r.2"
    wrong = commands.fetch_resume_script("r", 2, size=size, sha256=hashlib.sha256(b"x").hexdigest())
    res = _box(tmp_path, wrong, commands.url_lines([server.url]))
    assert res.returncode == transfer.MISMATCH and not staged.exists()
    _no_secret(res.stderr.decode())
    res = _box(tmp_path, commands.fetch_resume_script("r", 2, size=size, sha256=sha), commands.url_lines([server.url]))
    assert res.returncode == 0, res.stderr
    assert (staged / "ckpt" / "state.json").read_bytes() == b"{}"
    assert list((tmp_path / "rigsync" / "tmp").iterdir()) == []


def test_url_lines_refuse_a_url_that_would_break_the_line_without_quoting_it() -> None:
    with pytest.raises(ValueError) as err:
        commands.url_lines([f"https://s3/k?{SECRET}\nhttps://s3/other"])
    _no_secret(str(err.value))


@pytest.mark.parametrize("raw", [
    b"", b"{}\n{}\n", b'{"skipped": 0}\n{"size": 1, "sha256": "ab"}\n', b"[]\n[]\n", b"x" * (70 << 10),
    b'{"skipped": -1}\n{"size": 1, "sha256": "' + b"a" * 64 + b'"}\n', b'{"skipped": 0}\n{"size": 1e3}\n',
    b'{"skipped": 0}\n{"size": true, "sha256": "' + b"a" * 64 + b'"}\n',
])
def test_parse_upload_refuses_what_is_not_the_answer(raw: bytes) -> None:
    answer, problem = parse.parse_upload(raw)
    assert answer is None and problem is not None and problem.startswith("upload: ")


def test_parse_upload_reads_an_incomplete_sync() -> None:
    answer, problem = parse.parse_upload(b'{"bytes": 9, "files": 1, "skipped": 2}\n{"sha256": "' + b"b" * 64
                                         + b'", "size": 1024}\n')
    assert problem is None and answer == CheckpointUploaded(size=1024, sha256="b" * 64, complete=False)


# ------------------------------------------------- ShellBoxes: URLs on stdin only, never in an error it raises


class EchoShell:
    """A ``Shell`` whose box refuses every transfer and echoes its stdin (the URLs) to stderr, as a hostile or
    broken box might: what the adapter raises must not carry them."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    def run(self, endpoint: Endpoint, command: str, *, stdin: bytes | None = None, timeout: float = 30.0,
            max_stdout: int | None = None, stdout_sink: Any = None) -> CommandResult:
        self.sent.append((command, stdin or b""))
        return CommandResult(exit_code=transfer.REFUSED, stdout=b"", stderr=b"box says: " + (stdin or b""))


def test_shell_boxes_send_urls_on_stdin_only_and_raise_without_them() -> None:
    shell = EchoShell()
    boxes = ShellBoxes(shell)  # type: ignore[arg-type]  # only run() is reached
    inst = Instance(id=7, label="rigsync:t:0", status=InstanceStatus.RUNNING, gpu_name="g", num_gpus=1,
                    gpu_ram_mib=1, dph_total=0.1, start_date=0.0, direct=Endpoint("127.0.0.1", 22))
    url = f"https://s3.example/bucket/k?{SECRET}"
    calls: list[Callable[[], object]] = [
        lambda: boxes.upload_harvest(inst, "r", 1, patterns=[], cap_bytes=10,
                                     uploads={ATTEMPT_TAR: Upload("k", url, 0.0), "stdout.log": Upload("k2", url, 0)}),
        lambda: boxes.upload_checkpoint(inst, "r", 1, path="ckpt/", cap_bytes=10, upload=Upload("k", url, 0.0)),
        lambda: boxes.stage_resume_from(inst, "r", 2, Download("k", url, 3, "a" * 64, 0.0)),
    ]
    for call in calls:
        with pytest.raises(RemoteCommandFailed, match="refused by the store") as err:
            call()
        _no_secret(str(err.value))
        assert "s3.example" not in str(err.value)
    for command, stdin in shell.sent:
        assert "deadbeef" not in command and stdin.startswith(url.encode() + b"\n")
    assert repr(Upload("k", url, 0.0)).count("deadbeef") == 0
