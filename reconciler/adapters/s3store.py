"""The result store in an S3-compatible object store (AWS S3, Cloudflare R2, MinIO, Backblaze B2, SeaweedFS).

Where it is and its credentials are the controller's settings (``reconciler.settings.object_store``). Boxes reach it
themselves, with presigned URLs the controller mints for one attempt's keys (``ports.Presigner``): large data
never crosses the controller, and no box holds a credential. The layout, under ``<prefix>/<fleet>/``::

    runs/<run_id>.<attempt>/harvest.tar               the attempt's whole harvest (harvest.py's stream, manifest last)
    runs/<run_id>.<attempt>/files/<name>              the files read back on their own (stdout.log, the manifest...)
    checkpoints/<run_id>/<attempt>-<at_ms:013d>.tar   one checkpoint sync (a key of its own per sync)
    checkpoints/<run_id>/current.json                 the sync to resume from: attempt, key, size, sha256, synced_at
    bootstrap-cache/<key>.tar                         a bootstrap's packed result
    bootstrap-cache/<key>.json                        its record: size, sha256

Only the controller writes ``current.json`` and the cache records, and only after it has seen the object with the
size the box reported: an upload a vanish interrupted leaves the previous sync current. A box's presigned PUT names
one key: the server refuses it for any other (SigV4 signs the path), so a hostile box writes only under its own
attempt's keys.

The client is boto3 (with botocore): the reference implementation of SigV4 and of presigning, kept by AWS and
released weekly, and the client every S3-compatible service documents and tests against. Configured for
non-AWS endpoints: checksums only when an operation requires them (recent botocore adds CRC32 trailers by default,
which R2, B2 and older MinIO and SeaweedFS refuse), path-style addressing (no bucket DNS names on a loopback or
private endpoint), SigV4, bounded timeouts and botocore's standard retry mode. (obstore is fast but younger, and
its presigning API is narrower.)

Errors at this boundary: a store that does not answer (refused connection, timeout, 5xx, SlowDown) is
``StoreUnavailable`` (transient); refused credentials are ``StoreCredentialsRefused`` (one line naming the endpoint
and bucket, never a key); a missing bucket is ``StoreBucketMissing``; anything else ``StoreError``. No secret
(credential, presigned URL) is in any message, repr or log line: botocore's own loggers, whose DEBUG lines show
signed requests, are kept at WARNING.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import re
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import IO, Any, BinaryIO, TypeGuard, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError, NoCredentialsError
from botocore.exceptions import ConnectionError as BotoConnectionError

from reconciler.adapters.store import MANIFEST, LocalStore, data_dir_for, parse_manifest
from reconciler.core.bounds import MANIFEST_BYTES
from reconciler.core.model import Fleet
from reconciler.errors import (
    StoreBucketMissing,
    StoreCredentialsRefused,
    StoreError,
    StoreUnavailable,
    UserError,
)
from reconciler.ports import (
    ATTEMPT_TAR,
    Download,
    Harvested,
    HarvestStream,
    Presigner,
    ResultStore,
    StoredCheckpoint,
    Upload,
)
from reconciler.remote.commands import SHA256_RE, is_run_file
from reconciler.settings.object_store import ACCESS_KEY_ENV, SECRET_KEY_ENV, StoreConfig

T = TypeVar("T")

MIN_TTL_S = 60.0
MAX_TTL_S = 7 * 86400.0  # SigV4's own limit on a presigned URL
CONNECT_TIMEOUT_S = 10
READ_TIMEOUT_S = 60
MAX_ATTEMPTS = 4
CURRENT = "current.json"
MAX_RECORD_BYTES = 64 << 10  # current.json, a cache record
MAX_PUT_FILES = 256  # put_attempt: the run directory's files also stored on their own (read_attempt)
MAX_PUT_FILE_BYTES = 64 << 20
QUIET_LOGGERS = ("botocore", "boto3", "s3transfer")
SESSION_TOKEN_ENV = "AWS_SESSION_TOKEN"  # a variable's name

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_SYNC = re.compile(r"(?P<attempt>[0-9]{1,9})-(?P<at_ms>[0-9]{13})\.tar")

_CREDENTIAL_CODES = frozenset({
    "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken", "ExpiredToken",
    "InvalidClientTokenId", "AuthorizationHeaderMalformed", "Forbidden", "403",
})
_UNAVAILABLE_CODES = frozenset({
    "SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "RequestTimeTooSkewed", "Throttling",
    "ThrottlingException", "TooManyRequests", "503", "500", "502", "504",
})
_MISSING_CODES = frozenset({"NoSuchKey", "NotFound", "404", "InvalidRange", "416"})


def _is_size(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_id(value: str, what: str) -> str:
    if not isinstance(value, str) or not _ID.fullmatch(value) or ".." in value:
        raise StoreError(f"not a usable {what} for a store key: {value[:80]!r}")
    return value


def _check_attempt(attempt: int) -> int:
    if isinstance(attempt, bool) or not isinstance(attempt, int) or not 1 <= attempt < 10**9:
        raise StoreError(f"not a usable attempt number for a store key: {attempt!r}")
    return attempt


def check_name(name: str) -> str:
    """A run-directory file's name as part of a key: a relative path of safe parts (``remote.is_run_file``, the
    rule the box's upload checks too)."""
    if not isinstance(name, str) or not is_run_file(name):
        raise StoreError(f"not a usable file name for a store key: {str(name)[:80]!r}")
    return name


