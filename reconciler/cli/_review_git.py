"""``review(repo, base, head)``: the review of a change to desired/ from two commits of a fleet repository.

This is the I/O half of ``reconciler.plan.review``: it reads desired/ at both commits through the same loader the
controller uses (``GitRepo.desired_files``), and the fleet's committed observed/ state at the *base* commit
(the branch the change lands on is where rigsync commits what it saw; a pull request's branch may carry an
older copy). Nothing else is read: no provider, no credentials, no network. The CLI prints its answer, and
other front ends (an MCP tool) call ``review`` for the same JSON-able document.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reconciler.adapters.git import GitRepo
from reconciler.cli._common import MAX_OBSERVED_BYTES, REVIEW_HEAD
from reconciler.core.contract import dearest_rate
from reconciler.core.model import AttemptRecord, Observed
from reconciler.core.remember import NO_MEMORY, Restored, remember
from reconciler.desired import errors_of, load_desired
from reconciler.errors import DesiredStateInvalid, ObservedInvalid, RepoError, UserError
from reconciler.observed.archive_lines import entry_from_json
from reconciler.observed.codec import BUDGET, FLEET, RUNS, RUNS_DIR, expect_mapping, load_yaml
from reconciler.observed.memory import restored_from_files
from reconciler.plan.estimate import Place
from reconciler.plan.review import Side, compute_review


def _side(g: GitRepo, ref: str, sha: str) -> tuple[Side, dict[str, bytes]]:
    files = g.desired_files(sha)
    if not files and not files.refused:
        return Side(ref, sha, None, [{"file": "desired/", "line": None, "column": None, "pointer": "",
                                      "message": "no desired/ files at this commit"}]), {}
    try:
        desired = g.pin(load_desired(files), sha)
    except DesiredStateInvalid as exc:
        return Side(ref, sha, None, [e.to_json() for e in errors_of(exc)]), dict(files)
    return Side(ref, sha, desired), dict(files)


def _observed(g: GitRepo, sha: str, now: float) -> tuple[Observed, list[Place]]:
    """The committed observed/ at ``sha``: spend, the run archive, and the boxes held as price places (each at the
    dearest rate it may bill: an increase the fleet accepted on it counts, ``contract.dearest_rate``).

    Spend is the committed anchor carried along its line to ``now`` (``Spend.accrued``: the boxes held bill on,
    and "today" restarts at UTC midnight), as the controller's next cycle would start from it.
    """
    files = g.files_at(sha, "observed/", max_bytes=MAX_OBSERVED_BYTES, only=(FLEET, RUNS, BUDGET))
    if files.refused:
        raise ObservedInvalid("; ".join(f"{p}: {why}" for p, why in sorted(files.refused.items())))
    texts = {p: b.decode("utf-8", "replace") for p, b in files.items()}
    saved = restored_from_files(texts)
    spend = saved.spend
    if saved.spend_at is not None and BUDGET in texts:
        anchor = expect_mapping(load_yaml(texts[BUDGET], BUDGET), BUDGET).get("spend") or {}
        try:
            rate = float(anchor.get("fleet_dph") or 0.0)
        except (TypeError, ValueError) as exc:
            raise ObservedInvalid(f"{BUDGET}: spend.fleet_dph: malformed ({exc})") from exc
        spend = spend.accrued(rate, saved.spend_at, now)
    held: list[Place] = []
    if FLEET in texts:
        fleet = expect_mapping(load_yaml(texts[FLEET], FLEET), FLEET)
        for n, box in enumerate(fleet.get("boxes") or []):
            try:
                dph = dearest_rate(int(box.get("id") or 0), float(box["dph"]), saved.accepted_increases)
                held.append((dph, int(box["num_gpus"]), str(box.get("gpu_name") or "")))
            except (KeyError, TypeError, ValueError) as exc:
                raise ObservedInvalid(f"{FLEET}: boxes[{n}]: malformed ({exc})") from exc
    history: list[AttemptRecord] = []
    shards = g.files_at(sha, RUNS_DIR + "/", max_bytes=MAX_OBSERVED_BYTES)
    for path, blob in sorted(shards.items()):
        for number, line in enumerate(blob.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = entry_from_json(line)
            except ValueError as exc:
                raise ObservedInvalid(f"{path}:{number}: {exc}") from exc
            if isinstance(record, AttemptRecord):
                history.append(record)
    memory = remember(NO_MEMORY, Restored(spend=spend, in_flight=saved.in_flight))
    return Observed(history=tuple(history), memory=memory), held


def _changed(a: Mapping[str, bytes], b: Mapping[str, bytes]) -> list[str]:
    return sorted(p for p in set(a) | set(b) if a.get(p) != b.get(p))


def review(
    repo: Path, base: str, head: str = REVIEW_HEAD, *, now: float | None = None,
    allowed_secrets: frozenset[str] | None = None,
) -> dict[str, Any]:
    """The review document (the ``--json`` contract, ``schemas/review.schema.json``) of ``base..head`` in ``repo``;
    ``allowed_secrets``: the controller's job-secrets allowlist when the caller knows it (marks the references).

    Bad refs or a path that is no git checkout are ``UserError``; an invalid desired/ at head is data
    (``valid: false`` and its ``errors``), as it is what a reviewer must see.
    """
    try:
        g = GitRepo(Path(repo))
    except RepoError as exc:
        raise UserError(str(exc)) from exc
    shas: dict[str, str] = {}
    for flag, ref in (("--base", base), ("--head", head)):
        try:
            shas[flag] = g.rev(ref)
        except RepoError as exc:
            raise UserError(f"{flag} {ref!r} names no commit in {repo}") from exc
    at = time.time() if now is None else now
    base_side, base_files = _side(g, base, shas["--base"])
    head_side, head_files = _side(g, head, shas["--head"])
    observed, held = _observed(g, shas["--base"], at)
    return compute_review(
        base_side, head_side, observed, held, at, _changed(base_files, head_files), allowed_secrets=allowed_secrets
    )
