"""``rigsync validate``: check the desired/ tree and report every problem at once, for people, agents and CI.

Exit 0 when valid, 1 when not. Human output is one ``file:line:col: pointer: message`` line per problem and a
summary; ``--json`` prints ``{"valid": bool, "errors": [...]}`` (a contract other tools read); ``--github`` prints
each problem as a GitHub Actions workflow command (``::error file=…,line=…,col=…::…``), so a pull request shows
it on the offending line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from reconciler.cli._common import add_checkout_arg
from reconciler.core.model import Desired
from reconciler.desired import LoadError, errors_of, load_desired_from_dir
from reconciler.errors import DesiredStateInvalid


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_checkout_arg(parser)
    fmt = parser.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help='print {"valid": bool, "errors": [...]}')
    fmt.add_argument(
        "--github", action="store_true",
        help="print each problem as a GitHub Actions annotation (::error file=...,line=...::message)",
    )
    parser.set_defaults(handler=run)


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def github_annotation(error: LoadError) -> str:
    """One problem as a GitHub Actions ``error`` workflow command, escaped as the runner expects."""
    props = [f"file={_escape_property(error.file)}"]
    if error.line is not None:
        props.append(f"line={error.line}")
        if error.column is not None:
            props.append(f"col={error.column}")
    props.append("title=rigsync validate")
    message = f"{error.pointer or '/'}: {error.message}"
    return f"::error {','.join(props)}::{_escape_data(message)}"
def check(repo: Path) -> tuple[Desired | None, list[LoadError]]:
    """The desired state under ``repo`` and no errors, or None and every problem found."""
    try:
        return load_desired_from_dir(repo), []
    except DesiredStateInvalid as exc:
        return None, errors_of(exc)


def validate_json(repo: Path) -> dict[str, Any]:
    """What ``--json`` prints (``rigsync mcp``'s ``validate`` returns the same)."""
    _, errors = check(repo)
    return {"valid": not errors, "errors": [e.to_json() for e in errors]}


def run(args: argparse.Namespace) -> int:
    repo: Path = args.repo
    if args.json:
        doc = validate_json(repo)
        print(json.dumps(doc, indent=2))
        return 0 if doc["valid"] else 1
    desired, errors = check(repo)
    if desired is None:
        for error in errors:
            print(github_annotation(error) if args.github else error)
        print(f"desired state is invalid: {len(errors)} error(s)")
        return 1
    else:
        base = sum(1 for r in desired.runs if r.promotion_threshold is None)
        print(
            f"desired state is valid: fleet {desired.fleet.name!r} (max {desired.fleet.max_instances} instance(s)), "
            f"{len(desired.sweeps)} sweep(s), {base} run(s)"
        )
    return 0
