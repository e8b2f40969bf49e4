"""Shared by both tiers: tests/ on sys.path, and hypothesis's profiles.

This file being here makes pytest put tests/ on sys.path, so ``from gitutil import git``, ``from world import
fleet_repo`` and ``from profiles import examples`` work from tests/unit and tests/integration alike. The
``fast`` profile is loaded unless ``--hypothesis-profile`` names another (the README's test command says ``ci``).
"""

from __future__ import annotations

from hypothesis import settings
from profiles import register

register()
settings.load_profile("fast")  # pytest's hypothesis plugin loads ``--hypothesis-profile`` after this
