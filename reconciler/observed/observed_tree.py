"""observed/ in a checkout's working tree: reading its files, and the one writer of them.

Everything rigsync puts under observed/ reaches the disk through ``write_observed``: the rendered documents,
the lease, and the run archive's new lines. The git adapter's ``commit_observed`` is this writer followed
by a commit; ``rigsync apply`` (which leaves committing to ``rigsync run``) calls it alone. Nothing else
writes there, so what a commit holds is what the cycle handed over.

* A document is replaced atomically (a temporary file renamed over it); ``None`` deletes it; a file that
  already holds the same bytes is not touched.
* An append adds whole lines to a JSON Lines file (the archive's month shards) and is fsynced. A last line
  without its newline was cut short by a crash mid-append: when it still parses as JSON only its newline
  was lost and it is terminated; otherwise the fragment is cut off before appending (whoever appended it
  still holds the record and hands it over again). The check reads only the bytes after the last newline,
  so an append stays cheap however large the shard grows.
* Any path outside observed/ is refused before anything is written.
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Mapping
from pathlib import Path

from reconciler.errors import RepoError
from reconciler.observed.codec import LEASE, OBSERVED_DIR, RENDERED

_PREFIX = OBSERVED_DIR + "/"


def read_observed(checkout: Path) -> dict[str, str]:
    """The observed/*.yaml files present in the working tree at ``checkout`` (missing ones are left out)."""
    out: dict[str, str] = {}
    for rel in (*RENDERED, LEASE):
        p = Path(checkout) / rel
        if p.is_file():
            out[rel] = p.read_text(encoding="utf-8")
    return out


def check_observed_path(path: str) -> str:
    """Return the normalised repository path, or raise if it is not strictly under ``observed/``."""
    if not path or path.startswith("/") or "\\" in path or "\0" in path:
        raise RepoError(f"refusing to write {path!r}: rigsync writes only under {_PREFIX}")
    norm = posixpath.normpath(path)
    if norm != path.rstrip("/") or not norm.startswith(_PREFIX) or ".." in norm.split("/"):
        raise RepoError(f"refusing to write {path!r}: rigsync writes only under {_PREFIX}")
    return norm


def write_observed(checkout: Path, files: Mapping[str, str | None], appends: Mapping[str, bytes]) -> None:
    """Write ``files`` (None deletes) and append ``appends`` (whole JSON lines) under ``checkout``/observed/."""
    checked_files = {check_observed_path(p): c for p, c in files.items()}
    checked_appends = {check_observed_path(p): b for p, b in appends.items()}
    root = Path(checkout)
    try:
        for rel, content in sorted(checked_files.items()):
            _replace(root / rel, content)
        for rel, blob in sorted(checked_appends.items()):
            if blob:
                append_lines(root / rel, blob)
    except OSError as exc:
        raise RepoError(f"cannot write observed files in {root}: {exc}") from exc


def _replace(target: Path, content: str | None) -> None:
    if content is None:
        target.unlink(missing_ok=True)
        return
    data = content.encode("utf-8")
    if target.is_file() and target.read_bytes() == data:
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".rigsync-tmp")
    tmp.write_bytes(data)
    os.replace(tmp, target)


def append_lines(target: Path, blob: bytes) -> None:
    """Append ``blob`` (whole lines) to the JSON Lines file ``target`` after repairing a torn last line; fsync."""
    target.parent.mkdir(parents=True, exist_ok=True)
    repair_torn_tail(target)
    with open(target, "ab") as fh:
        fh.write(blob if blob.endswith(b"\n") else blob + b"\n")
        fh.flush()
        os.fsync(fh.fileno())


def complete_line(line: bytes) -> bool:
    """Whether a line that lost its newline is still whole: it parses as JSON (a torn prefix never does)."""
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def repair_torn_tail(path: Path) -> None:
    """Make ``path`` end with a newline: terminate a complete last line, cut off a torn one."""
    if not path.exists():
        return
    with open(path, "r+b") as fh:
        end = fh.seek(0, os.SEEK_END)
        if end == 0:
            return
        fh.seek(end - 1)
        if fh.read(1) == b"\n":
            return
        pos, tail = end, b""
        while pos > 0 and b"\n" not in tail:
            step = min(4096, pos)
            pos -= step
            fh.seek(pos)
            tail = fh.read(step) + tail
        cut = tail.rfind(b"\n") + 1  # 0 when the torn line is the whole file
        if complete_line(tail[cut:]):
            fh.seek(end)
            fh.write(b"\n")
        else:
            fh.truncate(pos + cut)
