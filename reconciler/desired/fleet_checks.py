"""What the fleet schema cannot say: bounds that contradict, names the market does not know, durations that can
never work, pools that disagree, bootstrap scripts that are missing or unreadable.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reconciler.core.model import OWN_PROVIDER, OfferFilters, Pool
from reconciler.core.offers import country_code, gpu_name_problem
from reconciler.desired.desired_tree import MAX_FILE_BYTES, bootstrap_file
from reconciler.desired.fields import duration_or, field_default, parse_duration
from reconciler.desired.load_error import LoadError
from reconciler.desired.strict_yaml import Doc, character_problems
from reconciler.remote import HEARTBEAT_INTERVAL_S, is_cache_path

# A heartbeat must be able to miss a beat or two (a busy box, a slow disk) before its run is declared lost.
HEARTBEAT_MARGIN = 3


def bootstrap_owners(data: Mapping[str, Any]) -> list[tuple[tuple[str | int, ...], Mapping[str, Any]]]:
    """(pointer, mapping) of the fleet and each pool that may name a ``bootstrap``."""
    owners: list[tuple[tuple[str | int, ...], Mapping[str, Any]]] = [((), data)]
    pools = data.get("pools")
    if isinstance(pools, list):
        owners += [(("pools", i), p) for i, p in enumerate(pools) if isinstance(p, dict)]
    return owners


def fleet_checks(doc: Doc, files: Mapping[str, bytes]) -> tuple[list[LoadError], dict[str, str]]:
    """Checks beyond the schema. Returns (errors, bootstrap path -> script text for the fleet's and its pools')."""
    data = doc.data
    errors: list[LoadError] = []
    instances = data.get("instances", {})
    if instances.get("min", 0) > instances.get("max", 0):
        errors.append(
            doc.error(("instances", "min"), f"min ({instances['min']}) is greater than max ({instances['max']})")
        )
    offers = data.get("offers", {})
    if "gpus_max" in offers and offers.get("gpus_min", field_default(OfferFilters, "gpus_min")) > offers["gpus_max"]:
        errors.append(
            doc.error(
                ("offers", "gpus_min"),
                f"gpus_min ({offers['gpus_min']}) is greater than gpus_max ({offers['gpus_max']})",
            )
        )
    # What a GPU name or a geolocation means is decided in core.offers; the loader refuses what it cannot use.
    for i, name in enumerate(offers.get("gpu_names", ())):
        problem = gpu_name_problem(name)
        if problem is not None:
            errors.append(doc.error(("offers", "gpu_names", i), f"GPU name {name!r} {problem}"))
    for i, entry in enumerate(offers.get("geolocations", ())):
        if country_code(entry) is None:
            errors.append(
                doc.error(
                    ("offers", "geolocations", i),
                    f'{entry!r} is not a country: write an ISO 3166-1 alpha-2 code such as "DE" or an English '
                    'country name such as "Germany"',
                )
            )
    errors += _fleet_duration_checks(doc)
    errors += _pool_checks(doc)
    scripts: dict[str, str] = {}
    for at, owner in bootstrap_owners(data):
        if "bootstrap" not in owner:
            continue
        value = owner["bootstrap"]
        where = (*at, "bootstrap")
        if isinstance(value, Mapping):
            errors += _cache_checks(doc, where, value.get("cache", ()))
            value, where = value.get("script"), (*where, "script")
        target = bootstrap_file(owner)
        if target is None:
            errors.append(doc.error(where, f"bootstrap path {value!r} must stay inside desired/ (no '..')"))
        elif target in scripts:
            continue
        elif target not in files:
            errors.append(doc.error(where, f"bootstrap script {target} does not exist"))
        else:
            raw = files[target]
            if len(raw) > MAX_FILE_BYTES:
                errors.append(doc.error(where, f"bootstrap script {target} is over {MAX_FILE_BYTES} bytes"))
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                errors.append(doc.error(where, f"bootstrap script {target} is not valid UTF-8"))
                continue
            # A script is reviewed in the same diffs: the same characters would hide what it runs.
            hidden = character_problems(target, text)
            errors += hidden
            if not hidden:
                scripts[target] = text
    return errors, scripts


# What a bootstrap cache may not hold: the whole file system, or the kernel's and the runtime's own trees (a
# restore unpacks over them on a new box).
CACHE_REFUSED_ROOTS = ("/proc", "/sys", "/dev", "/run")


def _cache_checks(doc: Doc, where: tuple[str | int, ...], paths: Any) -> list[LoadError]:
    """``bootstrap.cache`` beyond the schema (absolute, at most 16, unique): no ``.`` or ``..`` part, not ``/``, not
    at or under a system root."""
    errors: list[LoadError] = []
    for i, path in enumerate(paths if isinstance(paths, list) else ()):
        if not isinstance(path, str) or not path.startswith("/"):
            continue  # the schema said it
        if not is_cache_path(path):
            errors.append(doc.error((*where, "cache", i), f"cache path {path!r} must not have '.' or '..' parts"))
        elif any(path == root or path.startswith(root + "/") for root in CACHE_REFUSED_ROOTS):
            errors.append(
                doc.error(
                    (*where, "cache", i),
                    f"cache path {path!r} is a system directory ({', '.join(CACHE_REFUSED_ROOTS)} are the kernel's "
                    "and the runtime's): cache what the bootstrap builds, e.g. /opt/venv",
                )
            )
    return errors


def _pool_checks(doc: Doc) -> list[LoadError]:
    """``pools:`` beyond the schema: unique names, min <= max, and no fleet-wide floor beside the pools' own."""
    data = doc.data
    pools = data.get("pools")
    if not pools:
        return []
    errors: list[LoadError] = []
    seen: set[str] = set()
    for i, pool in enumerate(pools):
        if pool["name"] in seen:
            errors.append(doc.error(("pools", i, "name"), f"pool {pool['name']!r} is defined twice"))
        seen.add(pool["name"])
        own = pool.get("provider") == OWN_PROVIDER
        if own and "hosts" not in pool:
            errors.append(doc.error(("pools", i, "provider"), "a provider: ssh pool lists its machines in hosts:"))
        if not own and "hosts" in pool:
            errors.append(
                doc.error(("pools", i, "hosts"), "hosts: are the machines of a provider: ssh pool; add provider: ssh")
            )
        for key in ("offers", "instances"):
            if own and key in pool:
                errors.append(
                    doc.error(
                        ("pools", i, key),
                        f"a provider: ssh pool is its hosts: rigsync never rents for it, so it has no {key}",
                    )
                )
        addresses = [(h.get("address"), h.get("port", 22)) for h in pool.get("hosts", ())]
        for n, where in enumerate(addresses):
            if where in addresses[:n]:
                errors.append(doc.error(("pools", i, "hosts", n), f"host {where[0]}:{where[1]} is listed twice"))
        instances = pool.get("instances", {})
        least, most = (instances.get(k, field_default(Pool, f"instances.{k}")) for k in ("min", "max"))
        if least > most:
            errors.append(
                doc.error(
                    ("pools", i, "instances", "min"),
                    f"min ({least}) is greater than max ({most})",
                )
            )
    if data.get("instances", {}).get("min", 0) > 0:
        errors.append(
            doc.error(
                ("instances", "min"),
                "with pools, each pool keeps its own instances.min; the fleet's instances.min must be 0 "
                "(instances.max still bounds the whole fleet)",
            )
        )
    return errors


