"""The local result store: where an attempt's outputs live once they have come home from its box.

Boxes are disposable; what a run wrote (stdout/stderr, ``meta.json``, its metrics file, declared artifacts and
checkpoints) is pulled back before the box goes and kept here, outside the repository (git keeps only the small
summaries under ``observed/``). One layout, used by the harvest that writes it and by ``rigsync logs`` that reads
it:

    <data dir>/<fleet>/runs/<run_id>.<attempt>/            what the attempt's run directory held
    <data dir>/<fleet>/checkpoints/<run_id>/                the run's last synced checkpoint

The data dir is ``--data-dir``, else ``$RIGSYNC_DATA_DIR``, else ``$XDG_DATA_HOME/rigsync`` (``~/.local/share``).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, BinaryIO

from reconciler.core.bounds import (
    HARVEST_CAP_BYTES,
    MANIFEST_BYTES,
    MAX_HARVEST_FILES,
    MAX_HARVEST_MEMBERS,
    bounded_text,
    strict_json,
)
from reconciler.errors import StoreError
from reconciler.ports import HARVEST_MANIFEST, Harvested, HarvestStream, StoredCheckpoint

DATA_DIR_ENV = "RIGSYNC_DATA_DIR"


def data_dir_for(fleet: str, override: str | os.PathLike[str] | None = None) -> Path:
    """The fleet's data directory (created, private to the user)."""
    if override:
        base = Path(override)
    elif os.environ.get(DATA_DIR_ENV):
        base = Path(os.environ[DATA_DIR_ENV])
    else:
        xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        base = Path(xdg) / "rigsync"
    path = base / fleet
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def attempt_dir(fleet_data: Path, run_id: str, attempt: int) -> Path:
    """Where one attempt's harvested run directory lives (not created here)."""
    return fleet_data / "runs" / f"{run_id}.{attempt}"


def checkpoint_dir(fleet_data: Path, run_id: str) -> Path:
    """Where a run's last synced checkpoint lives (not created here)."""
    return fleet_data / "checkpoints" / run_id


MANIFEST = HARVEST_MANIFEST  # the harvest's own manifest (``reconciler/box/harvest.py``), kept beside
CHECKPOINT_MARK = ".rigsync-checkpoint.json"  # in a checkpoint dir: {"run_id", "attempt", "synced_at"}


Refused = tuple[str, int | None, str]  # (member name, bytes if known, why), as ``Harvested.skipped``


def _unpack(tar: HarvestStream, into: Path) -> list[Refused]:
    """Unpack a harvest stream (consumed: a file is closed after) into the new directory ``into``: regular files
    only, no path out of it, at most ``bounds.MAX_HARVEST_FILES`` of them, and at most ``bounds.HARVEST_CAP_BYTES``
    of them by apparent size (a sparse member counts what it would be written as, never the bytes it carries). What
    is refused (a FIFO or device node, a link, a path out of the directory, a member past the cap) is returned,
    named, for the harvest's note; the rest is unpacked. A stream of more than ``bounds.MAX_HARVEST_MEMBERS`` members
    is not read past them (``StoreError``): the box's harvest never sends one."""
    into.mkdir(parents=True, mode=0o700)
    refused: list[Refused] = []
    taken = total = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(tar) if isinstance(tar, bytes) else tar, mode="r:*") as tf:
            for n, member in enumerate(tf, 1):
                if n > MAX_HARVEST_MEMBERS:
                    raise StoreError(f"the harvest holds more than {MAX_HARVEST_MEMBERS} members: not read past them")
                why = _refusal(member, taken, total)
                if why is not None:
                    refused.append((bounded_text(member.name, 200), member.size if member.isfile() else None, why))
                    continue
                if member.isdir():
                    continue
                try:
                    tf.extract(member, into, filter="data")
                except tarfile.FilterError as exc:  # its message names where it would land: the controller's path
                    refused.append((bounded_text(member.name, 200), member.size, f"refused ({_filter_why(exc)})"))
                    continue
                taken += 1
                total += member.size if member.name != MANIFEST else 0
                # the members read so far are not needed again (no links are unpacked): 200k of them stay unheld
                tf.members.clear()  # type: ignore[attr-defined]
    except (tarfile.TarError, OSError) as exc:
        # the message goes into a committed archive record: it names the problem, never the controller's paths
        why = type(exc).__name__ if isinstance(exc, tarfile.FilterError) else _no_path(exc)
        raise StoreError(f"cannot unpack the harvest: {type(exc).__name__}: {why}") from exc
    finally:
        if not isinstance(tar, bytes):
            tar.close()
    return refused


