"""A seeded, plausible Vast.ai offer market and the server side of the offer query language.

rigsync ranks offers by DLPerf per $/h under caps, so the emulator needs a market shaped like the real one
(``shared/reference/market.md``): many cheap consumer cards with high DLPerf per dollar, fewer pricey
datacenter cards, a wide price spread for the same card, 1–8 GPUs per box. The query semantics mirror what the
``vastai`` 1.9.1 client sends (``vastai/api/query.py``): numbers arrive as strings, ``verified`` is a virtual
field, ``driver_version`` is compared as a packed integer, ``order`` is a list of ``[field, dir]``.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from reconciler.emulator.exceptions import QueryError


@dataclass(frozen=True)
class Card:
    name: str
    ram_mib: int
    dlperf: float  # per GPU
    price: tuple[float, float]  # $/h per GPU, on-demand
    compute_cap: int
    flops: float  # TFLOPS per GPU
    mem_bw: float
    consumer: bool
    weight: float  # how common in the market
    speed: float  # emulated work speed factor (RTX 3090 = 1.0)


CARDS: tuple[Card, ...] = (
    Card("RTX 2060", 6144, 6.5, (0.025, 0.07), 750, 6.5, 336.0, True, 9, 0.35),
    Card("RTX 3060", 12288, 9.5, (0.03, 0.09), 860, 12.7, 360.0, True, 12, 0.5),
    Card("RTX 3070", 8192, 12.0, (0.04, 0.11), 860, 20.3, 448.0, True, 6, 0.65),
    Card("RTX 3080", 10240, 16.0, (0.06, 0.16), 860, 29.8, 760.0, True, 6, 0.85),
    Card("RTX 3090", 24576, 21.0, (0.09, 0.30), 860, 35.6, 936.0, True, 10, 1.0),
    Card("RTX 4070", 12282, 18.0, (0.07, 0.18), 890, 29.1, 504.0, True, 5, 0.9),
    Card("RTX 4090", 24564, 42.0, (0.25, 0.85), 890, 82.6, 1008.0, True, 10, 2.0),
    Card("RTX 5090", 32607, 60.0, (0.6, 1.15), 1200, 104.8, 1792.0, True, 3, 2.8),
    Card("RTX A4000", 16376, 12.0, (0.04, 0.13), 860, 19.2, 448.0, True, 9, 0.6),
    Card("RTX A5000", 24564, 17.0, (0.10, 0.28), 860, 27.8, 768.0, False, 4, 0.8),
    Card("Titan V", 12288, 14.0, (0.04, 0.12), 700, 14.9, 652.0, True, 6, 0.7),
    Card("Tesla V100", 16384, 21.0, (0.12, 0.40), 700, 15.7, 900.0, False, 4, 1.0),
    Card("L40S", 46068, 50.0, (0.45, 0.95), 890, 91.6, 864.0, False, 3, 2.3),
    Card("A100 PCIE", 40960, 60.0, (0.6, 1.2), 800, 19.5, 1555.0, False, 3, 2.6),
    Card("A100 SXM4", 81920, 70.0, (0.9, 1.4), 800, 19.5, 2039.0, False, 3, 3.0),
    Card("H100 SXM", 81559, 110.0, (1.6, 2.8), 900, 67.0, 3350.0, False, 3, 4.5),
)
CARDS_BY_NAME = {c.name: c for c in CARDS}

GEOS = (
    "Sweden, SE", "United States, US", "Canada, CA", "Germany, DE", "Norway, NO", "France, FR",
    "Poland, PL", "Taiwan, TW", "Japan, JP", "Vietnam, VN", "Czechia, CZ", "Spain, ES", "Finland, FI",
)
CPUS = (
    ("AMD EPYC 7B13 64-Core Processor", 128), ("AMD Ryzen 9 5950X 16-Core Processor", 32),
    ("Intel Xeon E5-2680 v4", 56), ("AMD Ryzen 7 5800X 8-Core Processor", 16), ("Intel Core i9-13900K", 32),
)
DRIVERS = (("535.129.03", 12.2), ("545.29.06", 12.3), ("550.127.05", 12.4), ("560.35.03", 12.6), ("570.86.10", 12.8))


def driver_int(version: str) -> int:
    major, minor, patch = [*version.split("."), "0", "0"][:3]
    return int(major.zfill(3) + minor.zfill(3) + patch.zfill(3))


def speed_factor(gpu_name: str) -> float:
    """How fast emulated work runs on a card, relative to an RTX 3090 (faster cards finish sooner)."""
    card = CARDS_BY_NAME.get(gpu_name)
    return card.speed if card else 1.0


SSH_SHAPES = ("direct", "offers", "proxy")


def direct_port_count(drawn: int, ssh_shapes: str) -> int:
    """An offer's ``direct_port_count`` under the emulator's ``ssh_shapes``: ``direct`` (every offer has direct
    ports, so a rent asking for ``ssh_direc`` always gets one), ``offers`` (as drawn: a quarter have none and rent
    proxy-only), ``proxy`` (none has any)."""
    if ssh_shapes not in SSH_SHAPES:
        raise ValueError(f"ssh_shapes must be one of {', '.join(SSH_SHAPES)}, got {ssh_shapes!r}")
    if ssh_shapes == "proxy":
        return 0
    return (drawn or 20) if ssh_shapes == "direct" else drawn


def _generate(rng: random.Random, n: int, now: float) -> list[dict[str, Any]]:
    offers: list[dict[str, Any]] = []
    weights = [c.weight for c in CARDS]
    used_ids: set[int] = set()
    for i in range(n):
        card = rng.choices(CARDS, weights)[0]
        if card.consumer:
            num = rng.choices((1, 2, 4, 8), (55, 20, 17, 8))[0]
        else:
            num = rng.choices((1, 2, 4, 8), (35, 20, 20, 25))[0]
        oid = rng.randrange(10_000_000, 40_000_000)
        while oid in used_ids:
            oid = rng.randrange(10_000_000, 40_000_000)
        used_ids.add(oid)
        machine_id = 10_000 + i * 7 + rng.randrange(7)
        per_gpu = round(rng.uniform(*card.price), 4)
        dph_base = round(per_gpu * num, 4)
        rel = round(min(0.9999, rng.choices((rng.uniform(0.80, 0.95), rng.uniform(0.95, 0.9999)), (25, 75))[0]), 4)
        cpu_name, cores = rng.choice(CPUS)
        driver, cuda = rng.choice(DRIVERS)
        inet_down = round(rng.uniform(50, 2000), 1)
        inet_up = round(inet_down * rng.uniform(0.3, 1.0), 1)
        disk_space = round(rng.uniform(40, 2000), 1)
        storage_cost = round(rng.uniform(0.05, 0.3), 3)
        dlperf = round(card.dlperf * num * rng.uniform(0.85, 1.05), 2)
        verified = rng.random() < 0.85
        external = rng.random() < 0.08
        cpu_ram = int(rng.choice((16, 32, 64, 128, 256)) * 1000 * max(1, num // 2) + rng.randrange(-500, 500))
        end = now + rng.uniform(3, 180) * 86400
        offers.append({
            "id": oid, "ask_contract_id": oid, "bundle_id": oid + 1_000_000_000, "bundled_results": None,
            "machine_id": machine_id, "host_id": 100_000 + machine_id % 5000,
            "num_gpus": num, "gpu_name": card.name, "gpu_arch": "nvidia",
            "gpu_ram": card.ram_mib, "gpu_total_ram": card.ram_mib * num, "gpu_frac": 1.0,
            "gpu_lanes": 16, "gpu_mem_bw": card.mem_bw, "gpu_max_power": 350.0, "gpu_max_temp": 90.0,
            "gpu_display_active": False, "gpu_ids": [rng.randrange(1000, 9999) for _ in range(num)],
            "compute_cap": card.compute_cap, "cuda_max_good": cuda, "driver_version": driver,
            "driver_vers": driver_int(driver), "bw_nvlink": 0.0 if card.consumer else 100.0,
            "cpu_name": cpu_name, "cpu_arch": "amd64", "cpu_cores": cores,
            "cpu_cores_effective": float(max(2, cores * num // 8)), "cpu_ghz": round(rng.uniform(2.4, 5.2), 1),
            "cpu_ram": cpu_ram, "has_avx": 1, "mobo_name": "ROMED8-2T", "pci_gen": float(rng.choice((3, 4, 4, 5))),
            "pcie_bw": round(rng.uniform(6, 26), 1), "disk_space": disk_space,
            "disk_bw": round(rng.uniform(500, 6000), 1),
            "disk_name": "Samsung SSD 990 PRO 2TB", "inet_up": inet_up, "inet_down": inet_down,
            "inet_up_cost": 0.003, "inet_down_cost": 0.003, "internet_up_cost_per_tb": 3.0,
            "internet_down_cost_per_tb": 3.0, "direct_port_count": rng.choice((0, 20, 100, 500)),
            "dph_base": dph_base, "min_bid": round(dph_base * rng.uniform(0.25, 0.5), 4),
            "storage_cost": storage_cost, "vram_costperhour": 1.37e-05, "credit_discount_max": 0.4,
            "discount_rate": 0.0, "discounted_hourly": 0.0, "dlperf": dlperf,
            "total_flops": round(card.flops * num, 2),
            "reliability": rel, "reliability2": rel, "reliability_mult": round(0.99 + rel / 100, 4),
            "expected_reliability": round(rel * 0.998, 4), "rentable": True, "rented": False,
            "is_bid": False, "external": external, "hosting_type": 0 if card.consumer else rng.choice((0, 1)),
            "hostname": None, "public_ipaddr": f"203.0.113.{1 + i % 254}", "static_ip": rng.random() < 0.7,
            "geolocation": rng.choice(GEOS), "geolocode": rng.randrange(100, 2000),
            "os_version": rng.choice(("20.04", "22.04", "24.04")),
            "verification": "verified" if verified else "unverified", "vericode": 1 if verified else 0,
            "vms_enabled": False, "is_vm_deverified": False, "resource_type": "gpu", "cluster_id": None,
            "avail_vol_ask_id": None, "avail_vol_dph": None, "avail_vol_size": None,
            "nw_disk_min_bw": None, "nw_disk_max_bw": None, "nw_disk_avg_bw": None,
            "start_date": now - rng.uniform(1, 60) * 86400, "end_date": end, "duration": end - now,
            "time_remaining": "", "time_remaining_isbid": "", "logo": "/static/logos/vastai_small2.png",
            "webpage": None,
        })
    return offers


def price(offer: dict[str, Any], storage_gb: float, bid: bool) -> dict[str, Any]:
    """The offer as a search returns it for ``storage_gb`` of disk: totals and per-dollar figures filled in."""
    o = dict(offer)
    base = o["min_bid"] if bid else o["dph_base"]
    disk_hour = o["storage_cost"] * storage_gb / (30 * 24)
    total = round(base + disk_hour, 6)
    o["is_bid"] = bid
    o["dph_total"] = total
    o["dph_total_adj"] = total
    o["discounted_dph_total"] = total
    o["storage_total_cost"] = round(disk_hour, 7)
    o["dlperf_per_dphtotal"] = round(o["dlperf"] / total, 3)
    o["flops_per_dphtotal"] = round(o["total_flops"] / total, 3)
    o["score"] = round(o["dlperf_per_dphtotal"] * o["reliability"] ** 4, 3)
    o["search"] = o["instance"] = {
        "gpuCostPerHour": base, "diskHour": round(disk_hour, 7), "totalHour": total,
        "discountTotalHour": 0.0, "discountedTotalPerHour": total,
    }
    return o


# Query fields that are not record keys of the same name.
def _field_value(o: dict[str, Any], field: str) -> Any:
    if field == "verified":
        return o["verification"] == "verified"
    if field == "driver_version":
        return o["driver_vers"]
    if field == "ubuntu_version":
        return float(o["os_version"])
    if field == "datacenter":
        return o["hosting_type"] == 1
    if field in ("cuda_vers",):
        return o["cuda_max_good"]
    if field == "gpu_total_ram":
        return o["gpu_total_ram"]
    return o.get(field, _MISSING)


_MISSING = object()


def _coerce(want: Any, like: Any) -> Any:
    """Convert a query value to the record value's type (the client sends numbers as strings)."""
    if want is None or isinstance(like, str):
        return want if not isinstance(want, (int, float)) or isinstance(want, bool) else str(want)
    if isinstance(like, bool):
        if isinstance(want, bool):
            return want
        if isinstance(want, str) and want.lower() in ("true", "false"):
            return want.lower() == "true"
        raise QueryError(f"expected true/false, got {want!r}")
    if isinstance(like, (int, float)):
        if isinstance(want, bool):
            return float(want)
        try:
            return float(want)
        except (TypeError, ValueError):
            raise QueryError(f"expected a number, got {want!r}") from None
    return want


