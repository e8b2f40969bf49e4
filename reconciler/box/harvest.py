"""rigsync's harvest: one attempt's results (or its checkpoint) as a tar stream on stdout.

This program runs on the box under the best interpreter (``harvest.sh``), standard library only, Python 3.8
syntax. The reconciler reads the stream over the SSH channel it already holds (``Shell.run``: rigsync's key, the
pinned host key, the connection pool and its deadline) and unpacks it into the local store
(``reconciler.adapters.store``). A tar over the existing exec channel rather than SFTP: the ``Shell`` port stays
one method, the box picks the files (globs, containment, the size cap) in the same round trip, and it is the
same shape as ship-code in the other direction.

Arguments: the attempt's directory name under ``$RIGSYNC_ROOT/runs/``, what to take (``run``: the logs,
``meta.json``, the metrics file and the declared artifacts; ``checkpoint``: the files under the given
directories), the size cap in bytes, the patterns (a JSON list, relative to the run directory) and the exit code
for "no such run directory"; then, optionally, ``--out FILE`` (the tar goes to FILE instead of stdout, and stdout
gets one line, ``{"bytes": B, "files": N, "skipped": M}``) and ``--manifest FILE`` (the manifest is also written to
FILE): that is how a box uploads its harvest to the store itself (``upload.sh``).

Every file taken is read whole first (a log being appended or a checkpoint being replaced is taken as it was at
that moment), resolved paths must stay inside the run directory (a symlink out of it is skipped), and files are
taken in order (stderr.log, stdout.log, meta.json, then the patterns' matches sorted) while the total stays within
the cap; the rest are listed as skipped. A file counts by its apparent size (a sparse file of 50 GiB is 50 GiB, as
a copy without sparse support would make it). The harvest looks at no more than ``limits.HARVEST_FILES`` files and
starts none after ``limits.HARVEST_SECONDS`` (options ``--max-files`` and ``--seconds``): the first file left is
named, with why, and the files after it are not looked at. The last member is ``.rigsync-harvest.json``: what was
taken, what was skipped and why, and which attempt this one resumed from (``resume/.rigsync-checkpoint.json``).
"""

from __future__ import annotations

import contextlib
import glob
import io
import json
import os
import stat
import sys
import tarfile
import time
from collections.abc import Iterator
from typing import Any

from reconciler.box.limits import HARVEST_FILES, HARVEST_SECONDS

MANIFEST = ".rigsync-harvest.json"
RESUME_MARK = os.path.join("resume", ".rigsync-checkpoint.json")
FIXED = ("stderr.log", "stdout.log", "meta.json")


def _inside(root: str, path: str) -> bool:
    real = os.path.realpath(path)
    return real == root or real.startswith(root + os.sep)


def _expand(run_dir: str, root: str, pattern: str) -> Iterator[str]:
    """The files ``pattern`` names, in order: a directory's files walked as they are asked for (a directory of
    200,000 files is not listed past what the harvest looks at)."""
    if os.path.isabs(pattern) or ".." in pattern.replace("\\", "/").split("/"):
        return
    for match in sorted(glob.glob(os.path.join(run_dir, pattern), recursive=True)):
        if os.path.isdir(match) and not os.path.islink(match) and _inside(root, match):
            for base, dirs, files in os.walk(match):
                dirs.sort()
                for name in sorted(files):
                    yield os.path.join(base, name)
        else:
            yield match


def _candidates(run_dir: str, root: str, what: str, patterns: list[str]) -> Iterator[str]:
    if what == "run":
        for f in FIXED:
            yield os.path.join(run_dir, f)
    for pattern in patterns:
        yield from _expand(run_dir, root, pattern)


def main(argv: list[str]) -> int:
    started = time.monotonic()
    name, what, cap_text, patterns_text, missing_exit = argv[1:6]
    options = {argv[i]: argv[i + 1] for i in range(6, len(argv) - 1, 2)}
    run_dir = os.path.join(os.environ["RIGSYNC_ROOT"], "runs", name)
    if not os.path.isdir(run_dir):
        sys.stderr.write(f"no run directory runs/{name} on this box\n")
        return int(missing_exit)
    root = os.path.realpath(run_dir)
    patterns = [p for p in json.loads(patterns_text) if isinstance(p, str)]
    bounds = _Bounds(
        cap=int(cap_text),
        max_files=int(options.get("--max-files", HARVEST_FILES)),
        deadline=started + float(options.get("--seconds", HARVEST_SECONDS)),
    )
    out_path = options.get("--out")
    with open(out_path, "wb") if out_path else contextlib.nullcontext(sys.stdout.buffer) as sink:
        with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as out:
            manifest = _write(out, run_dir, root, what, bounds, _candidates(run_dir, root, what, patterns))
        sink.flush()
    if "--manifest" in options:
        with open(options["--manifest"], "wb") as f:
            f.write(_manifest_blob(manifest))
    if out_path:  # the stream went to a file: what it holds, in one line
        counts = {"files": len(manifest["files"]), "skipped": len(manifest["skipped"]), "bytes": manifest["bytes"]}
        sys.stdout.write(json.dumps(counts, sort_keys=True) + "\n")
    return 0


