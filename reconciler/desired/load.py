"""``load_desired``: the whole desired tree, validated all at once, into a frozen ``Desired``.

Nothing is acted on unless the whole tree is valid: every file is parsed, checked against its schema and its
own checks, and every problem is reported together, sorted and capped per file. ``_guard`` turns any
exception nobody planned for into an error of the file being read, so a user's file never becomes a traceback.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from reconciler.core.model import Desired, Sweep
from reconciler.desired import fields
from reconciler.desired.desired_tree import (
    BUDGET_FILE,
    DESIRED_DIR,
    FLEET_FILE,
    README_FILE,
    SWEEPS_DIR,
    TreeFiles,
    bootstrap_file,
    read_desired_files,
)
from reconciler.desired.expand import count_runs, expand
from reconciler.desired.fleet_checks import bootstrap_owners, fleet_checks
from reconciler.desired.load_error import MAX_MESSAGE, LoadError, short
from reconciler.desired.schema_errors import schema_errors
from reconciler.desired.strict_yaml import Doc, parse_yaml
from reconciler.desired.sweep_checks import sweep_checks
from reconciler.errors import DesiredStateInvalid

MAX_RUNS_TOTAL = 50_000
MAX_SWEEP_FILES = 500
MAX_ERRORS_PER_FILE = 50

_T = TypeVar("_T")


def load_desired_from_dir(repo: Path) -> Desired:
    """``load_desired(read_desired_files(repo))``."""
    return load_desired(read_desired_files(repo))


def _guard(file: str, errors: list[LoadError], step: Callable[[], _T]) -> _T | None:
    """Run one step of loading ``file``; an exception nobody planned for becomes that file's error, not a crash.

    Every known way a file can fail has its own check and message; this is the belt to those braces, so a user's
    file can never take the CLI or the daemon down with a traceback.
    """
    try:
        return step()
    except Exception as exc:  # anything at all: a bad file must not crash the loader
        message = f"internal error reading this file: {type(exc).__name__}: {exc}"
        errors.append(LoadError(file, None, None, "", short(message[: MAX_MESSAGE - 20] + "; please report it")))
        return None


def load_desired(
    files: Mapping[str, bytes], *, commit: str | None = None, repo_paths: Container[str] | None = None
) -> Desired:
    """Validate the desired tree and build the model; raise ``DesiredStateInvalid`` with every problem found.

    ``files`` maps repo-relative paths to contents; paths outside desired/ are ignored, so a whole commit tree
    may be passed. ``repo_paths`` says which paths exist in the repository (files and folders), to check each
    sweep's ``code``; it defaults to what a ``TreeFiles`` knows, and when unknown that check is skipped.
    """
    refused: dict[str, str] = {}
    if isinstance(files, TreeFiles):
        refused = files.refused
        repo_paths = files.repo_paths if repo_paths is None else repo_paths
    files = {k: v for k, v in files.items() if k.startswith(DESIRED_DIR + "/")}
    errors: list[LoadError] = [LoadError(path, None, None, "", why) for path, why in refused.items()]

    docs: dict[str, Doc] = {}
    parsed: dict[str, Doc] = {}
    sweep_files = sorted(k for k in files if k.startswith(SWEEPS_DIR) and _is_sweep_file(k))
    if len(sweep_files) > MAX_SWEEP_FILES:
        errors.append(LoadError(SWEEPS_DIR.rstrip("/"), None, None, "", f"more than {MAX_SWEEP_FILES} sweep files"))
        sweep_files = sweep_files[:MAX_SWEEP_FILES]
    for name, schema in ((FLEET_FILE, "fleet"), (BUDGET_FILE, "budget"), *((f, "sweep") for f in sweep_files)):
        if name in refused:
            continue
        if name not in files:
            if name != FLEET_FILE and name != BUDGET_FILE:
                continue
            errors.append(LoadError(name, None, None, "", f"missing: {name} is required"))
            continue
        doc = _guard(name, errors, partial(_parse_and_check, name, files[name], schema, errors, parsed))
        if doc is not None:
            docs[name] = doc

    fleet_doc = docs.get(FLEET_FILE)
    bootstrap: dict[str, str] = {}
    if fleet_doc is not None:
        checked = _guard(FLEET_FILE, errors, partial(fleet_checks, fleet_doc, files))
        problems, bootstrap = checked if checked is not None else ([], {})
        errors += problems
        if problems or checked is None:
            fleet_doc = None

    known = {FLEET_FILE, BUDGET_FILE, README_FILE, *sweep_files, *refused}
    named = _guard(FLEET_FILE, [], partial(_bootstrap_named, parsed.get(FLEET_FILE)))
    fleet_readable, bootstrap_named = named if named is not None else (False, [])
    known.update(bootstrap_named)
    for name in sorted(files):
        if name in known:
            continue
        if not fleet_readable and not name.startswith(SWEEPS_DIR):
            continue  # it may be the bootstrap script of a fleet file we could not read; don't pile on
        if name.startswith(SWEEPS_DIR) and name.endswith(".yml"):
            message = "sweep files must end in .yaml"
        elif name.startswith(SWEEPS_DIR) and "/" in name[len(SWEEPS_DIR) :]:
            message = "sweeps/ holds files only, no sub-folders"
        else:
            message = (
                "unknown file in desired/ (expected fleet.yaml, budget.yaml, sweeps/*.yaml, README.md "
                "and the fleet's bootstrap script)"
            )
        errors.append(LoadError(name, None, None, "", message))

    sweeps: list[Sweep] = []
    names: dict[str, str] = {}
    fleet_data = fleet_doc.data if fleet_doc is not None else None
    for order, name in enumerate(sweep_files):
        doc = docs.get(name)
        if doc is None:
            continue
        sweep = _guard(name, errors, partial(_checked_sweep, doc, order, fleet_data, repo_paths, names, errors))
        if sweep is not None:
            sweeps.append(sweep)

    if not errors and sum(count_runs(s) for s in sweeps) > MAX_RUNS_TOTAL:
        errors.append(
            LoadError(SWEEPS_DIR.rstrip("/"), None, None, "", f"all sweeps together exceed {MAX_RUNS_TOTAL} runs")
        )

    desired: Desired | None = None
    if not errors and fleet_doc is not None and BUDGET_FILE in docs:
        fleet = _guard(FLEET_FILE, errors, partial(fields.build_fleet, fleet_doc.data, bootstrap))
        budget = _guard(BUDGET_FILE, errors, partial(fields.build_budget, docs[BUDGET_FILE].data))
        runs = _guard(SWEEPS_DIR.rstrip("/"), errors, partial(expand, sweeps))
        if fleet is not None and budget is not None and runs is not None:
            desired = Desired(fleet=fleet, budget=budget, sweeps=tuple(sweeps), runs=runs, commit=commit)
    if desired is None:
        if not errors:
            errors.append(LoadError(DESIRED_DIR, None, None, "", "desired/ did not load; please report it"))
        raise DesiredStateInvalid([*_capped(sorted(errors, key=LoadError.sort_key))])
    return desired


def _capped(errors: list[LoadError]) -> list[LoadError]:
    """At most ``MAX_ERRORS_PER_FILE`` errors per file, then one saying how many more: a generated file with
    thousands of duplicate keys must not become thousands of lines in status.yaml and every commit message."""
    out: list[LoadError] = []
    per_file: dict[str, int] = {}
    for error in errors:
        n = per_file[error.file] = per_file.get(error.file, 0) + 1
        if n <= MAX_ERRORS_PER_FILE:
            out.append(error)
    for file, n in sorted(per_file.items()):
        if n > MAX_ERRORS_PER_FILE:
            more = n - MAX_ERRORS_PER_FILE
            out.append(LoadError(file, None, None, "", f"{more} more error(s) in this file not listed"))
    return sorted(out, key=LoadError.sort_key)


def _parse_and_check(name: str, raw: bytes, schema: str, errors: list[LoadError], parsed: dict[str, Doc]) -> Doc | None:
    """Parse one file and check it against its schema; its problems go to ``errors``, the doc back if clean.
    A file that parses is kept in ``parsed`` whatever its schema says (what the fleet names is known even then)."""
    doc, problems = parse_yaml(name, raw)
    errors += problems
    if doc is None:
        return None
    parsed[name] = doc
    schema_problems = schema_errors(doc, schema)
    errors += schema_problems
    return None if schema_problems else doc


def _checked_sweep(
    doc: Doc,
    order: int,
    fleet_data: Mapping[str, Any] | None,
    repo_paths: Container[str] | None,
    names: dict[str, str],
    errors: list[LoadError],
) -> Sweep | None:
    problems = sweep_checks(doc, fleet_data, repo_paths)
    sweep_name = doc.data["name"]
    if sweep_name in names:
        problems.append(doc.error(("name",), f"sweep name '{sweep_name}' is already used by {names[sweep_name]}"))
    else:
        names[sweep_name] = doc.file
    errors += problems
    return None if problems else fields.build_sweep(doc.data, order)


def _is_sweep_file(path: str) -> bool:
    rest = path[len(SWEEPS_DIR) :]
    return "/" not in rest and rest.endswith(".yaml") and not rest.startswith(".")


def _bootstrap_named(doc: Doc | None) -> tuple[bool, list[str]]:
    """(fleet file readable, the bootstrap paths it and its pools name), read leniently: known even when the fleet is
    invalid."""
    if doc is None or not isinstance(doc.data, dict):
        return False, []
    return True, [t for _, owner in bootstrap_owners(doc.data) if (t := bootstrap_file(owner)) is not None]


def errors_of(exc: DesiredStateInvalid) -> list[LoadError]:
    """The LoadErrors a DesiredStateInvalid carries (its ``errors`` is typed loosely in errors.py)."""
    return [e for e in exc.errors if isinstance(e, LoadError)]
