"""What the commands share: their common arguments, declared once, and for the live commands (plan, apply,
status) desired from a working tree, an opened fleet, write-back.

Each common option has one helper and one help text, used by every command that takes it: ``add_checkout_arg``
(``--repo``), ``add_state_dir_arg`` (``--state-dir``), ``add_data_dir_arg`` (``--data-dir``) and
``add_api_url_arg`` (``--api-url``); ``add_live_args`` is the set the live commands take.

The argument helpers import nothing heavy: every command imports this module, and the light ones (validate, runs,
diff, review, init, dashboard) must not pay for the fleet's adapters (git, paramiko, the provider) at start-up, so
the live helpers import the composition root (``reconciler.fleet``) and the desired/ loader when they are called.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from reconciler.errors import DesiredStateInvalid, RepoError, UserError

if TYPE_CHECKING:
    from reconciler.apply import ApplyResult
    from reconciler.core.actions import Plan
    from reconciler.core.model import Controller, Desired, Observed
    from reconciler.loop import Reconciler
    from reconciler.settings.object_store import StoreConfig


REVIEW_HEAD = "HEAD"  # the revision `rigsync review` (and the MCP server's review tool) reviews unless told
# A committed observed/ blob past this is not read (`rigsync diff`, `rigsync review`): the snapshots rigsync writes
# stay far below it even at the loader's 50,000 runs.
MAX_OBSERVED_BYTES = 64 * 1024 * 1024


def add_checkout_arg(parser: argparse.ArgumentParser) -> None:
    """``--repo``, on every command that reads a fleet repository."""
    parser.add_argument(
        "--repo", type=Path, default=Path("."), metavar="DIR",
        help="the fleet repository checkout, holding desired/ (default: the current directory)",
    )


def add_state_dir_arg(parser: argparse.ArgumentParser) -> None:
    """``--state-dir``, on every command that reaches the fleet's boxes (``fleet.state_dir_for``)."""
    parser.add_argument(
        "--state-dir", default=None, metavar="DIR",
        help="where rigsync keeps its SSH key, pinned host keys and launch journal (default: $RIGSYNC_STATE_DIR, "
        "else $XDG_STATE_HOME/rigsync); never in the repository",
    )


def add_live_args(parser: argparse.ArgumentParser) -> None:
    """What every command that acts on the live fleet takes: the checkout, the state dir, the provider's URL."""
    add_checkout_arg(parser)
    add_state_dir_arg(parser)
    add_api_url_arg(parser)


def add_data_dir_arg(parser: argparse.ArgumentParser) -> None:
    """``--data-dir`` and ``--store``, on every command that settles attempts or reads their results: the local
    store (``adapters.store``) or an S3-compatible one (``adapters.s3store``, ``storeconfig``)."""
    from reconciler.settings.object_store import STORE_ENDPOINT_ENV, STORE_ENV, STORE_FLAG

    parser.add_argument(
        "--data-dir", default=None, metavar="DIR",
        help="where attempts' harvested results and checkpoints go (default: $RIGSYNC_DATA_DIR, else "
        "$XDG_DATA_HOME/rigsync); never in the repository",
    )
    parser.add_argument(
        STORE_FLAG, dest="store", default=None, metavar="s3://BUCKET[/PREFIX]",
        help=f"keep results in an S3-compatible object store instead (default: ${STORE_ENV}, else the data dir); "
        f"its endpoint comes from ${STORE_ENDPOINT_ENV} (https, or http to loopback), its credentials from "
        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; boxes upload and download with presigned URLs; never "
        "read from desired/",
    )


def store_of(args: argparse.Namespace) -> StoreConfig | None:
    """The controller's result store for this command (None: the local data dir), checked before anything is
    read or contacted."""
    from reconciler.settings.object_store import store_config

    return store_config(getattr(args, "store", None), os.environ)


def add_api_url_arg(parser: argparse.ArgumentParser) -> None:
    """``--api-url``, on every command that talks to the provider."""
    from reconciler.settings.endpoint import API_URL_ENV, API_URL_FLAG, DEFAULT_URL

    parser.add_argument(
        API_URL_FLAG, dest="api_url", default=None, metavar="URL",
        help=f"the provider API the key is sent to (default: ${API_URL_ENV}, else {DEFAULT_URL}); https, or "
        "plain http to a loopback host such as the local emulator; never read from desired/",
    )


def api_url_of(args: argparse.Namespace) -> str:
    """The controller's provider URL for this command, checked before anything is read or contacted."""
    from reconciler.settings.endpoint import controller_api_url

    return controller_api_url(args.api_url, os.environ)


def add_allow_dirty_arg(parser: argparse.ArgumentParser) -> None:
    """``--allow-dirty``, on the live commands that plan from the working tree."""
    parser.add_argument(
        "--allow-dirty", action="store_true",
        help="plan uncommitted changes under desired/ and the sweeps' code paths (stamped dirty; nothing of them is "
        "ever launched: apply refuses a plan that ships code or launches while the tree is dirty)",
    )


