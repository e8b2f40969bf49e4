"""`rigsync demo`: the README's main job, on the built-in emulator."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from reconciler.demo import DemoOptions, run_demo, say_stderr
from reconciler.views.dashboard import open_hint
from reconciler.views.progress_display import progress_for


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=int, default=None, help="at least N runs (whole grid cells x enough seeds)")
    p.add_argument("--chaos", action="store_true", help="vanish a box mid-run, hang another, burst 429s")
    p.add_argument("--keep", default=None, help="leave the fleet repo here (its bare remote beside it)")
    p.add_argument("--data-dir", default=None, help="keep the attempts' harvested results here (default: a temp dir)")
    p.add_argument(
        "--store", action="store_true",
        help="keep results in a throwaway S3-compatible server on loopback (SeaweedFS) instead of a data dir: "
        "boxes upload harvests and checkpoints to it with presigned URLs",
    )
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument(
        "--repo", default=None,
        help="run this fleet repository's desired/ (e.g. one `rigsync init` made) instead of the example; "
        "it is copied, never changed",
    )
    seed = "the emulator market's seed (default %(default)s)"
    p.add_argument("--seed", type=int, default=DemoOptions.seed, help=seed)
    p.add_argument(
        "--timeout", type=float, default=DemoOptions.timeout_s,
        help="give up (and destroy everything) after this many seconds (default %(default)g)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.runs is not None and args.runs < 1:
        raise SystemExit("rigsync demo: --runs must be at least 1")
    # what the demo waits for: a live line when its stream is a terminal, plain lines otherwise; with --json it all
    # goes to stderr, so stdout holds the summary alone
    say = say_stderr if args.json else print
    progress = progress_for(sys.stderr if args.json else sys.stdout, write_line=say)
    opts = DemoOptions(
        runs=args.runs,
        chaos=args.chaos,
        keep=Path(args.keep) if args.keep else None,
        seed=args.seed,
        timeout_s=args.timeout,
        data_dir=Path(args.data_dir) if args.data_dir else None,
        store=args.store,
        source=Path(args.repo).resolve() if args.repo else None,
        say=progress.note,
        progress=progress,
    )
    summary = run_demo(opts)
    print(json.dumps(summary.to_json(), sort_keys=True) if args.json else summary.text())
    if args.json and summary.dashboard:
        say_stderr(open_hint(Path(summary.dashboard)))  # where to look, for the person beside the agent
    return 0 if summary.ok else 1
