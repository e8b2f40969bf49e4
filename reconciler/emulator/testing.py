"""Small helpers for tests and benchmarks that drive emulated boxes: a real ed25519 keypair, an ssh call.

They live in the package (not in a conftest) so benchmarks, other test folders and the demo can share them.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class KeyPair:
    private_path: Path
    public_path: Path
    public: str  # the OpenSSH public key line


def make_keypair(directory: Path, name: str = "id_ed25519") -> KeyPair:
    """Write an ed25519 keypair with the real ``ssh-keygen`` (no passphrase)."""
    directory.mkdir(parents=True, exist_ok=True)
    key = directory / name
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "rigsync-test", "-f", str(key)],
        check=True, capture_output=True, input=b"y\n",
    )
    pub = key.with_name(name + ".pub")
    return KeyPair(key, pub, pub.read_text().strip())


def ssh(key: KeyPair, host: str, port: int, command: str, *, timeout: float = 20, connect_timeout: int = 5
        ) -> subprocess.CompletedProcess[str]:
    """Run ``command`` on a box with the real OpenSSH client (host keys not checked: boxes are throwaway)."""
    return subprocess.run(
        ["ssh", "-i", str(key.private_path), "-p", str(port), "-o", "StrictHostKeyChecking=no",
         "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "BatchMode=yes",
         "-o", f"ConnectTimeout={connect_timeout}", f"root@{host}", command],
        capture_output=True, text=True, timeout=timeout,
    )
