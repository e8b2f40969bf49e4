"""The bootstrap cache on real parts: the emulator's sshd boxes, the real ``vastai`` SDK, paramiko, and a real S3
server (SeaweedFS, ``s3_server``) behind ``S3Store``, which mints the presigned URLs the boxes use themselves.

Each test bootstraps through ``apply`` (the ``Bootstrap`` action's branch, as the controller runs it every cycle)
with a script of its own (a nonce in its text: its own hash, its own cache key, its own paths) and a store prefix
of its own, so the two module boxes serve every test. The script appends to a marker file outside the cached paths,
which is how "the script did not run" is seen.
"""

from __future__ import annotations

import hashlib
import io
import json
import secrets
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest
from botocore.config import Config

from reconciler.adapters.ssh import SshShell
from reconciler.adapters.store import LocalStore
from reconciler.adapters.vast import VastProvider
from reconciler.core.identity import box_cache_key
from reconciler.core.model import DEFAULT_POOL, Instance, Pool
from reconciler.desired.fields import script_hash
from reconciler.emulator import Emulator
from reconciler.emulator.s3server import S3Server
from reconciler.emulator.testing import KeyPair
from reconciler.ports import ResultStore

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from bootstrap_cache import bootstrap_until_done, on_box, rent_boxes, s3_store

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def boxes(emulator: Emulator) -> Iterator[list[Instance]]:
    """Two running boxes of the fleet, rented through the real SDK."""
    rented = rent_boxes(emulator, 2)
    yield rented
    provider = VastProvider(api_key=emulator.api_key, server_url=emulator.url)
    for box in rented:
        provider.destroy_instance(box.id)


@pytest.fixture
def shell(ssh_keypair: KeyPair, tmp_path: Path) -> Iterator[SshShell]:
    s = SshShell(private_key=ssh_keypair.private_path, known_hosts=tmp_path / "known_hosts", connect_timeout=3)
    yield s
    s.close()


@dataclass
class Case:
    """One test's bootstrap: its script (with a nonce), the cached path, the marker the script appends to."""

    nonce: str
    venv: str  # the cached path on the box
    marker: str  # outside the cached paths: one line per run of the script

    def pool(self, extra: str = "") -> Pool:
        script = (
            "set -e\n"
            f"echo ran >> {self.marker}\n"
            f"mkdir -p {self.venv}/bin {self.venv}/lib\n"
            f"printf '#!/bin/sh\\necho {self.nonce}\\n' > {self.venv}/bin/tool && chmod 755 {self.venv}/bin/tool\n"
            f"head -c 300000 /dev/urandom > {self.venv}/lib/blob\n"
            f"# {self.nonce} {extra}\n"
        )
        return Pool(
            name=DEFAULT_POOL, image="img", bootstrap_path="desired/bootstrap.sh", bootstrap_script=script,
            bootstrap_hash=script_hash(script), bootstrap_cache=(self.venv,),
        )


@pytest.fixture
def case() -> Case:
    nonce = secrets.token_hex(4)
    return Case(nonce, f"/root/venv-{nonce}", f"/root/ran-{nonce}.log")


def s3_client(server: S3Server):  # type: ignore[no-untyped-def]
    return boto3.session.Session().client(
        "s3", endpoint_url=server.endpoint, region_name="us-east-1", aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key,
        config=Config(request_checksum_calculation="when_required", s3={"addressing_style": "path"}),
    )


def bootstrap(
    emulator: Emulator, shell: SshShell, store: ResultStore, box: Instance, pool: Pool, tmp_path: Path
) -> list[str]:
    return bootstrap_until_done(emulator, shell, store, box, pool, tmp_path / "archive")


def bootstrap_log(emulator: Emulator, box: Instance, pool: Pool) -> str:
    return on_box(emulator, box, f"/root/rigsync/bootstrap/{pool.bootstrap_hash}.log").read_text()


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def no_url_left(emulator: Emulator, box: Instance) -> None:
    """No presigned URL (its signature) in any file the box keeps under /root."""
    for f in emulator.host_root(box.id).rglob("*"):
        if f.is_file() and not f.is_symlink():
            assert b"X-Amz-Signature" not in f.read_bytes(), f


