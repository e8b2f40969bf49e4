"""Which market offers a fleet accepts, and in which order: one definition, used by the planner and the Vast adapter.

Pure: no I/O, no clock; imports only the standard library and ``reconciler.core.model`` (and the country table beside
it). ``RULES`` is a declarative table with one row per filter in ``model.OfferFilters`` plus the fleet's disk: the
``Offer`` attribute it constrains, how the filter's value limits it, and the term the ``vastai`` 1.9.1 client's
query language spells it with. ``offer_passes`` (the planner's test and the adapter's re-check of what the server
returned) and ``vast_query_terms`` (what the adapter asks the server for) both walk that table, so a filter cannot
be added to one and not the other. The query is never stricter than ``offer_passes``: a limit it cannot spell
safely is left out of the query and checked client-side only.

Semantics, decided once:

* GPU names compare case-insensitively, with spaces and underscores equal and runs of them folded:
  ``"RTX 3090" == "rtx_3090" == "RTX__3090 "``. The query spells a name the way the market does (``RTX_3090`` for
  a known model; the client turns ``_`` back into a space), plus the name as written when that differs.
* Geolocations are ISO 3166-1 alpha-2 country codes or English country names (``"DE"``, ``"de"``, ``"Germany"``,
  ``"United States"``, ``"USA"``), case-insensitive. An offer's ``geolocation`` (Vast writes ``"Sweden, SE"``,
  ``"California, US"``, ``"US"``) resolves to its country code(s) and matches when they meet the filter's. There is
  no substring matching; an entry that is not a country (``"E"``, ``"Atlantis"``) matches nothing here and is
  refused by the desired-state loader (``country_code`` returns None for it).
* A pool's per-box price cap is ``box_cap_dph``: its ``max_dph`` and the budget's ``max_instance_dph``, the lower.
* Numeric limits are inclusive (``>=`` a minimum, ``<=`` a maximum); None means no constraint. ``num_gpus_min``
  below 1 counts as 1; a negative or NaN ``dph_max`` counts as 0. The offer's disk must hold the fleet's
  ``disk_gb``. An offer whose ``dph_total`` is not a finite non-negative number never passes.
* ``verified: true`` accepts only verified hosts; ``false`` accepts any.
* Host reliability (``observed/hosts.yaml``, ``model.HostLedger``) is read here too, in one place: a machine named
  in the fleet's ``avoid_machines``, or with ``blacklist_after`` host faults or more, is never rented; an offer
  whose rent failed is skipped for ``ghost_cooldown``; and every other offer is ranked with the penalty
  ``HOST_FAULT_PENALTY ** faults`` (``host_penalty``): each fault of its machine halves its score (dlperf,
  dlperf per $, reliability) or doubles its price (``price`` ranking). A machine rigsync never rented has no
  penalty and no bonus.
* ``GPU_RAM_GIB`` is the most memory per GPU of each known model (its largest variant); the loader refuses a sweep
  that needs more than every model a fleet names has, and says nothing about a model not in the table.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from functools import cache, lru_cache
from typing import Any

from reconciler.core.model import Budget, Fleet, HostLedger, HostRecord, Offer, OfferFilters, Pool, Ranking

__all__ = [
    "BID_OVER_MIN",
    "GPU_RAM_GIB",
    "HOST_FAULT_PENALTY",
    "KNOWN_GPU_NAMES",
    "RULES",
    "Rule",
    "as_interruptible",
    "box_cap_dph",
    "country_code",
    "gpu_name_problem",
    "host_penalty",
    "most_gpu_ram_gib",
    "normalize_gpu_name",
    "offer_countries",
    "offer_passes",
    "offer_skipped",
    "rank_key",
    "rejected_by",
    "vast_gpu_spellings",
    "vast_query_terms",
]

# --------------------------------------------------------------------------------------------- GPU names

# GPU models as the Vast.ai market spells them (its ``gpu_name``). Only used to spell a query: a name that is not
# listed is sent as written, and matching offers client-side never needs the list.
KNOWN_GPU_NAMES: tuple[str, ...] = (
    "GTX 1070", "GTX 1070 Ti", "GTX 1080", "GTX 1080 Ti", "GTX 1660", "GTX 1660 Ti",
    "RTX 2060", "RTX 2060S", "RTX 2070", "RTX 2070S", "RTX 2080", "RTX 2080S", "RTX 2080 Ti",
    "RTX 3050", "RTX 3060", "RTX 3060 Ti", "RTX 3070", "RTX 3070 Ti", "RTX 3080", "RTX 3080 Ti",
    "RTX 3090", "RTX 3090 Ti",
    "RTX 4060", "RTX 4060 Ti", "RTX 4070", "RTX 4070S", "RTX 4070 Ti", "RTX 4080", "RTX 4080S", "RTX 4090",
    "RTX 5060 Ti", "RTX 5070", "RTX 5070 Ti", "RTX 5080", "RTX 5090",
    "RTX A2000", "RTX A4000", "RTX A4500", "RTX A5000", "RTX A6000",
    "RTX 4000Ada", "RTX 5000Ada", "RTX 6000Ada",
    "Q RTX 4000", "Q RTX 5000", "Q RTX 6000", "Q RTX 8000",
    "Titan V", "Titan RTX", "Titan Xp",
    "Tesla K80", "Tesla P4", "Tesla P40", "Tesla P100", "Tesla T4", "Tesla V100",
    "A10", "A16", "A30", "A40", "A100 PCIE", "A100 SXM4", "A100X",
    "L4", "L40", "L40S", "H100 PCIE", "H100 SXM", "H100 NVL", "H200", "B200",
)

# The most memory per GPU each known model comes with, in GiB (the largest variant: A100 80, not 40). Used only to
# refuse a sweep that asks more of every model a fleet names; a model missing here is never refused.
GPU_RAM_GIB: dict[str, float] = {
    "GTX 1070": 8, "GTX 1070 Ti": 8, "GTX 1080": 8, "GTX 1080 Ti": 11, "GTX 1660": 6, "GTX 1660 Ti": 6,
    "RTX 2060": 12, "RTX 2060S": 8, "RTX 2070": 8, "RTX 2070S": 8, "RTX 2080": 8, "RTX 2080S": 8, "RTX 2080 Ti": 11,
    "RTX 3050": 8, "RTX 3060": 12, "RTX 3060 Ti": 8, "RTX 3070": 8, "RTX 3070 Ti": 8, "RTX 3080": 12,
    "RTX 3080 Ti": 12, "RTX 3090": 24, "RTX 3090 Ti": 24,
    "RTX 4060": 8, "RTX 4060 Ti": 16, "RTX 4070": 12, "RTX 4070S": 12, "RTX 4070 Ti": 16, "RTX 4080": 16,
    "RTX 4080S": 16, "RTX 4090": 24,
    "RTX 5060 Ti": 16, "RTX 5070": 12, "RTX 5070 Ti": 16, "RTX 5080": 16, "RTX 5090": 32,
    "RTX A2000": 12, "RTX A4000": 16, "RTX A4500": 20, "RTX A5000": 24, "RTX A6000": 48,
    "RTX 4000Ada": 20, "RTX 5000Ada": 32, "RTX 6000Ada": 48,
    "Q RTX 4000": 8, "Q RTX 5000": 16, "Q RTX 6000": 24, "Q RTX 8000": 48,
    "Titan V": 12, "Titan RTX": 24, "Titan Xp": 12,
    "Tesla K80": 12, "Tesla P4": 8, "Tesla P40": 24, "Tesla P100": 16, "Tesla T4": 16, "Tesla V100": 32,
    "A10": 24, "A16": 16, "A30": 24, "A40": 48, "A100 PCIE": 80, "A100 SXM4": 80, "A100X": 80,
    "L4": 24, "L40": 48, "L40S": 48, "H100 PCIE": 80, "H100 SXM": 80, "H100 NVL": 94, "H200": 141, "B200": 192,
}

_SEPARATORS = re.compile(r"[\s_]+")
_QUERY_BREAKERS = frozenset('[],"')  # characters the vastai client's query parser cannot carry in a list value


@lru_cache(maxsize=4096)
def normalize_gpu_name(name: str) -> str:
    """The form GPU names are compared in: case-folded, runs of spaces/underscores as one space, stripped."""
    return _SEPARATORS.sub(" ", name).strip().casefold()


_CANONICAL_GPU = {normalize_gpu_name(n): n for n in KNOWN_GPU_NAMES}
_GPU_RAM_BY_NAME = {normalize_gpu_name(n): ram for n, ram in GPU_RAM_GIB.items()}


def gpu_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a ``gpu_names`` entry, or None when it can (the loader reports the reason)."""
    if not normalize_gpu_name(name):
        return "is blank"
    bad = sorted(c for c in set(name) if c in _QUERY_BREAKERS or (not c.isprintable() and not c.isspace()))
    if bad:
        chars = " ".join(repr(c) for c in bad)
        return f"may not contain {chars}: the Vast query cannot carry them (list each model as its own entry)"
    return None


