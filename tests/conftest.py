"""Shared by both tiers: tests/ is on sys.path (``gitutil``, ``world``) and hypothesis's profiles.

Putting this file here makes pytest put tests/ on sys.path, so ``from gitutil import git`` and
``from world import fleet_repo`` work from tests/unit and tests/integration alike.
"""
