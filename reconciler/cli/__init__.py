"""The ``rigsync`` command: argument parsing and dispatch to one module per subcommand.

User errors (``reconciler.errors.UserError``) print one clear line to stderr and exit 1; they never show a
traceback. What caused one (the library's exception an adapter wrapped, ``errors.cause_chain``) is logged at
DEBUG only: ``RIGSYNC_LOG_LEVEL=DEBUG`` shows it for any command (`rigsync run` also has ``--log-level``).

``COMMANDS`` lists every subcommand once, in the order ``rigsync --help`` shows them: its name, its module here and
its one-line help. Each module exposes ``add_arguments(parser)``, which declares the command's arguments (and its
description) and sets ``handler`` to its ``run(args) -> int``. A command's module is imported only when that
command is parsed: ``rigsync validate`` never loads paramiko, the vastai SDK or the MCP SDK, and each start-up of
the console script pays only for what its command uses.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from reconciler import __version__
from reconciler.core.textsafe import SafeStream
from reconciler.errors import RigsyncError, UserError, cause_chain

log = logging.getLogger("rigsync.cli")
LOG_LEVEL_ENV = "RIGSYNC_LOG_LEVEL"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")  # what RIGSYNC_LOG_LEVEL (and `rigsync run --log-level`) takes

# (command, its module under reconciler.cli, its help in `rigsync --help`), in the order that help lists them
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("init", "init_cmd", "create a ready fleet repository: desired/, schemas, workflows, pre-commit hook"),
    ("validate", "validate_cmd", "validate desired/ (fleet, budget, sweeps) against the schemas and rules"),
    ("runs", "runs_cmd", "list the runs the desired sweeps expand to (ids, params, seeds, commands)"),
    ("emulator", "emulator_cmd", "serve the Vast.ai emulator (REST API + real SSH boxes) in the foreground"),
    ("plan", "plan_cmd", "show what apply would do, with a reason per action"),
    ("apply", "apply_cmd", "apply a fresh plan (after showing it) or a saved one"),
    ("status", "status_cmd", "boxes, runs by phase, $/h now"),
    ("demo", "demo_cmd", "run the example sweep to completion on the built-in emulator"),
    ("run", "run_cmd", "the loop: follow the remote, reconcile, commit observed/ back"),
    ("diff", "diff_cmd", "observed against desired, from the committed files (no provider access)"),
    ("logs", "logs_cmd", "an attempt's stdout/stderr, from its box while it lives, from the local store afterwards"),
    ("ssh", "ssh_cmd", "a shell on a box (an instance id, or the box a run's live attempt is on), with rigsync's key"),
    ("review", "review_cmd",
     "what a change to desired/ means: runs added/removed/changed, price, budget (no credentials)"),
    ("dashboard", "dashboard_cmd", "a local HTML page of the fleet from the committed files (no credentials)"),
    ("mcp", "mcp_cmd", "serve rigsync's read-only commands to coding agents (Model Context Protocol over stdio)"),
    ("fleets", "fleets_cmd", "every instance on the account by fleet and pool, hand-rented ones too (read-only)"),
)


if TYPE_CHECKING:
    _SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]
else:  # not subscriptable at run time
    _SubParsers = argparse._SubParsersAction


class _Subcommands(_SubParsers):
    """The subparsers action that declares a command's arguments (importing its module) when argparse picks it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.unconfigured: dict[str, str] = {}  # command -> its module, not imported yet

    def add_command(self, name: str, module: str, help_text: str) -> None:
        self.add_parser(name, help=help_text)
        self.unconfigured[name] = module

    def configure(self, name: str) -> None:
        """Declare ``name``'s arguments and handler (its module's ``add_arguments``), once."""
        module = self.unconfigured.pop(name, None)
        if module is not None:
            importlib.import_module(f"{__name__}.{module}").add_arguments(self._name_parser_map[name])

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
        option_string: str | None = None,
    ) -> None:
        self.configure(values[0])
        super().__call__(parser, namespace, values, option_string)


def build_parser(*, full: bool = False) -> argparse.ArgumentParser:
    """The ``rigsync`` parser. Only the command being parsed has its arguments declared (its module imported);
    ``full`` declares every command's now, for callers that inspect all options."""
    parser = argparse.ArgumentParser(
        prog="rigsync", description="Git-native GitOps reconciler for rented GPUs on Vast.ai."
    )
    parser.add_argument("--version", action="version", version=f"rigsync {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", action=_Subcommands)
    assert isinstance(sub, _Subcommands)
    for name, module, help_text in COMMANDS:
        sub.add_command(name, module, help_text)
    if full:
        for name, _, _ in COMMANDS:
            sub.configure(name)
    return parser


def _errors_for_people() -> tuple[type[Exception], ...]:
    """``UserError``, and the emulator's own errors (meant for people too) when this command loaded the emulator:
    no command that left it unloaded can raise them, and importing it would cost every command its start-up."""
    emulator = sys.modules.get("reconciler.emulator.exceptions")
    return (UserError,) if emulator is None else (UserError, emulator.EmulatorError)


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
    if level in LOG_LEVELS:
        logging.basicConfig(level=getattr(logging, level), format="%(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 1
    try:
        code: int = args.handler(args)
        return code
    except _errors_for_people() as exc:
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
