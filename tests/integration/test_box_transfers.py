"""Boxes move their own data to and from the store, on real parts: the emulator's sshd boxes (``ShellBoxes`` over
paramiko), the SeaweedFS S3 server on loopback (``s3_server``: it checks SigV4 signatures, presigned URLs included)
and URLs presigned here with boto3. The box uploads its harvest and its checkpoint, downloads a checkpoint it checks
before it unpacks it, cannot write another key with an edited URL, leaves no partial object when it vanishes
mid-upload, and never shows a URL in its process list or keeps one in its files."""

from __future__ import annotations

import hashlib
import io
import json
import os
import secrets
import tarfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from conftest import S3_CANARY
from tarutil import tar_of
from waiting import wait_for

from reconciler.adapters.box_control import ShellBoxes
from reconciler.adapters.s3store import S3Store
from reconciler.adapters.ssh import SshShell
from reconciler.adapters.vast import VastProvider
from reconciler.core.model import Endpoint, Instance, OfferFilters
from reconciler.emulator import Emulator
from reconciler.emulator.s3server import S3Server
from reconciler.emulator.testing import KeyPair
from reconciler.errors import RemoteCommandFailed
from reconciler.ports import ATTEMPT_TAR, Download, Upload
from reconciler.settings.object_store import store_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MANIFEST = ".rigsync-harvest.json"
SIGNATURES: list[str] = []  # every presigned URL's signature minted here: none may be left on a box


def _rent(emulator: Emulator, label: str) -> Instance:
    provider = VastProvider(api_key=emulator.api_key, server_url=emulator.url)
    offer = provider.search_offers(OfferFilters(verified=False), disk_gb=10)[0]
    iid = provider.create_instance(offer.id, image="img", disk_gb=10, label=label, onstart="", env={})
    emulator.wait_running([iid])
    return next(i for i in provider.list_instances() if i.id == iid)


@pytest.fixture(scope="module")
def box(emulator: Emulator) -> Iterator[Instance]:
    inst = _rent(emulator, "rigsync:transfers:0")
    yield inst
    emulator.destroy_instance(inst.id)


@pytest.fixture(scope="module")
def shell(ssh_keypair: KeyPair, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshShell]:
    s = SshShell(private_key=ssh_keypair.private_path, known_hosts=tmp_path_factory.mktemp("kh") / "known_hosts",
                 connect_timeout=3)
    yield s
    s.close()


@pytest.fixture(scope="module")
def s3(s3_server: S3Server) -> Any:
    return boto3.client(
        "s3", endpoint_url=s3_server.endpoint, aws_access_key_id=s3_server.access_key,
        aws_secret_access_key=s3_server.secret_key, region_name="us-east-1",
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                      request_checksum_calculation="when_required", response_checksum_validation="when_required"),
    )


@pytest.fixture
def prefix() -> str:
    return f"transfers-{secrets.token_hex(4)}/"


def _remember(url: str) -> str:
    SIGNATURES.extend(parse_qs(urlsplit(url).query)["X-Amz-Signature"])
    return url


def _put(s3: Any, server: S3Server, key: str) -> Upload:
    url = s3.generate_presigned_url("put_object", Params={"Bucket": server.bucket, "Key": key}, ExpiresIn=600)
    return Upload(key=key, url=_remember(url), expires_at=time.time() + 600)


def _get(s3: Any, server: S3Server, key: str, size: int, sha256: str) -> Download:
    url = s3.generate_presigned_url("get_object", Params={"Bucket": server.bucket, "Key": key}, ExpiresIn=600)
    return Download(key=key, url=_remember(url), size=size, sha256=sha256, expires_at=time.time() + 600)


def _object(s3: Any, server: S3Server, key: str) -> bytes | None:
    try:
        return bytes(s3.get_object(Bucket=server.bucket, Key=key)["Body"].read())
    except ClientError as exc:
        assert exc.response["Error"]["Code"] in ("NoSuchKey", "404"), exc.response
        return None


def _keys(s3: Any, server: S3Server, prefix: str) -> list[str]:
    return [o["Key"] for o in s3.list_objects_v2(Bucket=server.bucket, Prefix=prefix).get("Contents", [])]


def _ep(inst: Instance) -> Endpoint:
    assert inst.ssh is not None
    return inst.ssh


def _sh(shell: SshShell, inst: Instance, command: str, stdin: bytes | None = None) -> str:
    res = shell.run(_ep(inst), command, stdin=stdin, timeout=60)
    assert res.exit_code == 0, res.stderr
    return res.stdout.decode()


def _members(blob: bytes) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        for m in tar.getmembers():
            f = tar.extractfile(m)
            assert f is not None
            out[m.name] = f.read()
    return out