def test_a_cold_box_uploads_and_a_new_box_restores_without_running_the_script(
    emulator: Emulator, s3_server: S3Server, shell: SshShell, boxes: list[Instance], case: Case, tmp_path: Path
) -> None:
    store = s3_store(s3_server, f"t-{case.nonce}")
    pool = case.pool()
    cold, warm = boxes
    key = box_cache_key(pool, cold)
    assert key is not None and key == box_cache_key(pool, warm)  # same image and CUDA major in the emulator
    assert store.cache_download(key, ttl_s=60) is None

    details = bootstrap(emulator, shell, store, cold, pool, tmp_path)
    assert details[-1].startswith("bootstrap ok cache ") and details[-1].endswith(f"cache {key} recorded"), details
    assert on_box(emulator, cold, case.marker).read_text() == "ran\n"
    assert f"uploaded cache {key}" in bootstrap_log(emulator, cold, pool)
    recorded = store.cache_download(key, ttl_s=60)
    assert recorded is not None and recorded.size > 300_000
    # the answer is said once: the next bootstrap of the same box is plain "ok", nothing recorded again
    assert bootstrap(emulator, shell, store, cold, pool, tmp_path) == ["bootstrap ok"]

    details = bootstrap(emulator, shell, store, warm, pool, tmp_path)
    assert details[-1] == "bootstrap ok", details  # restored: no upload, nothing to record
    assert not on_box(emulator, warm, case.marker).exists()  # the script did not run
    assert f"restored from cache {key}" in bootstrap_log(emulator, warm, pool)
    blob = f"{case.venv}/lib/blob"
    assert sha(on_box(emulator, warm, blob)) == sha(on_box(emulator, cold, blob))
    tool = on_box(emulator, warm, f"{case.venv}/bin/tool")
    assert tool.stat().st_mode & 0o777 == 0o755 and case.nonce in tool.read_text()
    assert not on_box(emulator, warm, "/root/rigsync/bootstrap/" + pool.bootstrap_hash + ".cache.tar").exists()
    for box in boxes:
        no_url_left(emulator, box)


def test_a_script_change_is_a_new_key_and_rebuilds(
    emulator: Emulator, s3_server: S3Server, shell: SshShell, boxes: list[Instance], case: Case, tmp_path: Path
) -> None:
    store = s3_store(s3_server, f"t-{case.nonce}")
    cold, warm = boxes
    first, changed = case.pool(), case.pool(extra="now with more")
    assert box_cache_key(first, warm) != box_cache_key(changed, warm)
    bootstrap(emulator, shell, store, cold, first, tmp_path)
    details = bootstrap(emulator, shell, store, warm, changed, tmp_path)
    assert details[-1].endswith(f"cache {box_cache_key(changed, warm)} recorded"), details  # built, uploaded anew
    assert on_box(emulator, warm, case.marker).read_text() == "ran\n"
    assert "restored from cache" not in bootstrap_log(emulator, warm, changed)


@pytest.mark.parametrize("corruption", ["wrong sha256 recorded", "object replaced"])
def test_a_corrupted_cache_falls_back_to_the_script(
    emulator: Emulator, s3_server: S3Server, shell: SshShell, boxes: list[Instance], case: Case, tmp_path: Path,
    corruption: str,
) -> None:
    store = s3_store(s3_server, f"t-{case.nonce}")
    pool = case.pool()
    cold, warm = boxes
    key = box_cache_key(pool, cold)
    assert key is not None
    bootstrap(emulator, shell, store, cold, pool, tmp_path)
    recorded = store.cache_download(key, ttl_s=60)
    assert recorded is not None
    client = s3_client(s3_server)
    tar_key, record_key = store.cache_key(key, ".tar"), store.cache_key(key, ".json")
    if corruption == "wrong sha256 recorded":
        doc = json.loads(client.get_object(Bucket=s3_server.bucket, Key=record_key)["Body"].read())
        doc["sha256"] = "0" * 64
        client.put_object(Bucket=s3_server.bucket, Key=record_key, Body=json.dumps(doc).encode())
    else:  # the same size (the store's own check passes), other bytes: only the box's SHA-256 check sees it
        client.put_object(Bucket=s3_server.bucket, Key=tar_key, Body=b"\0" * recorded.size)
    assert store.cache_download(key, ttl_s=60) is not None  # the controller still hands it out

    details = bootstrap(emulator, shell, store, warm, pool, tmp_path)
    log = bootstrap_log(emulator, warm, pool)
    assert f"restore from cache {key} failed (download or check): running the script" in log
    assert on_box(emulator, warm, case.marker).read_text() == "ran\n"  # the script ran
    assert on_box(emulator, warm, f"{case.venv}/lib/blob").stat().st_size == 300_000
    # and its upload replaced the bad object: the cache is whole again
    assert details[-1].endswith(f"cache {key} recorded"), details
    healed = store.cache_download(key, ttl_s=60)
    assert healed is not None and healed.sha256 != "0" * 64
    body = client.get_object(Bucket=s3_server.bucket, Key=tar_key)["Body"].read()
    assert hashlib.sha256(body).hexdigest() == healed.sha256


def test_a_cache_that_holds_more_than_its_paths_writes_only_its_paths(
    emulator: Emulator, s3_server: S3Server, shell: SshShell, boxes: list[Instance], case: Case, tmp_path: Path
) -> None:
    """A cache object whose tar also holds other files (a hostile uploader's, recorded with its true SHA-256): the
    restore unpacks only the declared paths."""
    store = s3_store(s3_server, f"t-{case.nonce}")
    pool = case.pool()
    key = box_cache_key(pool, boxes[1])
    assert key is not None
    evil = f"/root/evil-{case.nonce}"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in ((f"{case.venv}/lib/blob", b"cached"), (evil, b"planted")):
            info = tarfile.TarInfo(name.removeprefix("/"))
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    body = buf.getvalue()
    upload = store.cache_upload(key, ttl_s=60)
    s3_client(s3_server).put_object(Bucket=s3_server.bucket, Key=upload.key, Body=body)
    assert store.cache_uploaded(key, upload, size=len(body), sha256=hashlib.sha256(body).hexdigest())

    bootstrap(emulator, shell, store, boxes[1], pool, tmp_path)
    assert f"restored from cache {key}" in bootstrap_log(emulator, boxes[1], pool)
    assert on_box(emulator, boxes[1], f"{case.venv}/lib/blob").read_bytes() == b"cached"
    assert not on_box(emulator, boxes[1], evil).exists()


