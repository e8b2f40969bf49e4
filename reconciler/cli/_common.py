"""What the live commands (plan, apply, status) share: desired from a working tree, adapters, memory."""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

from reconciler.actions import Plan
from reconciler.apply import ApplyResult
from reconciler.archive import RunArchive
from reconciler.desired import errors_of, load_desired_from_dir
from reconciler.errors import DesiredStateInvalid, RepoError, UserError
from reconciler.loop import Reconciler, build_adapters, state_dir_for
from reconciler.model import Desired, Observed
from reconciler.observe import Memory
from reconciler.observed_files import ReconcilerStatus, read_memory, read_observed, render_observed


def add_repo_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repo", default=".", help="the fleet repository (default: current directory)")
    parser.add_argument("--state-dir", default=None, help="where rigsync keeps its SSH key and pinned host keys")


def pin_commits(repo: Path, desired: Desired) -> Desired:
    """The revisions a run records: the last commit that changed desired/, and the one that changed the code.

    Not HEAD: rigsync's own observed/ commits move HEAD and must neither look like new desired state nor make
    the boxes fetch the same code again. Outside a git checkout (or before its first commit) both stay None.
    """
    from reconciler.adapters.git import GitRepo

    try:
        git_repo = GitRepo(repo)
        return replace(
            desired,
            commit=git_repo.desired_commit("HEAD"),
            code_commit=git_repo.last_commit_touching("HEAD", desired.code_paths()),
        )
    except RepoError:
        return desired


def load_local_desired(repo: Path) -> Desired:
    if not repo.is_dir():
        raise UserError(f"{repo}: not a directory")
    try:
        desired = load_desired_from_dir(repo)
    except DesiredStateInvalid as exc:
        # every problem with its file:line:col, as `rigsync validate` prints them; nothing was contacted yet
        lines = [str(e) for e in errors_of(exc)]
        raise UserError(f"{exc}:\n  " + "\n  ".join(lines)) from None
    return pin_commits(repo, desired)


def open_reconciler(repo: Path, desired: Desired, state_dir: str | None) -> Reconciler:
    from reconciler.adapters.git import GitRepo

    # Local inputs first (the checkout, observed/ memory): a bad one fails before the provider is contacted.
    git_repo = GitRepo(repo)
    # As `rigsync run` does: spend extrapolated to now from the observed files, and accrued from now on;
    # without the anchor a CLI apply would never count money and the daily/total caps would never bind.
    now = time.time()
    boxes, in_flight, spend = read_memory(repo, now=now)
    provider, shell = build_adapters(desired.fleet, state_dir_for(desired.fleet, state_dir))
    return Reconciler(
        provider=provider,
        shell=shell,
        archive=RunArchive(repo),
        code_tar=git_repo.archive,
        memory=Memory(boxes=boxes, in_flight=in_flight, spend=spend, spend_at=now),
    )


def write_observed(
    repo: Path, desired: Desired, observed: Observed, plan: Plan, rec: Reconciler, result: ApplyResult | None = None
) -> None:
    """Write observed/ into the working tree (not committed: `rigsync run` is the one that commits)."""
    failures = result.failure_lines() if result else ()
    status = ReconcilerStatus(
        desired_commit_applied=desired.commit, last_valid_desired_commit=desired.commit, apply_errors=failures
    )
    after = rec.observed_after_apply(observed)
    files = render_observed(
        desired=desired, observed=after, plan=plan, status=status, now=rec.clock.now(), previous=read_observed(repo)
    )
    for rel, text in files.items():
        path = repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def observe_once(args: argparse.Namespace) -> tuple[Desired, Observed, Plan]:
    """Desired from the working tree, one observation of the world, and the plan for it; nothing applied."""
    repo = Path(args.repo)
    desired = load_local_desired(repo)
    rec = open_reconciler(repo, desired, args.state_dir)
    try:
        observed, the_plan, _ = rec.observe_and_plan(desired)
    finally:
        rec.shell.close()
    return desired, observed, the_plan