def _run_dir(shell: SshShell, inst: Instance, name: str, files: dict[str, bytes]) -> None:
    _sh(shell, inst, f"mkdir -p ~/rigsync/runs/{name} && tar -x -C ~/rigsync/runs/{name} -f -", stdin=tar_of(files))


def _tmp_is_empty(shell: SshShell, inst: Instance) -> None:
    assert _sh(shell, inst, "ls -A ~/rigsync/tmp 2>/dev/null").strip() == ""


def test_upload_harvest_puts_the_tar_and_each_file_and_they_read_back_equal(
    box: Instance, shell: SshShell, s3: Any, s3_server: S3Server, prefix: str
) -> None:
    files = {"stdout.log": b"hello\n" * 100, "stderr.log": b"warn\n", "meta.json": b'{"run_id": "h"}',
             "metrics.jsonl": b'{"loss": 0.5}\n', "out/model.bin": os.urandom(50_000)}
    _run_dir(shell, box, "h.1", files)
    names = [ATTEMPT_TAR, "stdout.log", "stderr.log", MANIFEST, "metrics.jsonl", "never-written.log"]
    uploads = {n: _put(s3, s3_server, f"{prefix}h/1/{n}") for n in names}
    ShellBoxes(shell).upload_harvest(box, "h", 1, patterns=["metrics.jsonl", "out/"], cap_bytes=1 << 20,
                                     uploads=uploads)
    tar = _object(s3, s3_server, f"{prefix}h/1/{ATTEMPT_TAR}")
    assert tar is not None
    members = _members(tar)
    assert list(members)[-1] == MANIFEST and {k: v for k, v in members.items() if k != MANIFEST} == files
    for name in ("stdout.log", "stderr.log", "metrics.jsonl"):
        assert _object(s3, s3_server, f"{prefix}h/1/{name}") == files[name], name
    assert _object(s3, s3_server, f"{prefix}h/1/{MANIFEST}") == members[MANIFEST]
    assert json.loads(members[MANIFEST])["skipped"] == []
    assert _object(s3, s3_server, f"{prefix}h/1/never-written.log") is None  # a file the run did not write
    _tmp_is_empty(shell, box)


def test_upload_checkpoint_answers_the_size_and_sha256_the_store_holds(
    box: Instance, shell: SshShell, s3: Any, s3_server: S3Server, prefix: str
) -> None:
    ckpt = {"ckpt/state.json": b'{"step": 3000}', "ckpt/weights.bin": os.urandom(200_000)}
    _run_dir(shell, box, "c.1", {"stdout.log": b"x", **ckpt})
    boxes = ShellBoxes(shell)
    up = _put(s3, s3_server, f"{prefix}c/ckpt-1")
    got = boxes.upload_checkpoint(box, "c", 1, path="ckpt/", cap_bytes=1 << 20, upload=up)
    blob = _object(s3, s3_server, up.key)
    assert blob is not None and got.complete
    assert (got.size, got.sha256) == (len(blob), hashlib.sha256(blob).hexdigest())
    assert {k: v for k, v in _members(blob).items() if k != MANIFEST} == ckpt
    # under a cap that leaves the weights out, the sync says it is not complete (it never becomes the checkpoint)
    part = _put(s3, s3_server, f"{prefix}c/ckpt-2")
    assert not boxes.upload_checkpoint(box, "c", 1, path="ckpt/", cap_bytes=1000, upload=part).complete
    with pytest.raises(RemoteCommandFailed, match="no such run directory"):
        boxes.upload_checkpoint(box, "nosuch", 1, path="ckpt/", cap_bytes=1000, upload=part)
    _tmp_is_empty(shell, box)


def _stored_checkpoint(s3: Any, server: S3Server, key: str, files: dict[str, bytes]) -> tuple[int, str]:
    blob = tar_of(files)
    s3.put_object(Bucket=server.bucket, Key=key, Body=blob)
    return len(blob), hashlib.sha256(blob).hexdigest()


def test_stage_resume_from_unpacks_a_checked_download_into_resume(
    box: Instance, shell: SshShell, s3: Any, s3_server: S3Server, prefix: str
) -> None:
    files = {"ckpt/state.json": b'{"step": 5000}', "ckpt/w.bin": os.urandom(10_000)}
    size, sha = _stored_checkpoint(s3, s3_server, f"{prefix}r/ckpt", files)
    ShellBoxes(shell).stage_resume_from(box, "r", 2, _get(s3, s3_server, f"{prefix}r/ckpt", size, sha))
    listed = _sh(shell, box, "cd ~/rigsync/resume/r.2 && find . -type f | sort && cat ckpt/state.json")
    assert listed.split() == ["./ckpt/state.json", "./ckpt/w.bin", '{"step":', "5000}"]
    _tmp_is_empty(shell, box)


