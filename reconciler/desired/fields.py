"""From validated YAML data to the model: ``Fleet``, ``Pool``, ``Budget``, ``Sweep``.

The schema and the checks have already refused what cannot work; what is left is conversion.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from reconciler.desired.tree import bootstrap_file
from reconciler.model import (
    Budget,
    Checkpoint,
    Fleet,
    MetricGoal,
    OfferFilters,
    OnExceed,
    OwnHost,
    Pool,
    PromotionRule,
    Ranking,
    Scalar,
    Sweep,
)

_DURATION_RE = re.compile(r"^(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?$")


def parse_duration(text: str) -> float:
    """``"1h30m"`` → 5400.0 seconds. The schema has already checked the shape."""
    m = _DURATION_RE.match(text)
    if not m or not text:
        raise ValueError(f"not a duration: {text!r}")
    d, h, mi, s = (int(g) if g else 0 for g in m.groups())
    return float(((d * 24 + h) * 60 + mi) * 60 + s)


def gib_to_mib(value: float | int | None) -> int | None:
    return None if value is None else round(float(value) * 1024)


def _filters(offers: Mapping[str, Any]) -> OfferFilters:
    return OfferFilters(
        gpu_names=tuple(offers.get("gpu_names", ())),
        num_gpus_min=int(offers.get("gpus_min", 1)),
        num_gpus_max=offers.get("gpus_max"),
        gpu_ram_mib_min=gib_to_mib(offers.get("min_gpu_ram_gib")),
        reliability_min=_opt_float(offers.get("min_reliability")),
        inet_down_mbps_min=_opt_float(offers.get("min_inet_down_mbps")),
        dph_max=_opt_float(offers.get("max_dph")),
        dlperf_per_dph_min=_opt_float(offers.get("min_dlperf_per_dph")),
        cuda_min=_opt_float(offers.get("min_cuda")),
        verified=bool(offers.get("verified", True)),
        geolocations=tuple(offers.get("geolocations", ())),
    )


def _build_pool(data: Mapping[str, Any], fleet: Fleet, scripts: Mapping[str, str]) -> Pool:
    """One entry of ``pools:``: what it does not say, it takes from the fleet's own fields."""
    instances = data.get("instances", {})
    offers = data.get("offers")
    bootstrap = bootstrap_file(data) if "bootstrap" in data else fleet.bootstrap_path
    script = scripts.get(bootstrap, "") if bootstrap else ""
    return Pool(
        name=data["name"],
        min_instances=int(instances.get("min", 0)),
        max_instances=int(instances.get("max", 1)),
        filters=_filters(offers) if offers is not None else fleet.filters,
        ranking=Ranking(offers.get("rank_by", Ranking.DLPERF_PER_DPH.value)) if offers is not None else fleet.ranking,
        image=data.get("image", fleet.image),
        disk_gb=float(data.get("disk_gb", fleet.disk_gb)),
        bootstrap_path=bootstrap,
        bootstrap_script=script,
        bootstrap_hash=_script_hash(script) if bootstrap else "",
        provider=str(data.get("provider", "vast")),
        max_bid_dph=_max_bid(data) if "interruptible" in data else fleet.max_bid_dph,
        hosts=tuple(
            OwnHost(
                address=str(h["address"]),
                port=int(h.get("port", 22)),
                user=str(h.get("user", "root")),
                gpus=int(h["gpus"]),
                gpu_name=str(h.get("gpu_name", "own")),
            )
            for h in data.get("hosts", ())
        ),
    )


def _max_bid(data: Mapping[str, Any]) -> float | None:
    """``interruptible: {max_bid_dph: X}`` as X; ``interruptible: null`` (a pool turning the fleet's off) or none:
    None."""
    block = data.get("interruptible")
    return None if not isinstance(block, dict) else float(block["max_bid_dph"])


def _script_hash(script: str) -> str:
    return hashlib.sha256(script.encode()).hexdigest()[:16]