def _refusal(member: tarfile.TarInfo, taken: int, total: int) -> str | None:
    """Why the store does not unpack ``member`` after ``taken`` files of ``total`` bytes; None when it may."""
    if member.isdir():
        return None
    if not member.isfile():
        return f"not a regular file ({_member_kind(member)})"
    if member.name == MANIFEST:
        return None
    if taken >= MAX_HARVEST_FILES:
        return f"past {MAX_HARVEST_FILES} files"
    if total + member.size > HARVEST_CAP_BYTES:
        return "a sparse member over the size cap" if member.issparse() else "over the size cap"
    return None


def _member_kind(member: tarfile.TarInfo) -> str:
    if member.isfifo():
        return "fifo"
    if member.ischr():
        return "character device"
    if member.isblk():
        return "block device"
    if member.issym():
        return "symlink"
    if member.islnk():
        return "hard link"
    return "special file"


def _filter_why(exc: tarfile.FilterError) -> str:
    if isinstance(exc, tarfile.AbsolutePathError):
        return "an absolute path"
    if isinstance(exc, tarfile.OutsideDestinationError):
        return "outside the run directory"
    return type(exc).__name__


def _no_path(exc: BaseException) -> str:
    """What went wrong, without the file names an ``OSError`` carries (they are the controller's own paths)."""
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    return bounded_text(str(exc), 200)


def _count(value: object) -> int | None:
    """A byte count from the box's manifest: a non-negative int (not bool) below 2**63, else None."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 63:
        return None
    return value


def _entries(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _manifest(directory: Path) -> Harvested:
    """The harvest's manifest kept in ``directory`` (``parse_manifest``); a missing one is a ``StoreError`` that
    names no path of the controller's."""
    try:
        with (directory / MANIFEST).open("rb") as fh:
            raw = fh.read(MANIFEST_BYTES + 1)
    except OSError as exc:
        raise StoreError(f"the harvest has no readable manifest: {_no_path(exc)}") from exc
    return parse_manifest(raw)


def parse_manifest(raw: bytes) -> Harvested:
    """The harvest's manifest, as the box wrote it (the first ``bounds.MANIFEST_BYTES`` + 1 bytes of it, read by
    the caller: more is refused), every entry checked (a malformed one is left out; a path is shown escaped and
    bounded). Every store parses a manifest here (``LocalStore``, ``s3store.S3Store``). An unparsable manifest is a
    ``StoreError``."""
    if len(raw) > MANIFEST_BYTES:
        raise StoreError(f"the harvest's manifest is larger than {MANIFEST_BYTES} bytes")
    doc, problem = strict_json(raw.decode("utf-8", "replace"))
    if problem is not None:
        raise StoreError(f"the harvest's manifest cannot be used: {problem}")
    if not isinstance(doc, dict):
        raise StoreError("the harvest's manifest is not a JSON object")
    files = tuple(
        (bounded_text(e[0]), n)
        for e in _entries(doc.get("files"))
        if isinstance(e, list) and len(e) == 2 and isinstance(e[0], str) and (n := _count(e[1])) is not None
    )
    skipped = tuple(
        (bounded_text(str(e.get("path"))), _count(e.get("size")), bounded_text(str(e.get("why", ""))))
        for e in _entries(doc.get("skipped"))
        if isinstance(e, dict)
    )
    resumed = doc.get("resumed_from")
    return Harvested(
        files=files,
        skipped=skipped,
        bytes=_count(doc.get("bytes", 0)) or 0,
        cap=_count(doc.get("cap", 0)) or 0,
        resumed_from=resumed if isinstance(resumed, int) and not isinstance(resumed, bool) and resumed > 0 else None,
    )



def harvest_skipped(got: Harvested, name: str) -> str | None:
    """Why a stored harvest (``ResultStore.harvested``) left ``name`` behind (``over the size cap, 2.0 GiB``), as
    its manifest says; None when it did not."""
    for path, size, why in got.skipped:
        if path == name:
            return f"{why}, {size} bytes" if size is not None else why
    return None


def _with_refused(got: Harvested, refused: list[Refused]) -> Harvested:
    """The manifest's account, with what the store refused to unpack added to what was skipped."""
    if not refused:
        return got
    listed = {path for path, _, _ in got.skipped}
    return replace(got, skipped=got.skipped + tuple(r for r in refused if r[0] not in listed))


def _swap_in(tmp: Path, final: Path) -> None:
    """Replace ``final`` with ``tmp`` (a directory): the old one is moved aside, then removed."""
    old = final.with_name(f".{final.name}.old.{os.getpid()}")
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