def test_a_corrupted_checkpoint_is_refused_and_nothing_is_staged(
    box: Instance, shell: SshShell, s3: Any, s3_server: S3Server, prefix: str
) -> None:
    size, sha = _stored_checkpoint(s3, s3_server, f"{prefix}x/ckpt", {"ckpt/state.json": b"{}"})
    boxes = ShellBoxes(shell)
    wrong = hashlib.sha256(b"what the controller recorded for another upload").hexdigest()
    with pytest.raises(RemoteCommandFailed, match="size or SHA-256 mismatch") as err:
        boxes.stage_resume_from(box, "x", 2, _get(s3, s3_server, f"{prefix}x/ckpt", size, wrong))
    assert SIGNATURES[-1] not in str(err.value) and "X-Amz" not in str(err.value)
    with pytest.raises(RemoteCommandFailed, match="size or SHA-256 mismatch"):
        boxes.stage_resume_from(box, "x", 2, _get(s3, s3_server, f"{prefix}x/ckpt", size - 1, sha))
    with pytest.raises(RemoteCommandFailed, match="refused by the store"):  # no such object: 404
        boxes.stage_resume_from(box, "x", 2, _get(s3, s3_server, f"{prefix}x/none", size, sha))
    assert _sh(shell, box, "ls -A ~/rigsync/resume/ 2>/dev/null").split().count("x.2") == 0
    _tmp_is_empty(shell, box)


def test_a_box_that_edits_its_url_to_another_key_is_refused_and_nothing_is_written(
    box: Instance, shell: SshShell, s3: Any, s3_server: S3Server, prefix: str
) -> None:
    _run_dir(shell, box, "e.1", {"ckpt/state.json": b'{"step": 1}'})
    mine = _put(s3, s3_server, f"{prefix}e/1/ckpt")
    other = f"{prefix}e/other-attempt/ckpt"
    edited = Upload(key=mine.key, url=mine.url.replace("/e/1/ckpt", "/e/other-attempt/ckpt"), expires_at=0)
    assert edited.url != mine.url
    with pytest.raises(RemoteCommandFailed, match="refused by the store") as err:
        ShellBoxes(shell).upload_checkpoint(box, "e", 1, path="ckpt/", cap_bytes=1 << 20, upload=edited)
    assert "HTTP 403" in str(err.value) and SIGNATURES[-1] not in str(err.value) and "X-Amz" not in str(err.value)
    assert _object(s3, s3_server, other) is None and _keys(s3, s3_server, prefix) == []


def test_the_store_s_own_urls_carry_a_harvest_a_checkpoint_and_a_resume_end_to_end(
    box: Instance, shell: SshShell, s3_server: S3Server
) -> None:
    """``S3Store`` (the s3 helper's ``Presigner``) mints the URLs, the box moves the data, the store reads it back."""
    where = s3_server.env(f"e2e-{secrets.token_hex(4)}")
    config = store_config(None, where)
    assert config is not None
    presigner = S3Store(config, "fleet-t", env=where).presigner
    run = "sweep-0123456789ab"
    _run_dir(shell, box, f"{run}.1", {"stdout.log": b"out", "stderr.log": b"err", "metrics.jsonl": b'{"loss": 1}\n',
                                      "ckpt/state.json": b'{"step": 7}'})
    boxes = ShellBoxes(shell)
    uploads = presigner.attempt_uploads(run, 1, ["stdout.log", "stderr.log", MANIFEST, "metrics.jsonl"], ttl_s=600)
    for upload in uploads.values():
        _remember(upload.url)
    boxes.upload_harvest(box, run, 1, patterns=["metrics.jsonl"], cap_bytes=1 << 20, uploads=uploads)
    harvested = presigner.attempt_uploaded(run, 1)
    assert dict(harvested.files) == {"stderr.log": 3, "stdout.log": 3, "metrics.jsonl": 12} and not harvested.skipped
    up = presigner.checkpoint_upload(run, 1, at=time.time(), ttl_s=600)
    _remember(up.url)
    got = boxes.upload_checkpoint(box, run, 1, path="ckpt/", cap_bytes=1 << 20, upload=up)
    assert got.complete
    assert presigner.checkpoint_uploaded(run, 1, up, size=got.size, sha256=got.sha256, at=time.time(), keep=2)
    current = presigner.checkpoint_download(run, ttl_s=600)
    assert current is not None and current[0] == 1
    _remember(current[1].url)
    boxes.stage_resume_from(box, run, 2, current[1])
    assert _sh(shell, box, f"cat ~/rigsync/resume/{run}.2/ckpt/state.json") == '{"step": 7}'
    _tmp_is_empty(shell, box)


