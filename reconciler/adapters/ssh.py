"""paramiko behind the ``Shell`` port: pooled connections, pinned host keys, bounded parallel commands.

A reconciler probes every box every cycle, so connections are kept open and reused (one TCP + SSH handshake per
box, not per cycle), and a fleet is probed in parallel. The property that matters most is that nothing can hang
the loop: a box that accepts TCP but never answers (SIGSTOPped, half-open) must become ``HostUnreachable``
for that box alone within about the requested timeout. paramiko bounds some steps (``banner_timeout``,
``auth_timeout``, channel timeouts) but not all (``Channel.exec_command`` waits forever for its reply), so every
operation also runs under a watchdog that closes the socket when the deadline passes, which wakes any blocked
paramiko call with an exception.

Every command's output is read under a byte bound (``reconciler.core.bounds``): stdout up to ``max_stdout``
(``COMMAND_STDOUT_BYTES`` unless the caller says otherwise), and reading stops past it (``OutputOverBound``, the
channel closed); of stderr only the last ``COMMAND_STDERR_BYTES`` are kept. A box is a stranger's machine, and
whatever it prints, the controller's memory stays flat: the channel's window is no larger than the bound either,
so paramiko never buffers much past it.

Host keys are pinned trust-on-first-use into rigsync's own ``known_hosts`` file; a different key later is refused
with ``HostKeyMismatch``, never accepted silently. A pin's name is the endpoint's ``host_key_alias`` when it has
one (a rented box: its instance, so its direct and proxy addresses must show one key, and two boxes behind one
proxy host, or a destroyed box and the next rental at its reused port, never share a pin), else its address
(``[host]:port``, the lab's own machines). ``forget(endpoint)`` drops the pooled connection and the pin (and an
address pin left from before aliases), and is meant for a box that was destroyed.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, TypeVar

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from reconciler.core.bounds import COMMAND_STDERR_BYTES, COMMAND_STDOUT_BYTES
from reconciler.core.model import Endpoint
from reconciler.errors import HostKeyMismatch, HostUnreachable, OutputOverBound, RigsyncError, ShellError
from reconciler.ports import COMMAND_TIMEOUT_S, FANOUT_TIMEOUT_S, CommandResult

T = TypeVar("T")

KEY_FILE = "id_ed25519"
KEY_COMMENT = "rigsync"
BOX_USER = "root"  # who rigsync is on a box
_ALIAS_OK = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def ensure_keypair(directory: Path) -> tuple[Path, str]:
    """rigsync's own ed25519 key in ``directory`` (created once, mode 0600); returns (path, public key line)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / KEY_FILE
    if path.exists():
        try:
            loaded = serialization.load_ssh_private_key(path.read_bytes(), password=None)
        except (ValueError, TypeError) as exc:
            raise ShellError(f"{path} is not an unencrypted OpenSSH private key: {type(exc).__name__}") from exc
        if not isinstance(loaded, Ed25519PrivateKey):
            raise ShellError(f"{path} is not an ed25519 key")
        key = loaded
    else:
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
        tmp = directory / f".{KEY_FILE}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        os.replace(tmp, path)
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    line = f"{public.decode()} {KEY_COMMENT}"
    (directory / f"{KEY_FILE}.pub").write_text(line + "\n")
    return path, line


def _address_id(endpoint: Endpoint) -> str:
    return endpoint.host if endpoint.port == 22 else f"[{endpoint.host}]:{endpoint.port}"


def _host_id(endpoint: Endpoint) -> str:
    """The name ``endpoint``'s host key is pinned under (OpenSSH's known_hosts host field)."""
    return endpoint.host_key_alias or _address_id(endpoint)


