"""The run archive: one JSON line per finished attempt, append-only, sharded by month under observed/runs/.

It is the long memory of every sweep (what ran where, for how long, at what cost, with what result) and
lives in git so it can be diffed, grepped and analysed with nothing but the repository. This adapter owns the
files (the shards on disk, the journal); the line format itself is pure and lives in
``reconciler.observed.archive_lines``, where the views read committed lines without any file I/O.

**Two kinds of line.** An attempt line (``{"run_id": ..., "attempt": ..., ...}``) is one finished attempt. An
overhead line (``{"kind": "overhead", "instance_id": ..., ...}``) is one box's billed money that no attempt ran
on (boot, bootstrap, idle, GPUs no run held), appended once when the box ended: the attempts' ``cost_usd`` plus
the overhead lines' add up to what the provider billed. Readers of attempts (the planner's history, run phases,
the documents, diff, the demo) read ``records()``, which yields attempts only; ``overheads()`` yields the
overhead lines and ``entries()`` both. Both kinds share the shards, the journal and the exactly-once rule below
(an overhead line is keyed by ``("overhead", instance_id)``; run ids are hex digests, never that word).

**One writer.** The shards reach the disk the way every other file under observed/ does: the cycle hands
them to the one writer (``reconciler.observed.observed_tree.write_observed``, which ``GitRepo.commit_observed`` calls
before it commits) together with the rendered documents, so a commit holds exactly what the cycle handed
over. ``hand_off(write)`` gives ``write`` the new lines per shard and settles them once it returned.

**Durable before anything launches.** Between an attempt being archived during apply and the end of the
cycle, a later action of the same apply may launch the run's next attempt on the strength of that record
(a retry, or the requeue of a run whose box vanished). If rigsync were killed after that launch and the
record lived only in memory, the restarted process would find a second attempt running and nothing durable
saying what became of the first one, whose box may be gone for good. So ``append`` writes the new records
to a journal first (``.git/rigsync-archive.journal`` in the checkout: a write-ahead log, never committed)
and fsyncs it before returning; ``apply`` runs its actions in order, so a record is on disk before any
launch that follows it. The journal is read back on start: its records count as archived (for the keys and
for the history the planner reads) and are handed to the writer with the next cycle's commit. It is
emptied once the writer took them.

**Exactly once.** Every append is keyed by ``(run_id, attempt)``: the key set of the shards is loaded once
per ``ShardedRunArchive`` (one pass, parsing only what a key needs, so a million records load in about a second)
and kept in memory with the journal's keys. A record already in a shard or in the journal is not appended
again; a journal record already in a shard (the writer wrote it, rigsync died before emptying the journal)
is dropped on load. A line cut short by a crash (no trailing newline) is ignored on load, and cut before the
next append, in the journal here and in a shard by the writer, so the retried record lands on a line of its
own. A union merge of two writers' shards may repeat a line; reading keeps the first.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

from reconciler.core.model import AttemptRecord, OverheadRecord
from reconciler.errors import ArchiveCorrupt, RepoError
from reconciler.observed.archive_lines import R, Record, entry_from_json, entry_to_json, key_of, shard_path
from reconciler.observed.codec import RUNS_DIR
from reconciler.observed.observed_tree import append_lines

JOURNAL_FILE = "rigsync-archive.journal"  # under the checkout's .git/

T = TypeVar("T")
log = logging.getLogger("rigsync.archive")


def journal_path(checkout: Path) -> Path:
    """Where the archive's write-ahead journal lives: inside the checkout's ``.git/``, never committed."""
    return Path(checkout) / ".git" / JOURNAL_FILE


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """Non-empty lines with their numbers; a final line without a newline (a torn write) is skipped."""
    with open(path, "rb") as fh:
        for n, line in enumerate(fh, start=1):
            if not line.endswith(b"\n"):
                # Torn by a crash mid-append, unless it parses: then only the newline was lost.
                try:
                    key_of(line)
                except (ValueError, KeyError, TypeError):
                    return
            stripped = line.strip()
            if stripped:
                yield n, stripped


class ShardedRunArchive:
    """The archive of the checkout at ``checkout``: its shards under observed/runs/ plus the pending journal."""

    def __init__(self, checkout: Path, *, journal: Path | None = None) -> None:
        self.root = Path(checkout)
        self.dir = self.root / RUNS_DIR
        self.journal = journal if journal is not None else journal_path(self.root)
        self._shard_keys: set[tuple[str, int]] | None = None
        self._pending: dict[tuple[str, int], Record] | None = None  # journalled, not yet in a shard

    def shards(self) -> list[Path]:
        if not self.dir.is_dir():
            return []
        return sorted(p for p in self.dir.iterdir() if p.suffix == ".jsonl" and p.is_file())

    def _load_shard_keys(self) -> set[tuple[str, int]]:
        if self._shard_keys is None:
            keys: set[tuple[str, int]] = set()
            for shard in self.shards():
                for n, line in _lines(shard):
                    try:
                        keys.add(key_of(line))
                    except (ValueError, KeyError, TypeError) as exc:
                        raise ArchiveCorrupt(f"{shard}:{n}: not an archive record ({exc})") from exc
            self._shard_keys = keys
        return self._shard_keys

    def _load_pending(self) -> dict[tuple[str, int], Record]:
        if self._pending is None:
            in_shards = self._load_shard_keys()
            pending: dict[tuple[str, int], Record] = {}
            if self.journal.is_file():
                for n, line in _lines(self.journal):
                    try:
                        rec = entry_from_json(line)
                    except ValueError as exc:
                        raise ArchiveCorrupt(f"{self.journal}:{n}: not an archive record ({exc})") from exc
                    if rec.key not in in_shards:
                        pending.setdefault(rec.key, rec)
            self._pending = pending
        return self._pending

    def _known(self, key: tuple[str, int]) -> bool:
        return key in self._load_shard_keys() or key in self._load_pending()

    def __contains__(self, key: object) -> bool:
        return isinstance(key, tuple) and self._known(key)

    def __len__(self) -> int:
        return len(self._load_shard_keys()) + len(self._load_pending())

    def records(self) -> Iterator[AttemptRecord]:
        """Every attempt: the shards in month order, then the journalled ones; each key once (the first wins).

        Overhead lines are not attempts and are skipped (``overheads()`` reads them).
        """
        for rec in self.entries():
            if isinstance(rec, AttemptRecord):
                yield rec

    def overheads(self) -> Iterator[OverheadRecord]:
        """Every overhead line (one per box that ended), in archive order."""
        for rec in self.entries():
            if isinstance(rec, OverheadRecord):
                yield rec

    def entries(self) -> Iterator[Record]:
        """Every line of either kind: the shards in month order, then the journalled ones; each key once."""
        seen: set[tuple[str, int]] = set()
        for shard in self.shards():
            for n, line in _lines(shard):
                try:
                    rec = entry_from_json(line)
                except ValueError as exc:
                    raise ArchiveCorrupt(f"{shard}:{n}: not an archive record ({exc})") from exc
                if rec.key in seen:
                    continue
                seen.add(rec.key)
                yield rec
        for key, rec in list(self._load_pending().items()):
            if key not in seen:
                seen.add(key)
                yield rec

    def encode_new(self, records: Iterable[R]) -> tuple[list[R], dict[str, bytes]]:
        """The records not yet archived (deduplicated among themselves too) and their lines per shard.

        Nothing is written and nothing is remembered; ``append`` journals them.
        """
        fresh: list[R] = []
        batch: set[tuple[str, int]] = set()
        for rec in records:
            if rec.key in batch or self._known(rec.key):
                continue
            batch.add(rec.key)
            fresh.append(rec)
        return fresh, _shard_lines(fresh)

    def append(self, records: Iterable[R]) -> list[R]:
        """Archive the records (of one kind) not archived yet; return them. Durable (journalled, fsynced) on return.

        Re-appending is a no-op. The shards themselves are written by the next ``hand_off``.
        """
        fresh, _ = self.encode_new(records)
        if fresh:
            blob = "".join(entry_to_json(r) + "\n" for r in fresh).encode("utf-8")
            try:
                append_lines(self.journal, blob)
            except OSError as exc:
                raise RepoError(f"cannot append to the archive journal {self.journal}: {exc}") from exc
            pending = self._load_pending()
            for rec in fresh:
                pending[rec.key] = rec
        return fresh

    def pending_lines(self) -> dict[str, bytes]:
        """The lines archived since the last hand-off, per shard path: what the writer must append."""
        return _shard_lines(self._load_pending().values())

    def hand_off(self, write: Callable[[dict[str, bytes]], T]) -> T:
        """Give the pending lines to ``write`` (the one writer of observed/); once it returned, empty the journal.

        If ``write`` raises, it may have written part: the shards and the journal are read again before the
        next hand-off, so what did land is not appended twice and what did not is handed over again.
        """
        appends = self.pending_lines()
        try:
            out = write(appends)
        except BaseException:
            self._shard_keys = None
            self._pending = None
            raise
        if appends:
            self._load_shard_keys().update(self._load_pending())
            self._pending = {}
        if self.journal.is_file() and self.journal.stat().st_size:
            try:
                os.truncate(self.journal, 0)
            except OSError as exc:  # harmless: on load, journalled records already in a shard are dropped
                log.warning("cannot empty the archive journal %s: %s", self.journal, exc)
        return out


def _shard_lines(records: Iterable[Record]) -> dict[str, bytes]:
    out: dict[str, list[str]] = {}
    for rec in records:
        out.setdefault(shard_path(rec), []).append(entry_to_json(rec) + "\n")
    return {path: "".join(lines).encode("utf-8") for path, lines in sorted(out.items())}