def _geo(field: str, value: Any, wants: list[Any]) -> Any:
    """``geolocation`` is matched by country code (``SE``) when the query gives a code, as the service does."""
    if field == "geolocation" and isinstance(value, str) and all(isinstance(w, str) and len(w) == 2 for w in wants):
        return value.rsplit(", ", 1)[-1]
    return value


_OPS = {"eq", "neq", "gt", "gte", "lt", "lte", "in", "notin"}


def matches(o: dict[str, Any], query: dict[str, Any]) -> bool:
    for field, cond in query.items():
        if field in ("order", "type", "limit", "allocated_storage", "disable_bundling", "select_cols"):
            continue
        if not isinstance(cond, dict):
            raise QueryError(f"condition for {field!r} must be an object like {{\"gte\": 1}}")
        value = _field_value(o, field)
        for op, raw in cond.items():
            if op not in _OPS:
                raise QueryError(f"unknown operator {op!r} for field {field!r}")
            if value is _MISSING:
                return False
            if op in ("in", "notin"):
                items = raw if isinstance(raw, list) else [raw]
                vals = [_coerce(x, value) for x in items]
                if (_geo(field, value, vals) in vals) != (op == "in"):
                    return False
                continue
            want = _coerce(raw, value)
            value = _geo(field, value, [want])
            if op == "eq":
                ok = value == want
            elif op == "neq":
                ok = value != want
            elif value is None or want is None:
                ok = False
            elif op == "gt":
                ok = value > want
            elif op == "gte":
                ok = value >= want
            elif op == "lt":
                ok = value < want
            else:
                ok = value <= want
            if not ok:
                return False
    return True


