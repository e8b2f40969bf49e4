"""The field table: one row per YAML key, saying which model field it sets and how its text becomes the value.

``ROWS`` is declarative, like ``offers.RULES``: each row is a key path inside one model's YAML mapping, the
model's field it sets and the converter from validated YAML to the field's type. A key that is not written is
not passed, so the dataclass default in ``reconciler.core.model`` is the only default there is (``Row.default`` reads
it back, and a test checks that every ``default`` the JSON schemas show equals it). The schema and the checks
have already refused what cannot work; what is left here is conversion.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from reconciler.core.model import (
    DEFAULT_POOL,
    Budget,
    Checkpoint,
    Distribution,
    EarlyTerminate,
    EarlyTerminateType,
    Fleet,
    MetricGoal,
    NotifyEvent,
    OfferFilters,
    OnExceed,
    OwnHost,
    Pool,
    Progress,
    PromotionRule,
    Ranking,
    Search,
    SearchMethod,
    SearchParam,
    Sweep,
)
from reconciler.desired.desired_tree import bootstrap_file

_DURATION_RE = re.compile(r"^(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?$")


def parse_duration(text: str) -> float:
    """``"1h30m"`` → 5400.0 seconds. The schema has already checked the shape."""
    m = _DURATION_RE.match(text)
    if not m or not text:
        raise ValueError(f"not a duration: {text!r}")
    d, h, mi, s = (int(g) if g else 0 for g in m.groups())
    return float(((d * 24 + h) * 60 + mi) * 60 + s)


def format_duration(seconds: float) -> str:
    """3600.0 → ``"1h"``, 5400.0 → ``"1h30m"``: a duration the way desired/ files write it."""
    rest = int(seconds)
    out = ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if rest >= size:
            out += f"{rest // size}{unit}"
            rest %= size
    return out or "0s"


def gib_to_mib(value: float | int | None) -> int | None:
    return None if value is None else round(float(value) * 1024)


def _opt(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``convert``, with YAML null staying None."""
    return lambda value: None if value is None else convert(value)


def _strs(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value)


def _max_bid(block: Any) -> float | None:
    """``interruptible: {max_bid_dph: X}`` as X; ``interruptible: null`` (a pool turning the fleet's off): None."""
    return None if not isinstance(block, dict) else float(block["max_bid_dph"])


def _hosts(entries: Any) -> tuple[OwnHost, ...]:
    return tuple(build(OwnHost, entry) for entry in entries)


def _checkpoint(data: Any) -> Checkpoint | None:
    """A sweep's ``checkpoint: {path, every}`` (validated by the schema and the sweep checks)."""
    if not data:
        return None
    return Checkpoint(path=str(data["path"]).rstrip("/"), every_s=parse_duration(data["every"]))


def _filters(offers: Any) -> OfferFilters:
    return build(OfferFilters, offers)


def param_distribution(spec: Mapping[str, Any]) -> Distribution:
    """A search parameter's distribution: as written, else categorical for ``values``, else int_uniform when min
    and max are both integers, else uniform (W&B's inference)."""
    if "distribution" in spec:
        return Distribution(spec["distribution"])
    if "values" in spec:
        return Distribution.CATEGORICAL
    whole = all(isinstance(spec.get(k), int) and not isinstance(spec.get(k), bool) for k in ("min", "max"))
    return Distribution.INT_UNIFORM if whole else Distribution.UNIFORM


def _search_params(value: Any) -> tuple[SearchParam, ...]:
    return tuple(
        build(SearchParam, spec, name=str(name), distribution=param_distribution(spec)) for name, spec in value.items()
    )


def grid_size(search: Mapping[str, Any]) -> int:
    """How many combinations a grid search's parameters have (each has ``values``: the checks say so)."""
    return math.prod(len(spec.get("values", ())) for spec in search["parameters"].values())


def build_search(value: Any) -> Search:
    """A sweep's ``search:``; a grid search without run_cap runs every combination."""
    if "run_cap" not in value and value["method"] == SearchMethod.GRID:
        return build(Search, value, run_cap=grid_size(value))
    return build(Search, value)


def _early_terminate(value: Any) -> EarlyTerminate:
    return build(EarlyTerminate, value)


@dataclass(frozen=True)
class Row:
    """One YAML key of one model's mapping: where it is written, the field it sets, how its value converts."""

    model: type
    key: tuple[str, ...]
    field: str
    convert: Callable[[Any], Any] = lambda value: value

    @property
    def default(self) -> Any:
        """The model's default for this field (``dataclasses.MISSING`` when the field is required)."""
        return default_of(self.model, self.field)


def default_of(model: type, name: str) -> Any:
    """The dataclass default of ``model.name``: the one place a default of desired/ is written."""
    for f in dataclasses.fields(model):
        if f.name == name:
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
            return f.default
    raise KeyError(f"{model.__name__} has no field {name!r}")