def vast_gpu_spellings(names: Iterable[str]) -> list[str]:
    """The query-language spellings of ``names`` (spaces as ``_``): the market's spelling of a known model and the
    name as written when that differs, in order, without duplicates; names the query cannot carry are left out."""
    out: list[str] = []
    for name in names:
        if gpu_name_problem(name) is not None:
            continue
        canonical = _CANONICAL_GPU.get(normalize_gpu_name(name))
        for spelling in (canonical, name):
            if spelling is None:
                continue
            term = _SEPARATORS.sub("_", spelling.strip()).strip("_")
            if term not in out:
                out.append(term)
    return out


def most_gpu_ram_gib(names: Iterable[str]) -> float | None:
    """The most GPU memory any of ``names`` can have, in GiB; None when a name is not in ``GPU_RAM_GIB`` (or none
    is given), since then nothing is known about it."""
    most = 0.0
    for name in names:
        ram = _GPU_RAM_BY_NAME.get(normalize_gpu_name(name))
        if ram is None:
            return None
        most = max(most, ram)
    return most or None


@lru_cache(maxsize=256)
def _gpu_name_set(names: tuple[str, ...]) -> frozenset[str]:
    return frozenset(normalize_gpu_name(n) for n in names)


# --------------------------------------------------------------------------------------------- countries


