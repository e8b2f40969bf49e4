"""rigsync's transfers between a box and the result store, with presigned URLs: the box holds no credentials.

This program runs on the box (standard library only, Python 3.8 syntax), started by ``upload.sh`` and
``fetch_resume.sh``. The controller mints one presigned URL per object (``ports.Upload``, ``ports.Download``); it
reaches this program on stdin's first line, never on its command line (every user of a box sees argv in ``ps``),
and is never written to a file or a message: a URL is a bearer credential for its one key.

    transfer.py put FILE                 PUT FILE to the URL, with a Content-Length (never chunked); prints
                                         {"size": N, "sha256": "<hex>"} on stdout
    transfer.py get DEST SIZE SHA256     GET the URL into DEST.part, reading no more than SIZE (+1) bytes; the size
                                         and SHA-256 the controller recorded must match, then DEST.part becomes DEST
                                         (on a mismatch the part file is removed)

Connection errors, 5xx, 408 and 429 are retried with jittered exponential backoff (``TRIES`` tries within
``BUDGET_S``); any other answer is a refusal. Exit codes: 0 done, 2 usage (or a local file that cannot be read or
written), 3 refused, 4 transient failures exhausted, 5 size or checksum mismatch. Messages on stderr name the
verb, the status and the object's path only: never the query string (the signature) or the whole URL.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import random
import re
import ssl
import sys
import time
from collections.abc import Callable
from typing import IO, Any
from urllib.parse import urlsplit

USAGE, REFUSED, TRANSIENT, MISMATCH = 2, 3, 4, 5
TRIES = 5
BUDGET_S = 60.0
BACKOFF_S = 1.0  # the first wait; each next one doubles, jittered, within what is left of the budget
TIMEOUT_S = 60.0  # one socket operation
CHUNK = 1 << 20
RETRIED = frozenset({408, 429})
URL_BYTES = 16 << 10  # the first line of stdin; a presigned URL is well under 2 KiB

_CODE = re.compile(rb"<Code>([A-Za-z0-9.]{1,64})</Code>")


class Failed(Exception):
    """A transfer that did not happen: ``code`` is the exit code, the message names no URL."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class _Transient(Exception):
    pass


def _target(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, path with query) of an http(s) URL; ``Failed`` (usage) for anything else."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Failed(USAGE, "the URL on stdin is not an http(s) URL")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise Failed(USAGE, "the URL on stdin has an invalid port") from None
    return parts.scheme, parts.hostname, port, parts.path + ("?" + parts.query if parts.query else "")


def shown(url: str) -> str:
    """What a message may say about ``url``: its object path, nothing of the query (the signature)."""
    return urlsplit(url).path or "/"


def _connect(scheme: str, host: str, port: int) -> http.client.HTTPConnection:
    if scheme == "https":
        return http.client.HTTPSConnection(host, port, timeout=TIMEOUT_S, context=ssl.create_default_context())
    return http.client.HTTPConnection(host, port, timeout=TIMEOUT_S)


def _refusal(verb: str, url: str, response: http.client.HTTPResponse) -> Exception:
    """The exception for a non-2xx answer: transient (retried) or a refusal, named by status and S3 error code."""
    body = response.read(8192)
    found = _CODE.search(body)
    code = f" {found.group(1).decode()}" if found else ""
    text = f"{verb} {shown(url)}: HTTP {response.status}{code}"
    if response.status >= 500 or response.status in RETRIED:
        return _Transient(text)
    return Failed(REFUSED, text)


def _retrying(
    verb: str, url: str, attempt: Callable[[], Any], *, tries: int, budget_s: float, backoff_s: float,
    sleep: Callable[[float], None],
) -> Any:
    """``attempt()`` until it returns, retrying transient failures with jittered exponential backoff."""
    deadline = time.monotonic() + budget_s
    last = ""
    for n in range(tries):
        try:
            return attempt()
        except _Transient as exc:
            last = str(exc)
        except (OSError, http.client.HTTPException) as exc:  # refused, reset, timed out, a broken answer
            last = f"{verb} {shown(url)}: {type(exc).__name__}"
        wait = backoff_s * (2 ** n) * random.uniform(0.5, 1.0)
        left = deadline - time.monotonic()
        if n + 1 >= tries or left <= wait:
            break
        sys.stderr.write(f"{last}; retrying in {wait:.1f}s\n")
        sleep(wait)
    raise Failed(TRANSIENT, f"{last} (gave up after {n + 1} tries)")


