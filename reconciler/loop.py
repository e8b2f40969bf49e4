"""One reconcile cycle.

A cycle is a straight line (Flux's Reconcile): observe → plan → apply → remember. The ``Reconciler`` holds only
what must survive between cycles (pooled SSH connections, the archive's key index, cross-cycle memory), and that
memory is also written under observed/ so a restarted process rebuilds it from files plus the world. It is
assembled in one place, ``reconciler.fleet.open_fleet``, with ``fleet.build_adapters`` as the default adapter factory.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from reconciler.apply import ApplyContext, apply
from reconciler.core.actions import Action, ApplyResult, Plan
from reconciler.core.jobenv import ControllerEnv, references
from reconciler.core.model import (
    CONTROLLER_INTERVAL_S,
    AttemptRecord,
    CheckpointPull,
    Controller,
    Desired,
    Endpoint,
    FleetMemory,
    Observed,
    OverheadRecord,
)
from reconciler.core.remember import NO_MEMORY, Applied, StoreSyncs, remember, world_after_apply
from reconciler.core.runphase import launched_by_box
from reconciler.errors import RigsyncError
from reconciler.observe import PROBE_TIMEOUT_S, observe
from reconciler.observed.suggestions import Suggestion, advance, render_suggestions, suggested_runs
from reconciler.plan import plan
from reconciler.plan.common import fmt_duration
from reconciler.ports import BoxControl, Fence, LaunchJournal, Provider, ResultStore, RunArchive, Shell, no_fence

log = logging.getLogger("rigsync.loop")

DESTROY_LATENCY_S = 30.0  # from deciding to destroy until the provider stops billing the box (apply + API)
RECENT_CYCLES = 20  # how many cycles' lengths the budget's horizon looks back on
EXPIRE_EVERY_S = 3600.0  # how often the harvest retention lists the store


class SystemClock:
    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


@dataclass
class CycleResult:
    desired: Desired
    observed: Observed
    plan: Plan
    applied: ApplyResult | None
    memory: FleetMemory
    started_at: float
    finished_at: float
    controller: Controller = field(default_factory=Controller)  # the settings the plan was made with


@dataclass
class Reconciler:
    provider: Provider
    shell: Shell
    archive: RunArchive
    code_tar: Callable[[str, tuple[str, ...]], bytes]
    memory: FleetMemory = NO_MEMORY
    clock: SystemClock = field(default_factory=SystemClock)
    should_stop: Callable[[], bool] = lambda: False
    box_control: BoxControl | None = None  # what is done to boxes; None: the run protocol over ``shell``
    cycle_s: float = CONTROLLER_INTERVAL_S  # how often this controller decides (the daemon's --interval)
    destroy_latency_s: float = DESTROY_LATENCY_S
    fence: Fence = no_fence  # apply asks it before every action (the daemon's lease fence; ports.Fence)
    epoch: Callable[[], int] = lambda: 0  # the lease epoch each launch is stamped with (the daemon's lease)
    on_action: Callable[[Action], None] = lambda action: None  # apply tells it each action it starts (progress)
    journal: LaunchJournal | None = None  # launches written down before they happen (ports.LaunchJournal)
    # what the sweeps' ``${NAME}`` references resolve to (this process's environment): plan() learns which names
    # are allowed (RIGSYNC_JOB_SECRETS) and set, apply() reads the values at launch (reconciler.core.jobenv)
    controller_env: ControllerEnv = field(default_factory=lambda: ControllerEnv(os.environ))
    store: ResultStore | None = None  # the local result store harvests go to (None: nothing is harvested)
    pending_curves: dict[str, str] = field(default_factory=dict)  # observed/curves/ files for the next write
    # the bayes searches' configurations made, as observed/suggestions.yaml records them (read back at start)
    suggestions: dict[str, tuple[Suggestion, ...]] = field(default_factory=dict)
    _walls_s: list[float] = field(default_factory=list)  # how long the last cycles took (at most RECENT_CYCLES)
    _history: list[AttemptRecord] | None = None
    _overheads: list[OverheadRecord] | None = None  # the archive's overhead lines (the views' ops tax)
    _endpoints: dict[int, tuple[Endpoint, ...]] = field(default_factory=dict)
    _applied: ApplyResult | None = None  # this cycle's apply, until the next cycle observes
    _expired_at: float = float("-inf")  # when the harvest retention was last enforced

    @property
    def boxes(self) -> BoxControl:
        if self.box_control is None:
            from reconciler.adapters.box_control import ShellBoxes

            self.box_control = ShellBoxes(self.shell)
        return self.box_control

    @property
    def history(self) -> tuple[AttemptRecord, ...]:
        if self._history is None:
            self._history = list(self.archive.records())
        return tuple(self._history)

    @property
    def overheads(self) -> tuple[OverheadRecord, ...]:
        if self._overheads is None:
            self._overheads = list(self.archive.overheads())
        return tuple(self._overheads)

    def with_suggestions(self, desired: Desired) -> Desired:
        """``desired`` with the runs of its bayes searches' recorded batches, after recording the next batch of each
        search whose configurations made are all finished in the archive (``observed.suggestions.advance``). The
        same archive gives the same record, so calling it again in one cycle adds nothing; plan() sees only runs."""
        if any(s.search is not None for s in desired.sweeps):
            self.suggestions = advance(desired, self.suggestions, self.history)
        return suggested_runs(desired, self.suggestions)

    def suggestions_file(self) -> str | None:
        """observed/suggestions.yaml as recorded now (None: no bayes search has made anything)."""
        return render_suggestions(self.suggestions)

    def controller(self, desired: Desired) -> Controller:
        """The settings this controller plans with (``Controller``): the budget's horizon is until it decides again
        (its interval after a cycle as long as the slowest it can be) plus the time a destroy takes to stop the
        billing; of the names the sweeps reference, those allowed and set here; whether a store takes harvests."""
        envs = {sweep.env for sweep in desired.sweeps} | {run.sweep.env for run in desired.runs}
        wanted = {name for env in envs for name in references(env)}
        return Controller(
            cycle_s=self.cycle_s + self.slowest_cycle_s() + self.destroy_latency_s,
            allowed_secrets=self.controller_env.allowed,
            env_names=self.controller_env.available(wanted),
            harvesting=self.store is not None,
        )

    def observe_and_plan(self, desired: Desired) -> tuple[Observed, Plan, Controller]:
        """One observation, brought up to what the store knows, and this controller's plan for it (with the
        controller's settings it was made with)."""
        desired = self.with_suggestions(desired)
        self._applied = None  # a new cycle: what the last apply did is in the world's lists now
        now = self.clock.now()
        observed, _ = observe(desired, self.provider, self.boxes, self.history, self.memory, now, epoch=self.epoch())
        observed = replace(observed, memory=self._with_store_syncs(desired, observed))
        self._forget_gone(observed)
        controller = self.controller(desired)
        return observed, plan(desired, observed, controller, now), controller

    def _with_store_syncs(self, desired: Desired, observed: Observed) -> FleetMemory:
        """The memory with, for each live attempt of ours whose checkpoint this process has not pulled yet (it started
        since), the time of the store's last sync of it: after a restart the store says what was pulled before."""
        memory = observed.memory
        if self.store is None:
            return memory
        known = {p.key for p in memory.checkpoint_pulls}
        archived = {rec.key for rec in observed.history}
        found: list[CheckpointPull] = []
        for ours in launched_by_box(observed.probes, memory.in_flight, archived).values():
            for r in (a.run_dir for a in ours if a.live):
                spec = desired.run(r.run_id)
                sweep = spec.sweep if spec is not None else None
                if (r.run_id, r.attempt) in known or sweep is None or sweep.checkpoint is None:
                    continue
                try:
                    synced = self.store.checkpoint_synced(r.run_id)
                except RigsyncError as exc:  # a store that is down: the next cycle asks again
                    log.info("checkpoint of %s.%d: the store cannot say: %s", r.run_id, r.attempt, exc)
                    continue
                if synced is not None and synced[0] == r.attempt:
                    found.append(CheckpointPull(r.run_id, r.attempt, synced[1]))
        return remember(memory, StoreSyncs(tuple(found))) if found else memory

    def slowest_cycle_s(self) -> float:
        """How long the next cycle may take before it can act: the slowest of the recent ones, and never less than
        the probe's deadline (one hung box makes a cycle that long, however quick the last ones were)."""
        return max((PROBE_TIMEOUT_S, *self._walls_s))

    def _forget_gone(self, observed: Observed) -> None:
        """Boxes no longer listed (destroyed by hand, vanished): drop their connections and host-key pins. A box
        still held although the list dropped it (``FleetMemory.held``) keeps its pin: its next probe must show the
        same host key."""
        listed = {i.id: i for i in (*observed.memory.held, *observed.instances)}
        for instance_id, endpoints in list(self._endpoints.items()):
            if instance_id not in listed:
                for endpoint in endpoints:
                    self.shell.forget(endpoint)
                del self._endpoints[instance_id]
        for inst in listed.values():
            self._endpoints[inst.id] = tuple(e for e in (inst.direct, inst.proxy) if e is not None)

    def cycle(self, desired: Desired, *, act: bool = True) -> CycleResult:
        started = self.clock.now()
        desired = self.with_suggestions(desired)
        observed, the_plan, controller = self.observe_and_plan(desired)
        applied = None
        memory = observed.memory
        if act:
            applied = self.apply(desired, observed, the_plan)
            memory = self.memory
        finished = self.clock.now()
        self._walls_s = [*self._walls_s[-(RECENT_CYCLES - 1):], max(0.0, finished - started)]
        return CycleResult(desired, observed, the_plan, applied, memory, started, finished, controller)

    def take_curves(self) -> dict[str, str]:
        """The curve files of the attempts settled since the last write (``fleet.render_cycle`` writes them)."""
        curves, self.pending_curves = self.pending_curves, {}
        return curves

    def observed_after_apply(self, observed: Observed) -> Observed:
        """The snapshot as the next cycle will start from it (``remember.world_after_apply``)."""
        return world_after_apply(observed, self.memory, self._applied, self.history, self.clock.now())

    def apply(self, desired: Desired, observed: Observed, the_plan: Plan) -> ApplyResult:
        desired = suggested_runs(desired, self.suggestions)  # the plan's launches of suggested runs find their spec
        ctx = ApplyContext(
            provider=self.provider,
            boxes=self.boxes,
            desired=desired,
            observed=observed,
            archive=self.archive,
            code_tar=self.code_tar,
            now=self.clock.now,
            should_stop=self.should_stop,
            fence=self.fence,
            epoch=self.epoch,
            on_action=self.on_action,
            note_launch=self.journal.note if self.journal is not None else (lambda flight: None),
            controller_env=self.controller_env,
            store=self.store,
        )
        result = apply(the_plan, ctx)
        self._applied = result
        self.pending_curves.update(result.curves)
        if self._history is not None:
            self._history.extend(result.archived)
        if self._overheads is not None:
            self._overheads.extend(result.overheads)
        self.memory = remember(observed.memory, Applied(observed, result, desired.fleet, self.clock.now()))
        if self.journal is not None:
            self.journal.reset(self.memory.in_flight)
        self._expire(desired)
        return result

    def _expire(self, desired: Desired) -> None:
        """Enforce the fleet's harvest retention (``retention.harvests_for``) in the store, at most every
        ``EXPIRE_EVERY_S`` (a listing of the store); a store that is down is asked again at the next chance."""
        now = self.clock.now()
        if self.store is None or desired.fleet.keep_harvests_s is None or now - self._expired_at < EXPIRE_EVERY_S:
            return
        try:
            removed = self.store.expire(now, keep_harvests_s=desired.fleet.keep_harvests_s)
        except RigsyncError as exc:
            log.warning("harvest retention not enforced this time: %s", exc)
            return
        self._expired_at = now
        if removed:
            log.info("harvest retention: %d attempt harvest(s) older than %s removed from the store", removed,
                     fmt_duration(desired.fleet.keep_harvests_s))