class _SlowSink:
    """A PUT target on loopback that holds each upload open until released (so the box can be looked at while the
    transfer runs), then reads it whole and answers 200."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.got: list[bytes] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_PUT(self) -> None:
                outer.release.wait(60)
                outer.got.append(self.rfile.read(int(self.headers["Content-Length"])))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def test_the_url_never_appears_in_the_box_process_list_or_its_files(
    box: Instance, shell: SshShell, ssh_keypair: KeyPair, tmp_path: Path, emulator: Emulator
) -> None:
    sink = _SlowSink()
    token = "sig" + secrets.token_hex(16)
    SIGNATURES.append(token)
    url = f"http://127.0.0.1:{sink.port}/bucket/p/ckpt?X-Amz-Credential=RSKEY&X-Amz-Signature={token}"
    _run_dir(shell, box, "p.1", {"ckpt/state.json": b'{"step": 2}'})
    outcome: list[Any] = []

    def upload() -> None:
        try:
            outcome.append(ShellBoxes(shell).upload_checkpoint(
                box, "p", 1, path="ckpt/", cap_bytes=1 << 20, upload=Upload(key="p/ckpt", url=url, expires_at=0)))
        except Exception as exc:  # surfaced below
            outcome.append(exc)

    worker = threading.Thread(target=upload)
    worker.start()
    watcher = SshShell(private_key=ssh_keypair.private_path, known_hosts=tmp_path / "kh", connect_timeout=3)
    try:
        seen = ""
        deadline = time.monotonic() + 30
        while " put /root/rigsync/tmp/" not in seen and time.monotonic() < deadline:
            seen = _sh(watcher, box, "ps -eww -o args; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'")
        assert " put /root/rigsync/tmp/" in seen, "the transfer was never seen running"
        assert token not in seen and "X-Amz" not in seen and f":{sink.port}" not in seen
    finally:
        sink.release.set()
        worker.join(60)
        watcher.close()
        sink.close()
    assert outcome and not isinstance(outcome[0], Exception), outcome
    assert len(sink.got) == 1 and outcome[0].size == len(sink.got[0])
    # nothing under the box's root holds a URL minted in this module, or the store's secret
    for path in emulator.host_root(box.id).rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            for needle in [*SIGNATURES, S3_CANARY]:
                assert needle.encode() not in data, (path, needle[:6])


def _transfer_progress(emulator: Emulator, iid: int) -> tuple[int, int] | None:
    """(bytes read so far, size) of the tar a running ``transfer.py put`` on the box is sending, read from the host's
    /proc (the box's processes are the host's, in a PID namespace of their own); None while none runs."""
    for pid in emulator._get(iid).box.pids():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"put" not in argv or not argv[-2].endswith(b"harvest.tar"):
                continue
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}").endswith("harvest.tar"):
                    pos = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
                               .splitlines() if line.startswith("pos:"))
                    return pos, os.stat(f"/proc/{pid}/fd/{fd}").st_size
        except (OSError, IndexError, StopIteration):
            continue
    return None


def test_a_box_vanishing_mid_upload_leaves_the_key_without_a_partial_object(
    emulator: Emulator, shell: SshShell, s3: Any, s3_server: S3Server, prefix: str
) -> None:
    doomed = _rent(emulator, "rigsync:transfers:vanish")
    _sh(shell, doomed, "mkdir -p ~/rigsync/runs/v.1/ckpt && head -c 167772160 /dev/urandom >~/rigsync/runs/v.1/ckpt/w")
    up = _put(s3, s3_server, f"{prefix}v/ckpt-1")
    outcome: list[Any] = []

    def upload() -> None:
        try:
            outcome.append(ShellBoxes(shell).upload_checkpoint(doomed, "v", 1, path="ckpt/", cap_bytes=1 << 30,
                                                               upload=up))
        except Exception as exc:  # the box is gone: the command fails
            outcome.append(exc)

    worker = threading.Thread(target=upload)
    worker.start()
    try:
        def sending() -> bool:
            sent = _transfer_progress(emulator, doomed.id)
            return sent is not None and sent[0] >= 32 << 20

        wait_for("the upload to have sent 32 MiB", sending, 60, every=0.02)
        emulator.hang(doomed.id)  # frozen mid-send, so what it sent so far can be read before it dies
        progress = _transfer_progress(emulator, doomed.id)
        assert progress is not None and progress[0] < progress[1], f"the upload was not mid-way: {progress}"
        emulator.vanish(doomed.id)
    finally:
        worker.join(120)
    assert outcome and isinstance(outcome[0], Exception), outcome
    time.sleep(1)  # the server has seen the connection end
    assert _object(s3, s3_server, up.key) is None and _keys(s3, s3_server, prefix) == []
    print(f"vanished at {progress[0]} of {progress[1]} bytes sent: no object")
