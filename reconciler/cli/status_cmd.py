"""`rigsync status`: the boxes, the runs by phase and the $/h right now, observed live; and the ops tax.

The ops tax (``views.opstax``, the one function every view calls) is computed from the run archive of the checkout
(its attempt and overhead lines) and, for the boxes held now, their bill from their start to this observation.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from reconciler.cli._common import add_live_args, observe_once
from reconciler.core.model import Observed
from reconciler.core.remember import running_cost
from reconciler.plan.render import status_json, status_text
from reconciler.views.opstax import LiveBox, OpsTax, ops_tax, tax_lines


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_live_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=run)


def live_ops_tax(repo: Path, observed: Observed, now: float) -> OpsTax:
    """The ops tax of the archive at ``repo`` plus the boxes ``observed`` lists as ours, billed to ``now``."""
    from reconciler.adapters.archive import ShardedRunArchive

    mine = {m.instance_id: m for m in observed.memory.boxes}
    held = []
    for inst in observed.instances:
        mem = mine.get(inst.id)
        if mem is None:
            continue  # not a box of this fleet (or not remembered yet)
        running = running_cost(inst.id, inst.dph_total, inst.num_gpus, observed.memory.in_flight, now)
        held.append(LiveBox(inst.id, inst.dph_total, inst.start_date or mem.first_seen_at, now, mem.reachable_at,
                            mem.ready_at, running))
    return ops_tax(observed.history, ShardedRunArchive(repo).overheads(), held)


def _observe(args: argparse.Namespace) -> tuple[dict[str, Any], OpsTax]:
    desired, observed, the_plan, _, _ = observe_once(args)  # a look at the world: a dirty tree is fine
    now = time.time()
    doc = status_json(desired, observed, the_plan, now)
    tax = live_ops_tax(Path(args.repo), observed, now)
    doc["ops_tax"] = tax.to_json()
    return doc, tax


def status_doc(args: argparse.Namespace) -> dict[str, Any]:
    """What ``--json`` prints: one live observation (``rigsync mcp``'s ``status`` returns it too)."""
    return _observe(args)[0]


def run(args: argparse.Namespace) -> int:
    doc, tax = _observe(args)
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    print("\n".join([status_text(doc), *tax_lines(tax)]))
    return 0
