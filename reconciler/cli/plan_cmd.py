"""`rigsync plan`: observe the world and print what the next apply would do, and why."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from reconciler.cli._common import add_allow_dirty_arg, add_live_args, dirty_banner, observe_once
from reconciler.core.actions import Plan
from reconciler.core.suggest import SearchBound, search_bounds
from reconciler.errors import UserError
from reconciler.plan.render import plan_text
from reconciler.plan.saved import SavedPlan


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_live_args(p)
    p.add_argument("--json", action="store_true", help="print the plan as JSON (schemas/plan.schema.json)")
    p.add_argument("--detailed-exitcode", action="store_true", help="exit 0 no changes, 2 changes, 1 error")
    p.add_argument("--out", default=None, help="save the plan as JSON for `rigsync apply --plan`")
    p.add_argument("--noops", action="store_true", help="also list what was considered and left alone")
    add_allow_dirty_arg(p)
    p.set_defaults(handler=run)


def plan_doc(args: argparse.Namespace) -> tuple[Plan, dict[str, Any], list[str], list[SearchBound]]:
    """The plan of one live observation, its JSON with the settings of the controller that made it (a saved plan:
    schemas/plan.schema.json; ``rigsync mcp``'s ``plan`` too), the uncommitted files it rests on (``--allow-dirty``;
    a caller without that flag, such as the read-only MCP tool, plans a dirty tree and says so in ``dirty``) and
    what each bayes search may still start."""
    desired, _, the_plan, controller, dirty = observe_once(args, allow_dirty=getattr(args, "allow_dirty", True))
    doc = SavedPlan(the_plan, controller).to_json()
    if dirty:
        doc["dirty"] = dirty
    return the_plan, doc, dirty, search_bounds(desired.sweeps, desired.runs, the_plan.estimates)


def run(args: argparse.Namespace) -> int:
    the_plan, doc, dirty, searches = plan_doc(args)
    if args.out:
        try:
            Path(args.out).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        except OSError as exc:
            raise UserError(f"{args.out}: cannot save the plan: {exc.strerror}") from exc
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        if dirty:
            print(dirty_banner(dirty))
        print(plan_text(the_plan, show_noops=args.noops, searches=searches))
    if args.detailed_exitcode:
        return 2 if the_plan.changes else 0
    return 0