def _rows(model: type, *rows: tuple[Any, ...]) -> tuple[Row, ...]:
    return tuple(Row(model, tuple(key.split(".")), *rest) for key, *rest in rows)


ROWS: tuple[Row, ...] = (
    *_rows(
        OfferFilters,
        ("gpu_names", "gpu_names", _strs),
        ("gpus_min", "num_gpus_min", int),
        ("gpus_max", "num_gpus_max", _opt(int)),
        ("min_gpu_ram_gib", "gpu_ram_mib_min", gib_to_mib),
        ("min_reliability", "reliability_min", _opt(float)),
        ("min_inet_down_mbps", "inet_down_mbps_min", _opt(float)),
        ("max_dph", "dph_max", _opt(float)),
        ("min_dlperf_per_dph", "dlperf_per_dph_min", _opt(float)),
        ("min_cuda", "cuda_min", _opt(float)),
        ("verified", "verified", bool),
        ("geolocations", "geolocations", _strs),
    ),
    *_rows(
        OwnHost,
        ("address", "address", str),
        ("port", "port", int),
        ("user", "user", str),
        ("gpus", "gpus", int),
        ("gpu_name", "gpu_name", str),
    ),
    # a pool entry; a fleet without pools: is one pool of its own top-level keys (see ``build_pools``)
    *_rows(
        Pool,
        ("name", "name", str),
        ("instances.min", "min_instances", int),
        ("instances.max", "max_instances", int),
        ("offers", "filters", _filters),
        ("offers.rank_by", "ranking", Ranking),
        ("image", "image", str),
        ("disk_gb", "disk_gb", float),
        ("bootstrap", "bootstrap_path", lambda value: bootstrap_file({"bootstrap": value})),
        ("bootstrap.cache", "bootstrap_cache", _strs),
        ("provider", "provider", str),
        ("interruptible", "max_bid_dph", _max_bid),
        ("hosts", "hosts", _hosts),
    ),
    # what is fleet-wide; its pool keys (offers, image, ...) are its pools' (``POOL_INHERITS``)
    *_rows(
        Fleet,
        ("name", "name", str),
        ("provider.name", "provider", str),
        ("instances.min", "min_instances", int),
        ("instances.max", "max_instances", int),
        ("idle_timeout", "idle_timeout_s", parse_duration),
        ("ttl", "ttl_s", parse_duration),
        ("boot_timeout", "boot_timeout_s", parse_duration),
        ("unreachable_grace", "unreachable_grace_s", parse_duration),
        ("heartbeat_stale", "heartbeat_stale_s", parse_duration),
        ("suspend", "suspend", bool),
        ("orphan_timeout", "orphan_timeout_s", parse_duration),
        ("avoid_machines", "avoid_machines", lambda value: tuple(sorted(int(m) for m in value))),
        ("blacklist_after", "blacklist_after", int),
        ("ghost_cooldown", "ghost_cooldown_s", parse_duration),
        ("bootstrap_timeout", "bootstrap_timeout_s", parse_duration),
        ("max_rents_per_hour", "max_rents_per_hour", _opt(int)),
        ("rent_backoff", "rent_backoff_s", parse_duration),
        ("queue_ahead", "queue_ahead_s", parse_duration),
        ("contract_margin", "contract_margin_s", parse_duration),
        ("exploration_share", "exploration_share", float),
        ("retention.checkpoints", "keep_checkpoints", int),
        ("retention.harvests_for", "keep_harvests_s", parse_duration),
        ("notify.events", "notify_events", lambda value: tuple(e for e in NotifyEvent if e.value in value)),
    ),
    *_rows(
        Budget,
        ("max_instance_dph", "max_instance_dph", _opt(float)),
        ("max_fleet_dph", "max_fleet_dph", _opt(float)),
        ("max_daily_usd", "daily_usd", _opt(float)),
        ("max_total_usd", "total_usd", _opt(float)),
        ("on_exceed", "on_exceed", OnExceed),
    ),
    *_rows(
        Sweep,
        ("name", "name", str),
        ("command", "command", str),
        ("grid", "grid", lambda value: tuple((str(k), tuple(v)) for k, v in value.items())),
        ("seeds", "seeds", lambda value: tuple(int(s) for s in value)),
        ("priority", "priority", int),
        ("code", "code_paths", _strs),
        ("resources.gpus", "gpus_per_run", int),
        ("resources.min_gpu_ram_gib", "min_gpu_ram_mib", lambda value: gib_to_mib(value) or 0),
        ("max_runtime", "max_runtime_s", parse_duration),
        ("expected_runtime", "expected_runtime_s", parse_duration),
        ("retries", "retries", int),
        ("max_preemptions", "max_preemptions", int),
        ("metrics.file", "metrics_file", str),
        ("metrics.key", "metric_key", _opt(str)),
        ("metrics.goal", "metric_goal", MetricGoal),
        (
            "promotion",
            "promotion",
            lambda value: tuple(PromotionRule(float(r["threshold"]), int(r["add_seeds"])) for r in value),
        ),
        ("env", "env", lambda value: tuple((str(k), str(v)) for k, v in value.items())),
        ("artifacts", "artifacts", _strs),
        ("checkpoint", "checkpoint", _checkpoint),
        ("stall_timeout", "stall_timeout_s", parse_duration),
        ("stall_gpu_util", "stall_gpu_util_pct", float),
        ("pool", "pool", str),
        ("progress", "progress", lambda value: Progress(str(value["key"]), float(value["total"]))),
        ("search", "search", build_search),
        ("early_terminate", "early_terminate", _early_terminate),
    ),
    *_rows(
        Search,
        ("method", "method", SearchMethod),
        ("metric.key", "metric_key", str),
        ("metric.goal", "metric_goal", MetricGoal),
        ("parameters", "parameters", _search_params),
        ("run_cap", "run_cap", int),
        ("batch", "batch", int),
        ("seed", "seed", int),
    ),
    # one entry of search.parameters (its name and distribution are given: see ``_search_params``)
    *_rows(
        SearchParam,
        ("values", "values", tuple),
        ("min", "min", float),
        ("max", "max", float),
        ("q", "q", float),
    ),
    *_rows(
        EarlyTerminate,
        ("type", "type", EarlyTerminateType),
        ("min_iter", "min_iter", float),
        ("eta", "eta", float),
        ("max_iter", "max_iter", float),
    ),
)

