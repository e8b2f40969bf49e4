"""JSON plan cases -> model objects, with defaults so each case states only what it is about.

A case file is ``{"description", "now", "desired", "observed", "controller", "expected"}``; ``controller`` (its
``cycle_s``, ``allowed_secrets``, ``env_names``, ``harvesting``) is the planning controller's settings, as a saved
plan carries them (default: a 60 s cycle, no secrets, no result store). Conveniences (all optional):
times may be given relative to ``now`` (``start_ago``, ``started_ago``, ``launched_ago``, ``unreachable_ago``,
``last_activity_ago``, ``ended_ago``); an instance without ``label`` gets this fleet's ownership label for the
current spec (``"{spec}"`` inside a given label is replaced by the current spec hash); a RUNNING instance
without a probe gets a reachable, bootstrapped probe with its code shipped; a probe without ``gpus`` gets one
GPU per instance GPU, with memory in use on the GPUs of its live runs. The host ledger is ``observed.memory.hosts``
(``build_hosts``). Only what is in ``observed.in_flight`` on a box (or archived) is this fleet's there: a run a
probe shows without it is foreign. A probe's ``queued`` lists its box's queue entries (``run_id``, ``attempt``,
``gpu_mask``, ``epoch``; position is their order), with ``epoch`` and ``draining`` beside; an in-flight entry may
say ``queued``. The rung values early termination compares by: ``rungs`` (``run_id``, ``rung``, ``value``); a run
may carry its sweep's ``early_terminate`` and its ``trial``. The process-only memory: ``heartbeats`` (``run_id``,
``attempt``, ``implied_ago``, ``since_ago``), ``failed_actions`` (``kind``, ``target``, ``error``) and ``distrusted``
(``instance_id``, ``since_ago``, ``why``). A probe may show the box's ``queued`` entries (``run_id``, ``attempt``,
``gpu_mask``, ``epoch``) and ``draining``; a box's memory its ``reachable_ago``/``ready_ago`` and ``pool``.
``unlisted`` are the held boxes the provider's list does not show (instances, probed like the listed ones), and
``rents`` the rents the memory keeps (``instance_id``, ``at_ago``, ``pool``, ``seen``).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fakes import flat_run_spec

from reconciler.core.identity import own_boxes, pool_spec_hash, slot_pool
from reconciler.core.model import (
    DEFAULT_POOL,
    AttemptOutcome,
    AttemptRecord,
    BoxMemory,
    BoxProbe,
    BoxSpend,
    Budget,
    Checkpoint,
    CheckpointPull,
    Controller,
    Desired,
    DistrustedBox,
    EarlyTerminate,
    EarlyTerminateType,
    FailedAction,
    Fleet,
    FleetMemory,
    GhostOffer,
    GpuQuiet,
    GpuState,
    HeartbeatClock,
    HostLedger,
    HostRecord,
    InFlight,
    Instance,
    InstanceStatus,
    MetricGoal,
    Observed,
    Offer,
    OfferFilters,
    OnExceed,
    Ownership,
    OwnHost,
    Pool,
    PriceIncrease,
    Progress,
    QueuedEntry,
    Ranking,
    RentMade,
    RunDirState,
    RungValue,
    RunSpec,
    Spend,
    Sweep,
)
from reconciler.plan import fleet_spec_hash
from reconciler.plan.saved import controller_from_json

J = dict[str, Any]


@dataclass(frozen=True)
class Case:
    name: str
    description: str
    now: float
    desired: Desired
    observed: Observed
    expected: J
    controller: Controller  # the case's ``controller``: the settings of the controller that plans


def _t(d: J, now: float, key: str, ago_key: str, default: float | None, *, ahead: bool = False) -> float | None:
    """``d[key]`` as a time, or ``now`` minus ``d[ago_key]`` (plus it when ``ahead``: "end_in")."""
    if key in d:
        return None if d[key] is None else float(d[key])
    if ago_key in d:
        return now + float(d[ago_key]) if ahead else now - float(d[ago_key])
    return default


def build_increase(d: J, now: float) -> PriceIncrease:
    """A pending (or accepted) price increase: ``id``, ``instance_id``, ``old_dph``, ``new_dph``, ``applies_in`` (or
    ``applies_at``), ``new_end_in`` (or ``new_end``)."""
    return PriceIncrease(
        id=int(d["id"]),
        instance_id=int(d["instance_id"]),
        old_dph=float(d.get("old_dph", 0.2)),
        new_dph=float(d["new_dph"]),
        applies_at=_t(d, now, "applies_at", "applies_in", now + 3600.0, ahead=True) or now,
        new_end=_t(d, now, "new_end", "new_end_in", None, ahead=True),
        created_at=_t(d, now, "created_at", "created_ago", None),
    )


def _filters(d: J) -> OfferFilters:
    return OfferFilters(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items()})


def build_pool(d: J) -> Pool:
    d = dict(d)
    filters = _filters(d.pop("filters", {}))
    d["hosts"] = tuple(OwnHost(**h) for h in d.pop("hosts", []))
    if "ranking" in d:
        d["ranking"] = Ranking(d["ranking"])
    return Pool(filters=filters, **d)


# The keys of a case's fleet that are its pool's: a fleet without ``pools`` is one pool of them (as the loader does).
_POOL_KEYS = {f.name for f in dataclasses.fields(Pool)} - {f.name for f in dataclasses.fields(Fleet)}


def build_fleet(d: J) -> Fleet:
    """A fleet; ``pools`` (each a Pool's fields) makes it a fleet with named pools; without, its one pool
    ``DEFAULT_POOL`` takes the pool keys given with the fleet's (filters, image, ...) and the fleet's bounds."""
    d = dict(d)
    pools = tuple(build_pool(p) for p in d.pop("pools", []))
    own = {k: d.pop(k) for k in list(d) if k in _POOL_KEYS}
    d.setdefault("name", "lab")
    d = {k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items()}
    if not pools:
        bounds = {k: d[k] for k in ("min_instances", "max_instances") if k in d}
        pools = (build_pool({"name": DEFAULT_POOL, **bounds, **own}),)
    return Fleet(pools=pools, **d)


def build_budget(d: J) -> Budget:
    d = dict(d)
    if "on_exceed" in d:
        d["on_exceed"] = OnExceed(d["on_exceed"])
    return Budget(**d)


def build_run(d: J, i: int) -> RunSpec:
    rid = d["id"]
    spec = _flat_run(d, rid)
    if "progress" in d:  # the sweep's progress key and total: {"key", "total"}
        spec = replace(spec, sweep=replace(spec.sweep, progress=Progress(d["progress"]["key"], d["progress"]["total"])))
    if "early_terminate" in d:  # the sweep's early_terminate: {"type", "min_iter", "eta", "max_iter"}
        et = dict(d["early_terminate"])
        et["type"] = EarlyTerminateType(et["type"])
        spec = replace(spec, sweep=replace(spec.sweep, early_terminate=EarlyTerminate(**et)))
    if "trial" in d:  # a search's configuration number
        spec = replace(spec, trial=d["trial"])
    return spec


def _flat_run(d: J, rid: str) -> RunSpec:
    return flat_run_spec(
        id=rid,
        sweep=d.get("sweep", "s"),
        cell=d.get("cell", rid),
        params=tuple((k, v) for k, v in d.get("params", {}).items()),
        seed=d.get("seed", 0),
        command=d.get("command", f"python train.py --run {rid}"),
        priority=d.get("priority", 0),
        sweep_order=d.get("sweep_order", 0),
        gpus=d.get("gpus", 1),
        min_gpu_ram_mib=d.get("min_gpu_ram_mib", 0),
        max_runtime_s=d.get("max_runtime_s", 3600.0),
        retries=d.get("retries", 2),
        metrics_file=d.get("metrics_file", "metrics.jsonl"),
        metric_key=d.get("metric_key", "reward"),
        metric_goal=MetricGoal(d.get("metric_goal", "max")),
        promotion_threshold=d.get("promotion_threshold"),
        expected_runtime_s=d.get("expected_runtime_s"),
        env=tuple((k, str(v)) for k, v in d.get("env", {}).items()),
        stall_timeout_s=d.get("stall_timeout_s"),
        stall_gpu_util_pct=d.get("stall_gpu_util_pct", 5.0),
        pool=d.get("pool", ""),
        **{k: d[k] for k in ("max_preemptions",) if k in d},  # the model's default otherwise
    )


def build_desired(d: J) -> Desired:
    sweeps = tuple(build_sweep(s) for s in d.get("sweeps", []))
    checkpoints = {s.name: s.checkpoint for s in sweeps}
    runs = tuple(build_run(r, i) for i, r in enumerate(d.get("runs", [])))
    runs = tuple(
        replace(r, sweep=replace(r.sweep, checkpoint=checkpoints[r.sweep.name])) if r.sweep.name in checkpoints else r
        for r in runs
    )  # a run carries its sweep: the one the case names, with its checkpoint
    return Desired(
        fleet=build_fleet(d.get("fleet", {})),
        budget=build_budget(d.get("budget", {})),
        sweeps=sweeps,
        runs=runs,
        commit=d.get("commit"),
        code_commit=d.get("code_commit"),
    )


def build_sweep(d: J) -> Sweep:
    """A sweep only for what the planner reads of it beyond its runs (``checkpoint``: path, every_s)."""
    ck = d.get("checkpoint")
    return Sweep(
        name=d.get("name", "s"),
        command=d.get("command", "python train.py"),
        grid=(),
        seeds=(0,),
        checkpoint=Checkpoint(ck["path"], float(ck["every_s"])) if ck else None,
    )


def build_spend(d: J, now: float) -> Spend:
    """``observed.memory.spend``: its totals, and ``boxes`` (BoxSpend fields; ``at_ago``, ``gone_ago``)."""
    boxes = tuple(
        BoxSpend(
            instance_id=int(b["instance_id"]),
            usd=float(b.get("usd", 0.0)),
            at=_t(b, now, "at", "at_ago", now) or now,
            dph=float(b.get("dph", 0.2)),
            estimated=bool(b.get("estimated", False)),
            gone_at=_t(b, now, "gone_at", "gone_ago", None),
        )
        for b in d.get("boxes", [])
    )
    return Spend(today_usd=d.get("today_usd", 0.0), total_usd=d.get("total_usd", 0.0), boxes=boxes)


def build_instance(d: J, now: float, fleet: Fleet) -> Instance:
    iid = int(d["id"])
    spec = fleet_spec_hash(fleet)
    if "pool" in d:  # a box of a named pool: its pool's spec and the pool suffix
        pool = fleet.pool(d["pool"])
        assert pool is not None, d["pool"]
        default = f"rigsync:{fleet.name}:{pool_spec_hash(pool)}-{iid}-{pool.name}"
    else:
        default = f"rigsync:{fleet.name}:{{spec}}-{iid}"
    label = d.get("label", default).replace("{spec}", spec)
    return Instance(
        id=iid,
        label=label,
        status=InstanceStatus(d.get("status", "running")),
        gpu_name=d.get("gpu_name", "RTX 3090"),
        num_gpus=d.get("num_gpus", 1),
        gpu_ram_mib=d.get("gpu_ram_mib", 24576),
        dph_total=d.get("dph_total", 0.2),
        start_date=_t(d, now, "start_date", "start_ago", now - 300.0) or 0.0,
        machine_id=d.get("machine_id", iid),
        end_date=_t(d, now, "end_date", "end_in", None, ahead=True),
    )


def build_rundir(d: J, now: float) -> RunDirState:
    return RunDirState(
        run_id=d["run_id"],
        attempt=d.get("attempt", 1),
        gpu_mask=tuple(d.get("gpu_mask", [0])),
        pid_alive=d.get("pid_alive", d.get("exit_code") is None),
        started_at=_t(d, now, "started_at", "started_ago", now - 60.0),
        heartbeat_age_s=d.get("heartbeat_age_s", 5.0 if d.get("exit_code") is None else None),
        exit_code=d.get("exit_code"),
        ended_at=_t(d, now, "ended_at", "ended_ago", None),
        best_metric=d.get("best_metric"),
        final_metric=d.get("final_metric"),
        metrics_age_s=d.get("metrics_age_s"),
        problem=d.get("problem"),
        last_metrics=tuple(d.get("last_metrics", {}).items()),
        pid=d.get("pid"),
        pid_started=d.get("pid_started"),
    )


def build_probe(d: J, now: float, inst: Instance | None, desired: Desired) -> BoxProbe:
    runs = tuple(build_rundir(r, now) for r in d.get("runs", []))
    if "gpus" in d:
        gpus = tuple(
            GpuState(
                index=g.get("index", i),
                memory_used_mib=g.get("memory_used_mib", 0),
                memory_total_mib=g.get("memory_total_mib", inst.gpu_ram_mib if inst else 24576),
            )
            for i, g in enumerate(d["gpus"])
        )
    else:
        busy = {i for r in runs if r.exit_code is None and r.pid_alive for i in r.gpu_mask}
        n = inst.num_gpus if inst else 1
        total = inst.gpu_ram_mib if inst else 24576
        gpus = tuple(GpuState(i, 2000 if i in busy else 0, total) for i in range(n))
    bh = desired.fleet.pools[0].bootstrap_hash
    own = Ownership.parse(inst.label) if inst is not None else None
    if own is not None and desired.fleet.named_pools:
        pool = desired.fleet.pool(slot_pool(desired.fleet, own.slot))
        bh = pool.bootstrap_hash if pool is not None else ""
    return BoxProbe(
        instance_id=int(d["instance_id"]),
        reachable=d.get("reachable", True),
        error=d.get("error"),
        host_key_changed=bool(d.get("host_key_changed", False)),
        gpus=gpus if d.get("reachable", True) else (),
        bootstrap_hashes=tuple(d.get("bootstrap_hashes", [bh] if bh else [])),
        bootstrap_failed=tuple(d.get("bootstrap_failed", [])),
        bootstrap_running=tuple(d.get("bootstrap_running", [])),
        code_commits=tuple(d.get("code_commits", [desired.code_commit] if desired.code_commit else [])),
        runs=runs,
        runs_omitted=int(d.get("runs_omitted", 0)),
        last_activity_at=_t(d, now, "last_activity_at", "last_activity_ago", None),
        unusable=d.get("unusable"),
        rejected=tuple(d.get("rejected", [])),
        queued=tuple(
            QueuedEntry(q["run_id"], q.get("attempt", 1), tuple(q.get("gpu_mask", [0])), q.get("epoch", 0), n)
            for n, q in enumerate(d.get("queued", []))
        ),
        epoch=d.get("epoch"),
        draining=bool(d.get("draining", False)),
    )


def build_offer(d: J, now: float) -> Offer:
    dph = float(d.get("dph_total", 0.2))
    dlperf = float(d.get("dlperf", 20.0))
    oid = int(d["id"])
    return Offer(
        id=oid,
        machine_id=d.get("machine_id", oid),
        gpu_name=d.get("gpu_name", "RTX 3090"),
        num_gpus=d.get("num_gpus", 1),
        gpu_ram_mib=d.get("gpu_ram_mib", 24576),
        dph_total=dph,
        dlperf=dlperf,
        dlperf_per_dph=d.get("dlperf_per_dph", dlperf / dph if dph > 0 else 0.0),
        reliability=d.get("reliability", 0.99),
        inet_down_mbps=d.get("inet_down_mbps", 500.0),
        cuda=d.get("cuda", 12.2),
        verified=d.get("verified", True),
        geolocation=d.get("geolocation", "Sweden, SE"),
        disk_space_gb=d.get("disk_space_gb", 100.0),
        min_bid=d.get("min_bid"),
        storage_dph=d.get("storage_dph", 0.0),
        end_date=_t(d, now, "end_date", "end_in", None, ahead=True),
    )


def build_history(d: J, now: float) -> AttemptRecord:
    return AttemptRecord(
        run_id=d["run_id"],
        attempt=d.get("attempt", 1),
        sweep=d.get("sweep", "s"),
        phase=AttemptOutcome(d["phase"]),
        exit_code=d.get("exit_code"),
        instance_id=d.get("instance_id", 0),
        best_metric=d.get("best_metric"),
        started_at=_t(d, now, "started_at", "started_ago", None),
        ended_at=_t(d, now, "ended_at", "ended_ago", None),
        gpu_name=d.get("gpu_name", ""),
        machine_id=d.get("machine_id", 0),
        progress=d.get("progress"),
        resumed_from=d.get("resumed_from"),
        queued_at=_t(d, now, "queued_at", "queued_ago", None),
    )


def build_hosts(d: J, now: float) -> HostLedger:
    """``observed.memory.hosts``: ``hosts`` (HostRecord fields), ``ghosts`` (offer_id, machine_id, failed_ago),
    ``rents_ago`` (seconds before now), ``failures_in_a_row``, ``last_failure_ago``."""
    return HostLedger(
        hosts=tuple(
            HostRecord(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in h.items()})
            for h in sorted(d.get("hosts", []), key=lambda h: h["machine_id"])
        ),
        ghosts=tuple(
            GhostOffer(int(g["offer_id"]), int(g.get("machine_id", g["offer_id"])), now - float(g["failed_ago"]),
                       g.get("detail", ""))
            for g in sorted(d.get("ghosts", []), key=lambda g: g["offer_id"])
        ),
        rents_at=tuple(sorted(now - float(t) for t in d.get("rents_ago", []))),
        failures_in_a_row=int(d.get("failures_in_a_row", 0)),
        last_failure_at=_t(d, now, "last_failure_at", "last_failure_ago", None),
    )


def build_box_memory(m: J, now: float) -> BoxMemory:
    return BoxMemory(
        instance_id=int(m["instance_id"]),
        first_seen_at=_t(m, now, "first_seen_at", "first_seen_ago", now - 3600.0) or 0.0,
        unreachable_since=_t(m, now, "unreachable_since", "unreachable_ago", None),
        bootstrap_since=_t(m, now, "bootstrap_since", "bootstrap_ago", None),
        reachable_at=_t(m, now, "reachable_at", "reachable_ago", None),
        ready_at=_t(m, now, "ready_at", "ready_ago", None),
        pool=m.get("pool", ""),
    )


def build_in_flight(f: J, now: float) -> InFlight:
    return InFlight(
        run_id=f["run_id"],
        attempt=f.get("attempt", 1),
        instance_id=int(f["instance_id"]),
        gpu_mask=tuple(f.get("gpu_mask", [0])),
        launched_at=_t(f, now, "launched_at", "launched_ago", now - 60.0) or 0.0,
        sweep=f.get("sweep", "s"),
        pid=f.get("pid"),
        pid_started=f.get("pid_started"),
        epoch=f.get("epoch", 0),
        queued=bool(f.get("queued", False)),
        seen_started_at=_t(f, now, "seen_started_at", "seen_started_ago", None),
    )


def build_memory(d: J, now: float) -> FleetMemory:
    """``observed``'s memory: the boxes' (``memory``), in flight, spend, hosts, rungs, accepted increases, and the
    process-only clocks and records, each a named record."""

    def of(key: str) -> list[J]:
        return list(d.get(key, []))

    def ago(entry: J, key: str) -> float:
        return now - float(entry[key])

    def attempt(e: J) -> tuple[str, int]:
        return e["run_id"], e.get("attempt", 1)

    return FleetMemory(
        boxes=tuple(build_box_memory(m, now) for m in of("memory")),
        in_flight=tuple(build_in_flight(f, now) for f in of("in_flight")),
        spend=build_spend(d.get("spend", {}), now),
        hosts=build_hosts(d.get("hosts", {}), now),
        rungs=tuple(RungValue(r["run_id"], float(r["rung"]), float(r["value"])) for r in of("rungs")),
        accepted_increases=tuple(build_increase(p, now) for p in of("accepted_increases")),
        gpu_quiet=tuple(sorted(GpuQuiet(*attempt(q), ago(q, "quiet_ago")) for q in of("gpu_quiet"))),
        checkpoint_pulls=tuple(
            sorted(CheckpointPull(*attempt(c), ago(c, "pulled_ago")) for c in of("checkpoint_pulls"))
        ),
        heartbeats=tuple(
            sorted(HeartbeatClock(*attempt(h), ago(h, "implied_ago"), ago(h, "since_ago")) for h in of("heartbeats"))
        ),
        failed_actions=tuple(sorted(FailedAction(a["kind"], a["target"], a["error"]) for a in of("failed_actions"))),
        distrusted=tuple(
            sorted(DistrustedBox(int(b["instance_id"]), ago(b, "since_ago"), b["why"]) for b in of("distrusted"))
        ),
        rents=tuple(
            sorted(
                RentMade(int(r["instance_id"]), ago(r, "at_ago"), r.get("pool", DEFAULT_POOL), bool(r.get("seen")))
                for r in of("rents")
            )
        ),
    )


def build_observed(d: J, now: float, desired: Desired) -> Observed:
    # the lab's own machines (provider ssh pools) are listed as observe() lists them
    instances = (*(build_instance(i, now, desired.fleet) for i in d.get("instances", [])), *own_boxes(desired.fleet))
    unlisted = tuple(build_instance(i, now, desired.fleet) for i in d.get("unlisted", []))
    by_id = {i.id: i for i in (*instances, *unlisted)}
    probes = [build_probe(p, now, by_id.get(int(p["instance_id"])), desired) for p in d.get("probes", [])]
    probed = {p.instance_id for p in probes}
    for inst in (*instances, *unlisted):
        if inst.id not in probed and inst.status is InstanceStatus.RUNNING:
            probes.append(build_probe({"instance_id": inst.id}, now, inst, desired))
    return Observed(
        instances=instances,
        probes=tuple(probes),
        offers=tuple(build_offer(o, now) for o in d.get("offers", [])),
        history=tuple(build_history(h, now) for h in d.get("history", [])),
        memory=build_memory(d, now),
        credit_usd=d.get("credit_usd"),
        price_increases=tuple(build_increase(p, now) for p in d.get("price_increases", [])),
        fleet_name=desired.fleet.name,
        unlisted=unlisted,
    )


def build_controller(d: J) -> Controller:
    """The case's ``controller`` (the saved plan's form, ``plan.saved.controller_from_json``), each key optional: a
    60 s cycle, no secrets allowed or set, no result store."""
    return controller_from_json({**CASE_CONTROLLER, **d})


CASE_CONTROLLER: J = {"cycle_s": 60.0, "allowed_secrets": [], "env_names": [], "harvesting": False}


def load_case(path: Path) -> Case:
    raw = json.loads(path.read_text())
    now = float(raw.get("now", 1_000_000.0))
    desired = build_desired(raw.get("desired", {}))
    observed = build_observed(raw.get("observed", {}), now, desired)
    controller = build_controller(raw.get("controller", {}))
    return Case(path.stem, raw["description"], now, desired, observed, raw["expected"], controller)
