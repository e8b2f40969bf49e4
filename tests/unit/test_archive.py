"""The run archive: month shards, idempotent appends, the journal, crash-torn lines, schema-valid records."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import jsonschema
import pytest

from reconciler.adapters.archive import ShardedRunArchive, journal_path
from reconciler.core.model import AttemptOutcome, AttemptRecord, OverheadRecord
from reconciler.errors import ArchiveCorrupt, RepoError
from reconciler.observed.archive_lines import (
    entry_from_json,
    overhead_to_json,
    record_from_json,
    record_to_json,
    shard_path,
)
from reconciler.observed.observed_tree import write_observed

SCHEMA = json.loads((Path(__file__).parents[2] / "schemas" / "archive-record.schema.json").read_text())
NOV = dt.datetime(2026, 11, 30, 23, 0, tzinfo=dt.UTC).timestamp()
DEC = dt.datetime(2026, 12, 1, 0, 30, tzinfo=dt.UTC).timestamp()


def rec(run_id: str = "r1", attempt: int = 1, ended_at: float | None = NOV, **kw: object) -> AttemptRecord:
    base: dict[str, object] = dict(
        run_id=run_id,
        attempt=attempt,
        sweep="s",
        phase=AttemptOutcome.SUCCEEDED,
        params=(("lr", 0.001), ("env", "walker"), ("deep", True)),
        seed=3,
        exit_code=0,
        code_commit="c" * 40,
        desired_commit="d" * 40,
        image="img",
        instance_id=7,
        machine_id=9,
        gpu_name="RTX 3060",
        dph=0.12,
        started_at=NOV - 3600,
        ended_at=ended_at,
        cost_usd=0.12,
        best_metric=0.9,
        final_metric=0.8,
        reason="exited 0",
    )
    base.update(kw)
    return AttemptRecord(**base)  # type: ignore[arg-type]


def written(archive: ShardedRunArchive) -> ShardedRunArchive:
    """What a cycle does at its end: hand the new lines to the one writer of observed/ (here without a commit)."""
    archive.hand_off(lambda appends: write_observed(archive.root, {}, appends))
    return archive


def test_json_round_trip_is_stable_compact_and_schema_valid() -> None:
    r = rec()
    line = record_to_json(r)
    assert "\n" not in line and ": " not in line
    assert line.startswith('{"run_id":"r1","attempt":1,"sweep":"s","phase":"succeeded","params":{"lr":0.001,')
    assert record_from_json(line) == r
    assert record_to_json(record_from_json(line)) == line
    jsonschema.Draft202012Validator(SCHEMA).validate(json.loads(line))
    lost = rec(phase=AttemptOutcome.LOST, exit_code=None, best_metric=None, final_metric=None, ended_at=None)
    jsonschema.Draft202012Validator(SCHEMA).validate(json.loads(record_to_json(lost)))
    assert record_from_json(record_to_json(lost)) == lost


@pytest.mark.parametrize(
    ("line", "why"),
    [("[1]", "not a JSON object"), ('{"attempt": 1, "phase": "succeeded"}', "run_id"), ("{", "not JSON")],
)
def test_malformed_lines_say_why(line: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        record_from_json(line)


def test_shard_is_month_of_end_time_utc() -> None:
    assert shard_path(rec(ended_at=NOV)) == "observed/runs/2026-11.jsonl"
    assert shard_path(rec(ended_at=DEC)) == "observed/runs/2026-12.jsonl"
    assert shard_path(rec(ended_at=None)) == "observed/runs/2026-11.jsonl"  # falls back to start
    assert shard_path(rec(ended_at=None, started_at=None)) == "observed/runs/undated.jsonl"


def test_append_is_idempotent_within_and_across_instances(tmp_path: Path) -> None:
    a = ShardedRunArchive(tmp_path)
    first = a.append([rec("r1"), rec("r2", ended_at=DEC), rec("r1")])
    assert [r.key for r in first] == [("r1", 1), ("r2", 1)]
    assert a.append([rec("r1"), rec("r2", ended_at=DEC)]) == []
    assert ("r1", 1) in a and ("r1", 2) not in a
    written(a)
    assert a.append([rec("r1"), rec("r2", ended_at=DEC)]) == []
    assert (tmp_path / "observed/runs/2026-11.jsonl").read_text().count("\n") == 1
    assert (tmp_path / "observed/runs/2026-12.jsonl").read_text().count("\n") == 1

    # A fresh archive over the same files (a restarted process) knows every key.
    b = ShardedRunArchive(tmp_path)
    assert b.append([rec("r1"), rec("r2", ended_at=DEC), rec("r1", attempt=2)]) == [rec("r1", attempt=2)]
    assert len(b) == 3
    written(b)
    assert len(ShardedRunArchive(tmp_path)) == 3
    assert [r.key for r in b.records()] == [("r1", 1), ("r1", 2), ("r2", 1)]


def test_append_does_not_rewrite_existing_lines(tmp_path: Path) -> None:
    a = ShardedRunArchive(tmp_path)
    a.append([rec("r1")])
    written(a)
    shard = tmp_path / "observed/runs/2026-11.jsonl"
    before = shard.read_bytes()
    inode = shard.stat().st_ino
    a.append([rec("r2")])
    written(a)
    assert shard.read_bytes().startswith(before)
    assert shard.stat().st_ino == inode


def test_torn_last_line_is_ignored_and_cut_before_the_retry(tmp_path: Path) -> None:
    a = ShardedRunArchive(tmp_path)
    a.append([rec("r1")])
    written(a)
    shard = tmp_path / "observed/runs/2026-11.jsonl"
    full = record_to_json(rec("r2"))
    with open(shard, "a") as fh:
        fh.write(full[: len(full) // 2])  # the crash
    b = ShardedRunArchive(tmp_path)
    assert ("r2", 1) not in b
    assert [r.run_id for r in b.records()] == ["r1"]
    assert b.append([rec("r2")]) == [rec("r2")]
    written(b)
    lines = shard.read_text().splitlines()
    assert lines == [record_to_json(rec("r1")), full]
    assert [r.run_id for r in ShardedRunArchive(tmp_path).records()] == ["r1", "r2"]


def test_complete_last_line_missing_only_its_newline_is_kept(tmp_path: Path) -> None:
    shard = tmp_path / "observed/runs/2026-11.jsonl"
    shard.parent.mkdir(parents=True)
    shard.write_text(record_to_json(rec("r1")))
    a = ShardedRunArchive(tmp_path)
    assert ("r1", 1) in a
    a.append([rec("r2")])
    written(a)
    assert [r.run_id for r in ShardedRunArchive(tmp_path).records()] == ["r1", "r2"]


def test_corrupt_line_in_the_middle_names_file_and_line(tmp_path: Path) -> None:
    shard = tmp_path / "observed/runs/2026-11.jsonl"
    shard.parent.mkdir(parents=True)
    shard.write_text(record_to_json(rec("r1")) + "\nnot json\n" + record_to_json(rec("r2")) + "\n")
    with pytest.raises(ArchiveCorrupt, match=r"2026-11\.jsonl:2"):
        ShardedRunArchive(tmp_path).append([rec("r3")])
    with pytest.raises(ArchiveCorrupt, match=r"2026-11\.jsonl:2"):
        list(ShardedRunArchive(tmp_path).records())


def test_duplicate_lines_from_a_union_merge_are_read_once(tmp_path: Path) -> None:
    shard = tmp_path / "observed/runs/2026-11.jsonl"
    shard.parent.mkdir(parents=True)
    line = record_to_json(rec("r1"))
    shard.write_text(line + "\n" + line + "\n")
    assert [r.key for r in ShardedRunArchive(tmp_path).records()] == [("r1", 1)]
    assert len(ShardedRunArchive(tmp_path)) == 1


def test_encode_new_writes_nothing(tmp_path: Path) -> None:
    a = ShardedRunArchive(tmp_path)
    fresh, blobs = a.encode_new([rec("r1"), rec("r2", ended_at=DEC)])
    assert [r.run_id for r in fresh] == ["r1", "r2"]
    assert set(blobs) == {"observed/runs/2026-11.jsonl", "observed/runs/2026-12.jsonl"}
    assert not (tmp_path / "observed").exists()
    assert ("r1", 1) not in a


def test_an_append_is_durable_in_the_journal_before_the_hand_off(tmp_path: Path) -> None:
    a = ShardedRunArchive(tmp_path)
    a.append([rec("r1"), rec("r2", ended_at=DEC)])
    assert not (tmp_path / "observed").exists()  # the shards are the writer's, at the end of the cycle
    assert journal_path(tmp_path).read_text().count("\n") == 2
    # A process killed now (kill -9, no hand-off): the next one knows both records and hands them over.
    b = ShardedRunArchive(tmp_path)
    assert ("r1", 1) in b and ("r2", 1) in b and len(b) == 2
    assert [r.key for r in b.records()] == [("r1", 1), ("r2", 1)]
    assert b.append([rec("r1")]) == []
    assert b.pending_lines() == {
        "observed/runs/2026-11.jsonl": (record_to_json(rec("r1")) + "\n").encode(),
        "observed/runs/2026-12.jsonl": (record_to_json(rec("r2", ended_at=DEC)) + "\n").encode(),
    }
    written(b)
    assert journal_path(tmp_path).read_text() == ""
    assert b.pending_lines() == {}
    assert [r.key for r in ShardedRunArchive(tmp_path).records()] == [("r1", 1), ("r2", 1)]


def test_killed_after_the_writer_wrote_and_before_the_journal_was_emptied(tmp_path: Path) -> None:
    a = ShardedRunArchive(tmp_path)
    a.append([rec("r1")])
    write_observed(tmp_path, {}, a.pending_lines())  # the writer took the lines; then the process died
    b = ShardedRunArchive(tmp_path)
    assert b.pending_lines() == {}  # already in the shard: not handed over twice
    written(b)
    assert (tmp_path / "observed/runs/2026-11.jsonl").read_text().count("\n") == 1
    assert journal_path(tmp_path).read_text() == ""


def test_a_writer_that_fails_part_way_is_not_duplicated_and_not_lost(tmp_path: Path) -> None:
    a = ShardedRunArchive(tmp_path)
    a.append([rec("r1"), rec("r2", ended_at=DEC)])

    def half(appends: dict[str, bytes]) -> None:
        first = sorted(appends)[0]
        write_observed(tmp_path, {}, {first: appends[first]})
        raise RepoError("disk full")

    with pytest.raises(RepoError):
        a.hand_off(half)
    rest = (record_to_json(rec("r2", ended_at=DEC)) + "\n").encode()
    assert a.pending_lines() == {"observed/runs/2026-12.jsonl": rest}
    written(a)
    assert [r.key for r in ShardedRunArchive(tmp_path).records()] == [("r1", 1), ("r2", 1)]
    for shard in ("2026-11", "2026-12"):
        assert (tmp_path / f"observed/runs/{shard}.jsonl").read_text().count("\n") == 1


def test_a_torn_journal_line_is_cut_and_the_rest_kept(tmp_path: Path) -> None:
    a = ShardedRunArchive(tmp_path)
    a.append([rec("r1")])
    full = record_to_json(rec("r2"))
    with open(journal_path(tmp_path), "a") as fh:
        fh.write(full[:20])  # killed mid-append: that append never returned, so nothing was launched on it
    b = ShardedRunArchive(tmp_path)
    assert [r.key for r in b.records()] == [("r1", 1)]
    assert b.append([rec("r2")]) == [rec("r2")]
    assert [r.key for r in ShardedRunArchive(tmp_path).records()] == [("r1", 1), ("r2", 1)]
    written(b)
    assert (tmp_path / "observed/runs/2026-11.jsonl").read_text().splitlines() == [record_to_json(rec("r1")), full]


def overhead(instance_id: int = 7, ended_at: float | None = NOV, **kw: object) -> OverheadRecord:
    base: dict[str, object] = dict(
        instance_id=instance_id, billed_usd=0.2, attempts_usd=0.12, attempts=1, cost_usd=0.08, machine_id=9,
        gpu_name="RTX 3060", num_gpus=1, dph=0.12, started_at=NOV - 6000, ended_at=ended_at,
        reason="box ended: billed $0.200000, 1 attempt(s) $0.120000, the rest was boot, bootstrap and idle time",
    )
    base.update(kw)
    return OverheadRecord(**base)  # type: ignore[arg-type]


def test_an_overhead_line_round_trips_validates_and_is_not_an_attempt() -> None:
    o = overhead()
    line = overhead_to_json(o)
    assert line.startswith('{"kind":"overhead","instance_id":7,"cost_usd":0.08,"billed_usd":0.2,')
    assert entry_from_json(line) == o and overhead_to_json(entry_from_json(line)) == line  # type: ignore[arg-type]
    jsonschema.Draft202012Validator(SCHEMA).validate(json.loads(line))
    with pytest.raises(ValueError, match="overhead line, not an attempt"):
        record_from_json(line)
    with pytest.raises(ValueError, match="unknown kind"):
        entry_from_json('{"kind": "refund", "instance_id": 7}')
    with pytest.raises(jsonschema.ValidationError):  # an attempt's fields on an overhead line are neither kind
        jsonschema.Draft202012Validator(SCHEMA).validate({**json.loads(line), "run_id": "r1"})
    assert shard_path(overhead(ended_at=DEC)) == "observed/runs/2026-12.jsonl"


def test_overhead_lines_share_the_shards_once_per_box_and_readers_of_attempts_skip_them(tmp_path: Path) -> None:
    a = ShardedRunArchive(tmp_path)
    assert a.append([rec("r1")]) == [rec("r1")]
    assert a.append([overhead(7), overhead(7)]) == [overhead(7)]
    assert a.append([overhead(7, cost_usd=1.0)]) == []  # exactly once per box, whatever it says the second time
    assert ("overhead", 7) in a and len(a) == 2
    # Journalled before the hand-off: a killed process's successor knows and hands over both kinds.
    b = ShardedRunArchive(tmp_path)
    assert [r.key for r in b.records()] == [("r1", 1)]
    assert list(b.overheads()) == [overhead(7)]
    written(b)
    shard = tmp_path / "observed/runs/2026-11.jsonl"
    assert shard.read_text().splitlines() == [record_to_json(rec("r1")), overhead_to_json(overhead(7))]
    c = ShardedRunArchive(tmp_path)
    assert [r.key for r in c.records()] == [("r1", 1)] and list(c.overheads()) == [overhead(7)]
    assert [type(e).__name__ for e in c.entries()] == ["AttemptRecord", "OverheadRecord"]
    assert c.append([overhead(7)]) == [] and c.append([overhead(8)]) == [overhead(8)]


def test_a_torn_overhead_line_is_cut_before_the_retry(tmp_path: Path) -> None:
    a = ShardedRunArchive(tmp_path)
    a.append([rec("r1")])
    written(a)
    shard = tmp_path / "observed/runs/2026-11.jsonl"
    full = overhead_to_json(overhead(7))
    with open(shard, "a") as fh:
        fh.write(full[:30])  # the crash, mid-line
    b = ShardedRunArchive(tmp_path)
    assert ("overhead", 7) not in b and list(b.overheads()) == []
    assert b.append([overhead(7)]) == [overhead(7)]
    written(b)
    assert shard.read_text().splitlines() == [record_to_json(rec("r1")), full]
    # A union merge that repeats the line reads it once.
    shard.write_text(shard.read_text() + full + "\n")
    assert list(ShardedRunArchive(tmp_path).overheads()) == [overhead(7)]
