"""`rigsync run`: the reconcile loop over a git checkout of the fleet repository."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from reconciler.adapters.git import DEFAULT_AUTHOR_NAME, DEFAULT_BRANCH
from reconciler.adapters.lease import DEFAULT_RENEW_EVERY_S, DEFAULT_STALE_AFTER_S
from reconciler.cli import LOG_LEVELS
from reconciler.cli._common import add_data_dir_arg, add_live_args, api_url_of, store_of
from reconciler.core.model import CONTROLLER_INTERVAL_S
from reconciler.daemon import REMOTE_POLL_S, DaemonConfig, FleetDaemon
from reconciler.errors import UserError
from reconciler.loop import DESTROY_LATENCY_S

DEFAULT_LOG_LEVEL = "WARNING"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Each default is the constant of the part it configures; each help says it (``%(default)``)."""
    add_live_args(p)
    add_data_dir_arg(p)
    p.add_argument("--once", action="store_true", help="run one cycle and exit")
    p.add_argument(
        "--interval", type=float, default=CONTROLLER_INTERVAL_S, help="seconds between cycles (default %(default)g)"
    )
    p.add_argument(
        "--lease-stale", type=float, default=DEFAULT_STALE_AFTER_S,
        help="seconds after which a silent lease is taken over (default %(default)g)",
    )
    p.add_argument(
        "--lease-renew", type=float, default=DEFAULT_RENEW_EVERY_S,
        help="seconds between lease heartbeats (default %(default)g)",
    )
    p.add_argument(
        "--poll", type=float, default=REMOTE_POLL_S,
        help="seconds between checks of the remote branch for new commits (default %(default)g)",
    )
    p.add_argument(
        "--destroy-latency", type=float, default=DESTROY_LATENCY_S, metavar="S",
        help="seconds from deciding to destroy a box until the provider stops billing it; the budget projects "
        "spend through it (default %(default)g)",
    )
    author = "author name of rigsync's commits (default %(default)s)"
    p.add_argument("--author", default=DEFAULT_AUTHOR_NAME, help=author)
    p.add_argument("--branch", default=DEFAULT_BRANCH, help="the tracked branch (default %(default)s)")
    p.add_argument(
        "--log-level", default=DEFAULT_LOG_LEVEL, choices=LOG_LEVELS,
        help="what is logged to stderr; DEBUG and INFO include paramiko's logs (default %(default)s)",
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
