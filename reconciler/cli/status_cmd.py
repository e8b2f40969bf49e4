"""`rigsync status`: the boxes, the runs by phase and the $/h right now, observed live."""

from __future__ import annotations

import argparse
import json
from typing import Any

from reconciler.cli._common import add_live_args, observe_once
from reconciler.render import status_json, status_text


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_live_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=run)


def status_doc(args: argparse.Namespace) -> dict[str, Any]:
    """What ``--json`` prints: one live observation (``rigsync mcp``'s ``status`` returns it too)."""
    desired, observed, the_plan, _ = observe_once(args)  # a look at the world: a dirty tree is fine
    return status_json(desired, observed, the_plan)


def run(args: argparse.Namespace) -> int:
    doc = status_doc(args)
    print(json.dumps(doc, indent=2, sort_keys=True) if args.json else status_text(doc))
    return 0