class Market:
    """The offers for rent. Thread-safe; a rented offer leaves the market until its instance is destroyed.

    Every offer has a fixed ``end_date`` (3 to 180 days out, or ``contract_s=(lo, hi)`` seconds for tests): a
    contract rented on it ends then. A search lists ``duration`` as the seconds left until it (what the client's
    ``duration>=X`` days filters on) and leaves out offers whose end has passed.
    """

    def __init__(
        self,
        seed: int = 0,
        n: int = 200,
        now: float | None = None,
        *,
        clock: Callable[[], float] | None = None,
        contract_s: tuple[float, float] | None = None,
        ssh_shapes: str = "direct",
    ) -> None:
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._clock: Callable[[], float] = clock or time.time
        start = self._clock() if now is None else now
        self._offers: dict[int, dict[str, Any]] = {o["id"]: o for o in _generate(self._rng, n, start)}
        for o in self._offers.values():
            o["direct_port_count"] = direct_port_count(int(o["direct_port_count"]), ssh_shapes)
        self._rented: set[int] = set()
        if contract_s is not None:
            self.set_contracts(contract_s[0], contract_s[1], seed=seed, now=start)

    def set_contracts(self, lo_s: float, hi_s: float, *, seed: int = 0, now: float | None = None) -> None:
        """Give every offer a contract ending ``lo_s`` to ``hi_s`` seconds from now (drawn apart from the market's
        own draws, so the offers are otherwise the same for a seed)."""
        if not (0 <= lo_s <= hi_s):
            raise ValueError(f"contract_s must be 0 <= lo <= hi, got ({lo_s}, {hi_s})")
        rng = random.Random(f"contracts-{seed}")
        at = self._clock() if now is None else now
        with self._lock:
            for oid in sorted(self._offers):
                o = self._offers[oid]
                o["end_date"] = at + rng.uniform(lo_s, hi_s)
                o["duration"] = o["end_date"] - at

    def all(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(o) for o in self._offers.values()]

    def get(self, offer_id: int) -> dict[str, Any] | None:
        with self._lock:
            o = self._offers.get(offer_id)
            return dict(o) if o is not None else None

    def is_available(self, offer_id: int) -> bool:
        """Listed, not rented, and its contract not already past its end."""
        now = self._clock()
        with self._lock:
            o = self._offers.get(offer_id)
            return o is not None and offer_id not in self._rented and o["end_date"] > now

    def rent(self, offer_id: int) -> dict[str, Any] | None:
        """Take an offer off the market; None when unknown or already rented."""
        with self._lock:
            o = self._offers.get(offer_id)
            if o is None or offer_id in self._rented:
                return None
            self._rented.add(offer_id)
            return dict(o)

    def release(self, offer_id: int) -> None:
        with self._lock:
            self._rented.discard(offer_id)

    def drift(self, max_fraction: float = 0.1, seed: int | None = None) -> None:
        """Move every on-demand price by up to ±max_fraction, as hosts reprice."""
        rng = random.Random(seed) if seed is not None else self._rng
        with self._lock:
            for o in self._offers.values():
                f = 1 + rng.uniform(-max_fraction, max_fraction)
                o["dph_base"] = round(max(0.005, o["dph_base"] * f), 4)
                o["min_bid"] = round(min(o["min_bid"] * f, o["dph_base"]), 4)

    def search(self, query: dict[str, Any]) -> list[dict[str, Any]]:
        """Offers matching ``query`` (the flat JSON body of ``POST /bundles/``), ordered and limited."""
        storage = float(query.get("allocated_storage") or 5.0)
        kind = str(query.get("type") or "on-demand")
        if kind not in ("on-demand", "ondemand", "bid", "reserved", "interruptible"):
            raise QueryError(f"unknown offer type {kind!r} (on-demand, bid, reserved)")
        bid = kind in ("bid", "interruptible")
        now = self._clock()
        with self._lock:
            pool = [
                price(o, storage, bid) for oid, o in self._offers.items()
                if oid not in self._rented and o["end_date"] > now  # an offer past its end is not for rent
            ]
        for o in pool:
            o["rented"] = False
            o["duration"] = o["end_date"] - now  # seconds left, as the service computes it per request
        hits = [o for o in pool if matches(o, query)]
        order = query.get("order")
        if order is None:
            order = [["score", "desc"]]
        if not isinstance(order, list):
            raise QueryError("order must be a list of [field, \"asc\"|\"desc\"]")
        hits.sort(key=lambda o: o["id"])
        for item in reversed(order):
            if not isinstance(item, list) or not item:
                raise QueryError("order must be a list of [field, \"asc\"|\"desc\"]")
            fld = str(item[0])
            desc = len(item) > 1 and str(item[1]).lower() == "desc"
            hits.sort(key=lambda o, f=fld: _sort_key(o, f), reverse=desc)  # type: ignore[misc]
        limit = query.get("limit")
        if limit is not None:
            try:
                hits = hits[: max(0, int(limit))]
            except (TypeError, ValueError):
                raise QueryError(f"limit must be an integer, got {limit!r}") from None
        for rank, o in enumerate(hits, 1):
            o["rn"] = rank
        return hits


def _sort_key(o: dict[str, Any], field: str) -> tuple[int, Any]:
    v = _field_value(o, field)
    if v is _MISSING or v is None:
        return (0, 0)
    if isinstance(v, (int, float)):
        return (1, float(v))
    return (2, str(v))
