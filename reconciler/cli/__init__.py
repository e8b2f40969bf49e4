"""The ``rigsync`` command: argument parsing and dispatch to one module per subcommand.

User errors (``reconciler.errors.UserError``) print one clear line to stderr and exit 1; they never show a
traceback. What caused one (the library's exception an adapter wrapped, ``errors.cause_chain``) is logged at
DEBUG only: ``RIGSYNC_LOG_LEVEL=DEBUG`` shows it for any command (`rigsync run` also has ``--log-level``).
Each subcommand module exposes ``add_parser(subparsers)`` (which sets ``handler`` to its
``run(args) -> int``); they are listed below, in the order ``rigsync --help`` shows them.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from reconciler import __version__
from reconciler.cli import (
    apply_cmd,
    dashboard_cmd,
    demo_cmd,
    diff_cmd,
    emulator_cmd,
    init_cmd,
    logs_cmd,
    mcp_cmd,
    plan_cmd,
    review_cmd,
    run_cmd,
    runs_cmd,
    ssh_cmd,
    status_cmd,
    validate_cmd,
)
from reconciler.emulator.errors import EmulatorError
from reconciler.errors import RigsyncError, UserError, cause_chain
from reconciler.textsafe import SafeStream

log = logging.getLogger("rigsync.cli")
LOG_LEVEL_ENV = "RIGSYNC_LOG_LEVEL"

SUBCOMMANDS = (
    init_cmd, validate_cmd, runs_cmd, emulator_cmd, plan_cmd, apply_cmd, status_cmd, demo_cmd, run_cmd, diff_cmd,
    logs_cmd, ssh_cmd, review_cmd, dashboard_cmd, mcp_cmd,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rigsync", description="Git-native GitOps reconciler for rented GPUs on Vast.ai."
    )
    parser.add_argument("--version", action="version", version=f"rigsync {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in SUBCOMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. Everything it prints goes through ``textsafe.SafeStream``: values from desired/, the
    provider and the boxes reach a person's terminal with their control and bidi characters made visible."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = SafeStream(out), SafeStream(err)
    try:
        return _main(argv)
    finally:
        sys.stdout, sys.stderr = out, err


def _main(argv: Sequence[str] | None) -> int:
    # The SSH adapter turns every paramiko failure into one line of ours (an unreachable box is an
    # observation, not a crash); paramiko's own tracebacks on stderr would only bury that.
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)
    level = os.environ.get(LOG_LEVEL_ENV, "").upper()
    if level in ("DEBUG", "INFO", "WARNING", "ERROR"):
        logging.basicConfig(level=getattr(logging, level), format="%(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 1
    try:
        code: int = args.handler(args)
        return code
    except (UserError, EmulatorError) as exc:  # the emulator has its own errors; they are meant for people too
        log.debug("%s failed: %s", args.command, cause_chain(exc))
        print(f"rigsync: error: {exc}", file=sys.stderr)
        return 1
    except RigsyncError as exc:
        log.debug("%s failed: %s", args.command, cause_chain(exc))
        print(f"rigsync: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("rigsync: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
