"""`rigsync mcp`: the SDK's own client drives the console script over stdio, as a coding agent would.

Each tool's structured result must be exactly what the command's ``--json`` prints (the same producer), valid
against the output schema the tool declares (the client checks that itself), and nothing may be applied.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from snapshot_repo import make_snapshot_repo

from reconciler.cli import main

RIGSYNC = Path(sys.executable).parent / "rigsync"
TOOLS = {"validate", "runs", "diff", "plan", "status", "logs", "review", "fleets"}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_snapshot_repo(tmp_path_factory.mktemp("mcp"), curve=False)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("home")  # no saved Vast key here, none in the environment
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL")}
    return {**keep, "HOME": str(home), "XDG_STATE_HOME": str(home / "state"), "XDG_DATA_HOME": str(home / "data")}


def cli_json(env: dict[str, str], *args: str) -> Any:
    """What the command prints with ``--json``: the CLI's own ``main`` in this process, in ``env``. The server is the
    subprocess under test; the command is only its reference (the console script has its own tests)."""
    out = io.StringIO()
    with mock.patch.dict(os.environ, env, clear=True), contextlib.redirect_stdout(out):
        main(list(args))
    return json.loads(out.getvalue())


def session_calls(repo: Path, env: dict[str, str], calls: list[tuple[str, dict[str, Any]]]) -> tuple[Any, list[Any]]:
    # the SDK's client is imported here, not at collection: each pytest worker would pay its seconds otherwise
    import anyio
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    async def go() -> tuple[Any, list[Any]]:
        params = StdioServerParameters(command=str(RIGSYNC), args=["mcp", "--repo", str(repo)], env=env)
        with open(os.devnull, "w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                listed = await session.list_tools()
                results = [await session.call_tool(name, args) for name, args in calls]
        return listed, results

    return anyio.run(go)


def _porcelain(repo: Path) -> str:
    return subprocess.run(["git", "-C", str(repo), "status", "--porcelain"], capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def served(repo: Path, env: dict[str, str]) -> tuple[Any, list[Any], str, str]:
    """One server on ``repo`` answering every tool call the tests below check (a server's start-up is most of the
    cost): the tools listed, the results in call order, and ``git status`` before and after."""
    before = _porcelain(repo)
    listed, results = session_calls(repo, env, [
        ("validate", {}), ("runs", {}), ("runs", {"promotions": True}), ("diff", {}), ("status", {}),
        ("logs", {"target": "tdmpc-9165"}), ("review", {"base": "HEAD"}),
    ])
    return listed, results, before, _porcelain(repo)


def test_tools_return_the_cli_json_and_apply_nothing(
    repo: Path, env: dict[str, str], served: tuple[Any, list[Any], str, str]
) -> None:
    listed, (validate, runs, promos, diff, status, logs, _), before, after = served
    tools = {t.name: t for t in listed.tools}
    assert set(tools) == TOOLS
    for t in tools.values():
        assert t.output_schema is not None and t.output_schema["type"] == "object", t.name
        assert t.annotations is not None and t.annotations.read_only_hint is True

    assert not validate.is_error and validate.structured_content == cli_json(env, "validate", "--json", "--repo",
                                                                              str(repo))
    assert validate.structured_content == {"valid": True, "errors": []}
    assert runs.structured_content == {"runs": cli_json(env, "runs", "--json", "--repo", str(repo))}
    assert json.loads(runs.content[0].text) == runs.structured_content["runs"]  # the text is the CLI's list
    assert len(runs.structured_content["runs"]) == 12
    assert len(promos.structured_content["runs"]) > 12
    assert diff.structured_content == cli_json(env, "diff", "--json", "--repo", str(repo))
    assert diff.structured_content["sweeps"]["tdmpc"]["done"] == 20

    # live tools need the provider's key: without one, an error result with the CLI's one line, not a crash
    assert status.is_error and status.structured_content is None
    assert status.content[0].text.startswith("rigsync: error: no Vast API key found")
    # logs: the run's box is gone and its output was never harvested into this (empty) store
    assert logs.is_error and "rigsync: error:" in logs.content[0].text

    assert after == before  # nothing written to the checkout


def test_a_bad_desired_state_is_a_result_not_an_error(repo: Path, env: dict[str, str], tmp_path: Path) -> None:
    broken = make_snapshot_repo(tmp_path, curve=False)
    budget = broken / "desired" / "budget.yaml"
    budget.write_text(budget.read_text().replace("max_fleet_dph: 0.45", "max_fleet_dph: lots"))
    _, (validate, runs) = session_calls(broken, env, [("validate", {}), ("runs", {})])
    assert validate.structured_content == cli_json(env, "validate", "--json", "--repo", str(broken))
    assert validate.structured_content["valid"] is False
    assert validate.structured_content["errors"][0]["file"].endswith("budget.yaml")
    assert runs.is_error and "budget.yaml" in runs.content[0].text


def test_review_returns_the_cli_json(repo: Path, env: dict[str, str], served: tuple[Any, list[Any], str, str]) -> None:
    review = served[1][-1]
    assert not review.is_error, review.content
    assert review.structured_content == cli_json(env, "review", "--json", "--base", "HEAD", "--repo", str(repo))