def dirty_files(repo: Path, desired: Desired) -> list[str]:
    """Uncommitted files under desired/ and the sweeps' code paths; [] outside a git checkout with commits."""
    from reconciler.fleet import open_git

    try:
        git = open_git(repo)
        git.head()
    except RepoError:
        return []
    return git.uncommitted(["desired", *desired.code_paths()])


def dirty_banner(dirty: list[str]) -> str:
    """The stamp on a plan made from a dirty tree, as `plan` and `apply` print it (the JSON plan: ``dirty``)."""
    return "DIRTY: planned from uncommitted changes (--allow-dirty); nothing of them is launched or shipped:" + "".join(
        f"\n  {d}" for d in dirty
    )


def refuse_dirty(repo: Path, dirty: list[str], what: str) -> None:
    """The one refusal of a dirty tree by the live commands (``--allow-dirty`` lifts it for ``plan``)."""
    if dirty:
        raise UserError(
            f"refusing to {what} uncommitted changes: rigsync acts on commits (every run records the commit it ran, "
            f"and code ships as `git archive` of a commit); in {repo}:\n  " + "\n  ".join(dirty)
            + "\ncommit them first, or pass --allow-dirty to plan them anyway (stamped dirty, never launched)"
        )


def load_live_desired(repo: Path, *, allow_dirty: bool, what: str) -> tuple[Desired, list[str]]:
    """desired/ from the working tree for `plan`/`apply`, and the uncommitted files it rests on.

    An invalid desired/ is reported first (file:line, whether committed or not: it must be fixed either way); then,
    without ``allow_dirty``, uncommitted files under desired/ or the sweeps' code paths are refused.
    """
    desired = load_local_desired(repo)
    dirty = dirty_files(repo, desired)
    if not allow_dirty:
        refuse_dirty(repo, dirty, what)
    return desired, dirty


def load_local_desired(repo: Path) -> Desired:
    """desired/ from the working tree, pinned to the revisions HEAD says (``GitRepo.pin``).

    Outside a git checkout (or before its first commit) the revisions stay None.
    """
    from reconciler.desired import errors_of, load_desired_from_dir
    from reconciler.fleet import open_git

    if not repo.is_dir():
        raise UserError(f"{repo}: not a directory")
    try:
        desired = load_desired_from_dir(repo)
    except DesiredStateInvalid as exc:
        # every problem with its file:line:col, as `rigsync validate` prints them; nothing was contacted yet
        lines = [str(e) for e in errors_of(exc)]
        raise UserError(f"{exc}:\n  " + "\n  ".join(lines)) from exc
    try:
        return open_git(repo).pin(desired)
    except RepoError:
        return desired


def open_reconciler(
    repo: Path, desired: Desired, state_dir: str | None, api_url: str, data_dir: str | None = None,
    store: StoreConfig | None = None,
) -> Reconciler:
    """The fleet opened as `rigsync run` opens it (``reconciler.fleet.open_fleet``)."""
    from reconciler.fleet import open_fleet

    return open_fleet(repo, desired.fleet, state_dir=state_dir, api_url=api_url, data_dir=data_dir, store=store)


def write_observed_uncommitted(
    repo: Path, desired: Desired, observed: Observed, plan: Plan, rec: Reconciler, result: ApplyResult | None = None
) -> None:
    """Write observed/ (and the archive's new lines) into the working tree; `rigsync run` is the one that commits."""
    from reconciler.fleet import open_git, render_cycle, write_back
    from reconciler.observed.documents import ReconcilerStatus

    failures = result.failure_lines() if result else ()
    status = ReconcilerStatus(
        desired_commit_applied=desired.commit, last_valid_desired_commit=desired.commit, apply_errors=failures
    )
    _, files = render_cycle(rec, desired, observed, plan, status, repo)
    write_back(open_git(repo), rec.archive, files, message=None)


def observe_once(
    args: argparse.Namespace, *, allow_dirty: bool = True
) -> tuple[Desired, Observed, Plan, Controller, list[str]]:
    """Desired from the working tree, one observation of the world, and the plan for it with the controller's
    settings it was made with; nothing applied.

    The last item lists the uncommitted files the plan rests on (refused unless ``allow_dirty``).
    """
    api_url = api_url_of(args)
    repo = Path(args.repo)
    desired, dirty = load_live_desired(repo, allow_dirty=allow_dirty, what="plan")
    rec = open_reconciler(repo, desired, args.state_dir, api_url)
    try:
        desired = rec.with_suggestions(desired)  # the bayes searches' recorded batches are runs too
        observed, the_plan, controller = rec.observe_and_plan(desired)
    finally:
        rec.shell.close()
    return desired, observed, the_plan, controller, dirty