class _Bounds:
    """What one harvest may take: ``cap`` bytes of files (by apparent size), ``max_files`` files looked at, and
    nothing started past ``deadline`` (``time.monotonic``)."""

    def __init__(self, cap: int, max_files: int, deadline: float) -> None:
        self.cap = cap
        self.max_files = max_files
        self.deadline = deadline

    def past(self, looked: int) -> str | None:
        """Why no more files are looked at after ``looked`` of them, or None while the harvest goes on."""
        if looked >= self.max_files:
            return f"past the harvest's {self.max_files}-file bound: it and the files after it not taken"
        if time.monotonic() > self.deadline:
            return "past the harvest's time bound: it and the files after it not taken"
        return None


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "fifo"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def _read_regular(path: str, limit: int) -> bytes:
    """At most ``limit`` bytes of ``path``, opened without blocking and only if it is still a regular file (it may
    have been swapped for a FIFO since it was looked at)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(0, "no longer a regular file")
        return f.read(limit)


def _manifest_blob(manifest: dict[str, Any]) -> bytes:
    return json.dumps(manifest, sort_keys=True).encode()


def _write(
    out: tarfile.TarFile, run_dir: str, root: str, what: str, bounds: _Bounds, candidates: Iterator[str]
) -> dict[str, Any]:
    taken: list[list[Any]] = []
    skipped: list[dict[str, Any]] = []
    seen: set[str] = set()
    total = 0
    for path in candidates:
        rel = os.path.relpath(path, run_dir)
        if rel in seen or rel == MANIFEST:
            continue
        seen.add(rel)
        cut = bounds.past(len(seen) - 1)
        if cut is not None:  # the rest is not even looked at: one line names where the harvest stopped
            skipped.append({"path": rel, "size": None, "why": cut})
            break
        data, refused = _take(path, rel, root, bounds.cap - total)
        if refused is not None:
            if refused:
                skipped.append(refused)
            continue
        info = tarfile.TarInfo(rel)
        info.size = len(data)
        info.mtime = int(time.time())
        info.mode = 0o644
        out.addfile(info, io.BytesIO(data))
        total += len(data)
        taken.append([rel, len(data)])
    manifest = {"v": 1, "what": what, "cap": bounds.cap, "bytes": total, "files": taken, "skipped": skipped,
                "resumed_from": _resumed_from(run_dir)}
    blob = _manifest_blob(manifest)
    info = tarfile.TarInfo(MANIFEST)
    info.size = len(blob)
    info.mtime = int(time.time())
    info.mode = 0o644
    out.addfile(info, io.BytesIO(blob))
    return manifest


def _take(path: str, rel: str, root: str, room: int) -> tuple[bytes, dict[str, Any] | None]:
    """The file's bytes when it is taken (``room``: what is left of the cap), else why not: a skipped entry, or an
    empty one for a file that is not there to take (a fixed file the attempt never wrote)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        if os.path.islink(path):  # a symlink to nothing (or to what cannot be looked at): named, not taken
            return b"", {"path": rel, "size": None, "why": "a symlink to nothing readable"}
        return b"", {}  # a fixed file the attempt never wrote (meta.json before the wrapper ran)
    if stat.S_ISDIR(mode):
        return b"", {}
    if not _inside(root, path):
        return b"", {"path": rel, "size": None, "why": "outside the run directory"}
    if not stat.S_ISREG(mode):  # a FIFO would block the read, a device never end: named, never opened
        return b"", {"path": rel, "size": None, "why": f"not a regular file ({_kind(mode)})"}
    try:
        size = os.path.getsize(path)  # its apparent size: a sparse file counts whole
        if size > room:
            return b"", {"path": rel, "size": size, "why": "over the size cap"}
        data = _read_regular(path, room + 1)
    except OSError as exc:
        return b"", {"path": rel, "size": None, "why": f"unreadable: {exc.strerror or type(exc).__name__}"}
    if len(data) > room:
        return b"", {"path": rel, "size": len(data), "why": "over the size cap"}
    return data, None


def _resumed_from(run_dir: str) -> Any:
    try:
        with open(os.path.join(run_dir, RESUME_MARK)) as f:
            return json.load(f).get("attempt")
    except (OSError, ValueError, AttributeError):
        return None


if __name__ == "__main__":
    sys.exit(main(sys.argv))
