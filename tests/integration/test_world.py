"""The test world itself (tests/world.py): what every integration module starts from must be what it says.

A copy of the example fleet with its bare remote, committed and pushed; edits through a YAML round trip change
the keys named and nothing the loader sees otherwise; two worlds share nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from gitutil import git
from world import BUDGET, FLEET, ROOT, SHORT_TIMEOUTS, fleet_repo

from reconciler.desired import load_desired_from_dir

pytestmark = pytest.mark.integration


def test_a_world_is_the_example_fleet_committed_and_pushed_with_short_timeouts(tmp_path: Path) -> None:
    repo = fleet_repo(tmp_path / "fleet")
    assert repo.remote == tmp_path / "fleet.remote.git"
    assert repo.git("status", "--porcelain") == ""
    assert repo.git("rev-parse", "HEAD") == git(repo.remote, "rev-parse", "main")
    assert len(repo.git("log", "--format=%H").splitlines()) == 2
    fleet = repo.read(FLEET)
    assert {k: fleet[k] for k in SHORT_TIMEOUTS} == SHORT_TIMEOUTS
    assert repo.read(BUDGET) == yaml.safe_load((ROOT / BUDGET).read_text())
    # the same runs as the example: the short timeouts and checkpoint interval are not part of a run's identity
    assert [r.id for r in load_desired_from_dir(repo.work).runs] == [r.id for r in load_desired_from_dir(ROOT).runs]


def test_edits_go_through_yaml_and_commits_reach_the_remote(tmp_path: Path) -> None:
    repo = fleet_repo(tmp_path / "fleet")
    before = repo.read(FLEET)
    repo.edit_fleet(name="itworld", max=1, suspend=True)
    repo.edit("desired/sweeps/tdmpc.yaml", lambda d: d.update(seeds=[1]))
    after = repo.read(FLEET)
    assert after["name"] == "itworld" and after["instances"] == {**before["instances"], "max": 1}
    assert after["suspend"] is True
    assert {k: v for k, v in after.items() if k not in ("name", "instances", "suspend")} == {
        k: v for k, v in before.items() if k not in ("name", "instances", "suspend")
    }
    desired = load_desired_from_dir(repo.work)
    assert desired.fleet.name == "itworld" and len([r for r in desired.runs if r.promotion_threshold is None]) == 4
    sha = repo.commit("test: one seed")
    assert git(repo.remote, "rev-parse", "main") == sha


def test_two_worlds_share_nothing(tmp_path: Path) -> None:
    one, two = fleet_repo(tmp_path / "one" / "fleet"), fleet_repo(tmp_path / "two" / "fleet")
    one.edit_fleet(name="first")
    one.commit("first")
    assert two.read(FLEET)["name"] == "demo"
    assert git(two.remote, "rev-parse", "main") != git(one.remote, "rev-parse", "main")
    assert two.git("remote", "get-url", "origin") == str(two.remote)
    with pytest.raises(FileExistsError):
        fleet_repo(one.work)

