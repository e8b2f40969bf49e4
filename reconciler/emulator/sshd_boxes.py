"""Emulated GPU boxes that are real hosts: one OpenSSH ``sshd`` per instance in its own PID + mount namespace.

rigsync's SSH adapter, its run protocol and its failure handling must be proven against real sshd processes,
not mocks. Each box gets a directory on disk (its ``/root`` and ``/usr/local/bin`` are bind-mounted from it inside
the namespace), its own loopback address, on which its sshd listens on an inner port (what the proxy forwards to)
and, for a direct-port instance, on the direct port (``ports["22/tcp"]`` on ``public_ipaddr``). The proxy is one
shared loopback address (``ProxyHost``, the emulator's ``ssh1.vast.ai``) with one forwarding listener per instance
(``Forwarder``) on a port of its own: several boxes behind one host, told apart by port only, as on Vast.
Killing the namespace's PID 1 makes the box vanish with everything it started (``nohup``/``setsid`` jobs
included); SIGSTOP on every process of the namespace makes it hang.

A box boots as a Vast container does: from a clean environment plus its instance's variables (``CONTAINER_ID``,
``CONTAINER_API_KEY``, the ``env`` it was rented with), it runs the instance's ``onstart`` detached (``setsid``,
output in ``/root/onstart.log``) before its sshd starts, and again at every restart. The namespaces are PID and
mount only, so whatever runs on the box reaches the emulator's API over loopback, as a box reaches Vast's.

Processes are spawned from one long-lived thread with ``PR_SET_PDEATHSIG=SIGKILL``: the signal fires when the
spawning *thread* exits, so spawning from short-lived HTTP handler threads would kill boxes early, and a
crashed test run must leave no ``sshd`` behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import queue
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from reconciler.emulator.exceptions import EmulatorError, EmulatorUnavailable
from reconciler.emulator.nvidia_smi import SCRIPT as NVIDIA_SMI

SSHD = "/usr/sbin/sshd"
UNSHARE = "/usr/bin/unshare"
_PR_SET_PDEATHSIG = 1
# A box starts from a clean environment, as a container does, plus its own variables (boot.sh exports them): never
# the emulator's, which may hold the account key (VAST_API_KEY) when tests or the demo run everything in one process.
BOX_BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
_ENV_NAME_OK = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")

T = TypeVar("T")


def preflight() -> None:
    """Say exactly what is missing, instead of failing obscurely later."""
    if not sys.platform.startswith("linux"):
        raise EmulatorUnavailable("the emulator's SSH boxes need Linux (PID and mount namespaces)")
    if os.geteuid() != 0:
        raise EmulatorUnavailable(
            "the emulator's SSH boxes need root (unshare --pid --mount, bind mounts); run it as root"
        )
    if not os.path.exists(SSHD):
        raise EmulatorUnavailable(
            f"OpenSSH server not found at {SSHD}; install it with: apt-get install -y openssh-server"
        )
    if not os.path.exists(UNSHARE):
        raise EmulatorUnavailable(f"{UNSHARE} not found; install it with: apt-get install -y util-linux")
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)


def _set_pdeathsig() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class Spawner:
    """Runs every process launch on one long-lived thread (see the module docstring for why)."""

    def __init__(self) -> None:
        self._q: queue.Queue[tuple[Callable[[], Any], Future[Any]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="emulator-spawner", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            fn, fut = item
            try:
                fut.set_result(fn())
            except BaseException as exc:
                fut.set_exception(exc)

    def call(self, fn: Callable[[], T]) -> T:
        fut: Future[T] = Future()
        self._q.put((fn, fut))
        return fut.result()

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=5)


@dataclass
class GpuSpec:
    name: str
    memory_mib: int
    uuid: str


@dataclass
class BoxSpec:
    instance_id: int
    ip: str
    inner_port: int  # where the box's sshd listens for the proxy's forwarder (on its own address)
    direct_port: int | None  # ``ports["22/tcp"]`` on ``ip``; None: a proxy-only instance
    gpus: list[GpuSpec]
    env: dict[str, str] = field(default_factory=dict)
    onstart: str = ""
    boot_delay: float = 0.5
    speed_factor: float = 1.0


def _port_free(ip: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((ip, port))
        except OSError:
            return False
    return True


def banner_ok(ip: str, port: int, timeout: float = 0.5) -> bool:
    """True when an SSH server answers with its banner (the box is booted)."""
    try:
        with socket.create_connection((ip, port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def _sockets(pid: int) -> set[str]:
    """The socket inodes a process holds open (``socket:[123]``)."""
    out: set[str] = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:"):
                    out.add(target)
    return out


def _pidns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _is_live(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Box:
    """One emulated instance's host: directory, sshd config, namespace process."""

    def __init__(self, spec: BoxSpec, directory: Path) -> None:
        self.spec = spec
        self.dir = directory
        self.proc: subprocess.Popen[bytes] | None = None
        self.ns: str | None = None
        self.init_pid: int | None = None
        self.hung = False
        self.dead = True  # no process of ours runs for this box

    @property
    def root(self) -> Path:
        return self.dir / "root"

    def prepare(self, authorized_keys: list[str]) -> None:
        """Write the box's files; keeps ``/root`` if it already exists (a stopped box restarts with its disk)."""
        (self.dir / "bin").mkdir(parents=True, exist_ok=True)
        (self.root / ".ssh").mkdir(parents=True, exist_ok=True, mode=0o700)
        if not (self.dir / "ssh_host_ed25519_key").exists():
            self._new_host_key()
        self.write_keys(authorized_keys)
        smi = self.dir / "bin" / "nvidia-smi"
        smi.write_text(NVIDIA_SMI)
        smi.chmod(0o755)
        gpus = [{"name": g.name, "memory_mib": g.memory_mib, "uuid": g.uuid} for g in self.spec.gpus]
        (self.dir / "bin" / ".gpus.json").write_text(json.dumps(gpus))
        if not os.path.exists("/usr/bin/python3"):
            # The box's /root hides a pyenv interpreter living under the host's /root; point python3 at the
            # interpreter's real path, which the wrapper re-exposes.
            target = os.path.realpath(sys.executable)
            link = self.dir / "bin" / "python3"
            if not link.exists():
                link.symlink_to(target)
        (self.dir / "onstart.sh").write_text(self.spec.onstart or "")
        self._write_sshd_config()
        self._write_wrapper()

    def _new_host_key(self) -> None:
        key_path = self.dir / "ssh_host_ed25519_key"
        key = Ed25519PrivateKey.generate()
        tmp = key_path.with_name(key_path.name + ".tmp")
        pem = serialization.PrivateFormat.OpenSSH
        tmp.write_bytes(key.private_bytes(serialization.Encoding.PEM, pem, serialization.NoEncryption()))
        tmp.chmod(0o600)
        os.replace(tmp, key_path)
        pub = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        (self.dir / "ssh_host_ed25519_key.pub").write_bytes(pub + b"\n")

    def rekey(self) -> None:
        """A new SSH host key, as after a reinstall (or another machine answering at this address): sshd re-reads it.

        sshd re-executes itself on SIGHUP; sessions already open stay up, new connections see the new key. Returns
        once the re-executed sshd listens again (its listening sockets are new ones and answer with a banner).
        """
        self._new_host_key()
        init = self._find_init()
        if init is None:
            return
        before = _sockets(init)
        os.kill(init, signal.SIGHUP)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            now = _sockets(init)
            if now and not (now & before) and banner_ok(self.spec.ip, self.spec.inner_port):
                return
            time.sleep(0.02)

    def write_keys(self, keys: list[str]) -> None:
        ak = self.root / ".ssh" / "authorized_keys"
        ak.write_text("".join(k.strip() + "\n" for k in keys))
        ak.chmod(0o600)

    def _env_items(self) -> list[tuple[str, str]]:
        out = []
        for k, v in self.spec.env.items():
            if not k or k[0].isdigit() or not set(k) <= _ENV_NAME_OK:
                continue  # docker option pairs such as "-p 8080:8080" are not variables
            if any(c in v for c in '"\n\r\\'):
                continue
            out.append((k, v))
        return out

    def _write_sshd_config(self) -> None:
        s = self.spec
        setenv = " ".join(f'"{k}={v}"' for k, v in self._env_items())
        lines = [f"ListenAddress {s.ip}:{s.inner_port}"]
        if s.direct_port is not None:
            lines.append(f"ListenAddress {s.ip}:{s.direct_port}")
        lines += [
            f"HostKey {self.dir / 'ssh_host_ed25519_key'}",
            "PidFile none",
            "AuthorizedKeysFile .ssh/authorized_keys",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "PermitRootLogin prohibit-password",
            "Subsystem sftp internal-sftp",
            "MaxStartups 200",
            "MaxSessions 100",
            "UseDNS no",
            "PrintMotd no",
            "LogLevel ERROR",
        ]
        if setenv:
            lines.append(f"SetEnv {setenv}")
        (self.dir / "sshd_config").write_text("\n".join(lines) + "\n")

    def _write_wrapper(self) -> None:
        d = shlex.quote(str(self.dir))
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in self._env_items())
        py_mount = ""
        if not os.path.exists("/usr/bin/python3"):
            prefix = shlex.quote(os.path.realpath(sys.base_prefix))
            py_mount = (
                f"mkdir -p {d}/.pystage && mount --bind {prefix} {d}/.pystage\n"
                f"AFTER_ROOT='mkdir -p {prefix} && mount --bind {d}/.pystage {prefix}'\n"
            )
        script = (
            "#!/bin/sh\n"
            "# PID 1 of the box's namespace: private /root and /usr/local/bin, then boot, onstart, sshd.\n"
            "set -e\n"
            "AFTER_ROOT=true\n"
            f"{py_mount}"
            f"mount --bind {d}/root /root\n"
            f"mount --bind {d}/bin /usr/local/bin\n"
            'eval "$AFTER_ROOT"\n'
            "export HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
            f"{exports}"
            f"sleep {max(0.0, self.spec.boot_delay):.3f}\n"
            f"while [ -e {d}/never_boot ]; do sleep 0.2; done\n"
            "cd /root\n"
            f"if [ -s {d}/onstart.sh ]; then\n"
            f"  setsid /bin/bash {d}/onstart.sh >/root/onstart.log 2>&1 </dev/null &\n"
            "fi\n"
            f"exec {SSHD} -D -e -f {d}/sshd_config\n"
        )
        (self.dir / "boot.sh").write_text(script)

    def start(self, spawner: Spawner) -> None:
        log = open(self.dir / "sshd.log", "ab")  # noqa: SIM115 - handed to the child, closed below
        argv = [
            UNSHARE, "--pid", "--fork", "--mount", "--mount-proc", "--kill-child",
            "--propagation", "private", "/bin/sh", str(self.dir / "boot.sh"),
        ]
        try:
            self.proc = spawner.call(
                lambda: subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=dict(BOX_BASE_ENV),
                    preexec_fn=_set_pdeathsig, close_fds=True,
                )
            )
        finally:
            log.close()
        self.ns = None
        self.init_pid = None
        self.hung = False
        self.dead = False

    def _find_init(self) -> int | None:
        if self.init_pid is not None and _is_live(self.init_pid):
            return self.init_pid
        if self.proc is None:
            return None
        pid = self.proc.pid
        try:
            kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            return None
        if not kids:
            return None
        self.init_pid = int(kids[0])
        self.ns = _pidns(self.init_pid)
        return self.init_pid

    def booted(self) -> bool:
        s = self.spec
        ports = [s.inner_port] + ([s.direct_port] if s.direct_port is not None else [])
        return self.running_process() and all(banner_ok(s.ip, p) for p in ports)

    def running_process(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def pids(self) -> list[int]:
        """Host PIDs of every live process inside the box's namespace; none once its PID 1 has exited.

        The kernel lets a namespace's init finish only after every other process in it is gone, and a dead
        namespace's number may already name another box's (its inode reused): processes found by that number then
        are not this box's."""
        if self._find_init() is None or self.ns is None:
            return []
        out = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and _pidns(int(entry)) == self.ns and _is_live(int(entry)):
                out.append(int(entry))
        return out

    def signal_all(self, sig: int) -> None:
        init = self._find_init()
        # Stop PID 1 (sshd) first so no new sessions fork while we sweep; repeat to catch forks in flight.
        for _ in range(3):
            if init is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(init, sig)
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)

    def hang(self) -> None:
        self.signal_all(signal.SIGSTOP)
        self.hung = True

    def resume(self) -> None:
        self.signal_all(signal.SIGCONT)
        self.hung = False

    def kill(self) -> None:
        """Kill the namespace (and so everything in it) and reap the unshare process."""
        if self.proc is None:
            return
        init = self._find_init()
        if init is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(init, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        # A stopped namespace still dies on SIGKILL; wait for the kernel to finish tearing it down.
        deadline = time.monotonic() + 5
        while self.ns is not None and self.pids() and time.monotonic() < deadline:
            time.sleep(0.01)
        self.hung = False
        self.dead = True

    def remove(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class AddressPool:
    """Hands out loopback addresses and port pairs (inner, direct) that nothing else on the machine is using.

    Several emulators may run at once (parallel test sessions), so every pick is checked with a bind probe.
    """

    def __init__(self, host_prefix: str, rng_seed: int | None = None) -> None:
        parts = host_prefix.split(".")
        if len(parts) != 3 or parts[0] != "127" or not all(p.isdigit() and 0 <= int(p) <= 255 for p in parts):
            raise EmulatorError(f"host_prefix must look like 127.X.Y (a loopback /24), got {host_prefix!r}")
        self._b, self._c = int(parts[1]), int(parts[2])
        self._d = 1
        self._lock = threading.Lock()
        seed = rng_seed if rng_seed is not None else int.from_bytes(os.urandom(4), "big")
        self._port = 20000 + seed % 20000

    def take(self) -> tuple[str, int, int]:
        with self._lock:
            for _ in range(100000):
                self._d += 1
                if self._d > 254:
                    self._d = 2
                    self._c = (self._c + 1) % 256
                ip = f"127.{self._b}.{self._c}.{self._d}"
                self._port += 1
                if self._port > 60000:
                    self._port = 20000
                inner, direct = self._port, self._port + 1000
                if _port_free(ip, inner) and _port_free(ip, direct):
                    return ip, inner, direct
        raise RuntimeError("no free loopback address/port pair")


class Forwarder:
    """One proxy port: a listener on the shared proxy address that pipes each connection to one box's sshd.

    One thread accepts; each connection gets one thread that copies both ways. A box that is down refuses the
    backend connect, so the client's connection is closed at once; a hung box (SIGSTOP) still completes TCP in the
    kernel and never answers, so the client times out as behind a partition. ``close`` stops the listener and
    every connection it carries (the box was destroyed, stopped or vanished).
    """

    def __init__(self, listener: socket.socket, target: tuple[str, int], held: socket.socket | None = None) -> None:
        self.port = int(listener.getsockname()[1])
        self.target = target
        self._listener = listener
        self._held = held  # the port below, bound and never listening (a jupyter instance's reported ssh_port)
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._closed = False
        self._thread = threading.Thread(target=self._accept_loop, name=f"emulator-proxy-{self.port}", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                ready, _, _ = select.select([self._listener], [], [], 0.2)
                if not ready:
                    continue
                client, _ = self._listener.accept()
            except (OSError, ValueError):
                return
            threading.Thread(target=self._serve, args=(client,), name=f"emulator-proxy-{self.port}-conn",
                             daemon=True).start()

    def _track(self, *socks: socket.socket) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._conns.update(socks)
            return True

    def _serve(self, client: socket.socket) -> None:
        backend: socket.socket | None = None
        try:
            if not self._track(client):
                return
            try:
                backend = socket.create_connection(self.target, timeout=5)
            except OSError:
                return  # the box is down: the client sees its connection closed
            backend.settimeout(None)
            if not self._track(backend):
                return
            _pipe(client, backend)
        finally:
            for sock in (client, backend):
                if sock is not None:
                    with self._lock:
                        self._conns.discard(sock)
                    with contextlib.suppress(OSError):
                        sock.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._conns = list(self._conns), set()
        with contextlib.suppress(OSError):
            self._listener.close()
        if self._held is not None:
            self._held.close()
        for sock in conns:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=2)


def _pipe(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until either side closes (a half-close is passed on)."""
    peer = {a: b, b: a}
    open_ends = {a, b}
    while open_ends:
        try:
            ready, _, _ = select.select(list(open_ends), [], [])
        except (OSError, ValueError):
            return
        for sock in ready:
            try:
                data = sock.recv(1 << 16)
            except OSError:
                return
            if not data:
                open_ends.discard(sock)
                try:
                    peer[sock].shutdown(socket.SHUT_WR)
                except OSError:
                    return
                continue
            try:
                peer[sock].sendall(data)
            except OSError:
                return


class ProxyHost:
    """The emulator's shared SSH proxy host (``ssh_host`` of every instance): one loopback address, one port each.

    Ports are picked with a real bind (several emulators may share the address). With ``reuse_ports`` a port freed
    by a destroyed instance is handed to the next one first, as Vast's proxies recycle theirs: a client that pinned
    a host key by address alone would then meet another box's key at the same ``host:port``.
    """

    def __init__(self, ip: str, *, reuse_ports: bool = False, rng_seed: int | None = None) -> None:
        self.ip = ip
        self.reuse_ports = reuse_ports
        self._lock = threading.Lock()
        self._freed: list[int] = []
        seed = rng_seed if rng_seed is not None else int.from_bytes(os.urandom(4), "big")
        self._next = 30000 + seed % 20000

    def _bind(self, port: int, *, listen: bool = True) -> socket.socket | None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((self.ip, port))
            if listen:
                s.listen(128)
        except OSError:
            s.close()
            return None
        return s

    def _try(self, port: int, target: tuple[str, int], hold_below: bool) -> Forwarder | None:
        held = None
        if hold_below:
            held = self._bind(port - 1, listen=False)
            if held is None:
                return None
        listener = self._bind(port)
        if listener is None:
            if held is not None:
                held.close()
            return None
        return Forwarder(listener, target, held)

    def open(self, target: tuple[str, int], port: int | None = None, *, hold_below: bool = False) -> Forwarder:
        """A forwarder to ``target`` on ``port`` if given and free, else on a freed port (``reuse_ports``), else on
        a new one. ``hold_below`` also takes the port below (a jupyter instance reports that one as its
        ``ssh_port``), so no other instance is listed there."""
        with self._lock:
            candidates: list[int] = [port] if port is not None else []
            if self.reuse_ports:
                candidates += reversed(self._freed)
            for p in candidates:
                fwd = self._try(p, target, hold_below)
                if fwd is not None:
                    if p in self._freed:
                        self._freed.remove(p)
                    return fwd
            for _ in range(40000):
                self._next = self._next + 2 if self._next < 60000 else 20001
                fwd = self._try(self._next, target, hold_below)
                if fwd is not None:
                    return fwd
        raise RuntimeError(f"no free port on the proxy address {self.ip}")

    def release(self, port: int) -> None:
        """The port's instance was destroyed: the port may go to the next rental (``reuse_ports``)."""
        with self._lock:
            if port not in self._freed:
                self._freed.append(port)
