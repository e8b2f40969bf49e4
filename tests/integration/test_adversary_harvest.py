"""Issue 33's leftovers of the adversary corpus, on the emulator's real sshd boxes: a harvest counts what it takes
by apparent size (on the box and in the store alike), and no harvest or metrics read holds a cycle long.

* A box that forges its harvest (``boxes.make_harvest_liar``): a GNU sparse member of 50 GiB apparent size (23
  bytes in the stream) is skipped and named by the store, never unpacked; a stream of 200,000 members is not read
  past the store's member bound.
* An honest box: a sparse file of 50 GiB is over the cap by its apparent size; a directory of 200,000 files is cut
  at the harvest's file bound, named, within a bound of time; a 230 MB metrics file comes home and its curve is read
  under the metrics byte bound.

Each case goes through the controller's real parts: ``ShellBoxes.harvest`` over paramiko, ``LocalStore``, and the
harvest note ``apply`` writes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from adversary import boxes as hostile
from adversary import checks
from adversary.streams import harvest_stream, many_members
from test_box_transfers import _rent

from reconciler.adapters.box_control import ShellBoxes
from reconciler.adapters.ssh import SshShell
from reconciler.adapters.store import LocalStore
from reconciler.apply import harvest_note
from reconciler.box.limits import HARVEST_FILES, HARVEST_SECONDS
from reconciler.core.bounds import HARVEST_CAP_BYTES, MAX_HARVEST_MEMBERS, METRICS_FILE_BYTES
from reconciler.core.curves import read_metrics
from reconciler.core.model import Instance
from reconciler.emulator import Emulator
from reconciler.emulator.testing import KeyPair
from reconciler.errors import StoreError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

FIFTY_GIB = 50 << 30
# what one harvest may hold a cycle: the box takes nothing new past HARVEST_SECONDS; the store's unpacking of at most
# HARVEST_FILES files comes on top (seconds, on a machine this test shares with others)
HARVEST_WALL_S = HARVEST_SECONDS + 30.0


@pytest.fixture(scope="module")
def rented(emulator: Emulator) -> Iterator[dict[str, Instance]]:
    """Two boxes: one left honest, one whose harvests a test forges (``boxes.make_harvest_liar``)."""
    made = {role: _rent(emulator, f"rigsync:advharvest:{n}") for n, role in enumerate(("honest", "liar"))}
    yield made
    for inst in made.values():
        emulator.destroy_instance(inst.id)


@pytest.fixture
def honest(rented: dict[str, Instance]) -> Instance:
    return rented["honest"]


@pytest.fixture
def liar(rented: dict[str, Instance]) -> Instance:
    return rented["liar"]


@pytest.fixture(scope="module")
def shell_boxes(ssh_keypair: KeyPair, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShellBoxes]:
    shell = SshShell(private_key=ssh_keypair.private_path,
                     known_hosts=tmp_path_factory.mktemp("kh") / "known_hosts", connect_timeout=3)
    yield ShellBoxes(shell)
    shell.close()


def _run_dir(emulator: Emulator, box: Instance, name: str) -> Path:
    d = emulator.host_root(box.id) / "rigsync" / "runs" / name
    d.mkdir(parents=True)
    (d / "stdout.log").write_text("out\n")
    return d


def test_a_forged_sparse_member_over_the_cap_is_skipped_and_named(
    emulator: Emulator, liar: Instance, shell_boxes: ShellBoxes, tmp_path: Path
) -> None:
    _run_dir(emulator, liar, "sparse.1")
    hostile.make_harvest_liar(
        emulator, liar.id, harvest_stream({"ckpt/huge.bin": FIFTY_GIB}, {"stdout.log": b"out\n"})
    )
    stream = shell_boxes.harvest(liar, "sparse", 1, what="run", patterns=["ckpt/"], cap_bytes=HARVEST_CAP_BYTES)
    got = LocalStore(tmp_path / "data").put_attempt("sparse", 1, stream)
    assert ("ckpt/huge.bin", FIFTY_GIB, "a sparse member over the size cap") in got.skipped, got
    note = harvest_note(got)
    assert note.startswith("partial: 1 file(s)") and "ckpt/huge.bin (50.0 GiB, a sparse member over" in note, note
    assert not list((tmp_path / "data").rglob("huge.bin")), "the sparse member was unpacked"
    assert checks.data_dir_problems(tmp_path / "data") == []
    apparent = sum(p.stat().st_size for p in (tmp_path / "data").rglob("*") if p.is_file())
    assert apparent < 1 << 20, f"{apparent} bytes of apparent size in the store"


def test_a_stream_of_200000_members_is_not_read_past_the_member_bound(
    emulator: Emulator, liar: Instance, shell_boxes: ShellBoxes, tmp_path: Path
) -> None:
    _run_dir(emulator, liar, "many.1")
    hostile.make_harvest_liar(emulator, liar.id, many_members(200_000))
    started = time.monotonic()
    stream = shell_boxes.harvest(liar, "many", 1, what="run", patterns=["out/"], cap_bytes=HARVEST_CAP_BYTES)
    streamed = time.monotonic() - started
    with pytest.raises(StoreError, match=f"more than {MAX_HARVEST_MEMBERS} members"):
        LocalStore(tmp_path / "data").put_attempt("many", 1, stream)
    unpacked = time.monotonic() - started - streamed
    print(f"200,000 forged members: streamed in {streamed:.1f}s, refused after {unpacked:.1f}s")
    assert streamed + unpacked < HARVEST_WALL_S
    assert checks.file_count(tmp_path / "data") == 0, "a refused harvest left files in the store"


def test_an_honest_sparse_file_counts_its_apparent_size_on_the_box(
    emulator: Emulator, honest: Instance, shell_boxes: ShellBoxes, tmp_path: Path
) -> None:
    d = _run_dir(emulator, honest, "honestsparse.1")
    (d / "ckpt").mkdir()
    with open(d / "ckpt" / "huge.bin", "wb") as f:
        f.truncate(FIFTY_GIB)
    (d / "ckpt" / "small.bin").write_bytes(b"x" * 100)
    stream = shell_boxes.harvest(honest, "honestsparse", 1, what="checkpoint", patterns=["ckpt/"],
                                 cap_bytes=HARVEST_CAP_BYTES)
    got = LocalStore(tmp_path / "data").put_attempt("honestsparse", 1, stream)
    assert [p for p, _ in got.files] == ["ckpt/small.bin"]
    assert got.skipped == (("ckpt/huge.bin", FIFTY_GIB, "over the size cap"),)
    assert "ckpt/huge.bin (50.0 GiB, over the size cap)" in harvest_note(got)


def test_a_directory_of_200000_files_is_cut_at_the_file_bound_within_a_bound_of_time(
    emulator: Emulator, honest: Instance, shell_boxes: ShellBoxes, tmp_path: Path
) -> None:
    d = _run_dir(emulator, honest, "manyfiles.1")
    many = d / "out" / "many"
    many.mkdir(parents=True)
    for i in range(200_000):
        os.close(os.open(many / f"f{i:06d}", os.O_CREAT | os.O_WRONLY, 0o644))
    started = time.monotonic()
    stream = shell_boxes.harvest(honest, "manyfiles", 1, what="run", patterns=["out/"], cap_bytes=HARVEST_CAP_BYTES)
    streamed = time.monotonic() - started
    got = LocalStore(tmp_path / "data").put_attempt("manyfiles", 1, stream)
    wall = time.monotonic() - started
    print(f"200,000 files: streamed in {streamed:.1f}s, stored in {wall - streamed:.1f}s, {len(got.files)} taken")
    assert wall < HARVEST_WALL_S, f"the harvest held its cycle {wall:.0f}s"
    assert 0 < len(got.files) <= HARVEST_FILES
    (cut,) = got.skipped
    assert cut[0].startswith("out/many/f") and cut[2].startswith("past the harvest's"), cut
    assert f"past the harvest's {HARVEST_FILES}-file bound" in harvest_note(got) or "time bound" in cut[2]
    assert checks.file_count(tmp_path / "data") == len(got.files) + 1  # and the manifest


def test_a_230_mb_metrics_file_is_read_for_its_curve_under_the_byte_bound(
    emulator: Emulator, honest: Instance, shell_boxes: ShellBoxes, tmp_path: Path
) -> None:
    d = _run_dir(emulator, honest, "bigmetrics.1")
    line = b'{"step": 1, "episode_reward": 1.5, "pad": "' + b"9" * 200 + b'"}\n'
    with open(d / "metrics.jsonl", "wb") as f:
        for _ in range(230):
            f.write(line * ((1 << 20) // len(line)))
    store = LocalStore(tmp_path / "data")
    started = time.monotonic()
    stream = shell_boxes.harvest(honest, "bigmetrics", 1, what="run", patterns=["metrics.jsonl"],
                                 cap_bytes=HARVEST_CAP_BYTES)
    got = store.put_attempt("bigmetrics", 1, stream)
    assert [p for p, _ in got.files] == ["stdout.log", "metrics.jsonl"]
    streamed = time.monotonic() - started
    fh = store.open_attempt("bigmetrics", 1, "metrics.jsonl")
    assert fh is not None
    with fh:
        curve = read_metrics(fh, "episode_reward")
        read = fh.tell()
    took = time.monotonic() - started - streamed
    print(f"230 MB metrics file: harvested in {streamed:.1f}s, its curve read in {took:.1f}s ({read} bytes)")
    assert curve.problem == f"only the first {METRICS_FILE_BYTES} bytes read"
    assert read <= METRICS_FILE_BYTES + (1 << 20)  # the bound, and the buffered reader's last block
    assert curve.total > 0
