"""apply(): carry out a Plan. Side effects only; every decision was already made by plan().

Actions run in dependency order (``actions.APPLY_ORDER``: record outcomes, free money, then rent, prepare boxes
and launch). Each action is idempotent against the world — a rent is labelled so a retry after a crash finds the
box, a launch takes an atomic ``mkdir`` lock on the box, a destroy of a gone box succeeds, an archive append is
keyed by run id + attempt — and each one's outcome is recorded. One failed action never aborts the others
(Terraform's lesson: apply returns the partial state, and the next cycle plans from what really happened).

What an action needs is in it: a rent its box's onstart, a bootstrap its script and cache, a requeue whether its box
is contacted, and the keys of the actions it needs (``Action.needs``, from ``actions.NEEDS``). apply keeps one rule
about them: an action whose needed action failed or was not run is not run either (``actions.unmet_need``).

This is the boundary where *any* exception raised by one action becomes that action's failed outcome: our own
errors (``RigsyncError``) are expected and logged as one line; anything else (a ``KeyError`` from an SDK, an
``OSError`` a library did not wrap) is a bug below us, logged here with its traceback, and its outcome names its
type and message. Only ``KeyboardInterrupt``/``SystemExit`` (not ``Exception``s) go past it.

Boxes are reached through the ``BoxControl`` port and the market through ``Provider``: apply never builds a
shell command itself, nor reads a launch's answer (the port returns it read).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TypeVar, assert_never

from reconciler.core.actions import (
    Action,
    AnswerPriceIncrease,
    ApplyResult,
    Bootstrap,
    CloseBill,
    Destroy,
    Drain,
    Kill,
    Launch,
    Noop,
    Outcome,
    Plan,
    Record,
    Rent,
    Requeue,
    ShipCode,
    SyncCheckpoint,
    apply_key,
    closed,
    unmet_need,
)
from reconciler.core.bounds import (
    EXIT_CODE_RANGE,
    HARVEST_CAP_BYTES,
    MAX_GPUS,
    MAX_NOTE_CHARS,
    bounded_int,
    bounded_text,
    clamp_time,
    finite,
)
from reconciler.core.curves import curve_path, read_metrics, render_curve
from reconciler.core.jobenv import ControllerEnv, JobEnv, reference
from reconciler.core.model import (
    AttemptOutcome,
    AttemptRecord,
    Desired,
    InFlight,
    Instance,
    Observed,
    RunDirState,
    RunSpec,
    Sweep,
)
from reconciler.core.remember import attempt_cost, capped_to_bill, overhead_record
from reconciler.core.textsafe import visible
from reconciler.core.throughput import progress_value
from reconciler.errors import (
    HostUnreachable,
    LaunchLockHeld,
    LaunchRefused,
    LeaseLost,
    PriceIncreaseGone,
    RemoteCommandFailed,
    RigsyncError,
    SecretMissing,
    StoreUnavailable,
)
from reconciler.failpoints import failpoint
from reconciler.ports import (
    HARVEST_MANIFEST,
    ArchiveAppender,
    BootstrapCache,
    BoxControl,
    Fence,
    Harvested,
    LaunchJob,
    Presigner,
    Provider,
    RentalAsk,
    ResultStore,
    no_fence,
)
from reconciler.remote import bootstrap_cache_uploaded

__all__ = ["ApplyContext", "ApplyResult", "Outcome", "apply", "harvest_note"]  # the outcomes' types live in actions

log = logging.getLogger("rigsync.apply")

T = TypeVar("T")

KILL_EXIT_CODE = 137  # what a killed attempt records (128 + SIGKILL), as a shell would report it
STDERR_TAIL_BYTES = 4096  # how much of a failed attempt's stderr its archive record carries
# the files of a harvest this controller reads back (a failed attempt's stderr tail, ``rigsync logs``), besides
# the sweep's metrics file: an object store keeps each on its own beside the whole tar
READ_BACK = ("stdout.log", "stderr.log", HARVEST_MANIFEST)
TRANSFER_TTL_S = 3600.0  # a presigned URL for one transfer (a harvest, a checkpoint sync, a resume) lives this long
CACHE_DOWNLOAD_TTL_S = 3600.0  # a bootstrap cache's download URL, used as the runner starts


@dataclass
class ApplyContext:
    provider: Provider
    boxes: BoxControl
    # the run specs a launch and a record read (``Desired.run``) and the commits; not the fleet's settings (the
    # actions carry what they need of those)
    desired: Desired
    observed: Observed
    archive: ArchiveAppender
    code_tar: Callable[[str, tuple[str, ...]], bytes]  # (commit, paths) -> tar of those paths at that commit
    now: Callable[[], float]
    should_stop: Callable[[], bool] = lambda: False
    fence: Fence = no_fence  # raises LeaseLost when this controller may no longer act (ports.Fence)
    epoch: Callable[[], int] = lambda: 0  # the lease epoch this controller acts under (0: no lease), per launch
    note_launch: Callable[[InFlight], None] = lambda flight: None  # the launch journal, before each launch
    on_action: Callable[[Action], None] = lambda action: None  # told as each action starts (views.progress_display)
    # where a sweep's ``${NAME}`` references are resolved, at launch and nowhere else (reconciler.core.jobenv)
    controller_env: ControllerEnv = field(default_factory=ControllerEnv)
    store: ResultStore | None = None  # where harvests go; None: nothing is harvested (and records say nothing)
    harvest_cap_bytes: int = HARVEST_CAP_BYTES


def apply(plan: Plan, ctx: ApplyContext) -> ApplyResult:
    """Run ``plan``'s actions in ``APPLY_ORDER``; every outcome recorded, one failure never stops the rest.

    **Fencing.** Just before each action the fence is asked whether this controller still holds the fleet's
    lease (``ports.Fence``, ``lease.Lease.check``). Every action changes the world — a rent or destroy the
    market, a launch, kill, bootstrap or code shipment a box, a record or requeue the archive — so each is fenced.
    Once the fence raises ``LeaseLost`` nothing more is done: that action and the rest are skipped (``not run:
    lease lost: ...``), the overheads of ended boxes are not archived, and ``result.lease_lost`` says why; the
    daemon then must not commit this cycle (another controller may own the fleet now).

    **Needs.** An action one of whose needed actions (``Action.needs``) failed or was not run is not run (``not
    run: ...``, the table's words): a run is not launched again after its attempt's kill or requeue failed, a
    drained box is not destroyed before its records are written, a bill is not closed before its attempts are
    archived.

    **A box that stops answering** (``HostUnreachable``: no answer within the command's timeout, or refused) is
    sent nothing more in this apply (``Action.talks_to``): one hung box costs a cycle one timeout, not one per
    action planned for it (two launches to a box that hung after its probe held a cycle two minutes, past its lease).
    """
    # a held box the list dropped (``Observed.unlisted``) is reached at its last listed endpoints, like a listed one
    reachable = (*ctx.observed.unlisted, *ctx.observed.instances)
    applying = _Applying(ctx, ApplyResult(), {i.id: i for i in reachable})
    for action in sorted(plan.actions, key=apply_key):
        applying.one(action)
    return applying.result


@dataclass
class _Applying:
    """One apply under way: its result, the outcomes so far by action key (what the needs read) and the boxes that
    stopped answering (instance id -> why)."""

    ctx: ApplyContext
    result: ApplyResult
    instances: dict[int, Instance]  # the provider's list as the plan was made from it: where each box is reached
    done: dict[str, Outcome] = field(default_factory=dict)
    silent: dict[int, str] = field(default_factory=dict)

    def one(self, action: Action) -> None:
        outcome = self._held(action)
        if outcome is None:
            box_id = _spoken_to(action, self.result)
            outcome = self._silenced(action, box_id) or self._run(action, box_id)
        self.result.outcomes.append(outcome)
        self.done[action.key] = outcome

    def _held(self, action: Action) -> Outcome | None:
        """The outcome of an action held back (None: go on): the lease is lost, the controller shuts down, or an
        action it needs did not succeed."""
        if self.result.lease_lost is not None:
            return _not_run(action, f"lease lost: {self.result.lease_lost}")
        if self.ctx.should_stop():
            return _not_run(action, "shutting down")
        try:
            self.ctx.fence()
        except LeaseLost as exc:
            log.error("lease lost before %s %s: %s; acting no more", action.kind.value, action.target, exc)
            self.result.lease_lost = str(exc)
            return _not_run(action, f"lease lost: {exc}")
        unmet = unmet_need(action, self.done)
        return _not_run(action, unmet) if unmet is not None else None

    def _silenced(self, action: Action, box_id: int | None) -> Outcome | None:
        """The outcome of an action to a box that stopped answering earlier in this apply (None: it did not)."""
        if box_id is None or box_id not in self.silent:
            return None
        why = f"instance/{box_id} stopped answering earlier in this apply ({self.silent[box_id]})"
        if isinstance(action, Kill | Requeue | Record):  # an attempt left unsettled: failed (its run not relaunched)
            return Outcome(action, False, why)
        return _not_run(action, why)  # nothing was sent: the next cycle plans it again from a fresh probe

    def _run(self, action: Action, box_id: int | None) -> Outcome:
        self.ctx.on_action(action)
        log.debug("%s %s [%s]: %s", action.kind.value, action.target, action.code.value, action.reason)
        try:
            return Outcome(action, True, _execute(action, self.ctx, self.instances, self.result))
        except RigsyncError as exc:
            log.warning("%s %s failed: %s", action.kind.value, action.target, exc)
            if isinstance(exc, HostUnreachable) and box_id is not None:
                self.silent[box_id] = bounded_text(str(exc), 160)
            return Outcome(action, False, _error_text(exc))
        except Exception as exc:  # the boundary: a library's surprise fails this action, not the plan
            log.exception("%s %s failed with an unexpected %s", action.kind.value, action.target, type(exc).__name__)
            return Outcome(action, False, _error_text(exc))


def _not_run(action: Action, why: str) -> Outcome:
    return Outcome(action, False, f"not run: {why}", skipped=True)


def _spoken_to(action: Action, result: ApplyResult) -> int | None:
    """The box ``action`` sends commands to (``Action.talks_to``), unless this apply destroyed it first (a requeue
    then archives its attempt without contacting it)."""
    box_id = action.talks_to
    return None if box_id in result.destroyed else box_id


def _execute(planned: Action, ctx: ApplyContext, instances: dict[int, Instance], result: ApplyResult) -> str:
    """Carry out one action; what its outcome says."""
    action = closed(planned)
    match action:
        case Rent():
            return _rent(action, ctx, result)
        case Destroy():
            return _destroy(action, ctx, instances, result)
        case Bootstrap():
            return _bootstrap(action, ctx, _box(instances, action.instance_id))
        case ShipCode():
            tar = ctx.code_tar(action.commit, action.paths)
            ctx.boxes.ship_code(_box(instances, action.instance_id), action.commit, tar)
            return f"{len(tar)} bytes shipped"
        case Launch():
            return _launch(action, ctx, instances, result)
        case Drain():
            ctx.boxes.drain(_box(instances, action.instance_id))
            return "draining"
        case Kill():
            return _kill(action, ctx, instances, result)
        case Requeue():
            return _requeue(action, ctx, instances, result)
        case Record():
            return _record(action, ctx, instances, result)
        case SyncCheckpoint():
            box = _box(instances, action.instance_id)
            _pull_checkpoint(ctx, result, box, action.run_id, action.attempt, action.path, action.keep_checkpoints)
            return "checkpoint pulled"
        case CloseBill():
            return _close_bill(ctx, result, action)
        case AnswerPriceIncrease():
            return _answer_price_increase(ctx, action)
        case Noop():
            return "nothing to do"
        case _:
            assert_never(action)


def _rent(action: Rent, ctx: ApplyContext, result: ApplyResult) -> str:
    new_id = ctx.provider.create_instance(
        action.offer_id, image=action.image, disk_gb=action.disk_gb, label=action.label, onstart=action.onstart,
        env={}, bid_dph=action.bid_dph, asked=RentalAsk(action.gpu_name, action.num_gpus, action.dph),
    )
    result.rented.append(new_id)
    result.rented_as[new_id] = action
    failpoint("apply.rent.after")
    return f"instance {new_id}"


def _destroy(action: Destroy, ctx: ApplyContext, instances: dict[int, Instance], result: ApplyResult) -> str:
    ctx.provider.destroy_instance(action.instance_id)
    result.destroyed.append(action.instance_id)
    inst = instances.get(action.instance_id)
    if inst is not None:  # its pooled connection and pinned host key go: the address may be handed to the next rental
        ctx.boxes.forget(inst)
    return "destroyed"


def _kill(action: Kill, ctx: ApplyContext, instances: dict[int, Instance], result: ApplyResult) -> str:
    state = _run_state(ctx.observed, action.instance_id, action.run_id, action.attempt)
    box = _box(instances, action.instance_id)
    ctx.boxes.kill(box, action.run_id, action.attempt, exit_code=KILL_EXIT_CODE, reason=action.reason,
                   pid=action.pid, pid_started=action.pid_started)
    rec = _attempt_record(ctx, instances, action.run_id, action.attempt, action.instance_id, state,
                          action.phase, KILL_EXIT_CODE, action.reason)
    rec = _harvest(ctx, result, box, rec, required=True, keep=action.keep_checkpoints)
    _archive(ctx, result, rec)
    return "killed"


def _requeue(action: Requeue, ctx: ApplyContext, instances: dict[int, Instance], result: ApplyResult) -> str:
    state = _run_state(ctx.observed, action.instance_id, action.run_id, action.attempt)
    rec = _attempt_record(ctx, instances, action.run_id, action.attempt, action.instance_id, state,
                          action.phase, None, action.reason)
    if action.instance_id in result.destroyed:  # destroyed first for the budget (``apply_key``)
        rec = replace(rec, harvest="lost: its box was destroyed first (the budget's headroom was gone)")
    elif action.unreached is None:
        # The attempt may still run half-alive, or its launch may still be on its way (kill.sh then leaves a
        # tombstone): it must not come back beside the next attempt. A box that stops answering now fails the
        # requeue, so nothing is archived and the run is not launched again in this apply (``actions.NEEDS``).
        box = _box(instances, action.instance_id)
        ctx.boxes.kill(box, action.run_id, action.attempt, exit_code=KILL_EXIT_CODE, reason=action.reason,
                       pid=action.pid, pid_started=action.pid_started)
        rec = _harvest(ctx, result, box, rec, required=False, keep=action.keep_checkpoints)  # what it wrote
    elif ctx.store is not None:
        rec = replace(rec, harvest=f"lost: {action.unreached}")
    _archive(ctx, result, rec)
    return "requeued"


def _record(action: Record, ctx: ApplyContext, instances: dict[int, Instance], result: ApplyResult) -> str:
    state = _run_state(ctx.observed, action.instance_id, action.run_id, action.attempt)
    rec = _attempt_record(ctx, instances, action.run_id, action.attempt, action.instance_id, state,
                          AttemptOutcome(action.phase), action.exit_code, action.reason)
    if action.skip_harvest is not None:  # a box whose answer is unusable: settled with what the probe read
        rec = replace(rec, harvest=f"not tried: {bounded_text(action.skip_harvest, 300)}")
    else:
        box = _box(instances, action.instance_id)
        rec = _harvest(ctx, result, box, rec, required=True, keep=action.keep_checkpoints)
    _archive(ctx, result, rec)
    return "archived"


def _close_bill(ctx: ApplyContext, result: ApplyResult, action: CloseBill) -> str:
    """Archive the box's overhead line (``remember.overhead_record``: its bill minus its archived attempts')."""
    box = ctx.observed.memory.spend.box(action.instance_id)
    if box is None:
        raise RemoteCommandFailed(f"instance {action.instance_id} has no bill in the spend this plan was made from")
    rec = overhead_record(box, (*ctx.observed.history, *result.archived), ctx.observed.memory_of(action.instance_id))
    result.overheads.extend(ctx.archive.append([rec]))
    return f"overhead ${rec.cost_usd:.6f} archived"


def _answer_price_increase(ctx: ApplyContext, action: AnswerPriceIncrease) -> str:
    """Accept or reject through the port. An increase no longer pending (answered before, its contract ended) is
    an outcome saying so, not a failure: the next cycle reads the list again. Such an outcome does not say
    ``accepted`` (``remember`` keeps only the increases really accepted)."""
    verb = "accept" if action.accept else "reject"
    try:
        ctx.provider.answer_price_increase(action.pending_id, accept=action.accept)
    except PriceIncreaseGone as exc:
        return f"gone: price increase {action.pending_id} is no longer pending, not {verb}ed ({_error_text(exc)})"
    return "accepted" if action.accept else "rejected"


def _error_text(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"


def _box(instances: dict[int, Instance], instance_id: int) -> Instance:
    inst = instances.get(instance_id)
    if inst is None:
        raise RemoteCommandFailed(f"instance {instance_id} is not in the provider's instance list")
    return inst


def _bootstrap(action: Bootstrap, ctx: ApplyContext, box: Instance) -> str:
    """Run the pool's bootstrap script on ``box``, with its bootstrap cache when the store is one boxes reach."""
    cache = _bootstrap_cache(ctx, box, action)
    out = ctx.boxes.bootstrap(box, action.script, action.script_hash, cache)
    return (f"bootstrap {out}" if out else "bootstrap started") + _cache_uploaded(ctx, cache, out)


def _bootstrap_cache(ctx: ApplyContext, box: Instance, action: Bootstrap) -> BootstrapCache | None:
    """The box's bootstrap cache when its pool declares one (``action.cache_key``) and the store is one boxes reach
    (``presigner``): the recorded object to restore, if any, and an upload URL that outlives the bootstrap. None
    otherwise (the local store: a bootstrap as ever), and when the store cannot mint them now (the script runs)."""
    presigner = ctx.store.presigner if ctx.store is not None else None
    key = action.cache_key
    if presigner is None or key is None:
        return None
    try:
        download = presigner.cache_download(key, ttl_s=CACHE_DOWNLOAD_TTL_S)
        upload = presigner.cache_upload(key, ttl_s=action.cache_upload_ttl_s)
    except RigsyncError as exc:
        log.warning("instance %d: bootstrap cache %s unavailable, the script runs: %s", box.id, key, _error_text(exc))
        return None
    return BootstrapCache(key, action.cache_paths, download, upload)


def _cache_uploaded(ctx: ApplyContext, cache: BootstrapCache | None, answer: str) -> str:
    """Record the cache object a box says it uploaded (``ok cache SIZE SHA256``, said once); what the outcome adds."""
    said = bootstrap_cache_uploaded(answer)
    presigner = ctx.store.presigner if ctx.store is not None else None
    if said is None or cache is None or cache.upload is None or presigner is None:
        return ""
    size, sha256 = said
    try:
        recorded = presigner.cache_uploaded(cache.key, cache.upload, size=size, sha256=sha256)
    except RigsyncError as exc:
        log.warning("bootstrap cache %s: not recorded: %s", cache.key, _error_text(exc))
        return f"; cache {cache.key} not recorded: {_error_text(exc)}"
    return f"; cache {cache.key} recorded" if recorded else f"; cache {cache.key} not recorded (not in the store whole)"


def _harvest(
    ctx: ApplyContext, result: ApplyResult, box: Instance, rec: AttemptRecord, *, required: bool, keep: int
) -> AttemptRecord:
    """Bring the attempt's run directory home (logs, meta.json, metrics file, the sweep's artifacts) before its
    record is written, and say in the record what came home (``harvest``), a failed attempt's ``stderr_tail``, and
    its curve under observed/curves/.

    ``required`` (an attempt that finished or was killed on a box that answers): a box that stops answering mid-way,
    or a store that is down, fails the action, nothing is archived, and the next cycle harvests again (the planner
    keeps the box until its finished attempts are archived). Otherwise (a lost attempt) what cannot come home is
    noted as lost. ``keep``: the run's checkpoint syncs the store keeps, should a retry's checkpoint be synced first.
    """
    if ctx.store is None:
        _mark_harvested(ctx, box, rec)  # nothing is kept here: the box has nothing more to give
        return rec
    spec = ctx.desired.run(rec.run_id)
    sweep = spec.sweep if spec else None
    metrics = [spec.sweep.metrics_file] if spec and not spec.sweep.metrics_file.startswith("/") else []
    patterns = [*metrics, *(sweep.artifacts if sweep else ())]
    if sweep is not None and sweep.checkpoint is not None and rec.phase.launches_again:
        _pull_checkpoint(ctx, result, box, rec.run_id, rec.attempt, sweep.checkpoint.path, keep)  # what a retry resumes
    try:
        got = _bring_home(ctx, box, rec, patterns, read_back=[*READ_BACK, *metrics])
    except (HostUnreachable, StoreUnavailable) as exc:
        if required:  # transient: the box keeps its results until the next cycle brings them home
            raise
        gone = "box unreachable" if isinstance(exc, HostUnreachable) else "the store is down"
        return replace(rec, harvest=f"lost: {gone} ({_note_text(exc, 200)})")
    except RigsyncError as exc:  # no run directory, no python, a stream the store refuses: say so, do not block
        return replace(rec, harvest=f"lost: {_note_text(exc, 300)}")
    except (ValueError, OverflowError, RecursionError, MemoryError) as exc:  # the box's stream itself is unusable
        return replace(rec, harvest=f"lost: unusable harvest: {type(exc).__name__}")
    _mark_harvested(ctx, box, rec)
    note = harvest_note(got)
    resumed = rec.resumed_from if rec.resumed_from is not None else got.resumed_from
    tail: str | None = None
    unusable: list[str] = []
    if rec.phase is not AttemptOutcome.SUCCEEDED:
        try:
            raw = ctx.store.read_attempt(rec.run_id, rec.attempt, "stderr.log", tail=STDERR_TAIL_BYTES)
            text = _tail_text(raw) if raw else None
            tail = _shown_tail(_secrets_hidden(ctx, spec, text)) if text else None
        except Exception as exc:  # what the box wrote must not keep its attempt from being settled
            unusable.append(f"unusable stderr.log: {type(exc).__name__}")
    if spec is not None and spec.sweep.metric_key and not spec.sweep.metrics_file.startswith("/"):
        try:
            problem = _curve(ctx, result, spec, rec, resumed)
        except Exception as exc:  # likewise: the record is written without a curve, saying why
            problem = f"{type(exc).__name__}"
        if problem is not None:
            unusable.append(f"unusable metrics: {problem}")
    if unusable:
        note = f"{note}; {'; '.join(unusable)}"
    return replace(rec, harvest=bounded_text(note, MAX_NOTE_CHARS), stderr_tail=tail, resumed_from=resumed)


def _bring_home(
    ctx: ApplyContext, box: Instance, rec: AttemptRecord, patterns: list[str], *, read_back: list[str]
) -> Harvested:
    """Move the attempt's harvest into the store: streamed through this controller into a local store, or uploaded
    by the box itself to an object store with presigned URLs scoped to this attempt's keys (no data through here;
    ``read_back``, the files this controller reads afterwards, are uploaded on their own beside the whole tar)."""
    assert ctx.store is not None
    presigner = ctx.store.presigner
    if presigner is None:
        tar = ctx.boxes.harvest(
            box, rec.run_id, rec.attempt, what="run", patterns=patterns, cap_bytes=ctx.harvest_cap_bytes
        )
        return ctx.store.put_attempt(rec.run_id, rec.attempt, tar)
    uploads = presigner.attempt_uploads(rec.run_id, rec.attempt, read_back, ttl_s=TRANSFER_TTL_S)
    ctx.boxes.upload_harvest(
        box, rec.run_id, rec.attempt, patterns=patterns, cap_bytes=ctx.harvest_cap_bytes, uploads=uploads
    )
    return presigner.attempt_uploaded(rec.run_id, rec.attempt)


def _mark_harvested(ctx: ApplyContext, box: Instance, rec: AttemptRecord) -> None:
    """Tell the box its attempt's harvest is stored (a draining box ends itself once all are). Best effort: a box
    that does not take the mark only keeps waiting for the controller to destroy it."""
    try:
        ctx.boxes.mark_harvested(box, rec.run_id, rec.attempt)
    except RigsyncError as exc:
        log.info("instance %d: cannot mark %s.%d harvested: %s", box.id, rec.run_id, rec.attempt, exc)


def _curve(
    ctx: ApplyContext, result: ApplyResult, spec: RunSpec, rec: AttemptRecord, resumed: int | None
) -> str | None:
    """Read the attempt's harvested metrics file (bounded, ``curves.read_metrics``) and keep its curve for
    observed/curves/; what of it could not be used (None: all of it)."""
    key = spec.sweep.metric_key
    fh = ctx.store.open_attempt(rec.run_id, rec.attempt, spec.sweep.metrics_file) if ctx.store and key else None
    if fh is None or key is None:
        return None
    with fh:
        got = read_metrics(fh, key)
    if got.points:
        result.curves[curve_path(spec.sweep.name, rec.run_id, rec.attempt)] = render_curve(
            sweep=spec.sweep.name, run_id=rec.run_id, attempt=rec.attempt, key=key,
            goal=spec.sweep.metric_goal.value, points=got.points, resumed_from=resumed, dropped=got.dropped,
            points_total=got.total,
        )
    if got.problem is None:
        return None
    dropped = f" ({got.dropped} line(s) dropped)" if got.dropped else ""
    return bounded_text(got.problem, 200) + dropped


def _note_text(exc: Exception, limit: int) -> str:
    """An error as a harvest note (committed to git) says it: escaped, bounded, and with this controller's home
    directory shown as ``~`` (a message of a library below may name a key or a file under it)."""
    text = _error_text(exc)
    home = os.path.expanduser("~")
    if len(home) > 1:
        text = text.replace(home, "~")
    return bounded_text(text, limit)


def _shown_tail(text: str) -> str:
    """A stderr tail as the archive stores it: control and bidi characters escaped (newlines kept), and when the
    escapes make it longer than ``STDERR_TAIL_BYTES`` characters, its end kept (the last lines say the most)."""
    shown = visible(text, block=True)
    return shown if len(shown) <= STDERR_TAIL_BYTES else "…" + shown[-(STDERR_TAIL_BYTES - 1) :]


def _secrets_hidden(ctx: ApplyContext, spec: RunSpec | None, text: str) -> str:
    """``text`` (what the job printed, on its way into git) with the values of its sweep's ``${NAME}`` references
    shown as ``${NAME}``: a job that prints its own token must not commit it. Literals are in git already."""
    refs = tuple((name, value) for name, value in (spec.sweep.env if spec else ()) if reference(value) is not None)
    if not refs or spec is None:
        return text
    try:
        return ctx.controller_env.resolve(spec.sweep.name, refs).redact(text)
    except SecretMissing:  # unset since the launch: nothing to hide that this controller knows of
        return text


def _pull_checkpoint(
    ctx: ApplyContext, result: ApplyResult, box: Instance, run_id: str, attempt: int, path: str, keep: int
) -> None:
    """Sync the attempt's checkpoint directory home (the store keeps it only when complete, and the run's newest
    ``keep`` syncs). Best effort."""
    if ctx.store is None:
        return
    result.checkpoint_pulls[(run_id, attempt)] = ctx.now()
    presigner = ctx.store.presigner
    try:
        if presigner is not None:
            _upload_checkpoint(ctx, presigner, box, run_id, attempt, path, keep)
            return
        tar = ctx.boxes.harvest(box, run_id, attempt, what="checkpoint", patterns=[path],
                                cap_bytes=ctx.harvest_cap_bytes)
        got = ctx.store.put_checkpoint(run_id, attempt, tar, at=ctx.now())
    except Exception as exc:  # the last complete sync stays; the next period tries again
        log.info("checkpoint %s.%s: not synced: %s", run_id, attempt, _error_text(exc))
        return
    if got.skipped:
        log.warning("checkpoint %s.%s: incomplete (%s), the last complete sync is kept", run_id, attempt,
                    harvest_note(got))


def _upload_checkpoint(
    ctx: ApplyContext, presigner: Presigner, box: Instance, run_id: str, attempt: int, path: str, keep: int
) -> None:
    """One checkpoint sync, box to store: the box packs and uploads it to a key of this sync's own, and it becomes
    the run's checkpoint only when complete and the store holds it whole (an upload cut off by a vanish leaves the
    previous one as the checkpoint a resume uses)."""
    at = ctx.now()
    upload = presigner.checkpoint_upload(run_id, attempt, at=at, ttl_s=TRANSFER_TTL_S)
    sent = ctx.boxes.upload_checkpoint(
        box, run_id, attempt, path=path, cap_bytes=ctx.harvest_cap_bytes, upload=upload
    )
    if not sent.complete:
        log.warning("checkpoint %s.%s: incomplete on its box (over the size cap or unreadable files), the last "
                    "complete sync is kept", run_id, attempt)
        return
    if not presigner.checkpoint_uploaded(run_id, attempt, upload, size=sent.size, sha256=sent.sha256, at=at,
                                         keep=keep):
        log.warning("checkpoint %s.%s: the store does not hold the upload the box reported (%d bytes), the last "
                    "complete sync is kept", run_id, attempt, sent.size)


def _stage_checkpoint(ctx: ApplyContext, box: Instance, action: Launch, sweep: Sweep) -> int | None:
    """Ship the run's last synced checkpoint (from an earlier attempt) to the attempt about to launch, through this
    controller from a local store or downloaded by the box itself from an object store (checked against the size
    and SHA-256 recorded at upload); the attempt it came from, or None when it starts fresh."""
    if ctx.store is None or sweep.checkpoint is None:
        return None
    presigner = ctx.store.presigner
    try:
        if presigner is not None:
            found = presigner.checkpoint_download(action.run_id, ttl_s=TRANSFER_TTL_S)
            if found is None or found[0] >= action.attempt:
                return None
            ctx.boxes.stage_resume_from(box, action.run_id, action.attempt, found[1])
            return found[0]
        ck = ctx.store.checkpoint(action.run_id)
        if ck is None or ck.attempt >= action.attempt:
            return None
        ctx.boxes.stage_resume(box, action.run_id, action.attempt, ck.tar)
        return ck.attempt
    except HostUnreachable:
        raise
    except RigsyncError as exc:  # the box or the store would not: start fresh rather than not at all
        log.warning("launch %s: checkpoint not shipped, starting fresh: %s", action.target, _error_text(exc))
        return None


def harvest_note(got: Harvested) -> str:
    """The archive record's ``harvest``: what came home, and what the size cap (or anything else) left behind."""
    text = f"{len(got.files)} file(s), {_size(got.bytes)}"
    if not got.skipped:
        return f"ok: {text}"
    # what a box had no business sending (a FIFO, a device node, a link, a path out of the run directory) is named
    # first, so the five named always include it; then what the size cap left behind
    named = sorted(got.skipped, key=lambda s: s[2] == "over the size cap")
    shown = ", ".join(f"{path} ({_size(size) if size is not None else '?'}, {why})" for path, size, why in named[:5])
    more = f" and {len(got.skipped) - 5} more" if len(got.skipped) > 5 else ""
    capped = any(why == "over the size cap" for _, _, why in got.skipped)
    within = f" kept within the {_size(got.cap)} cap" if capped else ""
    return bounded_text(f"partial: {text}{within}; skipped {shown}{more}", MAX_NOTE_CHARS)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _tail_text(raw: bytes) -> str | None:
    """The last whole lines of a stderr tail (at most ``STDERR_TAIL_BYTES``), as text."""
    if len(raw) >= STDERR_TAIL_BYTES and b"\n" in raw[:-1]:
        raw = raw[raw.index(b"\n") + 1 :]  # cut at a line start
    text = raw.decode("utf-8", "replace").rstrip()
    while len(text.encode("utf-8")) > STDERR_TAIL_BYTES:  # a replacement character is 3 bytes
        text = text[1:]
    return text or None


def _launch(action: Launch, ctx: ApplyContext, instances: dict[int, Instance], result: ApplyResult) -> str:
    spec = ctx.desired.run(action.run_id)
    if spec is None:
        raise RemoteCommandFailed(f"run {action.run_id} is not in the desired state this plan was made from")
    env = ctx.controller_env.resolve(spec.sweep.name, spec.sweep.env)  # SecretMissing names the variable, never a value
    job = _launch_job(action, spec, env, ctx.desired.commit, ctx.epoch())
    box = _box(instances, action.instance_id)
    resumed_from = _stage_checkpoint(ctx, box, action, spec.sweep)
    flight = InFlight(
        run_id=action.run_id,
        attempt=action.attempt,
        instance_id=action.instance_id,
        gpu_mask=action.gpu_mask,
        launched_at=ctx.now(),
        sweep=spec.sweep.name,
        resumed_from=resumed_from,
        epoch=job.epoch,
        queued=action.queued,
    )
    ctx.note_launch(flight)  # written ahead: a crash right after the launch must not lose the attempt's number
    try:
        answer = _redacted(env, lambda: ctx.boxes.launch(box, job))
    except (LaunchLockHeld, LaunchRefused):
        raise  # the attempt's directory was there already (the probe shows what it holds), or the box said no
    except Exception:
        result.in_doubt.append(flight)
        raise
    resumed = f", resumed from attempt {resumed_from}'s checkpoint" if resumed_from is not None else ""
    if action.queued:  # the box starts it when its slot frees: its identity comes with the probe that sees it
        result.launched.append(flight)
        return "queued" + resumed
    # The process group a kill may signal, as this launch saw it (never a pid read back from the box later).
    result.launched.append(replace(flight, pid=answer.pid, pid_started=answer.pid_started))
    started = f" (started at tick {answer.pid_started})" if answer.pid_started is not None else ""
    return (f"pid {answer.pid}{started}" if answer.pid is not None else "launched") + resumed


def _launch_job(action: Launch, spec: RunSpec, env: JobEnv, desired_commit: str | None, epoch: int) -> LaunchJob:
    return LaunchJob(
        run_id=action.run_id,
        attempt=action.attempt,
        gpu_mask=tuple(action.gpu_mask),
        command=action.command,
        code_commit=action.code_commit,
        desired_commit=desired_commit,
        sweep=spec.sweep.name,
        params=spec.params,
        seed=spec.seed,
        metrics_file=spec.sweep.metrics_file,
        metric_key=spec.sweep.metric_key,
        metric_goal=spec.sweep.metric_goal,
        max_runtime_s=spec.sweep.max_runtime_s,
        env=env,
        queued=action.queued,
        epoch=epoch,
    )


def _redacted(env: JobEnv, step: Callable[[], T]) -> T:
    """Run ``step``; should its error carry a value of ``env`` (a box echoing its input), the value is replaced by
    ``${NAME}`` before it reaches an outcome, a log line or a commit."""
    if not env:
        return step()
    try:
        return step()
    except RigsyncError as exc:
        text = env.redact(str(exc))
        if text == str(exc):
            raise
        raise RemoteCommandFailed(text) from None  # the cause carries the unredacted value: it must not travel on
    except Exception as exc:
        raise RemoteCommandFailed(env.redact(f"{type(exc).__name__}: {exc}")) from None  # likewise


def _run_state(observed: Observed, instance_id: int, run_id: str, attempt: int) -> RunDirState | None:
    probe = observed.probe(instance_id)
    if probe is None:
        return None
    for r in probe.runs:
        if r.run_id == run_id and r.attempt == attempt:
            return r
    return None


def _attempt_record(
    ctx: ApplyContext,
    instances: dict[int, Instance],
    run_id: str,
    attempt: int,
    instance_id: int,
    state: RunDirState | None,
    phase: AttemptOutcome,
    exit_code: int | None,
    reason: str,
) -> AttemptRecord:
    spec = ctx.desired.run(run_id)
    inst = instances.get(instance_id)
    billed = ctx.observed.memory.spend.box(instance_id)  # what the box is known by once the provider no longer lists it
    launched = next(
        (f for f in ctx.observed.memory.in_flight if f.run_id == run_id and f.attempt == attempt), None
    )
    now = ctx.now()
    # what the box said is checked once more here, where it is about to be committed: times within the window
    # around this controller's clock, metrics finite and in range, texts escaped and bounded, a GPU mask within the
    # box's GPUs (the parser already did so for a well-behaved probe; a record must be writable whatever it holds)
    box_started = _box_time(state.started_at, now) if state else None
    box_ended = _box_time(state.ended_at, now) if state else None
    started = box_started or (launched.launched_at if launched and not launched.queued else None)
    ended = box_ended or now
    dph = inst.dph_total if inst else (billed.dph if billed else 0.0)
    num_gpus = inst.num_gpus if inst else (billed.num_gpus if billed else 0)
    gpus = min(num_gpus, MAX_GPUS) if num_gpus > 0 else MAX_GPUS
    box_mask = tuple(dict.fromkeys(g for g in state.gpu_mask if 0 <= g < gpus)) if state and state.gpu_mask else ()
    mask = box_mask or (launched.gpu_mask if launched else ())
    box_exit = bounded_int(state.exit_code, *EXIT_CODE_RANGE) if state else None
    return AttemptRecord(
        run_id=run_id,
        attempt=attempt,
        sweep=spec.sweep.name if spec else (launched.sweep if launched else ""),
        phase=phase,
        params=spec.params if spec else (),
        seed=spec.seed if spec else 0,
        exit_code=box_exit if box_exit is not None else exit_code,
        code_commit=_box_text(state.code_commit) if state else ctx.desired.code_commit,
        desired_commit=_box_text(state.desired_commit) if state and state.desired_commit else ctx.desired.commit,
        image=inst.image if inst else "",
        instance_id=instance_id,
        machine_id=inst.machine_id if inst else (billed.machine_id if billed else 0),
        gpu_name=inst.gpu_name if inst else (billed.gpu_name if billed else ""),
        dph=dph,
        started_at=started,
        ended_at=ended,
        cost_usd=attempt_cost(dph, num_gpus, mask, started, ended),
        best_metric=finite(state.best_metric) if state else None,
        final_metric=finite(state.final_metric) if state else None,
        reason=bounded_text(reason, MAX_NOTE_CHARS),  # it may quote a box (a killed reason, an error)
        resumed_from=launched.resumed_from if launched else None,
        progress=progress_value(spec.sweep, state.last_metrics) if spec and state else None,
        queued_at=launched.launched_at if launched and launched.queued else None,
    )


def _box_time(t: float | None, now: float) -> float | None:
    """A time the box reported, when it is a finite number: kept within ``bounds.TIME_WINDOW_S`` of ``now``."""
    v = finite(t, limit=float("inf")) if t else None
    return clamp_time(v, now) if v is not None else None


def _box_text(text: str | None) -> str | None:
    return bounded_text(text) if isinstance(text, str) else None


def _archive(ctx: ApplyContext, result: ApplyResult, rec: AttemptRecord) -> None:
    state = _run_state(ctx.observed, rec.instance_id, rec.run_id, rec.attempt)
    if state is not None and state.problem:  # what of the box's report could not be used is said where it is kept
        said = f"unusable {bounded_text(state.problem, 300)}"
        rec = replace(rec, harvest=bounded_text(f"{rec.harvest}; {said}" if rec.harvest else said, MAX_NOTE_CHARS))
    listed = next((i for i in ctx.observed.instances if i.id == rec.instance_id), None)
    box = ctx.observed.memory.spend.box(rec.instance_id)
    rec = capped_to_bill(rec, box, listed, (*ctx.observed.history, *result.archived), ctx.now())
    result.archived.extend(ctx.archive.append([rec]))
    result.settled.add(rec.key)