def _fold(text: str) -> str:
    decomposed = unicodedata.normalize("NFKD", text)
    plain = "".join(c for c in decomposed if not unicodedata.combining(c))
    return _SEPARATORS.sub(" ", plain).strip().casefold()


@cache
def _countries() -> tuple[Mapping[str, str], dict[str, str]]:
    """(each alpha-2 code -> its name, each folded name or alias -> its code), read from the ISO database on first
    use: pycountry costs every command's start-up a tenth of a second, and most desired/ trees name no country."""
    from reconciler.core.countries import ALIASES, NAMES

    by_name = {_fold(name): code for code, name in NAMES.items()}
    by_name.update((_fold(name), code) for name, code in ALIASES.items())
    return NAMES, by_name


def country_code(entry: str) -> str | None:
    """The ISO 3166-1 alpha-2 code ``entry`` names, or None when it names no country.

    ``entry`` is a code or an English name, compared case-insensitively (accents, spaces and underscores folded):
    ``"de"``, ``"DE"``, ``"Germany"`` -> ``"DE"``; ``"USA"``, ``"United States"`` -> ``"US"``; ``"E"`` -> None.
    """
    names, by_name = _countries()
    folded = _fold(entry)
    if len(folded) == 2 and folded.upper() in names:
        return folded.upper()
    return by_name.get(folded)


@lru_cache(maxsize=4096)
def offer_countries(geolocation: str) -> frozenset[str]:
    """The country codes an offer's ``geolocation`` names: ``"Sweden, SE"`` -> {SE}, ``"California, US"`` -> {US}.

    A trailing comma-separated part that is a country code decides (so the state in ``"Georgia, US"`` is not read
    as the country); otherwise the whole text, then each part, is read as a code or a country name.
    """
    whole = country_code(geolocation)
    if whole is not None:
        return frozenset({whole})
    parts = [p.strip() for p in geolocation.split(",") if p.strip()]
    if parts and parts[-1].upper() in _countries()[0]:
        return frozenset({parts[-1].upper()})
    return frozenset(code for p in parts if (code := country_code(p)) is not None)


@lru_cache(maxsize=256)
def _country_set(entries: tuple[str, ...]) -> frozenset[str]:
    return frozenset(code for e in entries if (code := country_code(e)) is not None)


