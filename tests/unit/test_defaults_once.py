"""Each default is written once, beside the part it configures, and every help text says the value its option has.

A default written twice drifts: the lease's stale and renew seconds once stood in ``adapters/lease.py``,
``DaemonConfig`` and `rigsync run`'s options, git's branch, remote and author in four places, and the destroy
latency's help said "30" while the value lived in ``loop.py``; a port's defaults (the offers a search asks for, a
command's timeout) stood in ``ports.py`` and again in each implementation. These tests read the source (a literal
written again is found where it is written, with its file and line) and the parser (what `rigsync <command> --help`
shows).
"""

from __future__ import annotations

import argparse
import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path

from reconciler.adapters.git import DEFAULT_AUTHOR_EMAIL, DEFAULT_AUTHOR_NAME, DEFAULT_BRANCH, DEFAULT_REMOTE
from reconciler.adapters.lease import DEFAULT_RENEW_EVERY_S, DEFAULT_STALE_AFTER_S
from reconciler.cli import build_parser
from reconciler.core.model import CONTROLLER_INTERVAL_S
from reconciler.daemon import REMOTE_POLL_S
from reconciler.loop import DESTROY_LATENCY_S

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "reconciler"

LEASE, GIT = "reconciler/adapters/lease.py", "reconciler/adapters/git.py"
# A setting's names (as a parameter, a dataclass field, an option's dest) -> the one file its default is written in
SETTINGS = {
    **dict.fromkeys(("stale_after", "lease_stale_s", "lease_stale"), LEASE),
    **dict.fromkeys(("renew_every", "lease_renew_s", "lease_renew"), LEASE),
    **dict.fromkeys(("remote_poll_s", "poll"), "reconciler/daemon.py"),
    **dict.fromkeys(("interval_s", "cycle_s", "interval"), "reconciler/core/model.py"),
    **dict.fromkeys(("destroy_latency_s", "destroy_latency"), "reconciler/loop.py"),
    **dict.fromkeys(("remote", "branch", "author_name", "author", "author_email"), GIT),
    "head": "reconciler/cli/_common.py",
}
# Literal defaults of those names that are a part's own setting, not a copy: the demo decides every second
OWN_SETTING = {("reconciler/demo.py", "interval_s", 1.0)}
# Strings that are git's defaults wherever they are written (``adapters.git``): the branch, the remote, rigsync's email
GIT_LITERALS = {DEFAULT_BRANCH, DEFAULT_REMOTE, DEFAULT_AUTHOR_EMAIL}
# A port's parameters whose defaults ``ports.py`` declares once for the port and every implementation of it
PORT_DEFAULTS = {("search_offers", "limit"), ("run", "timeout"), ("run_many", "timeout")}
# Option defaults the CLI may write itself: 0 is the OS's "any free port", no default of rigsync's
CLI_OWN = {("reconciler/cli/emulator_cmd.py", "port", 0)}


@functools.cache
def _trees() -> tuple[tuple[str, ast.Module], ...]:
    """Every module of the package, parsed once: (its path from the repository's root, its tree)."""
    return tuple(
        (path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(encoding="utf-8")))
        for path in sorted(PACKAGE.rglob("*.py"))
    )


def _dest(call: ast.Call) -> str | None:
    """An ``add_argument`` call's dest: its ``dest=``, else its first long flag."""
    for k in call.keywords:
        if k.arg == "dest" and isinstance(k.value, ast.Constant):
            return str(k.value.value)
    flags = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    longs = [f for f in flags if f.startswith("--")]
    return longs[0][2:].replace("-", "_") if longs else (flags[0] if flags else None)


def _options(tree: ast.Module) -> Iterator[tuple[str, ast.expr]]:
    """(dest, default) of every ``add_argument`` option in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            dest = _dest(node) or "?"
            yield from ((dest, k.value) for k in node.keywords if k.arg == "default")


def _parameters(tree: ast.Module) -> Iterator[tuple[str, str, ast.expr]]:
    """(function, parameter, default) of every parameter with a default in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            positional = [*a.posonlyargs, *a.args]
            named = zip([p.arg for p in positional[len(positional) - len(a.defaults):]], a.defaults, strict=True)
            keyword = ((p.arg, d) for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None)
            yield from ((node.name, name, d) for name, d in (*named, *keyword))


