"""Bad desired/ trees and the exact errors the loader must report for them, plus the good example.

Each folder under ``loader_cases/`` is one case: files under its ``desired/`` are laid over the repository's
example desired/ tree (replacing whole files), ``remove.txt`` lists example files to drop, and ``expect.txt``
lists every error the loader must report, one per line, as ``LOCATION | POINTER | MESSAGE SUBSTRING`` where
LOCATION is ``file`` or ``file:line:col``. The loader must report exactly these errors (same count), which is
how "all errors at once, nothing spurious" is checked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from reconciler.core.model import MetricGoal, OnExceed, Ranking
from reconciler.desired import (
    MAX_FILE_BYTES,
    LoadError,
    TreeFiles,
    errors_of,
    load_desired,
    load_desired_from_dir,
    read_desired_files,
    schema_path,
)
from reconciler.errors import DesiredStateInvalid

REPO = Path(__file__).resolve().parents[2]
CASES = Path(__file__).resolve().parent / "loader_cases"


def example_files() -> dict[str, bytes]:
    return read_desired_files(REPO)


def case_files(case: Path) -> dict[str, bytes]:
    files = example_files()
    remove = case / "remove.txt"
    if remove.exists():
        for line in remove.read_text().splitlines():
            if line.strip():
                files.pop(line.strip())
    overlay = case / "desired"
    if overlay.exists():
        for path in sorted(overlay.rglob("*")):
            if path.is_file():
                files[path.relative_to(case).as_posix()] = path.read_bytes()
    return files


def parse_expect(case: Path) -> list[tuple[str, int | None, int | None, str, str]]:
    out = []
    for raw in (case / "expect.txt").read_text().splitlines():
        if not raw.strip() or raw.startswith("#"):
            continue
        location, pointer, message = (part.strip() for part in raw.split("|", 2))
        file, *pos = location.split(":")
        line = int(pos[0]) if pos else None
        col = int(pos[1]) if len(pos) > 1 else None
        out.append((file, line, col, pointer, message))
    return out


def load_errors(files: dict[str, bytes]) -> list[LoadError]:
    with pytest.raises(DesiredStateInvalid) as info:
        load_desired(files)
    return errors_of(info.value)


def matches(error: LoadError, want: tuple[str, int | None, int | None, str, str]) -> bool:
    file, line, col, pointer, message = want
    return (
        error.file == file
        and error.line == line
        and error.column == col
        and error.pointer == pointer
        and message.lower() in error.message.lower()
    )


ALL_CASES = sorted(p for p in CASES.iterdir() if p.is_dir())


def test_every_case_has_expectations() -> None:
    assert len(ALL_CASES) >= 30
    for case in ALL_CASES:
        assert (case / "expect.txt").is_file(), f"{case.name} has no expect.txt"


@pytest.mark.parametrize("case", ALL_CASES, ids=[p.name for p in ALL_CASES])
def test_loader_case(case: Path) -> None:
    expected = parse_expect(case)
    assert expected, f"{case.name}: expect.txt is empty"
    errors = load_errors(case_files(case))
    shown = "\n".join(str(e) for e in errors)
    remaining = list(errors)
    for want in expected:
        hit = next((e for e in remaining if matches(e, want)), None)
        assert hit is not None, f"{case.name}: no error matching {want}; got:\n{shown}"
        remaining.remove(hit)
    assert not remaining, f"{case.name}: unexpected extra errors:\n" + "\n".join(str(e) for e in remaining)


def test_example_loads() -> None:
    desired = load_desired_from_dir(REPO)
    fleet = desired.fleet
    assert fleet.name == "demo"
    assert fleet.max_instances == 3
    (pool,) = fleet.pools
    assert pool.filters.dph_max is not None and pool.filters.dph_max <= 0.15
    assert pool.ranking is Ranking.DLPERF_PER_DPH
    assert pool.bootstrap_path == "desired/bootstrap.sh"
    assert pool.bootstrap_script.startswith("#!/bin/sh")
    assert len(pool.bootstrap_hash) == 16
    assert fleet.idle_timeout_s == 600.0 and fleet.ttl_s == 12 * 3600.0 and fleet.heartbeat_stale_s == 60.0
    assert desired.budget.on_exceed is OnExceed.DRAIN and desired.budget.total_usd == 20.0
    (sweep,) = desired.sweeps
    assert sweep.name == "tdmpc" and sweep.seeds == (1, 2, 3)
    assert sweep.metric_key == "episode_reward" and sweep.metric_goal is MetricGoal.MAX
    assert [(r.threshold, r.add_seeds) for r in sweep.promotion] == [(600.0, 5), (500.0, 2), (380.0, 1)]
    base = [r for r in desired.runs if r.promotion_threshold is None]
    assert len(base) == 12
    assert len({r.id for r in desired.runs}) == len(desired.runs)
    assert len({r.cell for r in desired.runs}) == 4
    first = base[0]
    assert first.params == (("task", "walker-walk"), ("lr", 0.0003))
    assert first.command == (
        '"$RIGSYNC_PYTHON" experiments/train.py --task walker-walk --lr 0.0003 --seed 1 '
        '--out "$RIGSYNC_RUN_DIR"/metrics.jsonl'
    )


def test_commit_is_carried() -> None:
    desired = load_desired(example_files(), commit="abc123")
    assert desired.commit == "abc123"


def test_files_outside_desired_are_ignored() -> None:
    files = example_files()
    files["README.md"] = b"\xff not yaml"
    files["src/train.py"] = b"print(1)"
    assert len(load_desired(files).runs) > 0


def test_oversized_file() -> None:
    files = example_files()
    body = b"description: " + b"x" * MAX_FILE_BYTES + b"\n"
    files["desired/budget.yaml"] = body
    errors = load_errors(files)
    assert [(e.file, e.line) for e in errors] == [("desired/budget.yaml", None)]
    assert "limit is 262144 bytes" in errors[0].message


def test_many_aliases_fail_fast() -> None:
    """A quadratic-blowup style file (thousands of aliases) is refused at the first anchor."""
    files = example_files()
    text = "name: s\nbase: &x " + "[" + ",".join(["1"] * 1000) + "]\n"
    text += "".join(f"k{i}: [" + ",".join(["*x"] * 100) + "]\n" for i in range(200))
    files["desired/sweeps/tdmpc.yaml"] = text.encode()
    errors = load_errors(files)
    assert [str(e) for e in errors] == [
        "desired/sweeps/tdmpc.yaml:2:7: /: anchors (&x) are not allowed in desired/ files; write the value out"
    ]


def test_read_desired_files_refuses_symlinks(tmp_path: Path) -> None:
    (tmp_path / "desired").mkdir()
    (tmp_path / "desired" / "fleet.yaml").symlink_to("/etc/passwd")
    with pytest.raises(DesiredStateInvalid) as info:
        read_desired_files(tmp_path)
    assert [str(e) for e in errors_of(info.value)] == ["desired/fleet.yaml: /: symlinks are not allowed in desired/"]


def test_missing_desired_dir(tmp_path: Path) -> None:
    with pytest.raises(DesiredStateInvalid) as info:
        load_desired_from_dir(tmp_path)
    assert "no desired/ directory" in str(errors_of(info.value)[0])


def test_error_str_and_json() -> None:
    error = LoadError("desired/sweeps/a.yaml", 12, 5, "/seeds/1", "'x' is not of type 'integer'")
    assert str(error) == "desired/sweeps/a.yaml:12:5: /seeds/1: 'x' is not of type 'integer'"
    assert error.to_json() == {
        "file": "desired/sweeps/a.yaml",
        "line": 12,
        "column": 5,
        "pointer": "/seeds/1",
        "message": "'x' is not of type 'integer'",
    }
    assert str(LoadError("desired/x", None, None, "", "m")) == "desired/x: /: m"


SCHEMAS = ("fleet", "budget", "sweep")


def _properties(node: object, where: str) -> list[tuple[str, dict[str, object]]]:
    """Every (location, property schema) in a schema document, however deeply nested."""
    found: list[tuple[str, dict[str, object]]] = []
    if isinstance(node, dict):
        for name, sub in (node.get("properties") or {}).items():
            found.append((f"{where}/properties/{name}", sub))
        for key, sub in node.items():
            found += _properties(sub, f"{where}/{key}")
    elif isinstance(node, list):
        for i, sub in enumerate(node):
            found += _properties(sub, f"{where}/{i}")
    return found


def _objects(node: object, where: str) -> list[tuple[str, dict[str, object]]]:
    found: list[tuple[str, dict[str, object]]] = []
    if isinstance(node, dict):
        if node.get("type") == "object":
            found.append((where, node))
        for key, sub in node.items():
            found += _objects(sub, f"{where}/{key}")
    elif isinstance(node, list):
        for i, sub in enumerate(node):
            found += _objects(sub, f"{where}/{i}")
    return found


@pytest.mark.parametrize("name", SCHEMAS)
def test_schema_conventions(name: str) -> None:
    path = schema_path(name)
    assert path == REPO / "schemas" / f"{name}.schema.json"
    schema = json.loads(path.read_text())
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"]
    props = _properties(schema, "#")
    assert len(props) > 5
    for where, prop in props:
        assert isinstance(prop.get("description"), str) and prop["description"], f"{where} has no description"
    for where, obj in _objects(schema, "#"):
        if where in ("#/properties/grid", "#/properties/env", "#/properties/search/properties/parameters"):
            continue  # a map from parameter (variable) names to values: its values are typed, its keys are patterned
        assert obj.get("additionalProperties") is False, f"{where} allows additional properties"


@pytest.mark.parametrize(
    ("file", "name"), [("fleet.yaml", "fleet"), ("budget.yaml", "budget"), ("sweeps/tdmpc.yaml", "sweep")]
)
def test_example_files_point_editors_at_their_schema(file: str, name: str) -> None:
    path = REPO / "desired" / file
    first = path.read_text().splitlines()[0]
    prefix = "# yaml-language-server: $schema="
    assert first.startswith(prefix)
    assert (path.parent / first[len(prefix) :]).resolve() == schema_path(name)
    # An independent validator (what CI and editors use) accepts the example against the same schema.
    result = subprocess.run(
        [str(Path(sys.executable).parent / "check-jsonschema"), "--schemafile", str(schema_path(name)), str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_schema_path_unknown() -> None:
    with pytest.raises(FileNotFoundError):
        schema_path("nope")


def test_an_unexpected_exception_becomes_an_error_of_its_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """The safety net: a bug below the loader is reported against the file being read, not raised."""
    from reconciler.desired import fields as desired_module

    def broken(data: object) -> object:
        raise KeyError("surprise")

    monkeypatch.setattr(desired_module, "build_budget", broken)
    errors = load_errors(example_files())
    assert [str(e) for e in errors] == [
        "desired/budget.yaml: /: internal error reading this file: KeyError: 'surprise'; please report it"
    ]


def test_what_the_reader_refused_is_reported_and_repo_paths_check_code() -> None:
    files = TreeFiles(example_files(), refused={"desired/sweeps/big.yaml": "file is 9 bytes; the limit is 8 bytes"})
    errors = load_errors(files)
    assert [str(e) for e in errors] == ["desired/sweeps/big.yaml: /: file is 9 bytes; the limit is 8 bytes"]
    # Without a tree to look in, code paths are not checked; with one, they are, and the keyword wins.
    plain = dict(example_files())
    assert load_desired(plain).sweeps[0].code_paths == ("experiments",)
    errors = load_errors_with(plain, repo_paths={"src"})
    assert [e.message for e in errors] == [
        "code path 'experiments' is not in the repository: there is no such file or folder"
    ]
    assert load_desired(plain, repo_paths={"experiments"}).sweeps


def load_errors_with(files: dict[str, bytes], *, repo_paths: set[str]) -> list[LoadError]:
    with pytest.raises(DesiredStateInvalid) as info:
        load_desired(files, repo_paths=repo_paths)
    return errors_of(info.value)


def test_oversized_file_on_disk_is_refused_unread(tmp_path: Path) -> None:
    (tmp_path / "desired" / "sweeps").mkdir(parents=True)
    for rel, data in example_files().items():
        (tmp_path / rel).write_bytes(data)
    (tmp_path / "experiments").mkdir()
    (tmp_path / "desired" / "budget.yaml").write_bytes(b"#" * (MAX_FILE_BYTES * 4))
    files = read_desired_files(tmp_path)
    assert "desired/budget.yaml" not in files
    why = f"file is {MAX_FILE_BYTES * 4} bytes; the limit is 262144 bytes (256 KiB)"
    assert files.refused == {"desired/budget.yaml": why}
    assert [str(e) for e in load_errors(files)] == [f"desired/budget.yaml: /: {why}"]


def test_errors_are_capped_per_file() -> None:
    files = example_files()
    files["desired/budget.yaml"] = b"max_total_usd: 1\n" + b"max_total_usd: 1\n" * 120
    errors = load_errors(files)
    assert len(errors) == 51
    assert all("duplicate key 'max_total_usd'" in e.message for e in errors[1:])
    assert str(errors[0]) == "desired/budget.yaml: /: 70 more error(s) in this file not listed"