def build_fleet(data: Mapping[str, Any], scripts: Mapping[str, str]) -> Fleet:
    offers = data.get("offers", {})
    provider = data.get("provider", {})
    filters = _filters(offers)
    defaults = Fleet(name="_")
    bootstrap_path = bootstrap_file(data) if "bootstrap" in data else None
    script = scripts.get(bootstrap_path, "") if bootstrap_path else ""
    fleet = Fleet(
        name=data["name"],
        provider=provider.get("name", "vast"),
        min_instances=int(data["instances"].get("min", 0)),
        max_instances=int(data["instances"]["max"]),
        filters=filters,
        ranking=Ranking(offers.get("rank_by", Ranking.DLPERF_PER_DPH.value)),
        image=data.get("image", defaults.image),
        disk_gb=float(data.get("disk_gb", defaults.disk_gb)),
        bootstrap_path=bootstrap_path,
        bootstrap_script=script,
        bootstrap_hash=_script_hash(script) if bootstrap_path else "",
        idle_timeout_s=duration_or(data, "idle_timeout", defaults.idle_timeout_s),
        ttl_s=parse_duration(data["ttl"]) if "ttl" in data else None,
        boot_timeout_s=duration_or(data, "boot_timeout", defaults.boot_timeout_s),
        unreachable_grace_s=duration_or(data, "unreachable_grace", defaults.unreachable_grace_s),
        heartbeat_stale_s=duration_or(data, "heartbeat_stale", defaults.heartbeat_stale_s),
        suspend=bool(data.get("suspend", False)),
        orphan_timeout_s=duration_or(data, "orphan_timeout", defaults.orphan_timeout_s),
        avoid_machines=tuple(sorted(int(m) for m in data.get("avoid_machines", ()))),
        blacklist_after=int(data.get("blacklist_after", defaults.blacklist_after)),
        ghost_cooldown_s=duration_or(data, "ghost_cooldown", defaults.ghost_cooldown_s),
        bootstrap_timeout_s=duration_or(data, "bootstrap_timeout", defaults.bootstrap_timeout_s),
        max_rents_per_hour=data.get("max_rents_per_hour", defaults.max_rents_per_hour),
        rent_backoff_s=duration_or(data, "rent_backoff", defaults.rent_backoff_s),
        max_bid_dph=_max_bid(data),
    )
    pools = tuple(_build_pool(p, fleet, scripts) for p in data.get("pools", ()))
    if not pools:
        return fleet
    # the fleet's own filter set, image and bootstrap are those of its first pool (what single-pool readers see)
    first = pools[0]
    return replace(
        fleet,
        pools=pools,
        filters=first.filters,
        ranking=first.ranking,
        image=first.image,
        disk_gb=first.disk_gb,
        bootstrap_path=first.bootstrap_path,
        bootstrap_script=first.bootstrap_script,
        bootstrap_hash=first.bootstrap_hash,
    )


def _opt_float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def duration_or(data: Mapping[str, Any], key: str, default: float) -> float:
    return parse_duration(data[key]) if key in data else default


def build_budget(data: Mapping[str, Any]) -> Budget:
    return Budget(
        max_instance_dph=_opt_float(data.get("max_instance_dph")),
        max_fleet_dph=_opt_float(data.get("max_fleet_dph")),
        daily_usd=_opt_float(data.get("max_daily_usd")),
        total_usd=_opt_float(data.get("max_total_usd")),
        on_exceed=OnExceed(data.get("on_exceed", OnExceed.DRAIN.value)),
    )


def build_sweep(data: Mapping[str, Any], order: int) -> Sweep:
    goal = MetricGoal(data.get("metrics", {}).get("goal", MetricGoal.MAX.value))
    rules = [
        PromotionRule(threshold=float(r["threshold"]), add_seeds=int(r["add_seeds"])) for r in data.get("promotion", ())
    ]
    # Strongest bar first: highest threshold for goal max, lowest for goal min.
    rules.sort(key=lambda r: -r.threshold if goal is MetricGoal.MAX else r.threshold)
    resources = data.get("resources", {})
    metrics = data.get("metrics", {})
    grid: tuple[tuple[str, tuple[Scalar, ...]], ...] = tuple((k, tuple(v)) for k, v in data.get("grid", {}).items())
    return Sweep(
        name=data["name"],
        command=data["command"],
        grid=grid,
        seeds=tuple(int(s) for s in data["seeds"]),
        priority=int(data.get("priority", 0)),
        code_paths=tuple(data.get("code", (".",))),
        gpus_per_run=int(resources.get("gpus", 1)),
        min_gpu_ram_mib=gib_to_mib(resources.get("min_gpu_ram_gib")) or 0,
        max_runtime_s=duration_or(data, "max_runtime", 3600.0),
        expected_runtime_s=duration_or(data, "expected_runtime", 0.0) if "expected_runtime" in data else None,
        retries=int(data.get("retries", 2)),
        metrics_file=metrics.get("file", "metrics.jsonl"),
        metric_key=metrics.get("key"),
        metric_goal=goal,
        promotion=tuple(rules),
        order=order,
        env=tuple((str(k), str(v)) for k, v in data.get("env", {}).items()),
        artifacts=tuple(data.get("artifacts", ())),
        checkpoint=_checkpoint(data.get("checkpoint")),
        stall_timeout_s=duration_or(data, "stall_timeout", 0.0) if "stall_timeout" in data else None,
        stall_gpu_util_pct=float(data.get("stall_gpu_util", 5.0)),
        pool=str(data.get("pool", "")),
    )


def _checkpoint(data: Mapping[str, Any] | None) -> Checkpoint | None:
    """A sweep's ``checkpoint: {path, every}`` (validated by the schema and ``sweep_checks``)."""
    if not data:
        return None
    return Checkpoint(path=str(data["path"]).rstrip("/"), every_s=parse_duration(data["every"]))