# Why zero cannot work for each fleet duration; none of them documents 0 as "off" (ttl is off when omitted).
_ZERO_FLEET_DURATION = {
    "ttl": "every box would be destroyed as soon as it is rented; omit ttl for no limit",
    "boot_timeout": "every box would be destroyed before it could boot",
    "unreachable_grace": "one missed probe would destroy a box and requeue its runs",
    "heartbeat_stale": "every run would be declared lost at once",
    "orphan_timeout": "each box's watchdog would destroy it at once (it runs after this long without a probe)",
    "idle_timeout": "every box would be destroyed before it could take work",
    "bootstrap_timeout": "every box would be destroyed before its bootstrap could run",
}


def _fleet_duration_checks(doc: Doc) -> list[LoadError]:
    """Fleet durations that can never work: zero, too short for the run protocol, or contradicting each other."""
    data = doc.data
    errors: list[LoadError] = []
    zero = {key for key in _ZERO_FLEET_DURATION if key in data and parse_duration(data[key]) <= 0}
    for key in sorted(zero):
        errors.append(doc.error((key,), f"{key} must be longer than 0s: {_ZERO_FLEET_DURATION[key]}"))
    retention = data.get("retention")
    if isinstance(retention, dict) and "harvests_for" in retention and parse_duration(retention["harvests_for"]) <= 0:
        errors.append(doc.error(("retention", "harvests_for"), "retention.harvests_for must be longer than 0s: every "
                                "harvest would be deleted as soon as it is stored; omit it to keep harvests for ever"))
    least_stale = HEARTBEAT_MARGIN * HEARTBEAT_INTERVAL_S
    if "heartbeat_stale" not in zero and duration_or(data, "heartbeat_stale", least_stale) < least_stale:
        errors.append(
            doc.error(
                ("heartbeat_stale",),
                f"heartbeat_stale {data['heartbeat_stale']} is shorter than {least_stale}s: a run's heartbeat is "
                f"touched every {HEARTBEAT_INTERVAL_S}s, so a healthy run would be declared lost (use at least "
                f"{HEARTBEAT_MARGIN}x the period)",
            )
        )
    # Only when both are written: with the default boot_timeout a short ttl (a test fleet's 20s) simply ends first.
    if (
        "ttl" in data
        and "boot_timeout" in data
        and not zero & {"ttl", "boot_timeout"}
        and parse_duration(data["boot_timeout"]) >= parse_duration(data["ttl"])
    ):
        errors.append(
            doc.error(
                ("boot_timeout",),
                f"boot_timeout {data['boot_timeout']} is not shorter than ttl {data['ttl']}: a box would reach its "
                "ttl before it is given up as not booting",
            )
        )
    return errors
