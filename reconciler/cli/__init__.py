"""The ``rigsync`` command: argument parsing and dispatch to one module per subcommand.

User errors (``reconciler.errors.UserError``) print one clear line to stderr and exit 1; they never show a
traceback. Each subcommand module exposes ``add_parser(subparsers)`` and a ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from reconciler import __version__
from reconciler.emulator.errors import EmulatorError
from reconciler.errors import RigsyncError, UserError

SUBCOMMANDS = ("validate", "runs", "emulator", "plan", "apply", "status", "demo", "run", "diff")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rigsync", description="Git-native GitOps reconciler for rented GPUs on Vast.ai."
    )
    parser.add_argument("--version", action="version", version=f"rigsync {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"reconciler.cli.{name}_cmd")
        except ModuleNotFoundError as exc:
            if exc.name != f"reconciler.cli.{name}_cmd":
                raise
            continue
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # The SSH adapter turns every paramiko failure into one line of ours (an unreachable box is an
    # observation, not a crash); paramiko's own tracebacks on stderr would only bury that.
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 1
    try:
        code: int = args.handler(args)
        return code
    except (UserError, EmulatorError) as exc:  # the emulator has its own errors; they are meant for people too
        print(f"rigsync: error: {exc}", file=sys.stderr)
        return 1
    except RigsyncError as exc:
        print(f"rigsync: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("rigsync: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
