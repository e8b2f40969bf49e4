"""The layout is the architecture: every module in a layer, a pure core you can see, names that say one thing.

import-linter checks the imports between the layers it is told about (``lint-imports`` in the test command); a
module in no layer is checked by nothing, and that is how ten modules once drifted out of it. These tests hold the
rest of the layout to what the README's Layout section says: which modules stand at the top level (the cycle's
wiring), that the purity contract names whole packages rather than a hand-kept list, that no two classes share a
name and no two module files share a file name, and that the Layout section names exactly the tree.
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "reconciler"

# The top level keeps the cycle's wiring and little else: everything pure lives in core/ and plan/.
TOP_LEVEL = {"__main__", "apply", "daemon", "demo", "errors", "failpoints", "fleet", "loop", "observe", "ports"}


def _contracts() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    assert isinstance(contracts, list)
    return contracts


def _layered() -> set[str]:
    top = [c for c in _contracts() if c["type"] == "layers" and not c.get("containers")]
    assert len(top) == 1, "one layers contract for the whole package"
    names = top[0]["layers"]
    assert isinstance(names, list)
    return {m.strip() for layer in names for m in str(layer).split("|")}


def _importable(path: Path) -> bool:
    parts = path.relative_to(ROOT).parts
    return all((ROOT.joinpath(*parts[:i]) / "__init__.py").is_file() for i in range(1, len(parts)))


def _sources() -> list[Path]:
    # not importable: templates shipped as data (reconciler/example/)
    return [p for p in sorted(PACKAGE.rglob("*.py")) if _importable(p)]


def _modules() -> list[str]:
    out = []
    for path in _sources():
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if len(parts) > 1:  # the root package holds everything; it is no layer of itself
            out.append(".".join(parts))
    return out


def test_every_module_is_in_a_layer() -> None:
    named = _layered()
    missing = [m for m in _modules() if not any(m == n or m.startswith(n + ".") for n in named)]
    assert missing == [], f"modules in no layer of pyproject.toml's layers contract: {missing}"


def test_every_layer_names_a_module_that_exists() -> None:
    modules = set(_modules())
    for name in _layered():
        assert name in modules, f"the layers contract names {name}, which is no module under reconciler/"


def test_the_core_layers_cover_every_core_module() -> None:
    inner = [c for c in _contracts() if c["type"] == "layers" and c.get("containers") == ["reconciler.core"]]
    assert len(inner) == 1, "one layers contract inside reconciler.core"
    layers = inner[0]["layers"]
    assert isinstance(layers, list)
    named = {m.strip() for layer in layers for m in str(layer).split("|")}
    core = {p.stem for p in (PACKAGE / "core").glob("*.py") if p.stem != "__init__"}
    assert named == core, f"core modules in no inner layer: {core - named}; named but missing: {named - core}"


def test_the_purity_contract_names_the_core_packages_not_a_list() -> None:
    pure = [c for c in _contracts() if str(c["name"]).startswith("The decision core is pure")]
    assert len(pure) == 1
    assert pure[0]["source_modules"] == ["reconciler.core", "reconciler.plan"]


def test_the_top_level_is_the_cycles_wiring() -> None:
    top = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    assert top == TOP_LEVEL, f"new at the top level: {top - TOP_LEVEL}; gone: {TOP_LEVEL - top}"


def test_no_two_module_files_share_a_name() -> None:
    seen: dict[str, list[str]] = defaultdict(list)
    for path in _sources():
        if path.stem != "__init__":
            seen[path.name].append(str(path.relative_to(ROOT)))
    assert {name: where for name, where in seen.items() if len(where) > 1} == {}


def test_no_two_classes_share_a_name() -> None:
    seen: dict[str, list[str]] = defaultdict(list)
    for path in _sources():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                seen[node.name].append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert {name: where for name, where in seen.items() if len(where) > 1} == {}


def _layout_block() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Layout\n", 1)[1]
    return section.split("```", 2)[1]


def test_the_readme_layout_names_exactly_the_tree() -> None:
    """Each entry of the Layout block's reconciler/ part (its first column) is a package or module that exists,
    and every package and top-level module is named there."""
    block = _layout_block().split("\nschemas/", 1)[0]
    named: set[str] = set()
    for line in block.splitlines():
        entry = re.match(r"^  (\S.*?)(?:\s{2,}|$)", line)  # an entry's first column; continuation lines are indented
        if entry:
            named |= {n.strip() for n in entry.group(1).split(",")}
    actual = {p.name + "/" for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    actual |= {"example/"} | {f"{m}.py" for m in TOP_LEVEL - {"__main__"}}
    assert named == actual, f"in the tree, not the README: {actual - named}; in the README only: {named - actual}"


def test_there_are_at_least_six_contracts() -> None:
    assert len(_contracts()) >= 6
