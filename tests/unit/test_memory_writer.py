"""One writer of the fleet's memory: only ``core.remember`` makes a new ``FleetMemory`` (``core.model`` defines it).

An AST scan of reconciler/: a call of ``FleetMemory(...)``, ``FleetMemory`` handed over as a factory, or a
``replace()`` of a memory (its first argument a ``memory``, or a keyword only ``FleetMemory`` has) anywhere else
fails, naming the file and line.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

from reconciler.core.model import FleetMemory

ROOT = Path(__file__).resolve().parents[2] / "reconciler"
WRITERS = {ROOT / "core" / "remember.py", ROOT / "core" / "model.py"}


def _dataclass_fields(tree: ast.Module) -> Iterator[tuple[str, set[str]]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            names = {a.target.id for a in node.body if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name)}
            yield node.name, names


def _trees() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(encoding="utf-8")) for path in sorted(ROOT.rglob("*.py"))}


def _memory_only_fields(trees: dict[Path, ast.Module]) -> set[str]:
    """FleetMemory's fields that no other class in reconciler/ has: a replace() with one of them is of a memory."""
    others: set[str] = set()
    for tree in trees.values():
        for name, names in _dataclass_fields(tree):
            if name != "FleetMemory":
                others |= names
    return {f.name for f in fields(FleetMemory)} - others


def _names_memory(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id.endswith("memory")) or (
        isinstance(node, ast.Attribute) and node.attr.endswith("memory")
    )


def _is_named(node: ast.expr, name: str) -> bool:
    return (isinstance(node, ast.Name) and node.id == name) or (isinstance(node, ast.Attribute) and node.attr == name)


def _writes(tree: ast.Module, memory_only: set[str]) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if _is_named(node.func, "FleetMemory"):
            yield node.lineno, "constructs a FleetMemory"
        for kw in node.keywords:
            if _is_named(kw.value, "FleetMemory"):
                yield node.lineno, f"hands FleetMemory over as {kw.arg}"
        if _is_named(node.func, "replace") and node.args:
            keys = {kw.arg for kw in node.keywords if kw.arg is not None}
            if _names_memory(node.args[0]) or keys & memory_only:
                yield node.lineno, "replace()s a FleetMemory"


def test_only_remember_makes_a_new_fleet_memory() -> None:
    trees = _trees()
    memory_only = _memory_only_fields(trees)
    assert {"gpu_quiet", "heartbeats", "distrusted"} <= memory_only  # the scan knows a memory when it sees one
    found = [
        f"{path.relative_to(ROOT.parent)}:{line}: {what}"
        for path, tree in trees.items()
        if path not in WRITERS
        for line, what in _writes(tree, memory_only)
    ]
    assert not found, "only reconciler.core.remember.remember makes a new FleetMemory:\n" + "\n".join(found)


def test_the_scan_finds_each_way_of_writing_a_memory() -> None:
    source = (
        "a = FleetMemory()\n"
        "b = model.FleetMemory(in_flight=())\n"
        "c = replace(memory, in_flight=())\n"
        "d = dataclasses.replace(observed.memory, spend=s)\n"
        "e = replace(m, gpu_quiet=())\n"
        "f = field(default_factory=FleetMemory)\n"
        "g = replace(probe, reachable=False)\n"
    )
    got = [line for line, _ in _writes(ast.parse(source), {"gpu_quiet"})]
    assert got == [1, 2, 3, 4, 5, 6]
