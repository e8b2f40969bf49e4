"""`rigsync run`: the reconcile loop over a git checkout of the fleet repository."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from reconciler.cli._common import add_data_dir_arg, add_live_args, api_url_of, store_of
from reconciler.core.model import CONTROLLER_INTERVAL_S
from reconciler.daemon import DaemonConfig, FleetDaemon
from reconciler.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_live_args(p)
    add_data_dir_arg(p)
    p.add_argument("--once", action="store_true", help="run one cycle and exit")
    interval = f"seconds between cycles (default {CONTROLLER_INTERVAL_S:g})"
    p.add_argument("--interval", type=float, default=CONTROLLER_INTERVAL_S, help=interval)
    p.add_argument("--lease-stale", type=float, default=300.0, help="seconds after which a silent lease is taken over")
    p.add_argument("--lease-renew", type=float, default=60.0, help="seconds between lease heartbeats")
    p.add_argument(
        "--poll", type=float, default=5.0,
        help="seconds between checks of the remote branch for new commits (default 5)",
    )
    p.add_argument(
        "--destroy-latency", type=float, default=None, metavar="S",
        help="seconds from deciding to destroy a box until the provider stops billing it; the budget projects "
        "spend through it (default 30)",
    )
    p.add_argument("--author", default="rigsync", help="author name of rigsync's commits")
    p.add_argument("--branch", default="main", help="the tracked branch (default main)")
    p.add_argument(
        "--log-level", default="WARNING", choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help="what is logged to stderr; DEBUG and INFO include paramiko's logs (default WARNING)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    api_url = api_url_of(args)
    store = store_of(args)
    for flag in ("interval", "lease_stale", "lease_renew", "poll"):
        if getattr(args, flag) <= 0:
            raise UserError(f"--{flag.replace('_', '-')} must be a positive number of seconds")
    level = getattr(logging, args.log_level)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if level < logging.WARNING:  # asked for more: paramiko, quieted by default, speaks too
        logging.getLogger("paramiko").setLevel(level)
    config = DaemonConfig(
        interval_s=args.interval,
        lease_stale_s=args.lease_stale,
        lease_renew_s=args.lease_renew,
        remote_poll_s=args.poll,
        destroy_latency_s=args.destroy_latency,
        author_name=args.author,
        branch=args.branch,
    )
    daemon = FleetDaemon(
        Path(args.repo), config=config, state_dir=args.state_dir, api_url=api_url, data_dir=args.data_dir,
        store=store,
    )
    return daemon.run_forever(once=args.once)
