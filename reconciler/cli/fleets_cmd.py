"""`rigsync fleets`: every instance on the account, grouped by the fleet and pool its label names (read-only).

The provider's instance list (the read-only provider, ``fleet.open_provider``: no key is uploaded), and for each
``--repo`` its fleet (desired/ from the working tree) and the attempts its observed/runs.yaml holds in flight;
``views.account`` groups and renders them. Nothing is changed: no instance, no file, no SSH.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from reconciler.cli._common import add_api_url_arg, api_url_of, load_local_desired
from reconciler.views.account import Checkout, account_json, account_text


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Every instance on the provider account, grouped by the fleet and pool its rigsync label names (unlabelled "
        "ones: hand-rented): GPU, $/h, age, status, and, for the fleets of the checkouts given, what each box "
        "runs and which checkout it belongs to. Changes nothing."
    )
    p.add_argument(
        "--repo", type=Path, action="append", default=None, metavar="DIR",
        help="a fleet checkout whose boxes to name and whose observed/runs.yaml says what they run (repeatable)",
    )
    add_api_url_arg(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=run)


def read_checkout(repo: Path) -> Checkout:
    """One checkout's fleet and in-flight attempts, from its working tree alone."""
    from reconciler.observed.memory import read_fleet_memory

    return Checkout(str(repo), load_local_desired(repo).fleet, read_fleet_memory(repo).in_flight)


def fleets_doc(repos: list[Path], api_url: str | None) -> dict[str, Any]:
    """What ``--json`` prints (``rigsync mcp``'s ``fleets`` returns it too)."""
    from reconciler.fleet import open_provider

    url = api_url_of(argparse.Namespace(api_url=api_url))
    checkouts = [read_checkout(r) for r in repos]  # each checkout read (and refused) before the key is sent
    instances = open_provider(None, url).list_instances()  # the whole account, for no fleet in particular
    return account_json(instances, checkouts, time.time())


def run(args: argparse.Namespace) -> int:
    doc = fleets_doc(list(args.repo or []), args.api_url)
    print(json.dumps(doc, indent=2, sort_keys=True) if args.json else account_text(doc))
    return 0
