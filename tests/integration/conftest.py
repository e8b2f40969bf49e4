"""Shared integration fixtures: a real ed25519 keypair and a running emulator with real SSH boxes.

``ssh_keypair`` (session) writes a key with the real ``ssh-keygen``; ``emulator`` (module) starts an
``Emulator`` whose account already holds that key, so every instance it creates accepts it. The fleet repository
a test runs comes from ``world.fleet_repo`` (tests/world.py), the console script's environment for this emulator
from ``world.emulator_env``, and git from ``gitutil.git``.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest

from reconciler.emulator import Emulator
from reconciler.emulator.s3server import S3Server, start_s3_server
from reconciler.emulator.testing import KeyPair, make_keypair


@pytest.fixture(scope="session", autouse=True)
def _data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Harvests go to a temporary data dir, never the user's ``~/.local/share/rigsync`` (unless a test says)."""
    old = os.environ.get("RIGSYNC_DATA_DIR")
    os.environ["RIGSYNC_DATA_DIR"] = str(tmp_path_factory.mktemp("data"))
    yield
    if old is None:
        os.environ.pop("RIGSYNC_DATA_DIR", None)
    else:
        os.environ["RIGSYNC_DATA_DIR"] = old


@pytest.fixture(scope="session")
def ssh_keypair(tmp_path_factory: pytest.TempPathFactory) -> KeyPair:
    """A real ed25519 keypair (``.private_path``, ``.public_path``, ``.public`` line) in a tmp dir."""
    return make_keypair(tmp_path_factory.mktemp("sshkey"))


@pytest.fixture(scope="module")
def emulator(ssh_keypair: KeyPair) -> Iterator[Emulator]:
    with Emulator(seed=7, offers=200, boot_delay=0.2) as emu:
        emu.add_ssh_key(ssh_keypair.public)
        yield emu


@pytest.fixture
def api_key_env() -> Iterator[None]:
    """A test whose daemon runs in this process sets ``VAST_API_KEY`` (read from the environment, as a user's would):
    restored afterwards."""
    before = os.environ.get("VAST_API_KEY")
    yield
    if before is None:
        os.environ.pop("VAST_API_KEY", None)
    else:
        os.environ["VAST_API_KEY"] = before


S3_CANARY = "CANARYs3secret-" + "7f3a9c1e5b"  # in the store's secret key: it must never appear anywhere (issue 22)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A real S3-compatible server (SeaweedFS, ``reconciler.emulator.s3server``) on loopback, one per worker, whose
    secret key holds ``S3_CANARY``. Tests keep to prefixes of their own in its one bucket."""
    with start_s3_server(secret_key=S3_CANARY + secrets.token_hex(6)) as server:
        yield server
