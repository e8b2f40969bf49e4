"""A harvest's bounds (issue 33): what it takes counts by apparent size, on the box (``box/harvest.py``) and in the
store (``adapters.store``), and it looks at a bounded number of files for a bounded time, naming what it cut."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from adversary.streams import harvest_stream, many_members, sparse_member

import reconciler.adapters.store as store_module
from reconciler.adapters.store import LocalStore
from reconciler.apply import harvest_note
from reconciler.box import harvest, limits
from reconciler.core import bounds
from reconciler.core.curves import read_metrics
from reconciler.errors import StoreError

FIFTY_GIB = 50 << 30


def _box_harvest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, bytes | int], *options: str, cap: int = 1 << 20
) -> dict[str, object]:
    """Run ``harvest.py`` on a run directory of ``files`` (bytes, or an int: a sparse file of that apparent size);
    its manifest, as the tar's last member says it."""
    root = tmp_path / "box"
    run = root / "runs" / "r.1"
    for name, content in files.items():
        path = run / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            f.truncate(content) if isinstance(content, int) else f.write(content)
    monkeypatch.setenv("RIGSYNC_ROOT", str(root))
    out = tmp_path / "harvest.tar"
    argv = ["harvest.py", "r.1", "run", str(cap), json.dumps(["out/"]), "3", "--out", str(out), *options]
    assert harvest.main(argv) == 0
    with tarfile.open(out) as tf:
        names = tf.getnames()
        manifest = tf.extractfile(names[-1])
        assert manifest is not None and names[-1] == ".rigsync-harvest.json"
        doc: dict[str, object] = json.loads(manifest.read())
    return doc


def test_a_sparse_file_counts_its_apparent_size_on_the_box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = _box_harvest(tmp_path, monkeypatch, {"stdout.log": b"hi\n", "out/huge.bin": FIFTY_GIB, "out/a": b"a"})
    assert doc["files"] == [["stdout.log", 3], ["out/a", 1]]
    assert doc["skipped"] == [{"path": "out/huge.bin", "size": FIFTY_GIB, "why": "over the size cap"}]


def test_the_box_looks_at_no_more_files_than_its_bound_and_names_where_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files: dict[str, bytes | int] = {f"out/f{i:03d}": b"x" for i in range(50)}
    doc = _box_harvest(tmp_path, monkeypatch, files, "--max-files", "13")
    taken = doc["files"]
    assert isinstance(taken, list) and len(taken) == 10  # the three fixed names are looked at first (none exist)
    assert doc["skipped"] == [{"path": "out/f010", "size": None,
                               "why": "past the harvest's 13-file bound: it and the files after it not taken"}]
    assert limits.HARVEST_FILES <= bounds.MAX_HARVEST_FILES  # an honest box never meets the store's own bound


def test_the_box_takes_nothing_once_its_time_is_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = _box_harvest(tmp_path, monkeypatch, {"stdout.log": b"hi\n", "out/a": b"a"}, "--seconds", "-1")
    assert doc["files"] == []
    assert doc["skipped"] == [{"path": "stderr.log", "size": None,
                               "why": "past the harvest's time bound: it and the files after it not taken"}]


def test_the_store_skips_and_names_a_sparse_member_over_the_cap(tmp_path: Path) -> None:
    stream = harvest_stream({"ckpt/huge.bin": FIFTY_GIB, "ckpt/fits.bin": 1 << 20}, {"stdout.log": b"hi\n"})
    data = tmp_path / "data"
    got = LocalStore(data).put_attempt("r", 1, stream)
    assert got.skipped == (("ckpt/huge.bin", FIFTY_GIB, "a sparse member over the size cap"),)
    assert not list(data.rglob("huge.bin"))
    fits = next(data.rglob("fits.bin"))  # a sparse member within the cap counts its apparent size, and is taken
    assert fits.stat().st_size == 1 << 20
    note = harvest_note(got)
    assert note == "partial: 1 file(s), 3 B; skipped ckpt/huge.bin (50.0 GiB, a sparse member over the size cap)"


def test_the_store_counts_every_member_by_apparent_size_against_the_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "HARVEST_CAP_BYTES", 100)
    buf = io.BytesIO()
    buf.write(sparse_member("a.bin", 60))
    buf.write(sparse_member("b.bin", 60))  # 120 bytes apparent: past the cap, though each carries 23
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, blob in (("c.txt", b"x" * 40), (".rigsync-harvest.json", b'{"files": [], "skipped": []}')):
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tf.addfile(info, io.BytesIO(blob))
    got = LocalStore(tmp_path / "data").put_attempt("r", 1, buf.getvalue())
    assert [(p, why) for p, _, why in got.skipped] == [("b.bin", "a sparse member over the size cap")]
    assert sorted(p.name for p in (tmp_path / "data").rglob("*.*") if p.is_file()) == [
        ".rigsync-harvest.json", "a.bin", "c.txt",
    ]


def test_the_store_reads_no_stream_past_its_member_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "MAX_HARVEST_MEMBERS", 50)
    with pytest.raises(StoreError, match="more than 50 members: not read past them"):
        LocalStore(tmp_path / "data").put_attempt("r", 1, many_members(200))
    assert not (tmp_path / "data" / "runs" / "r.1").exists()
    assert bounds.MAX_HARVEST_MEMBERS > bounds.MAX_HARVEST_FILES  # past the file bound, members are still named


def test_a_curve_reads_no_more_of_a_metrics_file_than_its_byte_bound() -> None:
    line = b'{"step": 1, "episode_reward": 2.0}\n'
    fh = io.BytesIO(line * ((3 * bounds.METRICS_FILE_BYTES) // len(line)))
    got = read_metrics(fh, "episode_reward")
    assert fh.tell() <= bounds.METRICS_FILE_BYTES + 1
    assert got.problem == f"only the first {bounds.METRICS_FILE_BYTES} bytes read"
    assert bounds.METRICS_FILE_BYTES <= 16 << 20