class LocalStore:
    """The ``ResultStore`` port on local disk, in the layout above. Every write lands whole (a temporary directory
    renamed into place), so a reader (``rigsync logs``) sees the last complete harvest or none, and harvesting
    twice is harmless."""

    def __init__(self, fleet_data: Path) -> None:
        self.fleet_data = Path(fleet_data)

    @property
    def presigner(self) -> None:
        """Boxes cannot reach a directory on the controller: everything comes through its streams."""
        return None

    def expire(self, now: float, *, keep_harvests_s: float | None) -> int:
        """Remove harvested attempt directories last written more than ``keep_harvests_s`` ago."""
        if keep_harvests_s is None:
            return 0
        removed = 0
        runs = self.fleet_data / "runs"
        for directory in sorted(runs.iterdir()) if runs.is_dir() else []:
            try:
                if directory.name.startswith(".") or now - directory.stat().st_mtime <= keep_harvests_s:
                    continue
            except OSError:
                continue
            shutil.rmtree(directory, ignore_errors=True)
            removed += 1
        return removed

    def _tmp(self, final: Path) -> Path:
        final.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        return final.with_name(f".{final.name}.tmp.{os.getpid()}.{uuid.uuid4().hex[:8]}")

    def put_attempt(self, run_id: str, attempt: int, tar: HarvestStream) -> Harvested:
        final = attempt_dir(self.fleet_data, run_id, attempt)
        tmp = self._tmp(final)
        try:
            refused = _unpack(tar, tmp)
            got = _manifest(tmp)
            _swap_in(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return _with_refused(got, refused)

    def read_attempt(self, run_id: str, attempt: int, name: str, *, tail: int | None = None) -> bytes | None:
        path = self._file(run_id, attempt, name)
        if path is None:
            return None
        try:
            with path.open("rb") as f:
                if tail is not None:
                    f.seek(max(0, path.stat().st_size - tail))
                return f.read()
        except OSError:
            return None

    def _file(self, run_id: str, attempt: int, name: str) -> Path | None:
        """The harvested file ``name`` of the attempt, if it is one inside its directory."""
        base = attempt_dir(self.fleet_data, run_id, attempt)
        path = base / name
        try:
            return path if path.resolve().is_relative_to(base.resolve()) and path.is_file() else None
        except OSError:
            return None

    def read_range(self, run_id: str, attempt: int, name: str, offset: int, length: int) -> tuple[bytes, int] | None:
        path = self._file(run_id, attempt, name)
        if path is None:
            return None
        try:
            with path.open("rb") as f:
                size = os.fstat(f.fileno()).st_size
                f.seek(max(0, min(offset, size)))
                return f.read(max(0, length)), size
        except OSError:
            return None

    def harvested(self, run_id: str, attempt: int) -> Harvested | None:
        directory = attempt_dir(self.fleet_data, run_id, attempt)
        if not directory.is_dir():
            return None
        try:
            return _manifest(directory)
        except StoreError:  # harvested by an older rigsync, or its manifest lost: what is there is all there is
            return Harvested(files=(), skipped=(), bytes=0, cap=0)

    def open_attempt(self, run_id: str, attempt: int, name: str) -> BinaryIO | None:
        path = self._file(run_id, attempt, name)
        if path is None:
            return None
        try:
            return path.open("rb")
        except OSError:
            return None

    def put_checkpoint(self, run_id: str, attempt: int, tar: HarvestStream, *, at: float) -> Harvested:
        final = checkpoint_dir(self.fleet_data, run_id)
        tmp = self._tmp(final)
        try:
            refused = _unpack(tar, tmp)
            got = _with_refused(_manifest(tmp), refused)
            if got.skipped or not got.files:  # incomplete (or nothing yet): keep the last complete sync
                return got
            (tmp / MANIFEST).unlink()
            mark = {"run_id": run_id, "attempt": attempt, "synced_at": at}
            (tmp / CHECKPOINT_MARK).write_text(json.dumps(mark, sort_keys=True) + "\n", encoding="utf-8")
            _swap_in(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return got

    def checkpoint_synced(self, run_id: str) -> tuple[int, float] | None:
        try:
            mark = json.loads((checkpoint_dir(self.fleet_data, run_id) / CHECKPOINT_MARK).read_text(encoding="utf-8"))
            return int(mark["attempt"]), float(mark["synced_at"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def checkpoint(self, run_id: str) -> StoredCheckpoint | None:
        directory = checkpoint_dir(self.fleet_data, run_id)
        try:
            mark = json.loads((directory / CHECKPOINT_MARK).read_text(encoding="utf-8"))
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
                for path in sorted(directory.rglob("*")):
                    if path.is_file() and not path.is_symlink():
                        tf.add(path, arcname=path.relative_to(directory).as_posix(), recursive=False)
            return StoredCheckpoint(
                run_id=run_id, attempt=int(mark["attempt"]), synced_at=float(mark["synced_at"]), tar=buf.getvalue()
            )
        except (OSError, ValueError, KeyError, TypeError, tarfile.TarError):
            return None