# --------------------------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Rule:
    """One filter. ``limit(filters, disk_gb)`` is its constraint (None: no constraint); an offer passes when
    ``accepts(<the offer's offer_attr>, limit)``; ``vast_term(limit)`` is its query term (None: none)."""

    key: str  # the OfferFilters field, or "disk_gb" (the fleet's disk, passed alongside the filters)
    offer_attr: str  # the Offer attribute it constrains
    limit: Callable[[OfferFilters, float], Any]
    accepts: Callable[[Any, Any], bool]
    vast_term: Callable[[Any], str | None]
    vast_field: str | None  # the field the query names (after the client's aliases); None: client-side only


def _num(x: float) -> str:
    return repr(float(x)) if not float(x).is_integer() else str(int(x))


def _vast_number(limit: float, multiplier: float, at_least: bool) -> str | None:
    """``limit`` in the client's units, spelled so that ``float(text) * multiplier`` (what the client sends) is never
    stricter than ``limit``; None when it cannot be (the limit is then checked client-side only)."""
    if not math.isfinite(limit):
        return None
    x = limit / multiplier
    for _ in range(8):
        text = _num(x)
        sent = float(text) * multiplier
        if (sent <= limit) if at_least else (sent >= limit):
            return text
        x = math.nextafter(x, -math.inf if at_least else math.inf)
    return None


def _field(key: str) -> Callable[[OfferFilters, float], Any]:
    return lambda f, _d: getattr(f, key)


def _at_least(
    key: str, attr: str, query_name: str, *, vast_field: str | None = None, multiplier: float = 1.0,
    limit: Callable[[OfferFilters, float], Any] | None = None,
) -> Rule:
    def term(lim: float | None) -> str | None:
        text = None if lim is None else _vast_number(lim, multiplier, at_least=True)
        return None if text is None else f"{query_name}>={text}"

    return Rule(
        key=key, offer_attr=attr, limit=limit or _field(key), accepts=lambda value, lim: bool(value >= lim),
        vast_term=term, vast_field=vast_field or query_name,
    )


def _at_most(
    key: str, attr: str, query_name: str, *, vast_field: str | None = None,
    limit: Callable[[OfferFilters, float], Any] | None = None,
) -> Rule:
    def term(lim: float | None) -> str | None:
        text = None if lim is None else _vast_number(lim, 1.0, at_least=False)
        return None if text is None else f"{query_name}<={text}"

    return Rule(
        key=key, offer_attr=attr, limit=limit or _field(key), accepts=lambda value, lim: bool(value <= lim),
        vast_term=term, vast_field=vast_field or query_name,
    )


def _cap(value: float | None) -> float | None:
    """A maximum read defensively: None is no cap; negative or NaN is 0 (the safe side)."""
    if value is None:
        return None
    return 0.0 if math.isnan(value) or value < 0 else float(value)


def _gpu_term(names: tuple[str, ...] | None) -> str | None:
    spellings = vast_gpu_spellings(names or ())
    return f"gpu_name in [{','.join(spellings)}]" if spellings else None


RULES: tuple[Rule, ...] = (
    Rule(
        key="gpu_names", offer_attr="gpu_name",
        limit=lambda f, _d: tuple(f.gpu_names) or None,
        accepts=lambda value, names: normalize_gpu_name(value) in _gpu_name_set(names),
        vast_term=_gpu_term, vast_field="gpu_name",
    ),
    _at_least("num_gpus_min", "num_gpus", "num_gpus", limit=lambda f, _d: max(1, f.num_gpus_min)),
    _at_most("num_gpus_max", "num_gpus", "num_gpus"),
    # The client reads gpu_ram in GB and multiplies by 1000; the offer's gpu_ram is MB (the model calls it MiB).
    _at_least("gpu_ram_mib_min", "gpu_ram_mib", "gpu_ram", multiplier=1000.0),
    _at_least("reliability_min", "reliability", "reliability"),
    _at_least("inet_down_mbps_min", "inet_down_mbps", "inet_down"),
    _at_most("dph_max", "dph_total", "dph", vast_field="dph_total", limit=lambda f, _d: _cap(f.dph_max)),
    _at_least("dlperf_per_dph_min", "dlperf_per_dph", "dlperf_usd", vast_field="dlperf_per_dphtotal"),
    _at_least("cuda_min", "cuda", "cuda_vers", vast_field="cuda_max_good"),
    Rule(
        key="verified", offer_attr="verified",
        limit=lambda f, _d: True if f.verified else None,
        accepts=lambda value, _lim: bool(value),
        # "any" must be said: the client adds verified=true to every query that does not.
        vast_term=lambda lim: "verified=true" if lim else "verified=any", vast_field="verified",
    ),
    Rule(
        key="geolocations", offer_attr="geolocation",
        limit=lambda f, _d: tuple(f.geolocations) or None,
        accepts=lambda value, entries: bool(offer_countries(value) & _country_set(entries)),
        vast_term=lambda _lim: None, vast_field=None,  # client-side only
    ),
    _at_least("disk_gb", "disk_space_gb", "disk_space", limit=lambda _f, d: d),
)