def test_with_the_local_store_a_bootstrap_is_as_ever(
    emulator: Emulator, shell: SshShell, boxes: list[Instance], case: Case, tmp_path: Path
) -> None:
    pool = case.pool()
    details = bootstrap(emulator, shell, LocalStore(tmp_path / "data"), boxes[0], pool, tmp_path)
    assert details[-1] == "bootstrap ok"
    assert on_box(emulator, boxes[0], case.marker).read_text() == "ran\n"
    log = bootstrap_log(emulator, boxes[0], pool)
    assert "cache" not in log


E2E_SCRIPT = """\
#!/bin/sh
# builds /root/benv (cached); the marker is outside it
set -eu
echo ran >> /root/bcache-ran.log
mkdir -p /root/benv/bin
printf '#!/bin/sh\\necho built\\n' > /root/benv/bin/tool
chmod 755 /root/benv/bin/tool
head -c 100000 /dev/urandom > /root/benv/blob
"""


def test_the_daemon_caches_from_its_first_box_and_a_later_box_restores(
    emulator: Emulator, s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Reconciler.cycle`` as ``rigsync run --store`` runs it: a sweep on a cold box (script, upload, recorded),
    every box gone, then a new run's box restores the cache instead of running the script."""
    import world
    from test_reconcile import SWEEP, TIMEOUTS, drive

    from reconciler.cli._common import load_local_desired, open_reconciler
    from reconciler.core.actions import Bootstrap
    from reconciler.loop import CycleResult
    from reconciler.settings.object_store import StoreConfig

    prefix = f"e2e-{secrets.token_hex(4)}"
    monkeypatch.setenv("VAST_API_KEY", emulator.api_key)
    for name, value in s3_server.env(prefix).items():
        monkeypatch.setenv(name, value)
    repo = world.fleet_repo(tmp_path / "fleet")
    work = repo.work
    repo.write("desired/bootstrap.sh", E2E_SCRIPT)
    repo.edit_fleet(name="itbcache", bootstrap={"script": "bootstrap.sh", "cache": ["/root/benv"]}, max=1, **TIMEOUTS)
    repo.write("desired/sweeps/tdmpc.yaml", SWEEP.format(seconds=0.5))
    repo.edit("desired/sweeps/tdmpc.yaml", lambda doc: doc["grid"].update(lr=[1.0e-3]))
    repo.commit("test: a cached bootstrap, one run", push=False)
    desired = load_local_desired(work)
    assert desired.fleet.pools[0].bootstrap_cache == ("/root/benv",)
    rec = open_reconciler(work, desired, str(tmp_path / "state"), emulator.url,
                          store=StoreConfig(bucket=s3_server.bucket, prefix=prefix, endpoint=s3_server.endpoint))

    # per box: the Bootstrap outcomes it had, then (once a probe says its bootstrap is done) whether the script
    # ran (the marker) and its bootstrap log, read before the box goes
    outcomes: dict[int, list[str]] = {}
    seen: list[tuple[int, list[str], bool, str]] = []

    def look(res: CycleResult) -> None:
        for o in res.applied.outcomes if res.applied else ():
            if isinstance(o.action, Bootstrap):
                outcomes.setdefault(o.action.instance_id, []).append(o.detail)
        h = desired.fleet.pools[0].bootstrap_hash
        for probe in res.observed.probes:
            box = next((i for i in res.observed.instances if i.id == probe.instance_id), None)
            if box is None or h not in probe.bootstrap_hashes or any(s[0] == box.id for s in seen):
                continue
            log = on_box(emulator, box, f"/root/rigsync/bootstrap/{h}.log")
            seen.append((box.id, outcomes.get(box.id, []), on_box(emulator, box, "/root/bcache-ran.log").exists(),
                         log.read_text() if log.exists() else ""))

    drive(rec, desired, emulator, look)
    assert len(seen) == 1, seen
    first, said, ran, log = seen[0]
    assert ran and "uploaded cache" in log, seen
    assert said[-1].startswith("bootstrap ok cache ") and said[-1].endswith(" recorded"), seen  # recorded once
    assert sum("cache" in d for d in said) == 1, said

    repo.edit("desired/sweeps/tdmpc.yaml", lambda doc: doc.update(seeds=[1, 2]))
    repo.commit("test: one more seed", push=False)
    desired = load_local_desired(work)
    drive(rec, desired, emulator, look)
    assert len(seen) == 2, seen
    second, said, ran, log = seen[1]
    assert second != first and not ran and "restored from cache" in log, seen
    assert not any("cache" in d for d in said), said  # restored: nothing uploaded, nothing to record
