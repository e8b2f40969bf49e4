"""The common options are declared once: every command that takes ``--repo``, ``--state-dir``, ``--data-dir`` or
``--api-url`` takes it from ``cli._common``, with the same help, default and type."""

from __future__ import annotations

import argparse

from reconciler.cli import build_parser

# Options of the same name that mean something else on that command: the demo's repo is a source it copies
# (default: the example) and its data dir a temp dir by default; the emulator's state dir is where its boxes live;
# fleets' --repo is repeatable, none by default (the account's labels alone).
OWN_MEANING = {("demo", "--repo"), ("demo", "--data-dir"), ("emulator", "--state-dir"), ("fleets", "--repo")}
COMMON = ("--repo", "--state-dir", "--data-dir", "--api-url")


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser(full=True)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_each_common_option_has_one_declaration() -> None:
    seen: dict[str, set[tuple[str | None, object, object]]] = {flag: set() for flag in COMMON}
    users: dict[str, list[str]] = {flag: [] for flag in COMMON}
    for name, parser in _subcommands().items():
        for action in parser._actions:
            for flag in COMMON:
                if flag in action.option_strings and (name, flag) not in OWN_MEANING:
                    seen[flag].add((action.help, action.default, action.type))
                    users[flag].append(name)
    for flag in COMMON:
        assert len(seen[flag]) == 1, f"{flag} is declared {len(seen[flag])} ways: {seen[flag]}"
    assert len(users["--repo"]) >= 11, users["--repo"]


def test_the_live_commands_take_the_checkout_state_dir_and_api_url() -> None:
    commands = _subcommands()
    for name in ("plan", "apply", "status", "run", "logs", "ssh"):
        flags = {f for a in commands[name]._actions for f in a.option_strings}
        assert {"--repo", "--state-dir", "--api-url"} <= flags, name
    for name in ("apply", "run", "logs"):
        assert "--data-dir" in {f for a in commands[name]._actions for f in a.option_strings}, name
