"""Shared by both tiers: tests/ on sys.path, hypothesis's profiles, and the package compiled once.

This file being here makes pytest put tests/ on sys.path, so ``from gitutil import git``, ``from world import
fleet_repo`` and ``from profiles import examples`` work from tests/unit and tests/integration alike. The
``fast`` profile is loaded unless ``--hypothesis-profile`` names another (the README's test command says ``ci``).
Everything under tests/integration is marked ``integration``, and the fast tier (``-m "not integration"``) does not
even collect it.
"""

from __future__ import annotations

import compileall
import os
from pathlib import Path

import pytest
from hypothesis import settings
from profiles import register

register()
settings.load_profile("fast")  # pytest's hypothesis plugin loads ``--hypothesis-profile`` after this

INTEGRATION = Path(__file__).parent / "integration"
PACKAGE = Path(__file__).resolve().parents[1] / "reconciler"
FAST_TIER = "not integration"  # the README's mark expression for the unit tier


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything under tests/integration is in the integration tier, whether or not its module says so."""
    for item in items:
        if INTEGRATION in item.path.parents:
            item.add_marker(pytest.mark.integration)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The fast tier does not import tests/integration at all: ``-m "not integration"`` would deselect all of it
    (the hook above), and importing its modules (the vastai SDK, the emulator) cost every xdist worker seconds."""
    if collection_path == INTEGRATION and config.getoption("markexpr") == FAST_TIER:
        return True
    return None


def pytest_configure(config: pytest.Config) -> None:
    """Compile the package once, in the controlling process, before any test starts the console script.

    Many tests run ``rigsync`` as a user would, as a new process each time. Where no bytecode is on disk (a fresh
    checkout) and PYTHONDONTWRITEBYTECODE is set (as on these runners), every one of those processes compiled every
    module it imports from source again: about 1.3 s more per ``rigsync validate``.
    """
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        compileall.compile_dir(PACKAGE, quiet=1)
