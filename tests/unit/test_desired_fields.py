"""The field table against the schemas and the docs: each default lives once, and every key is documented.

A default is written only as the model's dataclass default; the schemas show defaults too (for editors and the
language server), so each of those must equal what the loader gives a key that is not written. Every key a
schema allows must be documented in desired/README.md, "the full rules".
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.core.model import Budget, EarlyTerminate, Fleet, OfferFilters, OwnHost, Pool, Search, Sweep
from reconciler.desired import schema_path
from reconciler.desired.fields import POOL_INHERITS, ROWS, Row

REPO = Path(__file__).resolve().parents[2]
README = REPO / "desired" / "README.md"

# Where each model's YAML mapping sits in each schema (a key path; "[]" is "each item of the list").
WHERE: dict[str, dict[tuple[str, ...], tuple[type, ...]]] = {
    "fleet": {
        (): (Fleet, Pool),
        ("offers",): (OfferFilters,),
        ("pools", "[]"): (Pool,),
        ("pools", "[]", "hosts", "[]"): (OwnHost,),
    },
    "budget": {(): (Budget,)},
    "sweep": {(): (Sweep,), ("search",): (Search,), ("early_terminate",): (EarlyTerminate,)},
}


def properties(schema: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], dict[str, Any]]]:
    """Every property a schema declares, with its key path; a ``$ref`` is documented (and checked) where it points."""
    for key, sub in schema.get("properties", {}).items():
        yield (*path, key), sub
        yield from properties(sub, (*path, key))
    items = schema.get("items")
    if isinstance(items, dict):
        yield from properties(items, (*path, "[]"))


def schema(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(schema_path(name).read_text(encoding="utf-8"))
    return loaded


def row_for(name: str, path: tuple[str, ...]) -> Row | None:
    """The row that reads the key at ``path`` of schema ``name`` (a fleet's top-level pool keys: its pool's)."""
    for prefix, models in sorted(WHERE[name].items(), key=lambda item: -len(item[0])):
        if path[: len(prefix)] != prefix:
            continue
        rest = path[len(prefix) :]
        for model in models:
            if model is Pool and prefix == () and rest[:1] not in [(k,) for k in POOL_INHERITS]:
                continue
            for row in ROWS:
                if row.model is model and row.key == rest:
                    return row
    return None


DEFAULTS = [
    (name, path, sub["default"]) for name in WHERE for path, sub in properties(schema(name)) if "default" in sub
]


@pytest.mark.parametrize(("name", "path", "default"), DEFAULTS, ids=[f"{n}:{'.'.join(p)}" for n, p, _ in DEFAULTS])
def test_every_schema_default_is_the_models(name: str, path: tuple[str, ...], default: object) -> None:
    row = row_for(name, path)
    assert row is not None, f"{name}.schema.json {'.'.join(path)} has a default but no row of the field table"
    assert row.convert(default) == row.default, (
        f"{name}.schema.json says {'.'.join(path)} defaults to {default!r}; "
        f"the model's {row.model.__name__}.{row.field} is {row.default!r}"
    )


def test_the_defaults_are_found() -> None:
    assert len(DEFAULTS) >= 30
    assert ("sweep", ("stall_gpu_util",), 5) in DEFAULTS


def test_every_schema_key_has_a_row() -> None:
    """What a schema allows, the loader reads: a key without a row would be accepted and ignored."""
    every = {name: [path for path, _ in properties(schema(name))] for name in WHERE}

    def read(name: str, path: tuple[str, ...]) -> bool:
        return (
            path[-1] == "description"  # words for people, in every file
            or path == ("pools",)  # the list build_fleet walks, one pool per entry
            or any(row_for(name, path[:n]) is not None for n in range(1, len(path) + 1))  # it, or its parent whole
            or any(p[: len(path)] == path and row_for(name, p) is not None for p in every[name])  # its keys are
        )

    missing = [f"{name}:{'.'.join(path)}" for name, paths in every.items() for path in paths if not read(name, path)]
    assert missing == []


def documented_name(path: tuple[str, ...]) -> str:
    return ".".join(path).replace(".[]", "[]")


def test_every_schema_key_is_documented_in_the_desired_readme() -> None:
    text = README.read_text(encoding="utf-8")
    missing = [
        f"{name}.schema.json: `{documented_name(path)}`"
        for name in WHERE
        for path, _ in properties(schema(name))
        if f"`{documented_name(path)}`" not in text
    ]
    assert missing == [], "desired/README.md does not document: " + ", ".join(missing)