def clamp_ttl(ttl_s: float) -> int:
    """A presigned URL's lifetime in whole seconds, within [60 s, 7 days]."""
    return int(min(MAX_TTL_S, max(MIN_TTL_S, float(ttl_s))))


def _code(exc: ClientError) -> tuple[str, int]:
    err = exc.response.get("Error", {}) if isinstance(exc.response, dict) else {}
    meta = exc.response.get("ResponseMetadata", {}) if isinstance(exc.response, dict) else {}
    status = meta.get("HTTPStatusCode")
    return str(err.get("Code", "")), status if isinstance(status, int) else 0


class _Missing(Exception):
    """Internal: the object (or range) is not there."""


@dataclass(frozen=True)
class _Sync:
    key: str
    attempt: int
    at_ms: int


class _Body(io.RawIOBase):
    """A botocore streaming body as a raw stream (buffered by ``open_attempt``): a read that fails mid-way is
    ``StoreUnavailable``, not a library's exception."""

    def __init__(self, body: Any, where: str) -> None:
        self._body = body
        self._where = where

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            chunk = self._body.read(len(buffer))
        except Exception as exc:  # urllib3's and botocore's read errors: the store stopped answering
            why = type(exc).__name__
            raise StoreUnavailable(f"the store {self._where} stopped answering mid-read ({why})") from exc
        n = len(chunk)
        buffer[:n] = chunk
        return n

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._body.close()
        super().close()