def _price_is_sane(offer: Offer) -> bool:
    return math.isfinite(offer.dph_total) and offer.dph_total >= 0


def _active_rules(filters: OfferFilters, disk_gb: float) -> list[tuple[str, str, Callable[[Any, Any], bool], Any]]:
    """The rules that constrain these filters, each with its limit worked out once: (key, attr, accepts, limit)."""
    active = []
    for rule in RULES:
        limit = rule.limit(filters, disk_gb)
        if limit is not None:
            active.append((rule.key, rule.offer_attr, rule.accepts, limit))
    return active


def _first_rejection(offer: Offer, active: list[tuple[str, str, Callable[[Any, Any], bool], Any]]) -> str | None:
    if not _price_is_sane(offer):
        return "dph_total"
    for key, attr, accepts, limit in active:
        if not accepts(getattr(offer, attr), limit):
            return key
    return None


def rejected_by(offer: Offer, filters: OfferFilters, disk_gb: float) -> str | None:
    """The first rule ``offer`` fails (its ``key``; ``"dph_total"`` for a nonsensical price), or None if it passes."""
    return _first_rejection(offer, _active_rules(filters, disk_gb))


def offer_passes(offer: Offer, filters: OfferFilters, disk_gb: float) -> bool:
    """Whether ``offer`` passes the fleet's filters and holds ``disk_gb`` (budget caps are checked separately)."""
    return rejected_by(offer, filters, disk_gb) is None


def box_cap_dph(pool: Pool, budget: Budget) -> float:
    """The most one box of ``pool`` may cost per hour: the lower of its filter's ``max_dph`` and the budget's
    ``max_instance_dph`` (``math.inf``: no cap; a negative or NaN one counts as 0).

    The one rule for a pool's per-box cap: renting holds it, and the estimate, the budget's headroom and review
    price a sweep's work at the places under its own pool's cap.
    """
    caps = [c for c in (_cap(pool.filters.dph_max), _cap(budget.max_instance_dph)) if c is not None]
    return min(caps, default=math.inf)


def passing_offers(offers: Iterable[Offer], filters: OfferFilters, disk_gb: float) -> list[Offer]:
    """The offers that pass (``offer_passes`` for each), with the filters' limits worked out once for all."""
    active = _active_rules(filters, disk_gb)
    return [o for o in offers if _first_rejection(o, active) is None]


def vast_query_terms(filters: OfferFilters, disk_gb: float) -> list[str]:
    """The ``vastai`` query-language terms for the filters, in table order (join with spaces for the SDK)."""
    terms = []
    for rule in RULES:
        term = rule.vast_term(rule.limit(filters, disk_gb))
        if term:
            terms.append(term)
    return terms


# ------------------------------------------------------------------------------------------------ ranking


BID_OVER_MIN = 1.2  # rigsync bids this much over an offer's minimum bid (capped at max_bid_dph): outbid less often


