"""`rigsync apply`: apply a fresh plan after showing it, or a saved plan exactly (refused if stale).

It is the hand-driven twin of one `rigsync run` cycle, so it obeys the same one-actor rule: it refuses while a
reconciler holds the checkout's local lock or the fleet's lease is fresh, instead of renting next to it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

import jsonschema

from reconciler.adapters import lease
from reconciler.adapters.lease import LeaseState, LocalLock, lock_path
from reconciler.cli._common import (
    add_allow_dirty_arg,
    add_data_dir_arg,
    add_live_args,
    api_url_of,
    dirty_banner,
    load_live_desired,
    open_reconciler,
    store_of,
    write_observed_uncommitted,
)
from reconciler.core.actions import PLAN_FORMAT_VERSION, Bootstrap, Launch, Plan, ShipCode
from reconciler.core.model import Desired
from reconciler.desired import schema_path
from reconciler.errors import LeaseHeld, RepoError, StalePlan, UserError
from reconciler.fleet import open_git, open_lease, open_local_lock
from reconciler.plan.render import plan_text
from reconciler.plan.saved import SavedPlan, stale_reasons
from reconciler.views.progress_display import booting, describe, progress_for

_SHIPS = (Bootstrap, ShipCode, Launch)  # what puts the tree's content on a box


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_live_args(p)
    add_data_dir_arg(p)
    p.add_argument("--plan", default=None, help="a plan saved by `rigsync plan --out`; applied exactly or refused")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    add_allow_dirty_arg(p)
    p.set_defaults(handler=run)


def _load_saved(path: str) -> SavedPlan:
    """Read a saved plan (with the settings of the controller that made it); anything that is not exactly a plan of
    this format is refused before any I/O."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise UserError(f"{path}: cannot read saved plan: {exc.strerror}") from exc
    except ValueError as exc:
        raise UserError(f"{path}: not a rigsync plan: not JSON ({exc})") from exc
    if isinstance(doc, dict) and doc.get("format_version") not in (None, PLAN_FORMAT_VERSION):
        raise UserError(
            f"{path}: plan format_version {doc.get('format_version')!r} is not {PLAN_FORMAT_VERSION}: "
            "make the plan again with this rigsync"
        )
    validator = jsonschema.Draft202012Validator(json.loads(schema_path("plan").read_text(encoding="utf-8")))
    error = jsonschema.exceptions.best_match(validator.iter_errors(doc))
    if error is not None:
        where = "/" + "/".join(str(p) for p in error.absolute_path)
        raise UserError(f"{path}: not a rigsync plan: {where}: {error.message}")
    try:
        return SavedPlan.from_json(doc)
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path}: not a rigsync plan: {exc}") from exc


def _lease_on_the_remote(repo: Path) -> LeaseState | None:
    """The fleet's lease as the checkout's remote has it (its own ref); None without a git checkout or a remote."""
    try:
        git = open_git(repo)
    except RepoError:
        return None
    if not git.has_remote():
        return None
    try:
        return open_lease(git, holder="", host="", pid=0).read()
    except RepoError as exc:
        raise UserError(f"cannot read the fleet's lease, so cannot tell whether a reconciler acts: {exc}") from exc


def _refuse_if_a_reconciler_acts(repo: Path) -> LocalLock | None:
    """One actor per fleet: not while `rigsync run` holds this checkout's lock or the fleet's lease is fresh.

    Returns the local lock, held for the whole apply (so a `rigsync run` started meanwhile waits for us).
    """
    lock = None
    if lock_path(repo).parent.is_dir():
        lock = open_local_lock(repo).acquire()
    try:
        current = _lease_on_the_remote(repo)
        if current is not None:
            decision = lease.acquire(
                current, holder=f"rigsync apply pid {os.getpid()}", host=socket.gethostname(), pid=os.getpid(),
                now=time.time(), stale_after=lease.DEFAULT_STALE_AFTER_S,
            )
            if not decision.granted:
                raise LeaseHeld(f"{decision.message}; stop that reconciler before applying by hand")
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return lock


def run(args: argparse.Namespace) -> int:
    api_url = api_url_of(args)
    repo = Path(args.repo)
    desired, dirty = load_live_desired(repo, allow_dirty=args.allow_dirty, what="apply")
    saved = _load_saved(args.plan) if args.plan else None
    lock = _refuse_if_a_reconciler_acts(repo)
    try:
        return _apply(args, repo, desired, saved, api_url, dirty)
    finally:
        if lock is not None:
            lock.release()


def _refuse_shipping_dirty(the_plan: Plan, dirty: list[str]) -> None:
    """A dirty tree is planned and may rent or destroy, but nothing of it reaches a box: code ships and runs launch
    only from commits, so that every run's archive line names the commits it really ran."""
    shipping = [a for a in the_plan.actions if isinstance(a, _SHIPS)]
    if dirty and shipping:
        kinds = ", ".join(sorted({a.kind.value for a in shipping}))
        raise UserError(
            f"refusing to apply: the plan has {len(shipping)} action(s) that put code or runs on boxes ({kinds}) "
            "and the tree has uncommitted changes:\n  " + "\n  ".join(dirty)
            + "\ncommit them (runs record the commit they ran); nothing was applied"
        )


def _apply(
    args: argparse.Namespace, repo: Path, desired: Desired, saved: SavedPlan | None, api_url: str, dirty: list[str]
) -> int:
    rec = open_reconciler(repo, desired, args.state_dir, api_url, args.data_dir, store_of(args))
    try:
        observed, fresh, controller = rec.observe_and_plan(desired)
        the_plan = fresh
        if saved is not None:
            # the saved plan as made, by the controller it was made with: refused if the world or this controller
            # no longer holds what it rests on
            reasons = stale_reasons(saved, desired, observed, controller)
            if reasons:
                raise StalePlan("the saved plan no longer holds:\n  " + "\n  ".join(reasons))
            the_plan = saved.plan
        if dirty:
            print(dirty_banner(dirty))
        print(plan_text(the_plan))
        _refuse_shipping_dirty(the_plan, dirty)
        if not the_plan.changes:
            write_observed_uncommitted(repo, desired, observed, the_plan, rec)
            return 0
        if saved is None and not args.yes:
            if not sys.stdin.isatty():
                raise UserError("refusing to apply without confirmation: pass --yes (stdin is not a terminal)")
            answer = input("Apply this plan? Only 'yes' is accepted: ")
            if answer.strip() != "yes":
                print("apply cancelled")
                return 1
        # what apply waits on, to stderr: a live line on a terminal, plain lines otherwise (stdout keeps the plan)
        progress = progress_for(sys.stderr)
        for line in booting(observed.instances, desired.fleet.name):
            progress.note(line)
        rec.on_action = lambda action: progress.update(describe(action))
        try:
            result = rec.apply(desired, observed, the_plan)
        finally:
            progress.close()
        write_observed_uncommitted(repo, desired, observed, the_plan, rec, result)
    finally:
        rec.shell.close()
    for o in result.outcomes:
        mark = "ok  " if o.ok else "FAIL"
        print(f"  {mark} {o.action.kind.value:<10} {o.action.target}  {o.detail}")
    print(f"Applied: {len(result.outcomes) - len(result.failures)} ok, {len(result.failures)} failed")
    return 1 if result.failures else 0
