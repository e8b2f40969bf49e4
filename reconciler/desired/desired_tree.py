"""The desired/ tree as a reader found it: its files, its limits, and the one message for each refusal.

The working-tree reader (``read_desired_files``) lives here; the git adapter reads a commit's tree itself and
imports only this module, so both readers bound the same things (size before content, depth, entry count, no
symlinks) and say so in the same words.
"""

from __future__ import annotations

import os
from collections.abc import Container, Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from reconciler.desired.load_error import LoadError
from reconciler.errors import DesiredStateInvalid

DESIRED_DIR = "desired"
FLEET_FILE = "desired/fleet.yaml"
BUDGET_FILE = "desired/budget.yaml"
SWEEPS_DIR = "desired/sweeps/"
README_FILE = "desired/README.md"
MAX_FILE_BYTES = 256 * 1024
MAX_DESIRED_DEPTH = 8
MAX_DESIRED_ENTRIES = 2000


def safe_relative(path: str) -> bool:
    parts = PurePosixPath(path).parts
    return bool(parts) and not path.startswith("/") and ".." not in parts


def bootstrap_file(data: Mapping[str, Any]) -> str | None:
    """The repo-relative path the fleet's (or a pool's) ``bootstrap`` names (``bootstrap: PATH`` or ``bootstrap:
    {script: PATH, cache: [...]}``), if it names a safe one."""
    value = data.get("bootstrap")
    if isinstance(value, Mapping):
        value = value.get("script")
    if not isinstance(value, str) or not safe_relative(value):
        return None
    return str(PurePosixPath(DESIRED_DIR) / PurePosixPath(value))


class TreeFiles(dict[str, bytes]):
    """The files under desired/ in one tree (a commit, or the working tree), as a reader found them.

    A plain mapping of repo-relative path to bytes, plus what only the reader knows: ``refused`` maps a path it
    left unread to why (too big to read, a symlink, not a regular file), and ``repo_paths`` answers whether a
    repo-relative path is a file or folder in that tree (None when the reader cannot say cheaply), which is how
    a sweep's ``code`` paths are checked. The git adapter and ``read_desired_files`` build one; ``load_desired``
    reads both.
    """

    def __init__(
        self,
        files: Mapping[str, bytes] | None = None,
        *,
        refused: Mapping[str, str] | None = None,
        repo_paths: Container[str] | None = None,
    ) -> None:
        super().__init__(files or {})
        self.refused: dict[str, str] = dict(refused or {})
        self.repo_paths = repo_paths


def symlink_refused(folder: str) -> str:
    """The one message for a symlink inside ``folder`` (desired/), from the working tree or a git tree."""
    return f"symlinks are not allowed in {folder.rstrip('/')}/"


def folder_is_symlink(folder: str) -> str:
    """The one message for ``folder`` (desired/) itself being a symlink."""
    return f"{folder.rstrip('/')}/ is a symlink; it must be a folder in the repository"


def too_many_entries(folder: str) -> str:
    """The one message for a tree under ``folder`` (desired/) with more than ``MAX_DESIRED_ENTRIES`` entries."""
    return f"{folder.rstrip('/')}/ holds more than {MAX_DESIRED_ENTRIES} entries"


def too_deep(folder: str) -> str:
    """The one message for folders nested past ``MAX_DESIRED_DEPTH`` levels under ``folder`` (desired/)."""
    return f"folders nested deeper than {MAX_DESIRED_DEPTH} levels in {folder.rstrip('/')}/"


def too_big(size: int, limit: int = MAX_FILE_BYTES) -> str:
    """The one message for a file over the size limit (also for blobs the git adapter leaves unread)."""
    return f"file is {size} bytes; the limit is {limit} bytes ({limit // 1024} KiB)"


class _WorkTreePaths(Container[str]):
    """Whether a repo-relative path exists in a working tree (file, folder or symlink)."""

    def __init__(self, repo: Path) -> None:
        self.repo = repo

    def __contains__(self, path: object) -> bool:
        return isinstance(path, str) and safe_relative(path) and os.path.lexists(self.repo / path)


def read_desired_files(repo: Path) -> TreeFiles:
    """Every regular file under ``repo/desired/``, keyed by repo-relative POSIX path ("desired/...").

    Raises ``DesiredStateInvalid`` when desired/ is missing or a symlink, holds symlinks or special files, or is
    deeper or larger than the limits. Oversized files are not read: they are listed in ``refused`` with their size.
    """
    root = repo / DESIRED_DIR
    if root.is_symlink():
        symlinked: list[object] = [LoadError(DESIRED_DIR, None, None, "", folder_is_symlink(DESIRED_DIR))]
        raise DesiredStateInvalid(symlinked)
    if not root.is_dir():
        missing: list[object] = [LoadError(DESIRED_DIR, None, None, "", f"no {DESIRED_DIR}/ directory in {repo}")]
        raise DesiredStateInvalid(missing)
    out = TreeFiles(repo_paths=_WorkTreePaths(repo))
    errors: list[LoadError] = []
    for path in sorted(_walk(root, errors, repo)):
        rel = path.relative_to(repo).as_posix()
        if path.is_symlink():
            errors.append(LoadError(rel, None, None, "", symlink_refused(DESIRED_DIR)))
        elif path.is_dir():
            continue
        elif not path.is_file():
            errors.append(LoadError(rel, None, None, "", "not a regular file"))
        else:
            with path.open("rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size > MAX_FILE_BYTES:
                    out.refused[rel] = too_big(size)
                else:
                    out[rel] = fh.read(MAX_FILE_BYTES + 1)
    if errors:
        raise DesiredStateInvalid([*errors])
    return out


def _walk(root: Path, errors: list[LoadError], repo: Path) -> Iterator[Path]:
    """Entries under ``root``, iteratively, stopping (with an error) past ``MAX_DESIRED_DEPTH`` folders deep or
    ``MAX_DESIRED_ENTRIES`` entries: desired/ holds a handful of files, and a hostile tree must not exhaust us."""
    stack: list[tuple[Path, int]] = [(root, 1)]
    seen = 0
    while stack:
        folder, depth = stack.pop()
        for entry in sorted(folder.iterdir()):
            seen += 1
            if seen > MAX_DESIRED_ENTRIES:
                errors.append(LoadError(DESIRED_DIR, None, None, "", too_many_entries(DESIRED_DIR)))
                return
            yield entry
            if entry.is_dir() and not entry.is_symlink():
                if depth >= MAX_DESIRED_DEPTH:
                    rel = entry.relative_to(repo).as_posix()
                    errors.append(LoadError(rel, None, None, "", too_deep(DESIRED_DIR)))
                    continue
                stack.append((entry, depth + 1))
