"""The S3 result store against a real S3-compatible server (SeaweedFS on loopback, ``s3_server``), which checks SigV4
signatures itself: presigned transfers with plain urllib (as a box makes them), what a hostile box cannot do with its
URLs, checkpoint records and retention, expiry, and the store's errors (refused credentials, a store that is down,
a missing bucket) as one line with no secret in it."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import socket
import tarfile
import time
import urllib.error
import urllib.request
import uuid
from urllib.parse import urlsplit, urlunsplit

import pytest
from conftest import S3_CANARY

from reconciler.adapters.s3store import MAX_TTL_S, MIN_TTL_S, S3Store, open_store
from reconciler.adapters.store import MANIFEST, LocalStore
from reconciler.emulator.s3server import S3Server
from reconciler.errors import (
    StoreBucketMissing,
    StoreCredentialsRefused,
    StoreError,
    StoreUnavailable,
    TransientError,
    UserError,
    cause_chain,
)
from reconciler.ports import ATTEMPT_TAR
from reconciler.settings.object_store import StoreConfig, store_config

RUN = "sweep-0123456789ab"


def fresh(server: S3Server, **env: str) -> S3Store:
    """A store on a prefix of its own (every test keeps to its own keys in the one bucket)."""
    where = {**server.env(f"t-{uuid.uuid4().hex[:10]}"), **env}
    config = store_config(None, where)
    assert config is not None
    return S3Store(config, "fleet-a", env=where)


def put(url: str, body: bytes) -> int:
    with urllib.request.urlopen(urllib.request.Request(url, data=body, method="PUT"), timeout=10) as reply:
        return int(reply.status)


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return bytes(reply.read())


def refused_status(method: str, url: str, body: bytes | None = None) -> int:
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(urllib.request.Request(url, data=body, method=method), timeout=10)
    return int(info.value.code)


def manifest(files: dict[str, bytes], skipped: list[dict[str, object]] | None = None) -> bytes:
    return json.dumps({"files": [[k, len(v)] for k, v in files.items()], "skipped": skipped or [],
                       "bytes": sum(len(v) for v in files.values()), "cap": 1 << 20}).encode()


def harvest_tar(files: dict[str, bytes], skipped: list[dict[str, object]] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in [*files.items(), (MANIFEST, manifest(files, skipped))]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def with_path(url: str, old: str, new: str) -> str:
    parts = urlsplit(url)
    assert old in parts.path
    return urlunsplit(parts._replace(path=parts.path.replace(old, new)))


def sync(store: S3Store, attempt: int, data: bytes, at: float, *, keep: int = 2) -> bool:
    upload = store.checkpoint_upload(RUN, attempt, at=at, ttl_s=300)
    assert put(upload.url, data) == 200
    return store.checkpoint_uploaded(
        RUN, attempt, upload, size=len(data), sha256=hashlib.sha256(data).hexdigest(), at=at, keep=keep
    )


def test_a_box_uploads_its_harvest_with_presigned_puts_and_the_controller_reads_it_back(s3_server: S3Server) -> None:
    store = fresh(s3_server)
    assert store.presigner is store
    names = ["stdout.log", "stderr.log", MANIFEST, "out/metrics.jsonl"]
    uploads = store.attempt_uploads(RUN, 1, names, ttl_s=600)
    assert set(uploads) == {ATTEMPT_TAR, *names}
    assert all(u.key.startswith(store.attempt_prefix(RUN, 1)) for u in uploads.values())
    files = {"stdout.log": b"step 1\nstep 2\nstep 3\n", "stderr.log": b"", "out/metrics.jsonl": b'{"r": 1}\n{"r": 2}\n'}
    for name, data in files.items():
        assert put(uploads[name].url, data) == 200
    assert put(uploads[MANIFEST].url, manifest(files)) == 200
    with pytest.raises(StoreError, match="uploaded no harvest"):  # no tar yet: not a harvest
        store.attempt_uploaded(RUN, 1)
    assert put(uploads[ATTEMPT_TAR].url, harvest_tar(files)) == 200

    got = store.attempt_uploaded(RUN, 1)
    assert dict(got.files) == {k: len(v) for k, v in files.items()} and got.skipped == ()
    assert store.read_attempt(RUN, 1, "stdout.log") == files["stdout.log"]
    assert store.read_attempt(RUN, 1, "stdout.log", tail=7) == b"step 3\n"
    assert store.read_attempt(RUN, 1, "stderr.log", tail=100) == b""
    assert store.read_attempt(RUN, 1, "meta.json") is None
    assert store.read_attempt(RUN, 2, "stdout.log") is None
    fh = store.open_attempt(RUN, 1, "out/metrics.jsonl")
    assert fh is not None
    with fh:
        assert list(fh) == [b'{"r": 1}\n', b'{"r": 2}\n']
    assert store.open_attempt(RUN, 1, "nope.log") is None
    # what the URLs grant is no secret's to show: not in any repr
    assert "X-Amz" not in repr(uploads) and S3_CANARY not in repr(store) and s3_server.access_key not in repr(store)


def test_a_presigned_put_edited_to_another_attempts_key_is_refused_by_the_server(s3_server: S3Server) -> None:
    store = fresh(s3_server)
    mine = store.attempt_uploads(RUN, 1, ["stdout.log"], ttl_s=600)
    for target in (f"{RUN}.2/", "other-run-000000000000.1/"):
        forged = with_path(mine["stdout.log"].url, f"{RUN}.1/", target)
        assert refused_status("PUT", forged, b"overwritten by a hostile box") == 403
    forged = with_path(mine[ATTEMPT_TAR].url, f"runs/{RUN}.1/harvest.tar", f"checkpoints/{RUN}/current.json")
    assert refused_status("PUT", forged, b'{"attempt": 1}') == 403
    assert store.read_attempt(RUN, 2, "stdout.log") is None
    assert store.read_attempt("other-run-000000000000", 1, "stdout.log") is None
    assert store.checkpoint_synced(RUN) is None
    # the URL as given still works: the refusal is the signature's, not a broken server
    assert put(mine["stdout.log"].url, b"mine\n") == 200
    assert store.read_attempt(RUN, 1, "stdout.log") == b"mine\n"


def test_a_presigned_get_cannot_be_used_to_put(s3_server: S3Server) -> None:
    store = fresh(s3_server)
    data = b"checkpoint bytes" * 64
    assert sync(store, 1, data, at=1000.0)
    got = store.checkpoint_download(RUN, ttl_s=600)
    assert got is not None
    attempt, download = got
    assert attempt == 1 and download.size == len(data) and download.sha256 == hashlib.sha256(data).hexdigest()
    assert get(download.url) == data
    assert refused_status("PUT", download.url, b"replaced") == 403
    assert refused_status("DELETE", download.url) == 403
    assert get(download.url) == data


def test_a_checkpoint_of_the_wrong_size_is_refused_and_the_previous_one_stays(s3_server: S3Server) -> None:
    store = fresh(s3_server)
    good = b"good" * 100
    assert sync(store, 1, good, at=1000.0)
    before = store.checkpoint_synced(RUN)
    assert before == (1, 1000.0)
    # a vanish mid-upload: the box reports more than the store holds (or nothing was uploaded at all)
    upload = store.checkpoint_upload(RUN, 2, at=2000.0, ttl_s=300)
    assert put(upload.url, b"part") == 200
    assert not store.checkpoint_uploaded(RUN, 2, upload, size=400, sha256="0" * 64, at=2000.0, keep=2)
    never = store.checkpoint_upload(RUN, 2, at=3000.0, ttl_s=300)
    assert not store.checkpoint_uploaded(RUN, 2, never, size=4, sha256="0" * 64, at=3000.0, keep=2)
    # a key outside the run's syncs, or another attempt's, is never made current
    assert not store.checkpoint_uploaded(RUN, 3, upload, size=4, sha256="0" * 64, at=2000.0, keep=2)
    assert store.checkpoint_synced(RUN) == before
    assert [s.attempt for s in store._syncs(RUN)] == [1]  # the refused object is gone: retention never counts it
    stored = store.checkpoint(RUN)
    assert stored is not None and stored.attempt == 1 and stored.tar == good


def test_retention_keeps_the_newest_syncs_and_never_the_current_one_goes(s3_server: S3Server) -> None:
    store = fresh(s3_server)
    for i in range(5):
        assert sync(store, 1 + i // 2, f"sync {i}".encode(), at=1000.0 + i, keep=2)
    kept = store._syncs(RUN)
    assert [(s.attempt, s.at_ms) for s in kept] == [(3, 1004000), (2, 1003000)]
    assert store.checkpoint_synced(RUN) == (3, 1004.0)
    assert sync(store, 3, b"last", at=1005.0, keep=1)
    assert [s.at_ms for s in store._syncs(RUN)] == [1005000]
    stored = store.checkpoint(RUN)
    assert stored is not None and stored.tar == b"last"


def test_expire_removes_only_harvests_older_than_the_retention(s3_server: S3Server) -> None:
    store = fresh(s3_server)
    for attempt in (1, 2):
        uploads = store.attempt_uploads(RUN, attempt, ["stdout.log"], ttl_s=300)
        assert put(uploads["stdout.log"].url, b"x") == 200 and put(uploads[ATTEMPT_TAR].url, b"tar") == 200
    assert sync(store, 1, b"ckpt", at=1000.0)
    now = time.time()
    assert store.expire(now, keep_harvests_s=None) == 0
    assert store.expire(now, keep_harvests_s=3600) == 0
    assert store.read_attempt(RUN, 1, "stdout.log") == b"x"
    assert store.expire(now + 7200, keep_harvests_s=3600) == 2
    assert store.read_attempt(RUN, 1, "stdout.log") is None and store.read_attempt(RUN, 2, "stdout.log") is None
    assert store.checkpoint_synced(RUN) == (1, 1000.0)  # checkpoints are not harvests: retention keeps them


def test_the_controller_side_streams_hold_the_port_whole(s3_server: S3Server) -> None:
    store = fresh(s3_server)
    files = {"stdout.log": b"hello\n", "meta.json": b"{}"}
    got = store.put_attempt(RUN, 1, harvest_tar(files))
    assert dict(got.files) == {k: len(v) for k, v in files.items()}
    assert store.read_attempt(RUN, 1, "stdout.log") == b"hello\n"
    complete = harvest_tar({"model.pt": b"weights"})
    assert store.put_checkpoint(RUN, 1, io.BytesIO(complete), at=50.0).skipped == ()
    partial = harvest_tar({"model.pt": b"w"}, skipped=[{"path": "big.pt", "size": 9, "why": "over the cap"}])
    assert store.put_checkpoint(RUN, 2, partial, at=60.0).skipped
    stored = store.checkpoint(RUN)
    assert stored is not None and (stored.attempt, stored.synced_at, stored.tar) == (1, 50.0, complete)


def test_the_bootstrap_cache_is_recorded_only_whole(s3_server: S3Server) -> None:
    store = fresh(s3_server)
    key = "0123456789abcdef-img-cuda12"
    assert store.cache_download(key, ttl_s=300) is None
    upload = store.cache_upload(key, ttl_s=300)
    data = b"venv" * 1000
    assert put(upload.url, data) == 200
    assert not store.cache_uploaded(key, upload, size=len(data) + 1, sha256=hashlib.sha256(data).hexdigest())
    assert store.cache_download(key, ttl_s=300) is None
    assert store.cache_uploaded(key, upload, size=len(data), sha256=hashlib.sha256(data).hexdigest())
    download = store.cache_download(key, ttl_s=300)
    assert download is not None and download.size == len(data) and get(download.url) == data
    assert refused_status("PUT", with_path(upload.url, key, "another-key"), b"x") == 403


def test_keys_are_checked_before_they_become_keys(s3_server: S3Server) -> None:
    store = fresh(s3_server)
    for name in ("../x", "/etc/passwd", "a/../../b", "", "a//b", "x" * 600, "a b"):
        with pytest.raises(StoreError, match="not a usable file name"):
            store.attempt_uploads(RUN, 1, [name], ttl_s=60)
    for run in ("../other", "a/b", "", ".hidden", "x" * 200):
        with pytest.raises(StoreError, match="not a usable run id"):
            store.checkpoint_upload(run, 1, at=1.0, ttl_s=60)
    for attempt in (0, -1, True):
        with pytest.raises(StoreError, match="not a usable attempt"):
            store.attempt_uploads(RUN, attempt, [], ttl_s=60)
    with pytest.raises(StoreError, match="not a usable bootstrap cache key"):
        store.cache_upload("../../runs/x", ttl_s=60)


def test_presigned_lifetimes_are_clamped(s3_server: S3Server) -> None:
    store = fresh(s3_server)
    now = time.time()
    short = store.checkpoint_upload(RUN, 1, at=1.0, ttl_s=1)
    long = store.checkpoint_upload(RUN, 1, at=1.0, ttl_s=10**9)
    assert now + MIN_TTL_S - 1 <= short.expires_at <= time.time() + MIN_TTL_S + 1
    assert long.expires_at <= time.time() + MAX_TTL_S + 1 and "X-Amz-Expires=604800" in long.url


def test_refused_credentials_are_one_line_without_any_secret(s3_server: S3Server) -> None:
    wrong = S3_CANARY + "-wrong"
    for env in ({"AWS_SECRET_ACCESS_KEY": wrong}, {"AWS_ACCESS_KEY_ID": "RSNOBODY00000000"}):
        store = fresh(s3_server, **env)
        for call in ("read", "synced"):
            with pytest.raises(StoreCredentialsRefused) as info:
                if call == "read":
                    store.read_attempt(RUN, 1, "stdout.log")
                else:
                    store.checkpoint_synced(RUN)
            message = str(info.value)
            assert isinstance(info.value, UserError) and "\n" not in message
            assert s3_server.endpoint in message and s3_server.bucket in message
            for secret in (S3_CANARY, wrong, s3_server.secret_key):
                assert secret not in message and secret not in cause_chain(info.value)


def test_a_store_that_is_down_is_transient(s3_server: S3Server) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = fresh(s3_server, RIGSYNC_STORE_ENDPOINT=f"http://127.0.0.1:{port}")
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as info:
        store.checkpoint_synced(RUN)
    assert isinstance(info.value, TransientError) and f"127.0.0.1:{port}" in str(info.value)
    assert time.monotonic() - started < 30
    with pytest.raises(StoreUnavailable):
        store.attempt_uploaded(RUN, 1)


def test_a_missing_bucket_is_a_user_error(s3_server: S3Server) -> None:
    env = s3_server.env("x")
    store = S3Store(StoreConfig(bucket="no-such-bucket-here", endpoint=s3_server.endpoint), "fleet-a", env=env)
    with pytest.raises(StoreBucketMissing) as info:
        store.checkpoint_synced(RUN)
    assert isinstance(info.value, UserError) and "'no-such-bucket-here' does not exist" in str(info.value)


def test_open_store_is_local_by_default(s3_server: S3Server, tmp_path: object) -> None:
    assert isinstance(open_store(None, "fleet-a", str(tmp_path)), LocalStore)
    env = s3_server.env("o")
    assert isinstance(open_store(store_config(None, env), "fleet-a", None, env=env), S3Store)


def test_nothing_secret_is_logged_even_at_debug(s3_server: S3Server, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        store = fresh(s3_server)
        uploads = store.attempt_uploads(RUN, 1, ["stdout.log"], ttl_s=300)
        assert put(uploads["stdout.log"].url, b"x") == 200
        assert sync(store, 1, b"ckpt", at=1.0)
        assert store.read_attempt(RUN, 1, "stdout.log") == b"x" and store.checkpoint_download(RUN, ttl_s=60)
    logged = "\n".join(f"{r.name} {r.getMessage()}" for r in caplog.records)
    for secret in (S3_CANARY, s3_server.secret_key, "Signature", "X-Amz-Credential", uploads["stdout.log"].url):
        assert secret not in logged
