"""Every module of reconciler/ sits in the import-linter layers contract, so the layout shows the layers.

import-linter checks the imports between the layers it is told about; a module in no layer is checked by
nothing, and that is how ten modules once drifted out of it. This test lists every importable module under
reconciler/ (a ``.py`` file whose directories are all packages) and fails naming those no layer covers
(a layer names a module, or a package and so everything in it).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "reconciler"


def _contracts() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    assert isinstance(contracts, list)
    return contracts


def _layered() -> set[str]:
    layers = [c for c in _contracts() if c["type"] == "layers"]
    assert len(layers) == 1, "one layers contract"
    names = layers[0]["layers"]
    assert isinstance(names, list)
    return {m.strip() for layer in names for m in str(layer).split("|")}


def _modules() -> list[str]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if not all((ROOT.joinpath(*parts[:i]) / "__init__.py").is_file() for i in range(1, len(parts))):
            continue  # not importable: a template shipped as data (reconciler/example/)
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


def test_there_are_at_least_six_contracts() -> None:
    assert len(_contracts()) >= 6