def put(
    url: str, path: str, *, tries: int = TRIES, budget_s: float = BUDGET_S, backoff_s: float = BACKOFF_S,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[int, str]:
    """PUT the file at ``path`` to ``url``; (its size, its SHA-256) as sent."""
    scheme, host, port, target = _target(url)
    try:
        size = os.path.getsize(path)
    except OSError as exc:
        raise Failed(USAGE, f"cannot read {path}: {exc.strerror or type(exc).__name__}") from None

    def once() -> tuple[int, str]:
        digest = hashlib.sha256()
        sent = 0
        conn = _connect(scheme, host, port)
        try:
            conn.putrequest("PUT", target, skip_accept_encoding=True)
            conn.putheader("Content-Length", str(size))
            conn.endheaders()
            with open(path, "rb") as f:
                while sent < size:
                    block = f.read(min(CHUNK, size - sent))
                    if not block:
                        raise Failed(USAGE, f"{path} shrank while it was sent")
                    conn.send(block)
                    digest.update(block)
                    sent += len(block)
            response = conn.getresponse()
            if not 200 <= response.status < 300:
                raise _refusal("put", url, response)
            response.read(8192)
        finally:
            conn.close()
        return size, digest.hexdigest()

    result: tuple[int, str] = _retrying("put", url, once, tries=tries, budget_s=budget_s, backoff_s=backoff_s,
                                        sleep=sleep)
    return result


def get(
    url: str, dest: str, size: int, sha256: str, *, tries: int = TRIES, budget_s: float = BUDGET_S,
    backoff_s: float = BACKOFF_S, sleep: Callable[[float], None] = time.sleep,
) -> None:
    """GET ``url`` into ``dest`` once it is ``size`` bytes with SHA-256 ``sha256``; nothing at ``dest`` otherwise."""
    scheme, host, port, target = _target(url)
    part = dest + ".part"

    def once() -> tuple[int, str]:
        digest = hashlib.sha256()
        got = 0
        conn = _connect(scheme, host, port)
        try:
            conn.request("GET", target)
            response = conn.getresponse()
            if not 200 <= response.status < 300:
                raise _refusal("get", url, response)
            with _create(part) as out:
                while got <= size:  # one byte past the recorded size is enough to know it is not the object
                    block = response.read(min(CHUNK, size + 1 - got))
                    if not block:
                        break
                    out.write(block)
                    digest.update(block)
                    got += len(block)
        finally:
            conn.close()
        return got, digest.hexdigest()

    try:
        got, digest = _retrying("get", url, once, tries=tries, budget_s=budget_s, backoff_s=backoff_s, sleep=sleep)
    except BaseException:
        _remove(part)
        raise
    if got != size or digest != sha256:
        _remove(part)
        what = f"{got if got <= size else 'more than ' + str(size)} bytes" if got != size else "its SHA-256"
        raise Failed(MISMATCH, f"get {shown(url)}: {what} does not match what was recorded ({size} bytes)")
    os.replace(part, dest)


def _create(path: str) -> IO[bytes]:
    try:
        return open(path, "wb")  # the caller's with closes it
    except OSError as exc:
        raise Failed(USAGE, f"cannot write {path}: {exc.strerror or type(exc).__name__}") from None


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _read_url(stdin: IO[bytes]) -> str:
    line = stdin.readline(URL_BYTES + 1)
    if len(line) > URL_BYTES:
        raise Failed(USAGE, "the first line of stdin is longer than a URL can be")
    return line.decode("ascii", "replace").strip()


def main(argv: list[str], stdin: IO[bytes] | None = None, **options: Any) -> int:
    """The command line (``options``: ``tries``, ``budget_s``, ``backoff_s``, ``sleep``, for the tests)."""
    verb = argv[1] if len(argv) > 1 else ""
    try:
        if verb == "put" and len(argv) == 3:
            size, digest = put(_read_url(stdin or sys.stdin.buffer), argv[2], **options)
            sys.stdout.write(json.dumps({"size": size, "sha256": digest}) + "\n")
            return 0
        if verb == "get" and len(argv) == 5 and argv[3].isdigit() and re.fullmatch("[0-9a-f]{64}", argv[4]):
            get(_read_url(stdin or sys.stdin.buffer), argv[2], int(argv[3]), argv[4], **options)
            return 0
        raise Failed(USAGE, "usage: transfer.py put FILE | get DEST SIZE SHA256 (the URL on stdin's first line)")
    except Failed as exc:
        sys.stderr.write(f"transfer: {exc}\n")
        return exc.code
    except Exception as exc:  # a traceback could quote the URL: only the type is named
        sys.stderr.write(f"transfer: {verb} failed: {type(exc).__name__}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