class _Deadline:
    """Closes whatever is registered when time runs out, so blocked socket/paramiko calls fail promptly."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds
        self.expired = False
        self._lock = threading.Lock()
        self._closers: list[Callable[[], None]] = []
        self._timer = threading.Timer(max(seconds, 0.0), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def remaining(self) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed")
        return left

    def watch(self, closer: Callable[[], None]) -> None:
        with self._lock:
            fire_now = self.expired
            if not fire_now:
                self._closers.append(closer)
        if fire_now:
            closer()

    def _fire(self) -> None:
        with self._lock:
            self.expired = True
            closers, self._closers = self._closers, []
        for c in closers:
            with contextlib.suppress(Exception):
                c()

    def cancel(self) -> None:
        self._timer.cancel()


class _Conn:
    def __init__(self, transport: paramiko.Transport, sock: socket.socket) -> None:
        self.transport = transport
        self.sock = sock

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.transport.close()
        with contextlib.suppress(Exception):
            self.sock.close()


class SshShell:
    """The ``Shell`` port over paramiko. Thread-safe; ``connects`` counts new SSH connections made."""

    def __init__(
        self,
        *,
        private_key: Path,
        known_hosts: Path,
        user: str = BOX_USER,
        connect_timeout: float = 5.0,
        max_workers: int = 32,
    ) -> None:
        try:
            self._pkey = paramiko.PKey.from_path(private_key)
        except (OSError, paramiko.SSHException, ValueError) as exc:
            raise ShellError(f"cannot load the SSH private key {private_key}: {type(exc).__name__}") from exc
        self._known_hosts_path = known_hosts
        self._user = user
        self._connect_timeout = connect_timeout
        self._max_workers = max_workers
        self._host_keys = paramiko.HostKeys()
        if known_hosts.exists():
            try:
                self._host_keys.load(str(known_hosts))
            except (OSError, paramiko.SSHException) as exc:
                raise ShellError(f"cannot read {known_hosts}: {exc}") from exc
        self._keys_lock = threading.Lock()
        self._pool: dict[Endpoint, _Conn] = {}
        self._pool_lock = threading.Lock()
        self._endpoint_locks: dict[Endpoint, threading.Lock] = {}
        self._executor: ThreadPoolExecutor | None = None
        self.connects = 0

    # ------------------------------------------------------------------------------------------ public API

    def run(
        self,
        endpoint: Endpoint,
        command: str,
        *,
        stdin: bytes | None = None,
        timeout: float = COMMAND_TIMEOUT_S,
        max_stdout: int | None = None,
        stdout_sink: IO[bytes] | None = None,
    ) -> CommandResult:
        """Run one command; its exit code is returned, not raised. Connection trouble raises ``ShellError``; more
        than ``max_stdout`` bytes of output (``COMMAND_STDOUT_BYTES`` when None), ``OutputOverBound``."""
        return self._bounded(
            endpoint, timeout, lambda dl: self._run_on(endpoint, command, stdin, dl, max_stdout, stdout_sink)
        )

    def run_many(
        self, targets: dict[int, tuple[Endpoint, str]], *, timeout: float = FANOUT_TIMEOUT_S,
        max_stdout: int | None = None,
    ) -> dict[int, CommandResult | Exception]:
        """Run one command per box in parallel; each box gets ``timeout`` from when its turn starts. A box's error
        (``max_stdout`` as in ``run``) is its answer, never raised."""
        if not targets:
            return {}
        pool = self._pool_executor()
        futures = {
            key: pool.submit(self._safe_run, endpoint, command, timeout, max_stdout)
            for key, (endpoint, command) in sorted(targets.items())
        }
        return {key: fut.result() for key, fut in futures.items()}

    def forget(self, endpoint: Endpoint) -> None:
        """Drop the pooled connection and the pinned host key (the address may now belong to another box)."""
        with self._pool_lock:
            conn = self._pool.pop(endpoint, None)
        if conn is not None:
            conn.close()
        with self._keys_lock:
            dropped = False
            for hid in {_host_id(endpoint), _address_id(endpoint)}:
                if hid in self._host_keys:
                    del self._host_keys[hid]
                    dropped = True
            if dropped:
                self._save_host_keys()

    def close(self) -> None:
        with self._pool_lock:
            conns, self._pool = list(self._pool.values()), {}
        for c in conns:
            c.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    def __enter__(self) -> SshShell:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------- internals

    def _pool_executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=self._max_workers, thread_name_prefix="rigsync-ssh")
            return self._executor

    def _safe_run(
        self, endpoint: Endpoint, command: str, timeout: float, max_stdout: int | None
    ) -> CommandResult | Exception:
        try:
            return self.run(endpoint, command, timeout=timeout, max_stdout=max_stdout)
        except RigsyncError as exc:
            return exc
        except Exception as exc:  # a library surprise must not sink the other boxes' answers
            return HostUnreachable(f"{endpoint.host}:{endpoint.port}: unexpected {type(exc).__name__}: {exc}")

    def _bounded(self, endpoint: Endpoint, timeout: float, fn: Callable[[_Deadline], T]) -> T:
        where = f"{endpoint.host}:{endpoint.port}"
        dl = _Deadline(timeout)
        try:
            return fn(dl)
        except RigsyncError:
            raise
        except paramiko.BadHostKeyException as exc:
            raise HostKeyMismatch(f"{where}: host key changed since it was pinned; refusing to connect") from exc
        except paramiko.AuthenticationException as exc:
            self._drop(endpoint)
            raise HostUnreachable(f"{where}: SSH authentication failed: {exc}") from exc
        except (OSError, EOFError, paramiko.SSHException) as exc:
            self._drop(endpoint)
            if dl.expired or isinstance(exc, socket.timeout | TimeoutError):
                raise HostUnreachable(f"{where}: no answer within {timeout:g}s") from exc
            raise HostUnreachable(f"{where}: {type(exc).__name__}: {exc or 'connection lost'}") from exc
        finally:
            dl.cancel()

    def _lock_for(self, endpoint: Endpoint) -> threading.Lock:
        with self._pool_lock:
            lock = self._endpoint_locks.get(endpoint)
            if lock is None:
                lock = self._endpoint_locks[endpoint] = threading.Lock()
            return lock

    def _drop(self, endpoint: Endpoint, conn: _Conn | None = None) -> None:
        with self._pool_lock:
            current = self._pool.get(endpoint)
            if current is not None and (conn is None or current is conn):
                del self._pool[endpoint]
            else:
                current = conn
        if current is not None:
            current.close()

    def _conn(self, endpoint: Endpoint, dl: _Deadline) -> tuple[_Conn, bool]:
        """A live pooled connection, or a new one; the flag says whether it came from the pool."""
        with self._pool_lock:
            conn = self._pool.get(endpoint)
        if conn is not None and conn.transport.is_active():
            return conn, True
        if conn is not None:
            self._drop(endpoint, conn)
        lock = self._lock_for(endpoint)
        if not lock.acquire(timeout=dl.remaining()):
            raise TimeoutError("waiting for another connect to the same box")
        try:
            with self._pool_lock:
                conn = self._pool.get(endpoint)
            if conn is not None and conn.transport.is_active():
                return conn, True
            conn = self._connect(endpoint, dl)
            with self._pool_lock:
                self._pool[endpoint] = conn
            return conn, False
        finally:
            lock.release()

    def _connect(self, endpoint: Endpoint, dl: _Deadline) -> _Conn:
        sock = socket.create_connection(
            (endpoint.host, endpoint.port), timeout=min(self._connect_timeout, dl.remaining())
        )
        dl.watch(sock.close)
        transport = paramiko.Transport(sock)
        conn = _Conn(transport, sock)
        dl.watch(conn.close)
        try:
            left = dl.remaining()
            transport.banner_timeout = left
            transport.handshake_timeout = left
            transport.auth_timeout = left
            transport.start_client(timeout=left)
            self._check_host_key(endpoint, transport.get_remote_server_key())
            transport.auth_publickey(endpoint.user or self._user, self._pkey)
            if not transport.is_authenticated():
                raise paramiko.AuthenticationException("public key not accepted")
            transport.set_keepalive(15)
        except BaseException:
            conn.close()
            raise
        with self._pool_lock:
            self.connects += 1
        return conn

    def _check_host_key(self, endpoint: Endpoint, key: paramiko.PKey) -> None:
        hid = _host_id(endpoint)
        with self._keys_lock:
            pinned = self._host_keys.lookup(hid)
            if pinned is None or len(pinned) == 0:
                self._host_keys.add(hid, key.get_name(), key)
                self._save_host_keys()
                return
            known = pinned.get(key.get_name())
            if known is None or known != key:
                pinned_as = f" for {hid}" if endpoint.host_key_alias else ""
                raise HostKeyMismatch(
                    f"{endpoint.host}:{endpoint.port}: host key {key.get_name()} {key.fingerprint} does not match "
                    f"the one pinned{pinned_as} in {self._known_hosts_path}; refusing to connect"
                )

    def _save_host_keys(self) -> None:
        path = self._known_hosts_path
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        self._host_keys.save(str(tmp))
        os.replace(tmp, path)

    def _run_on(
        self,
        endpoint: Endpoint,
        command: str,
        stdin: bytes | None,
        dl: _Deadline,
        max_stdout: int | None = None,
        sink: IO[bytes] | None = None,
    ) -> CommandResult:
        limit = COMMAND_STDOUT_BYTES if max_stdout is None else max_stdout
        # The box may send at most a window ahead of what is read: no larger than the bound (nor than paramiko's).
        window = min(paramiko.common.DEFAULT_WINDOW_SIZE, max(limit + 1, 1 << 16))
        conn, pooled = self._conn(endpoint, dl)
        dl.watch(conn.close)
        try:
            chan = conn.transport.open_session(window_size=window, timeout=dl.remaining())
        except (paramiko.SSHException, OSError, EOFError):
            if not pooled or dl.expired:
                raise
            # The pooled transport died quietly between cycles: reconnect once. Nothing ran yet, so it is safe.
            self._drop(endpoint, conn)
            conn, _ = self._conn(endpoint, dl)
            dl.watch(conn.close)
            chan = conn.transport.open_session(window_size=window, timeout=dl.remaining())
        with chan:
            chan.settimeout(dl.remaining())
            chan.exec_command(command)
            if stdin:
                chan.sendall(stdin)
            chan.shutdown_write()
            out = bytearray()
            err = bytearray()
            got = 0
            while True:
                while chan.recv_ready():
                    chunk = chan.recv(min(1 << 16, limit + 1 - got))
                    got += len(chunk)
                    if sink is None:
                        out += chunk
                    else:
                        sink.write(chunk)
                    if got > limit:  # leaving the block closes the channel: the box's sshd ends the command
                        raise OutputOverBound(
                            f"{endpoint.host}:{endpoint.port}: output over {limit} bytes; stopped reading"
                        )
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(1 << 16)
                    if len(err) > COMMAND_STDERR_BYTES:  # only its tail is kept: that is where the error is
                        del err[: len(err) - COMMAND_STDERR_BYTES]
                if (chan.eof_received or chan.closed) and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                select.select([chan], [], [], min(dl.remaining(), 0.5))
            if not chan.status_event.wait(dl.remaining()):
                raise TimeoutError("no exit status")
            code = chan.recv_exit_status()
        return CommandResult(exit_code=code, stdout=bytes(out), stderr=bytes(err), answered_at=time.time())


# ---------------------------------------------------------------------------------------- the system ssh client


def is_pinned(known_hosts: Path, endpoint: Endpoint) -> bool:
    """Whether ``known_hosts`` (rigsync's, as ``SshShell`` writes it) holds a host key for ``endpoint``."""
    if not known_hosts.is_file():
        return False
    keys = paramiko.HostKeys()
    try:
        keys.load(str(known_hosts))
    except (OSError, paramiko.SSHException) as exc:
        raise ShellError(f"cannot read {known_hosts}: {exc}") from exc
    found = keys.lookup(_host_id(endpoint))
    return found is not None and len(found) > 0


def openssh_argv(endpoint: Endpoint, *, private_key: Path, known_hosts: Path, user: str = "") -> list[str]:
    """The OpenSSH client command reaching ``endpoint`` as ``SshShell`` does: rigsync's key only, and only the host
    key pinned in rigsync's ``known_hosts``.

    ``SshShell`` saves its pins with paramiko in the OpenSSH format, plain host names, ``[host]:port`` for a port
    other than 22, which is how OpenSSH looks a host up (or the endpoint's ``host_key_alias``, which OpenSSH's
    ``HostKeyAlias`` looks up instead): so ``StrictHostKeyChecking=yes`` against that file accepts exactly the
    pinned key and refuses any other (and never adds one). The system-wide known hosts and the agent's keys play no
    part.
    """
    if endpoint.host_key_alias and not _ALIAS_OK.fullmatch(endpoint.host_key_alias):
        raise ShellError(f"{endpoint.host_key_alias!r}: not a host key alias ssh can be given")
    alias = ["-o", f"HostKeyAlias={endpoint.host_key_alias}"] if endpoint.host_key_alias else []
    return [
        "ssh",
        "-i", str(private_key),
        "-o", "IdentitiesOnly=yes",
        "-o", f"UserKnownHostsFile={_config_path(known_hosts)}",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", "StrictHostKeyChecking=yes",
        "-o", "UpdateHostKeys=no",
        *alias,
        "-p", str(endpoint.port),
        f"{user or endpoint.user or BOX_USER}@{endpoint.host}",
    ]


def _config_path(path: Path) -> str:
    """A path as an ``ssh -o`` value: OpenSSH splits such values at whitespace unless they are double-quoted."""
    text = str(path)
    if '"' in text:
        raise ShellError(f"{text}: a path with a double quote cannot be given to ssh")
    return f'"{text}"' if any(c.isspace() for c in text) else text