def as_interruptible(offer: Offer, max_bid_dph: float | None) -> Offer | None:
    """``offer`` priced as an interruptible box (``bid_dph`` set, ``dph_total`` the bid plus its storage), or None
    when it cannot be: no bids allowed or offered, ``max_bid_dph`` below its minimum bid, or no cheaper than on-demand.

    The bid is ``BID_OVER_MIN`` times the minimum bid, at most ``max_bid_dph``. Everything downstream (filters such as
    max_dph, ranking, caps, the budget and the plan's price) then sees the price actually paid.
    """
    if max_bid_dph is None or offer.min_bid is None or not math.isfinite(offer.min_bid) or offer.min_bid <= 0:
        return None
    bid = round(min(max_bid_dph, offer.min_bid * BID_OVER_MIN), 4)
    if bid < offer.min_bid:
        return None
    price = round(bid + max(0.0, offer.storage_dph), 6)
    if not price < offer.dph_total:
        return None
    return replace(offer, dph_total=price, dlperf_per_dph=offer.dlperf / price if price > 0 else 0.0, bid_dph=bid)


HOST_FAULT_PENALTY = 0.5  # each host fault of an offer's machine multiplies its ranking score by this


def host_penalty(record: HostRecord | None) -> float:
    """The factor an offer's ranking score is multiplied by for its machine's faults: 1 for a clean or unknown host."""
    return 1.0 if record is None else HOST_FAULT_PENALTY ** record.faults


def offer_skipped(offer: Offer, fleet: Fleet, ledger: HostLedger, now: float) -> tuple[str, str] | None:
    """Why the host reliability rules keep ``offer`` from being rented now, or None when they do not:
    (``"host"`` for a machine avoided by hand or blacklisted, ``"ghost"`` for an offer in its cooldown, the text)."""
    if offer.machine_id in fleet.avoid_machines:
        return "host", f"machine {offer.machine_id} is in avoid_machines"
    record = ledger.host(offer.machine_id)
    if record is not None and fleet.blacklist_after > 0 and record.faults >= fleet.blacklist_after:
        return "host", (
            f"machine {offer.machine_id} is blacklisted: {record.faults} host fault(s) >= blacklist_after "
            f"{fleet.blacklist_after} ({_fault_text(record)})"
        )
    ghost = ledger.ghost(offer.id)
    if ghost is not None and now - ghost.failed_at < fleet.ghost_cooldown_s:
        left = fleet.ghost_cooldown_s - (now - ghost.failed_at)
        ago = int(now - ghost.failed_at)
        return "ghost", f"its rent failed {ago}s ago ({ghost.detail or 'no detail'}); skipped {int(left)}s more"
    return None


def _fault_text(record: HostRecord) -> str:
    parts = [
        (record.boot_timeouts, "boot timeout"),
        (record.bootstrap_failures, "bootstrap failure"),
        (record.vanishes, "vanish"),
        (record.hangs, "hang"),
        (record.unusable, "unusable box"),
    ]
    return ", ".join(f"{n} {what}{'s' if n > 1 else ''}" for n, what in parts if n)


def rank_key(
    ranking: Ranking, ledger: HostLedger | None = None, work: Mapping[int, float] | None = None
) -> Callable[[Offer], tuple[float, int]]:
    """Sort key for offers that passed: price ascending, or dlperf / reliability / dlperf per $ / predicted work
    per $ descending, each weighed by its machine's ``host_penalty`` when a ledger is given; ties by offer id.

    ``work_per_dph`` orders by ``work`` (offer id -> ``throughput.work_score``, which the planner computes from the
    sweeps' learned rates); an offer it does not score, or no ``work`` at all (the Vast adapter), orders as
    ``dlperf_per_dph`` does, which is also what ``work_score`` gives while nothing is measured."""
    hosts = {h.machine_id: h for h in ledger.hosts} if ledger is not None else {}

    def factor(o: Offer) -> float:
        return host_penalty(hosts.get(o.machine_id))

    if ranking is Ranking.PRICE:
        return lambda o: (o.dph_total / factor(o), o.id)
    if ranking is Ranking.DLPERF:
        return lambda o: (-o.dlperf * factor(o), o.id)
    if ranking is Ranking.RELIABILITY:
        return lambda o: (-o.reliability * factor(o), o.id)
    if ranking is Ranking.WORK_PER_DPH and work is not None:
        scored = work
        return lambda o: (-scored.get(o.id, 0.0) * factor(o), o.id)
    return lambda o: (-o.dlperf_per_dph * factor(o), o.id)