class S3Store:
    """The ``ResultStore`` and ``Presigner`` ports over one bucket and prefix, for one fleet (layout above)."""

    def __init__(
        self, config: StoreConfig, fleet: str, *, env: Mapping[str, str] | None = None,
        keep_checkpoints: int = Fleet.keep_checkpoints,
    ) -> None:
        """``env``: where the credentials are read (the standard AWS names; default the process environment);
        ``keep_checkpoints``: the syncs ``put_checkpoint`` keeps (the presigned path is told by its caller)."""
        source = os.environ if env is None else env
        self.keep_checkpoints = keep_checkpoints
        for name in QUIET_LOGGERS:  # their DEBUG lines carry signed headers and presigned URLs: never below WARNING
            logger = logging.getLogger(name)
            logger.setLevel(max(logger.level, logging.WARNING))
        self.config = config
        self.fleet = _check_id(fleet, "fleet name")
        self.base = f"{config.prefix}/{fleet}/" if config.prefix else f"{fleet}/"
        self._where = config.where()
        access, secret = source.get(ACCESS_KEY_ENV), source.get(SECRET_KEY_ENV)
        if not access or not secret:
            raise UserError(f"the store {self._where} needs {ACCESS_KEY_ENV} and {SECRET_KEY_ENV} on the controller")
        try:
            self._client = boto3.session.Session().client(
                "s3", endpoint_url=config.endpoint, region_name=config.region, aws_access_key_id=access,
                aws_secret_access_key=secret, aws_session_token=source.get(SESSION_TOKEN_ENV) or None,
                config=Config(
                    request_checksum_calculation="when_required", response_checksum_validation="when_required",
                    s3={"addressing_style": "path"}, signature_version="s3v4",
                    retries={"mode": "standard", "max_attempts": MAX_ATTEMPTS},
                    connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S,
                ),
            )
        except (BotoCoreError, ValueError) as exc:
            raise StoreError(f"cannot open the store {self._where}: {type(exc).__name__}") from exc

    def __repr__(self) -> str:
        return f"S3Store({self._where!r}, fleet={self.fleet!r})"

    # ------------------------------------------------------------------------------------------------ boundary

    def _call(self, what: str, fn: Callable[..., T], /, **kwargs: Any) -> T:
        """One client call, its exceptions as ours (``_Missing`` for an absent object, for the caller to decide)."""
        try:
            return fn(Bucket=self.config.bucket, **kwargs)
        except ClientError as exc:
            code, status = _code(exc)
            if code in _MISSING_CODES or (status in (404, 416) and code != "NoSuchBucket"):
                raise _Missing(code) from exc
            if code == "NoSuchBucket":
                raise StoreBucketMissing(
                    f"the store {self._where}: the bucket {self.config.bucket!r} does not exist (create it, or fix "
                    "--store / RIGSYNC_STORE)"
                ) from exc
            if code in _CREDENTIAL_CODES or status in (401, 403):
                raise StoreCredentialsRefused(
                    f"the store {self._where} refused the controller's credentials ({code or status}) on {what}: "
                    f"check {ACCESS_KEY_ENV} and {SECRET_KEY_ENV} and the bucket's permissions"
                ) from exc
            if code in _UNAVAILABLE_CODES or status >= 500 or status == 429:
                raise StoreUnavailable(f"the store {self._where} is unavailable ({code or status}) on {what}") from exc
            raise StoreError(f"the store {self._where} refused {what} ({code or status})") from exc
        except NoCredentialsError as exc:
            raise UserError(f"the store {self._where} has no credentials: set {ACCESS_KEY_ENV} and {SECRET_KEY_ENV}") \
                from exc
        except (BotoConnectionError, HTTPClientError) as exc:  # refused, reset, timed out (connect or read)
            raise StoreUnavailable(f"the store {self._where} does not answer ({type(exc).__name__}) on {what}") \
                from exc
        except BotoCoreError as exc:
            raise StoreError(f"the store {self._where} failed on {what} ({type(exc).__name__})") from exc

    def _get(self, key: str, *, limit: int | None = None, tail: int | None = None) -> bytes | None:
        """The object's bytes (its last ``tail``; at most ``limit`` + 1 of them); None when it is not there."""
        kwargs: dict[str, Any] = {"Key": key}
        if tail is not None:
            if tail <= 0:
                return b"" if self._head(key) is not None else None
            kwargs["Range"] = f"bytes=-{tail}"
        elif limit is not None:
            kwargs["Range"] = f"bytes=0-{limit}"
        try:
            reply = self._call("a read", self._client.get_object, **kwargs)
        except _Missing as exc:
            if str(exc) in ("InvalidRange", "416"):  # a range of an empty object
                return b"" if self._head(key) is not None else None
            return None
        with _Body(reply["Body"], self._where) as body:
            return body.read()

    def _head(self, key: str) -> int | None:
        """The object's size; None when it is not there."""
        try:
            reply = self._call("a look-up", self._client.head_object, Key=key)
        except _Missing:
            return None
        size = reply.get("ContentLength")
        return size if isinstance(size, int) else None

    def _put(self, key: str, body: bytes | IO[bytes]) -> None:
        self._call("a write", self._client.put_object, Key=key, Body=body)

    def _delete(self, key: str) -> None:
        with contextlib.suppress(_Missing):
            self._call("a delete", self._client.delete_object, Key=key)

    def _list(self, prefix: str) -> Iterator[dict[str, Any]]:
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Prefix": prefix, "MaxKeys": 1000}
            if token:
                kwargs["ContinuationToken"] = token
            try:
                reply = self._call("a listing", self._client.list_objects_v2, **kwargs)
            except _Missing:
                return
            yield from reply.get("Contents", []) or []
            if not reply.get("IsTruncated"):
                return
            token = reply.get("NextContinuationToken")
            if not token:
                return

    def _record(self, key: str) -> dict[str, Any] | None:
        raw = self._get(key, limit=MAX_RECORD_BYTES)
        if raw is None or len(raw) > MAX_RECORD_BYTES:
            return None
        try:
            doc = json.loads(raw)
        except ValueError:
            return None
        return doc if isinstance(doc, dict) else None

    def _put_record(self, key: str, doc: Mapping[str, object]) -> None:
        self._put(key, (json.dumps(doc, sort_keys=True) + "\n").encode())

    def _presign(self, method: str, key: str, ttl_s: float) -> tuple[str, float]:
        ttl = clamp_ttl(ttl_s)
        try:
            url = self._client.generate_presigned_url(
                method, Params={"Bucket": self.config.bucket, "Key": key}, ExpiresIn=ttl
            )
        except (BotoCoreError, ClientError) as exc:
            raise StoreError(f"cannot presign for the store {self._where} ({type(exc).__name__})") from exc
        return str(url), time.time() + ttl

    def _upload(self, key: str, ttl_s: float) -> Upload:
        url, expires = self._presign("put_object", key, ttl_s)
        return Upload(key=key, url=url, expires_at=expires)

    def _download(self, key: str, size: int, sha256: str, ttl_s: float) -> Download:
        url, expires = self._presign("get_object", key, ttl_s)
        return Download(key=key, url=url, size=size, sha256=sha256, expires_at=expires)

    # ------------------------------------------------------------------------------------------------ keys

    def attempt_prefix(self, run_id: str, attempt: int) -> str:
        return f"{self.base}runs/{_check_id(run_id, 'run id')}.{_check_attempt(attempt)}/"

    def file_key(self, run_id: str, attempt: int, name: str) -> str:
        return f"{self.attempt_prefix(run_id, attempt)}files/{check_name(name)}"

    def checkpoint_prefix(self, run_id: str) -> str:
        return f"{self.base}checkpoints/{_check_id(run_id, 'run id')}/"

    def cache_key(self, key: str, suffix: str) -> str:
        return f"{self.base}bootstrap-cache/{_check_id(key, 'bootstrap cache key')}{suffix}"

    def check(self) -> None:
        """Ask the store for the bucket once: refused credentials, a missing bucket or a store that does not answer
        are said now, in one line, before the controller acts on anything whose results would have nowhere to go."""
        self._call("a look at the bucket", self._client.head_bucket)

    def count_objects(self) -> int:
        """How many objects the fleet has in the store (the demo's summary; a listing)."""
        return sum(1 for _ in self._list(self.base))

    # ------------------------------------------------------------------------------------------------ Presigner

    @property
    def presigner(self) -> Presigner:
        return self

    def attempt_uploads(self, run_id: str, attempt: int, names: Sequence[str], *, ttl_s: float) -> dict[str, Upload]:
        uploads = {ATTEMPT_TAR: self._upload(self.attempt_prefix(run_id, attempt) + ATTEMPT_TAR, ttl_s)}
        for name in names:
            if name != ATTEMPT_TAR:
                uploads[name] = self._upload(self.file_key(run_id, attempt, name), ttl_s)
        return uploads

    def attempt_uploaded(self, run_id: str, attempt: int) -> Harvested:
        if self._head(self.attempt_prefix(run_id, attempt) + ATTEMPT_TAR) is None:
            raise StoreError(f"the attempt {run_id}.{attempt} uploaded no harvest")
        raw = self._get(self.file_key(run_id, attempt, MANIFEST), limit=MANIFEST_BYTES)
        if raw is None:
            raise StoreError(f"the attempt {run_id}.{attempt} uploaded no harvest manifest")
        return parse_manifest(raw)

    def checkpoint_upload(self, run_id: str, attempt: int, *, at: float, ttl_s: float) -> Upload:
        key = f"{self.checkpoint_prefix(run_id)}{_check_attempt(attempt)}-{int(at * 1000):013d}.tar"
        return self._upload(key, ttl_s)

    def _syncs(self, run_id: str) -> list[_Sync]:
        prefix = self.checkpoint_prefix(run_id)
        found = []
        for obj in self._list(prefix):
            key = str(obj.get("Key", ""))
            m = _SYNC.fullmatch(key[len(prefix):])
            if m:
                found.append(_Sync(key=key, attempt=int(m["attempt"]), at_ms=int(m["at_ms"])))
        return sorted(found, key=lambda s: (s.at_ms, s.attempt), reverse=True)

    def checkpoint_uploaded(
        self, run_id: str, attempt: int, upload: Upload, *, size: int, sha256: str, at: float, keep: int
    ) -> bool:
        prefix = self.checkpoint_prefix(run_id)
        m = _SYNC.fullmatch(upload.key[len(prefix):]) if upload.key.startswith(prefix) else None
        if m is None or int(m["attempt"]) != _check_attempt(attempt) or not SHA256_RE.fullmatch(sha256):
            return False
        held = self._head(upload.key)
        if not _is_size(size) or held != size:
            if held is not None:  # not what the box said it sent: never a sync retention would count as one
                self._delete(upload.key)
            return False
        self._put_record(prefix + CURRENT, {
            "attempt": attempt, "key": upload.key, "size": size, "sha256": sha256, "synced_at": at,
        })
        self._retain(run_id, current=upload.key, keep=keep)
        return True

    def _retain(self, run_id: str, *, current: str, keep: int) -> None:
        """Delete all but the newest ``keep`` syncs of the run (never the current one)."""
        for sync in self._syncs(run_id)[max(1, keep):]:
            if sync.key != current:
                self._delete(sync.key)

    def _current(self, run_id: str) -> tuple[int, str, int, str, float] | None:
        doc = self._record(self.checkpoint_prefix(run_id) + CURRENT)
        if doc is None:
            return None
        attempt, key, size, sha, at = (doc.get(k) for k in ("attempt", "key", "size", "sha256", "synced_at"))
        if (
            isinstance(attempt, bool) or not isinstance(attempt, int) or not isinstance(key, str)
            or not key.startswith(self.checkpoint_prefix(run_id)) or not _is_size(size)
            or not isinstance(sha, str) or not SHA256_RE.fullmatch(sha)
            or isinstance(at, bool) or not isinstance(at, (int, float))
        ):
            return None
        return attempt, key, size, sha, float(at)

    def checkpoint_download(self, run_id: str, *, ttl_s: float) -> tuple[int, Download] | None:
        current = self._current(run_id)
        if current is None:
            return None
        attempt, key, size, sha, _ = current
        return attempt, self._download(key, size, sha, ttl_s)

    def cache_upload(self, key: str, *, ttl_s: float) -> Upload:
        return self._upload(self.cache_key(key, ".tar"), ttl_s)

    def cache_uploaded(self, key: str, upload: Upload, *, size: int, sha256: str) -> bool:
        tar = self.cache_key(key, ".tar")
        if upload.key != tar or not SHA256_RE.fullmatch(sha256) or not _is_size(size):
            return False
        if self._head(tar) != size:
            return False
        self._put_record(self.cache_key(key, ".json"), {"size": size, "sha256": sha256, "at": time.time()})
        return True

    def cache_download(self, key: str, *, ttl_s: float) -> Download | None:
        tar = self.cache_key(key, ".tar")
        doc = self._record(self.cache_key(key, ".json"))
        if doc is None:
            return None
        size, sha = doc.get("size"), doc.get("sha256")
        if not _is_size(size) or not isinstance(sha, str) or not SHA256_RE.fullmatch(sha) or self._head(tar) != size:
            return None
        return self._download(tar, size, sha, ttl_s)

    # ------------------------------------------------------------------------------------------------ ResultStore

    def expire(self, now: float, *, keep_harvests_s: float | None) -> int:
        if keep_harvests_s is None:
            return 0
        runs = f"{self.base}runs/"
        newest: dict[str, float] = {}
        keys: dict[str, list[str]] = {}
        for obj in self._list(runs):
            key = str(obj.get("Key", ""))
            attempt_dir = key[len(runs):].split("/", 1)[0]
            modified = obj.get("LastModified")
            stamp = modified.timestamp() if isinstance(modified, datetime) else now
            newest[attempt_dir] = max(newest.get(attempt_dir, stamp), stamp)
            keys.setdefault(attempt_dir, []).append(key)
        removed = 0
        for attempt_dir, stamp in sorted(newest.items()):
            if now - stamp <= keep_harvests_s:
                continue
            for key in keys[attempt_dir]:
                self._delete(key)
            removed += 1
        return removed

    def read_attempt(self, run_id: str, attempt: int, name: str, *, tail: int | None = None) -> bytes | None:
        return self._get(self.file_key(run_id, attempt, name), tail=tail)

    def read_range(self, run_id: str, attempt: int, name: str, offset: int, length: int) -> tuple[bytes, int] | None:
        key = self.file_key(run_id, attempt, name)
        size = self._head(key)
        if size is None:
            return None
        start = max(0, min(offset, size))
        end = min(size, start + max(0, length))
        if end <= start:
            return b"", size
        try:
            reply = self._call("a read", self._client.get_object, Key=key, Range=f"bytes={start}-{end - 1}")
        except _Missing:
            return None
        with _Body(reply["Body"], self._where) as body:
            return body.read(end - start), size

    def harvested(self, run_id: str, attempt: int) -> Harvested | None:
        try:
            return self.attempt_uploaded(run_id, attempt)
        except StoreUnavailable:
            raise
        except StoreError:
            return None

    def open_attempt(self, run_id: str, attempt: int, name: str) -> BinaryIO | None:
        key = self.file_key(run_id, attempt, name)
        try:
            reply = self._call("a read", self._client.get_object, Key=key)
        except _Missing:
            return None
        return io.BufferedReader(_Body(reply["Body"], self._where))

    def put_attempt(self, run_id: str, attempt: int, tar: HarvestStream) -> Harvested:
        """Upload a harvest streamed through the controller as the boxes would: the tar whole, and its files (the
        first ``MAX_PUT_FILES`` regular ones of at most ``MAX_PUT_FILE_BYTES``, the manifest among them) on their
        own for ``read_attempt``."""
        with _spooled(tar) as fh:
            try:
                with tarfile.open(fileobj=fh, mode="r:*") as tf:
                    taken = 0
                    for member in tf:
                        if not member.isfile() or member.size > MAX_PUT_FILE_BYTES:
                            continue
                        if taken >= MAX_PUT_FILES and member.name != MANIFEST:
                            continue
                        try:
                            key = self.file_key(run_id, attempt, member.name.removeprefix("./"))
                        except StoreError:
                            continue
                        data = tf.extractfile(member)
                        if data is not None:
                            self._put(key, data.read())
                            taken += 1
            except tarfile.TarError as exc:
                raise StoreError(f"cannot read the harvest: {type(exc).__name__}") from exc
            fh.seek(0)
            self._put(self.attempt_prefix(run_id, attempt) + ATTEMPT_TAR, fh)
        return self.attempt_uploaded(run_id, attempt)

    def put_checkpoint(self, run_id: str, attempt: int, tar: HarvestStream, *, at: float) -> Harvested:
        """Upload a checkpoint sync streamed through the controller, and make it current if it is complete (its
        manifest lists files and skipped none); the last complete one stays otherwise."""
        with _spooled(tar) as fh:
            got = _tar_manifest(fh)
            if got.skipped or not got.files:
                return got
            fh.seek(0)
            digest, size = _sha256(fh)
            fh.seek(0)
            upload = self.checkpoint_upload(run_id, attempt, at=at, ttl_s=MIN_TTL_S)
            self._put(upload.key, fh)
        self.checkpoint_uploaded(run_id, attempt, upload, size=size, sha256=digest, at=at, keep=self.keep_checkpoints)
        return got

    def checkpoint_synced(self, run_id: str) -> tuple[int, float] | None:
        current = self._current(run_id)
        return None if current is None else (current[0], current[4])

    def checkpoint(self, run_id: str) -> StoredCheckpoint | None:
        """The current sync, fetched through the controller (a fallback: boxes download it themselves), checked
        against its recorded size and SHA-256."""
        current = self._current(run_id)
        if current is None:
            return None
        attempt, key, size, sha, at = current
        data = self._get(key, limit=size)
        if data is None or len(data) != size or hashlib.sha256(data).hexdigest() != sha:
            return None
        return StoredCheckpoint(run_id=run_id, attempt=attempt, synced_at=at, tar=data)


