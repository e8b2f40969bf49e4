"""``rigsync mcp``: rigsync for coding agents, as a Model Context Protocol server over stdio (the official SDK).

Each tool is one CLI command's ``--json``: it calls the same producer the command does (``validate_json``,
``runs_json``, ``diff_json``, ``plan_doc``, ``status_doc``, ``logs_json``, ``fleets_doc``) and returns that JSON as
the tool's structured result, with the command's schema (schemas/) as the tool's output schema, and as text.
Nothing here applies anything: ``plan`` and ``status`` observe the provider (they need its API key, like the CLI,
and report a clear error without it), ``fleets`` lists its instances; ``validate``, ``runs`` and ``diff`` read the
checkout alone; ``logs`` reads the local store, else the box. A tool that fails returns an error result with the
CLI's one-line message.

A tool's structured result must be a JSON object, so ``runs`` (a bare list on the CLI) is returned as
``{"runs": [...]}`` (``schemas/mcp-runs.schema.json``); its text content is the CLI's list itself.

Whatever a producer prints goes to stderr while serving (the SDK's ``stdio_server``): stdout carries the protocol alone.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler import __version__
from reconciler.cli import diff_cmd, logs_cmd, plan_cmd, runs_cmd, status_cmd, validate_cmd
from reconciler.cli._common import REVIEW_HEAD, add_checkout_arg, load_local_desired
from reconciler.desired import schema_path
from reconciler.emulator.exceptions import EmulatorError
from reconciler.errors import RigsyncError, UserError

if TYPE_CHECKING:  # the SDK is imported when the server starts: every other command would pay for it otherwise
    import mcp.types as types
    from mcp.server.lowlevel import Server


@dataclass(frozen=True)
class ToolSpec:
    """One tool: its name, what it does, its arguments' schema, its output schema's name, and its producer."""

    name: str
    description: str
    arguments: dict[str, Any]  # JSON Schema properties besides ``repo``
    required: tuple[str, ...]
    output_schema: str  # under schemas/
    produce: Callable[[Path, dict[str, Any]], Any]

    def input_schema(self) -> dict[str, Any]:
        props = {"repo": {"type": "string", "description": "the fleet checkout (default: the server's --repo)"}}
        return {"type": "object", "properties": {**props, **self.arguments}, "required": list(self.required),
                "additionalProperties": False}


_LIVE_ARGS = {
    "state_dir": {"type": "string", "description": "where rigsync keeps its SSH key and pinned host keys"},
    "api_url": {"type": "string", "description": "the provider API (default: $RIGSYNC_API_URL, else Vast.ai)"},
}


def _live(repo: Path, a: dict[str, Any]) -> argparse.Namespace:
    return argparse.Namespace(repo=str(repo), state_dir=a.get("state_dir"), api_url=a.get("api_url"))


def _logs(repo: Path, a: dict[str, Any]) -> Any:
    ns = argparse.Namespace(
        repo=str(repo), state_dir=a.get("state_dir"), api_url=a.get("api_url"), target=str(a["target"]),
        stderr=bool(a.get("stderr", False)), tail=a.get("tail"), data_dir=a.get("data_dir"), follow=False,
        raw=False, json=True,
    )
    return logs_cmd.logs_json(ns)


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec("validate", "Validate desired/ (fleet, budget, sweeps): valid, and every error with file:line:col. "
             "Reads the checkout only.", {}, (), "cli-validate", lambda repo, a: validate_cmd.validate_json(repo)),
    ToolSpec("runs", "The runs the desired sweeps expand to: content-addressed ids, params, seeds, rendered "
             "commands. Reads the checkout only.",
             {"promotions": {"type": "boolean", "description": "also list promotion candidates"}}, (), "mcp-runs",
             lambda repo, a: {"runs": runs_cmd.runs_json(load_local_desired(repo),
                                                         promotions=bool(a.get("promotions", False)))}),
    ToolSpec("diff", "Observed (as committed) against desired/ at HEAD: runs per sweep, boxes, drift, price. "
             "Reads git only, no credentials.", {}, (), "cli-diff", lambda repo, a: diff_cmd.diff_json(repo)),
    ToolSpec("plan", "What the next apply would do, each action with its reason (read-only: observes the provider "
             "and the boxes, applies nothing; needs the provider's API key in the server's environment).",
             _LIVE_ARGS, (), "plan", lambda repo, a: plan_cmd.plan_doc(_live(repo, a))[1]),
    ToolSpec("status", "Boxes, runs by phase, $/h and spend right now (observes the provider; needs its API key).",
             _LIVE_ARGS, (), "cli-status", lambda repo, a: status_cmd.status_doc(_live(repo, a))),
    ToolSpec("logs", "An attempt's stdout (or stderr) as it is now: from the local store once harvested, else "
             "from its box over SSH.",
             {"target": {"type": "string", "description": "RUN[.ATTEMPT]: a run id or unique prefix"},
              "stderr": {"type": "boolean", "description": "stderr.log instead of stdout.log"},
              "tail": {"type": "integer", "minimum": 0, "description": "only the last N lines"},
              "data_dir": {"type": "string", "description": "the local result store"}, **_LIVE_ARGS},
             ("target",), "cli-logs", _logs),
)


def _review(repo: Path, a: Mapping[str, Any]) -> Any:
    from reconciler.cli._review_git import review  # the producer `rigsync review --json` prints
    from reconciler.core.jobenv import allowlist_given

    return review(repo, str(a["base"]), str(a.get("head") or REVIEW_HEAD), allowed_secrets=allowlist_given(os.environ))


TOOLS += (
    ToolSpec(
        "review", "What a change to desired/ means: runs added, removed and changed per sweep, the price of the "
        "added work against the budget left, the head's validation errors. Reads git only, no credentials.",
        {"base": {"type": "string", "description": "the revision compared with, e.g. origin/main"},
         "head": {"type": "string", "description": f"the revision under review (default: {REVIEW_HEAD})"}},
        ("base",), "review", _review,
    ),
)


def _fleets(repo: Path, a: Mapping[str, Any]) -> Any:
    from reconciler.cli.fleets_cmd import fleets_doc  # the producer `rigsync fleets --json` prints

    repos = [Path(r) for r in a["repos"]] if "repos" in a else [repo]
    return fleets_doc(repos, a.get("api_url"))


TOOLS += (
    ToolSpec(
        "fleets", "Every instance on the provider account, grouped by the fleet and pool its label names, "
        "unlabelled ones as hand-rented: GPU, $/h, age, status, what each runs and which checkout it belongs to "
        "(read-only: lists the provider's instances; needs its API key in the server's environment).",
        {"repos": {"type": "array", "items": {"type": "string"},
                   "description": "fleet checkouts to name boxes from (default: [repo]; [] for none)"},
         "api_url": _LIVE_ARGS["api_url"]},
        (), "cli-fleets", _fleets,
    ),
)


def _text_of(spec: ToolSpec, doc: Any) -> str:
    body = doc["runs"] if spec.name == "runs" else doc  # the CLI's own JSON
    return json.dumps(body, indent=2, sort_keys=True, ensure_ascii=False)


def _tool_list() -> list[types.Tool]:
    import mcp.types as types

    return [
        types.Tool(name=t.name, description=t.description, input_schema=t.input_schema(),
                   output_schema=json.loads(schema_path(t.output_schema).read_text(encoding="utf-8")),
                   annotations=types.ToolAnnotations(read_only_hint=True, destructive_hint=False))
        for t in TOOLS
    ]


def _failed(message: str) -> types.CallToolResult:
    import mcp.types as types

    return types.CallToolResult(content=[types.TextContent(text=f"rigsync: error: {message}")], is_error=True)


async def call(name: str, arguments: dict[str, Any], default_repo: Path) -> types.CallToolResult:
    """Run one tool (its producer in a worker thread: the live ones wait on the network) and wrap its JSON."""
    import anyio
    import mcp.types as types

    spec = next((t for t in TOOLS if t.name == name), None)
    if spec is None:
        return _failed(f"no tool {name!r}: the tools are {', '.join(t.name for t in TOOLS)}")
    repo = Path(arguments.get("repo") or default_repo)
    try:
        doc = await anyio.to_thread.run_sync(spec.produce, repo, arguments)
    except (UserError, EmulatorError) as exc:
        return _failed(str(exc))
    except RigsyncError as exc:
        return _failed(f"{type(exc).__name__}: {exc}")
    return types.CallToolResult(content=[types.TextContent(text=_text_of(spec, doc))], structured_content=doc)


def build_server(default_repo: Path) -> Server[Any]:
    """The MCP server with rigsync's read-only tools."""
    import mcp.types as types
    from mcp.server.lowlevel import Server

    async def on_list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=_tool_list())

    async def on_call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        return await call(params.name, dict(params.arguments or {}), default_repo)

    return Server("rigsync", version=__version__, on_list_tools=on_list_tools, on_call_tool=on_call_tool)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "A Model Context Protocol server on stdin/stdout: tools validate, runs, diff, plan, status, "
        "logs, review, fleets, each returning the JSON of the command's --json. Nothing is applied."
    )
    add_checkout_arg(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    repo = Path(args.repo)
    if not repo.is_dir():
        raise UserError(f"{repo}: not a directory")
    import anyio
    from mcp.server.stdio import stdio_server

    server = build_server(repo)

    async def serve() -> None:
        # stdio_server points fd 1 at stderr while it serves: whatever a producer prints misses the protocol
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(serve)
    return 0