def _defaults(tree: ast.Module) -> Iterator[tuple[str, ast.expr]]:
    """(name, default) of every parameter, dataclass-style field and ``add_argument`` option in ``tree``."""
    yield from ((name, d) for _, name, d in _parameters(tree))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
                    yield stmt.target.id, stmt.value
    yield from _options(tree)


def _literal(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is not None and not isinstance(node.value, bool)


def test_a_setting_has_its_default_written_in_its_home_only() -> None:
    again = [
        f"{path}:{d.lineno}: {name} = {d.value!r} (its default lives in {SETTINGS[name]})"
        for path, tree in _trees()
        for name, d in _defaults(tree)
        if name in SETTINGS and path != SETTINGS[name] and isinstance(d, ast.Constant) and _literal(d)
        and (path, name, d.value) not in OWN_SETTING
    ]
    assert again == [], "a default written again:\n" + "\n".join(again)


def test_a_port_s_defaults_are_written_in_ports_only() -> None:
    again = [
        f"{path}:{d.lineno}: {function}({name}={d.value!r})"
        for path, tree in _trees() if path != "reconciler/ports.py"
        for function, name, d in _parameters(tree)
        if (function, name) in PORT_DEFAULTS and isinstance(d, ast.Constant) and _literal(d)
    ]
    assert again == [], "a port's default written again (ports.py declares it):\n" + "\n".join(again)


def test_the_cli_declares_no_default_of_its_own() -> None:
    """`rigsync`'s options take their defaults from the parts they configure (a constant, a dataclass's default)."""
    literal = [
        f"{path}:{d.lineno}: --{name.replace('_', '-')} default={d.value!r}"
        for path, tree in _trees() if path.startswith("reconciler/cli/")
        for name, d in _options(tree)
        if isinstance(d, ast.Constant) and _literal(d) and (path, name, d.value) not in CLI_OWN
    ]
    assert literal == [], "an option's default written in the CLI:\n" + "\n".join(literal)


def test_git_defaults_are_written_in_the_git_adapter_only() -> None:
    again = [
        f"{path}:{node.lineno}: {node.value!r}"
        for path, tree in _trees() if path != GIT
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in GIT_LITERALS
    ]
    assert again == [], "git's defaults written outside adapters/git.py:\n" + "\n".join(again)


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser(full=True)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _shown(value: object) -> str:
    """A default as a help text shows it (``%(default)g`` for seconds and dollars)."""
    return f"{value:g}" if isinstance(value, float) else str(value)


STATED = re.compile(r"\bdefault:? ([^\s,;:)]+)")


def _help_problem(command: str, action: argparse.Action) -> str | None:
    """What is wrong with what ``action``'s help says of its default, or None."""
    text = argparse.HelpFormatter(command)._expand_help(action) if action.help else ""
    stated = STATED.findall(text)
    flag = f"rigsync {command} {action.option_strings[0]}"
    default = action.default
    if default is None or isinstance(default, bool) or not isinstance(default, int | float | str):
        numbers = [s for s in stated if re.fullmatch(r"[0-9.]+", s)]
        return f"{flag}: its help says default {numbers[0]}, it has {default!r}" if numbers else None
    if isinstance(default, int | float) and stated and not re.fullmatch(r"[0-9.]+", stated[0]):
        return None  # the default said in words ("default: a free port")
    if _shown(default) not in stated:
        return f"{flag}: default {_shown(default)}, its help says {stated or 'nothing of it'}: {text!r}"
    return None


def test_every_help_says_the_default_its_option_has() -> None:
    problems = [
        problem
        for command, parser in _commands().items()
        for action in parser._actions
        if action.option_strings and action.default is not argparse.SUPPRESS
        and (problem := _help_problem(command, action)) is not None
    ]
    assert problems == [], "\n".join(problems)


def test_run_help_shows_the_constants_of_the_parts_it_configures() -> None:
    text = " ".join(_commands()["run"].format_help().split())
    for flag, value in (
        ("--interval", CONTROLLER_INTERVAL_S), ("--lease-stale", DEFAULT_STALE_AFTER_S),
        ("--lease-renew", DEFAULT_RENEW_EVERY_S), ("--poll", REMOTE_POLL_S), ("--destroy-latency", DESTROY_LATENCY_S),
        ("--author", DEFAULT_AUTHOR_NAME), ("--branch", DEFAULT_BRANCH),
    ):
        said = re.search(re.escape(flag) + r" \S+ [^-]*?\(default ([^)]+)\)", text)
        assert said is not None and said.group(1) == _shown(value), (flag, said and said.group(1), value)
