"""`rigsync plan`: observe the world and print what the next apply would do, and why."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from reconciler.actions import Plan
from reconciler.cli._common import add_repo_arg, observe_once
from reconciler.errors import UserError
from reconciler.render import plan_text


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("plan", help="show what apply would do, with a reason per action")
    add_repo_arg(p)
    p.add_argument("--json", action="store_true", help="print the plan as JSON (schemas/plan.schema.json)")
    p.add_argument("--detailed-exitcode", action="store_true", help="exit 0 no changes, 2 changes, 1 error")
    p.add_argument("--out", default=None, help="save the plan as JSON for `rigsync apply --plan`")
    p.add_argument("--noops", action="store_true", help="also list what was considered and left alone")
    p.set_defaults(handler=run)


def plan_doc(args: argparse.Namespace) -> tuple[Plan, dict[str, Any]]:
    """The plan of one live observation and its JSON (schemas/plan.schema.json; ``rigsync mcp``'s ``plan`` too)."""
    _, _, the_plan = observe_once(args)
    return the_plan, the_plan.to_json()


def run(args: argparse.Namespace) -> int:
    the_plan, doc = plan_doc(args)
    if args.out:
        try:
            Path(args.out).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        except OSError as exc:
            raise UserError(f"{args.out}: cannot save the plan: {exc.strerror}") from None
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(plan_text(the_plan, show_noops=args.noops))
    if args.detailed_exitcode:
        return 2 if the_plan.changes else 0
    return 0