_ABSENT = object()
_M = TypeVar("_M")


def _lookup(data: Any, key: tuple[str, ...]) -> Any:
    for part in key:
        if not isinstance(data, Mapping) or part not in data:
            return _ABSENT
        data = data[part]
    return data


def build(model: type[_M], data: Mapping[str, Any], **given: Any) -> _M:
    """``model`` from its YAML mapping by its rows of ``ROWS``: keys written are converted, keys not written take
    the model's default; ``given`` sets what no single key says (a sweep's order, a bootstrap's script)."""
    values: dict[str, Any] = {}
    for row in ROWS:
        if row.model is model and (value := _lookup(data, row.key)) is not _ABSENT:
            values[row.field] = row.convert(value)
    return model(**{**values, **given})


def field_default(model: type, key: str) -> Any:
    """The default of the field that YAML ``key`` (dotted) of ``model`` sets: ``field_default(Sweep, "retries")``."""
    row = next(r for r in ROWS if r.model is model and r.key == tuple(key.split(".")))
    return row.default


def script_hash(script: str) -> str:
    return hashlib.sha256(script.encode()).hexdigest()[:16]


def _with_script(pool: Pool, scripts: Mapping[str, str]) -> Pool:
    """``pool`` with the text and hash of the bootstrap script it names (none: both empty)."""
    path = pool.bootstrap_path
    script = scripts.get(path, "") if path else ""
    return replace(pool, bootstrap_script=script, bootstrap_hash=script_hash(script) if path else "")


# What a pool entry does not say, it takes from the fleet's own top-level keys (the whole key: a pool's offers
# replace the fleet's, and a pool's ``interruptible: null`` turns the fleet's off).
POOL_INHERITS = ("offers", "image", "disk_gb", "bootstrap", "interruptible")


def _build_pool(data: Mapping[str, Any], fleet_data: Mapping[str, Any], scripts: Mapping[str, str]) -> Pool:
    merged = {**{k: fleet_data[k] for k in POOL_INHERITS if k in fleet_data}, **data}
    return _with_script(build(Pool, merged), scripts)


def build_fleet(data: Mapping[str, Any], scripts: Mapping[str, str]) -> Fleet:
    """The fleet and its pools; without ``pools:``, its one pool ``DEFAULT_POOL`` is its top-level keys, its
    bounds the fleet's."""
    entries = data.get("pools") or [{"name": DEFAULT_POOL, "instances": data.get("instances", {})}]
    return build(Fleet, data, pools=tuple(_build_pool(entry, data, scripts) for entry in entries))


def build_budget(data: Mapping[str, Any]) -> Budget:
    return build(Budget, data)


def build_sweep(data: Mapping[str, Any], order: int) -> Sweep:
    sweep = build(Sweep, data, order=order)
    if sweep.search is not None and sweep.metric_key is None:
        # a search's objective is the sweep's metric: what the archive records and promotion compares
        sweep = replace(sweep, metric_key=sweep.search.metric_key, metric_goal=sweep.search.metric_goal)
    # Strongest bar first: highest threshold for goal max, lowest for goal min.
    rules = sorted(sweep.promotion, key=lambda r: -r.threshold if sweep.metric_goal is MetricGoal.MAX else r.threshold)
    return replace(sweep, promotion=tuple(rules))


def duration_or(data: Mapping[str, Any], key: str, default: float) -> float:
    return parse_duration(data[key]) if key in data else default