@contextlib.contextmanager
def _spooled(tar: HarvestStream) -> Iterator[IO[bytes]]:
    """The stream as a seekable file (bytes wrapped; a stream spooled to a temporary file), closed after."""
    if isinstance(tar, bytes):
        yield io.BytesIO(tar)
        return
    try:
        with tempfile.TemporaryFile() as spool:
            while chunk := tar.read(1 << 20):
                spool.write(chunk)
            spool.seek(0)
            yield spool
    finally:
        tar.close()


def _sha256(fh: IO[bytes]) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    while chunk := fh.read(1 << 20):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def _tar_manifest(fh: IO[bytes]) -> Harvested:
    """The manifest member of a harvest tar (``parse_manifest``); ``StoreError`` when it has none."""
    try:
        with tarfile.open(fileobj=fh, mode="r:*") as tf:
            for member in tf:
                if member.isfile() and member.name.removeprefix("./") == MANIFEST:
                    data = tf.extractfile(member)
                    if data is not None:
                        return parse_manifest(data.read(MANIFEST_BYTES + 1))
    except tarfile.TarError as exc:
        raise StoreError(f"cannot read the harvest: {type(exc).__name__}") from exc
    raise StoreError("the harvest has no manifest")


def open_store(
    config: StoreConfig | None, fleet: str, data_dir: str | None, *, env: Mapping[str, str] | None = None
) -> ResultStore:
    """The composition root's result store: the object store ``config`` names, else the local directory."""
    if config is None:
        return LocalStore(data_dir_for(fleet, data_dir))
    store = S3Store(config, fleet, env=env)
    store.check()
    return store
