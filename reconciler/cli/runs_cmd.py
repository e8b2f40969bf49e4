"""``rigsync runs``: show what the desired sweeps expand to, with their content-addressed ids and commands.

It lets a reviewer see, before merging, exactly which runs a change adds or keeps (same input, same ids, byte
for byte). Base seeds are listed; promotion candidates (seeds added only when a cell does well) are counted,
and listed with ``--promotions``.
"""

from __future__ import annotations

import argparse
import json

from reconciler.cli._common import add_checkout_arg
from reconciler.core.model import Desired, RunSpec
from reconciler.core.textsafe import md_section
from reconciler.desired import errors_of, load_desired_from_dir
from reconciler.desired.expand import scalar_text
from reconciler.errors import DesiredStateInvalid


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_checkout_arg(parser)
    parser.add_argument("--json", action="store_true", help="print a JSON list of runs")
    parser.add_argument(
        "--promotions", action="store_true", help="also list promotion candidates, with their thresholds"
    )
    parser.add_argument(
        "--markdown", action="store_true",
        help="print the list as a markdown section for a pull-request comment (a fence no value can close)",
    )
    parser.set_defaults(handler=run)


def run_json(spec: RunSpec) -> dict[str, object]:
    out: dict[str, object] = {
        "id": spec.id,
        "sweep": spec.sweep.name,
        "params": dict(spec.params),
        "seed": spec.seed,
        "command": spec.command,
    }
    if spec.promotion_threshold is not None:
        out["promotion_threshold"] = spec.promotion_threshold
    return out


def runs_json(desired: Desired, *, promotions: bool = False) -> list[dict[str, object]]:
    """What ``--json`` prints: the base runs, and with ``promotions`` the candidates too (``rigsync mcp`` too)."""
    return [run_json(r) for r in desired.runs if promotions or r.promotion_threshold is None]


def run(args: argparse.Namespace) -> int:
    try:
        desired = load_desired_from_dir(args.repo)
    except DesiredStateInvalid as exc:
        errors = errors_of(exc)
        for error in errors:
            print(error)
        print(f"desired state is invalid: {len(errors)} error(s); run `rigsync validate` for details")
        return 1
    base = [r for r in desired.runs if r.promotion_threshold is None]
    candidates = [r for r in desired.runs if r.promotion_threshold is not None]
    shown = list(desired.runs) if args.promotions else base
    if args.json:
        print(json.dumps(runs_json(desired, promotions=args.promotions), indent=2, ensure_ascii=False))
        return 0
    text = _text(desired, shown, len(base), 0 if args.promotions else len(candidates))
    if args.markdown:
        print(md_section("Runs this revision asks for", text), end="")
    else:
        print(text)
    return 0


def _text(desired: Desired, shown: list[RunSpec], base: int, unlisted: int) -> str:
    lines: list[str] = []
    for spec in shown:
        params = " ".join(f"{k}={scalar_text(v)}" for k, v in spec.params)
        extra = f"  (promotion: best >= {spec.promotion_threshold:g})" if spec.promotion_threshold is not None else ""
        if spec.promotion_threshold is not None and spec.sweep.metric_goal.value == "min":
            extra = f"  (promotion: best <= {spec.promotion_threshold:g})"
        lines.append(f"{spec.id}  seed={spec.seed}  {params}{extra}".rstrip())
        lines.append(f"    {spec.command}")
    last = f"{base} run(s) in {len(desired.sweeps)} sweep(s)"
    if unlisted:
        last += (
            f"; {unlisted} promotion candidate(s) not listed (they run only when a cell's best metric "
            "reaches a threshold; see --promotions)"
        )
    lines.append(last)
    return "\n".join(lines)
