"""The one definition of which offers a fleet accepts (``reconciler.core.offers``), and its Vast query.

Table tests over every filter field (each side of each limit, None = no constraint), GPU name and geolocation
forms, the ranking keys, and a property: for random offers and filters, what the generated query asks the server
for (parsed by the real vastai 1.9.1 client, evaluated by a small evaluator written here) agrees with
``offer_passes`` on every field the query expresses.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from profiles import examples

from reconciler.core import offers
from reconciler.core.countries import ALIASES, NAMES
from reconciler.core.model import Offer, OfferFilters, Ranking
from reconciler.emulator.market import CARDS, GEOS

BASE = Offer(
    id=7, machine_id=70, gpu_name="RTX 3090", num_gpus=2, gpu_ram_mib=24576, dph_total=0.30, dlperf=42.0,
    dlperf_per_dph=140.0, reliability=0.98, inet_down_mbps=500.0, cuda=12.2, verified=True,
    geolocation="Sweden, SE", disk_space_gb=100.0,
)


def _offer(**changes: Any) -> Offer:
    return dataclasses.replace(BASE, **changes)


# ------------------------------------------------------------------------------------------ the table


def test_the_table_has_one_rule_per_filter_plus_disk() -> None:
    keys = [r.key for r in offers.RULES]
    assert len(keys) == len(set(keys))
    assert set(keys) == {f.name for f in dataclasses.fields(OfferFilters)} | {"disk_gb"}
    offer_fields = {f.name for f in dataclasses.fields(Offer)}
    for rule in offers.RULES:
        assert rule.offer_attr in offer_fields, rule.key
    # Every filter reaches the server query except geolocation, which is checked client-side only.
    assert [r.key for r in offers.RULES if r.vast_field is None] == ["geolocations"]


def test_defaults_pass_and_query_says_what_the_client_would_otherwise_assume() -> None:
    assert offers.offer_passes(BASE, OfferFilters(), 20)
    assert offers.vast_query_terms(OfferFilters(), 20) == ["num_gpus>=1", "verified=true", "disk_space>=20"]
    assert offers.vast_query_terms(OfferFilters(verified=False), 0) == ["num_gpus>=1", "verified=any", "disk_space>=0"]


# (filters, disk_gb, offer changes, the rule that rejects it or None)
CASES: list[tuple[str, dict[str, Any], float, dict[str, Any], str | None]] = [
    # gpu_names: case-insensitive, spaces = underscores, runs folded; never a substring
    ("names empty", {"gpu_names": ()}, 20, {}, None),
    ("names exact", {"gpu_names": ("RTX 3090",)}, 20, {}, None),
    ("names lower", {"gpu_names": ("rtx 3090",)}, 20, {}, None),
    ("names underscore", {"gpu_names": ("RTX_3090",)}, 20, {}, None),
    ("names runs and padding", {"gpu_names": ("  rtx__ 3090 ",)}, 20, {}, None),
    ("names offer underscore", {"gpu_names": ("rtx 3090",)}, 20, {"gpu_name": "RTX_3090"}, None),
    ("names one of several", {"gpu_names": ("RTX 4090", "rtx_3090")}, 20, {}, None),
    ("names prefix is not a match", {"gpu_names": ("RTX 309",)}, 20, {}, "gpu_names"),
    ("names longer is not a match", {"gpu_names": ("RTX 3090 Ti",)}, 20, {}, "gpu_names"),
    ("names no space is not a match", {"gpu_names": ("RTX3090",)}, 20, {}, "gpu_names"),
    ("names other", {"gpu_names": ("RTX 4090",)}, 20, {}, "gpu_names"),
    # num_gpus_min (below 1 counts as 1)
    ("gpus_min at", {"num_gpus_min": 2}, 20, {}, None),
    ("gpus_min above", {"num_gpus_min": 3}, 20, {}, "num_gpus_min"),
    ("gpus_min 0 still needs a gpu", {"num_gpus_min": 0}, 20, {"num_gpus": 0}, "num_gpus_min"),
    ("gpus_min default needs a gpu", {}, 20, {"num_gpus": 0}, "num_gpus_min"),
    # num_gpus_max
    ("gpus_max none", {"num_gpus_max": None}, 20, {"num_gpus": 8}, None),
    ("gpus_max at", {"num_gpus_max": 2}, 20, {}, None),
    ("gpus_max below", {"num_gpus_max": 1}, 20, {}, "num_gpus_max"),
    # gpu_ram_mib_min
    ("ram none", {"gpu_ram_mib_min": None}, 20, {"gpu_ram_mib": 0}, None),
    ("ram at", {"gpu_ram_mib_min": 24576}, 20, {}, None),
    ("ram above", {"gpu_ram_mib_min": 24577}, 20, {}, "gpu_ram_mib_min"),
    # reliability_min
    ("reliability none", {"reliability_min": None}, 20, {"reliability": 0.0}, None),
    ("reliability at", {"reliability_min": 0.98}, 20, {}, None),
    ("reliability above", {"reliability_min": 0.981}, 20, {}, "reliability_min"),
    # inet_down_mbps_min
    ("inet none", {"inet_down_mbps_min": None}, 20, {"inet_down_mbps": 0.0}, None),
    ("inet at", {"inet_down_mbps_min": 500}, 20, {}, None),
    ("inet above", {"inet_down_mbps_min": 500.5}, 20, {}, "inet_down_mbps_min"),
    # dph_max (negative or NaN reads as 0)
    ("dph none", {"dph_max": None}, 20, {"dph_total": 99.0}, None),
    ("dph at", {"dph_max": 0.30}, 20, {}, None),
    ("dph below", {"dph_max": 0.29}, 20, {}, "dph_max"),
    ("dph negative is 0", {"dph_max": -1.0}, 20, {}, "dph_max"),
    ("dph nan is 0", {"dph_max": math.nan}, 20, {}, "dph_max"),
    ("dph negative is 0, free passes", {"dph_max": -1.0}, 20, {"dph_total": 0.0}, None),
    # dlperf_per_dph_min
    ("value none", {"dlperf_per_dph_min": None}, 20, {"dlperf_per_dph": 0.0}, None),
    ("value at", {"dlperf_per_dph_min": 140}, 20, {}, None),
    ("value above", {"dlperf_per_dph_min": 140.01}, 20, {}, "dlperf_per_dph_min"),
    # cuda_min
    ("cuda none", {"cuda_min": None}, 20, {"cuda": 0.0}, None),
    ("cuda at", {"cuda_min": 12.2}, 20, {}, None),
    ("cuda above", {"cuda_min": 12.3}, 20, {}, "cuda_min"),
    ("cuda nan limit accepts nothing", {"cuda_min": math.nan}, 20, {}, "cuda_min"),
    # verified
    ("verified wanted, is", {"verified": True}, 20, {}, None),
    ("verified wanted, is not", {"verified": True}, 20, {"verified": False}, "verified"),
    ("verified any, is not", {"verified": False}, 20, {"verified": False}, None),
    ("verified any, is", {"verified": False}, 20, {}, None),
    # geolocations: codes and names, case-insensitive, matched on the offer's country; never a substring
    ("geo empty", {"geolocations": ()}, 20, {"geolocation": ""}, None),
    ("geo code", {"geolocations": ("SE",)}, 20, {}, None),
    ("geo code lower", {"geolocations": ("se",)}, 20, {}, None),
    ("geo name", {"geolocations": ("Sweden",)}, 20, {}, None),
    ("geo name lower", {"geolocations": ("sweden",)}, 20, {}, None),
    ("geo mixed, one hits", {"geolocations": ("germany", "SE")}, 20, {}, None),
    ("geo other country", {"geolocations": ("DE", "Germany")}, 20, {}, "geolocations"),
    ("geo code not inside a name", {"geolocations": ("DE",)}, 20, {"geolocation": "Sweden, SE"}, "geolocations"),
    ("geo no substring", {"geolocations": ("Swe",)}, 20, {}, "geolocations"),
    ("geo unknown entry matches nothing", {"geolocations": ("E",)}, 20, {"geolocation": "Spain, ES"}, "geolocations"),
    ("geo atlantis", {"geolocations": ("Atlantis",)}, 20, {}, "geolocations"),
    ("geo bare code offer", {"geolocations": ("us",)}, 20, {"geolocation": "US"}, None),
    ("geo region offer by name", {"geolocations": ("United States",)}, 20, {"geolocation": "California, US"}, None),
    ("geo region offer by alias", {"geolocations": ("USA",)}, 20, {"geolocation": "California, US"}, None),
    ("geo CA is Canada", {"geolocations": ("CA",)}, 20, {"geolocation": "California, US"}, "geolocations"),
    ("geo state is no country", {"geolocations": ("Georgia",)}, 20, {"geolocation": "Georgia, US"}, "geolocations"),
    ("geo name-only offer", {"geolocations": ("SE",)}, 20, {"geolocation": "Sweden"}, None),
    ("geo offer without location", {"geolocations": ("SE",)}, 20, {"geolocation": ""}, "geolocations"),
    ("geo germany", {"geolocations": ("germany",)}, 20, {"geolocation": "Germany, DE"}, None),
    ("geo E never matches", {"geolocations": ("E",)}, 20, {"geolocation": "Germany, DE"}, "geolocations"),
    # disk (always required)
    ("disk below what the offer has", {}, 99.5, {}, None),
    ("disk at", {}, 100, {}, None),
    ("disk above", {}, 100.5, {}, "disk_gb"),
    ("disk zero", {}, 0, {"disk_space_gb": 0.0}, None),
    # the offer's price must be a finite, non-negative number whatever the filters say
    ("price nan", {}, 20, {"dph_total": math.nan}, "dph_total"),
    ("price inf", {}, 20, {"dph_total": math.inf}, "dph_total"),
    ("price negative", {}, 20, {"dph_total": -0.01}, "dph_total"),
    ("price zero", {}, 20, {"dph_total": 0.0}, None),
]


@pytest.mark.parametrize(("name", "filters", "disk", "changes", "rejected"), CASES, ids=[c[0] for c in CASES])
def test_offer_passes(
    name: str, filters: dict[str, Any], disk: float, changes: dict[str, Any], rejected: str | None
) -> None:
    o = _offer(**changes)
    f = OfferFilters(**filters)
    assert offers.rejected_by(o, f, disk) == rejected
    assert offers.offer_passes(o, f, disk) is (rejected is None)


def test_every_filter_field_has_table_cases() -> None:
    covered = {k for _, filters, *_ in CASES for k in filters} | {"disk_gb"}
    assert covered == {r.key for r in offers.RULES}
    for key in covered - {"disk_gb"}:
        sides = {rejected == key for _, filters, _, _, rejected in CASES if key in filters}
        assert sides == {True, False}, f"{key}: needs a passing and a failing case"


# ------------------------------------------------------------------------------------------ names


@pytest.mark.parametrize(
    ("entry", "code"),
    [("DE", "DE"), ("de", "DE"), (" De ", "DE"), ("Germany", "DE"), ("germany", "DE"), ("GERMANY", "DE"),
     ("United States", "US"), ("united_states", "US"), ("USA", "US"), ("United States of America", "US"),
     ("US", "US"), ("UK", "GB"), ("United Kingdom", "GB"), ("Czechia", "CZ"), ("Czech Republic", "CZ"),
     ("Viet Nam", "VN"), ("Vietnam", "VN"), ("Taiwan", "TW"), ("Côte d'Ivoire", "CI"), ("Cote d'Ivoire", "CI"),
     ("Turkey", "TR"), ("Korea, Republic of", "KR"), ("NO", "NO"), ("Norway", "NO"),
     ("E", None), ("Atlantis", None), ("EU", None), ("", None), ("Sweden, SE", None), ("XX", None)],
)
def test_country_code(entry: str, code: str | None) -> None:
    assert offers.country_code(entry) == code


def test_every_code_and_name_in_the_table_resolves_to_itself() -> None:
    assert len(NAMES) == 249 and all(len(c) == 2 and c.isupper() for c in NAMES)
    for code, name in NAMES.items():
        assert offers.country_code(code) == code
        assert offers.country_code(code.lower()) == code
        assert offers.country_code(name) == code, name
    for alias, code in ALIASES.items():
        assert offers.country_code(alias) == code, alias


def test_every_emulator_and_reference_geolocation_resolves_to_one_country() -> None:
    for geo in (*GEOS, "Sweden, SE", "Germany, DE"):  # "Country name, CC": both halves name the same country
        name, _, code = geo.rpartition(", ")
        assert offers.offer_countries(geo) == {code}
        assert offers.country_code(name) == code == offers.country_code(code.lower()), geo
    assert offers.offer_countries("California, US") == offers.offer_countries("US") == {"US"}


@pytest.mark.parametrize(
    ("geo", "codes"),
    [("Sweden, SE", {"SE"}), ("California, US", {"US"}), ("Georgia, US", {"US"}), ("US", {"US"}),
     ("Sweden", {"SE"}), ("Stockholm, Sweden", {"SE"}), ("", set()), ("Nowhere", set()),
     ("Korea, Republic of", {"KR"})],
)
def test_offer_countries(geo: str, codes: set[str]) -> None:
    assert offers.offer_countries(geo) == codes


def test_gpu_name_forms() -> None:
    assert offers.normalize_gpu_name(" RTX__3090  ") == offers.normalize_gpu_name("rtx 3090") == "rtx 3090"
    assert offers.normalize_gpu_name("RTX\t 3090") == "rtx 3090"
    assert offers.vast_gpu_spellings(["RTX 4090", "RTX 3090"]) == ["RTX_4090", "RTX_3090"]
    # The market's spelling of a known model first, and the name as written when that differs.
    assert offers.vast_gpu_spellings(["rtx 3090", "RTX_3090"]) == ["RTX_3090", "rtx_3090"]
    assert offers.vast_gpu_spellings(["My  Card"]) == ["My_Card"]
    assert offers.vast_gpu_spellings(["A,B", "__", "x]"]) == []
    assert offers.vast_query_terms(OfferFilters(gpu_names=("__",)), 20)[0] == "num_gpus>=1"  # looser, never broken


def test_every_emulator_card_is_known_by_its_market_spelling() -> None:
    known = set(offers.KNOWN_GPU_NAMES)
    for card in CARDS:
        assert card.name in known
        assert offers.vast_gpu_spellings([card.name.lower()])[0] == card.name.replace(" ", "_")
    normalized = [offers.normalize_gpu_name(n) for n in offers.KNOWN_GPU_NAMES]
    assert len(normalized) == len(set(normalized))


@pytest.mark.parametrize(
    ("name", "problem"),
    [("RTX 3090", None), ("rtx_3090", None), ("A100 SXM4", None), ("  ", "is blank"), ("_", "is blank"),
     ("A,B", "may not contain ','"), ("A100 [80GB]", "may not contain '[' ']'"), ('"x"', "may not contain '\"'"),
     ("a\x00b", "may not contain '\\x00'")],
)
def test_gpu_name_problem(name: str, problem: str | None) -> None:
    got = offers.gpu_name_problem(name)
    assert got == problem if problem is None else got is not None and got.startswith(problem)


# ------------------------------------------------------------------------------------------ ranking


def test_rank_key_per_ranking() -> None:
    a = _offer(id=1, dph_total=0.2, dlperf=10.0, reliability=0.99, dlperf_per_dph=50.0)
    b = _offer(id=2, dph_total=0.1, dlperf=30.0, reliability=0.95, dlperf_per_dph=300.0)
    c = _offer(id=3, dph_total=0.1, dlperf=30.0, reliability=0.99, dlperf_per_dph=300.0)
    d = _offer(id=4, dph_total=0.5, dlperf=50.0, reliability=0.90, dlperf_per_dph=100.0)

    def order(r: Ranking) -> list[int]:
        return [o.id for o in sorted([d, c, b, a], key=offers.rank_key(r))]

    assert order(Ranking.PRICE) == [2, 3, 1, 4]  # cheapest first, ties by id
    assert order(Ranking.DLPERF) == [4, 2, 3, 1]
    assert order(Ranking.RELIABILITY) == [1, 3, 2, 4]
    assert order(Ranking.DLPERF_PER_DPH) == [2, 3, 4, 1]
    # with nothing measured, predicted work per $ is DLPerf per $
    assert order(Ranking.WORK_PER_DPH) == [2, 3, 4, 1]
    assert {r for r in Ranking} == {
        Ranking.PRICE, Ranking.DLPERF, Ranking.RELIABILITY, Ranking.DLPERF_PER_DPH, Ranking.WORK_PER_DPH,
    }
    assert offers.rank_key(Ranking.PRICE)(a) == (0.2, 1)


# ------------------------------------------------------------------------------- query agrees with offer_passes

# Written here, not taken from the table: the field each parsed query key constrains on the offer.
VAST_TO_OFFER = {
    "gpu_name": "gpu_name", "num_gpus": "num_gpus", "gpu_ram": "gpu_ram_mib", "reliability": "reliability",
    "inet_down": "inet_down_mbps", "dph_total": "dph_total", "dlperf_per_dphtotal": "dlperf_per_dph",
    "cuda_max_good": "cuda", "verified": "verified", "disk_space": "disk_space_gb",
}
CLIENT_DEFAULTS = {"verified": {"eq": True}, "external": {"eq": False}, "rentable": {"eq": True}}


def parsed(filters: OfferFilters, disk_gb: float) -> dict[str, Any]:
    """The query as the real vastai 1.9.1 client sends it (string query, default filters seeded first)."""
    # imported here, not at collection: the SDK's package costs every pytest worker a second
    from vastai.api.query import offers_alias, offers_fields, offers_mult, parse_query

    query = " ".join(offers.vast_query_terms(filters, disk_gb))
    base = {k: dict(v) for k, v in CLIENT_DEFAULTS.items()}
    return parse_query(query, base, offers_fields, offers_alias, offers_mult)


def server_accepts(o: Offer, query: dict[str, Any]) -> bool:
    """What a server holding ``o`` (as its record) answers: exact names, numbers compared as numbers."""
    for field, cond in query.items():
        if field in ("external", "rentable"):
            continue  # the market offers only rentable, non-external machines
        assert field in VAST_TO_OFFER, f"the query constrains {field}, which this evaluator does not know"
        value = getattr(o, VAST_TO_OFFER[field])
        for op, want in cond.items():
            if op == "in":
                ok = value in want
            elif op == "eq":
                ok = value == want
            elif op == "gte":
                ok = value >= float(want)
            elif op == "lte":
                ok = value <= float(want)
            else:
                raise AssertionError(f"unexpected operator {op} for {field}")
            if not ok:
                return False
    return True


def _variant(draw: st.DrawFn, name: str) -> str:
    """The same GPU name as a person might write it: any case, spaces or underscores, padding."""
    words = name.split(" ")
    seps = [draw(st.sampled_from([" ", "_", "  ", "__", " _"])) for _ in words[1:]]
    text = words[0] + "".join(s + w for s, w in zip(seps, words[1:], strict=True))
    text = draw(st.sampled_from([text, text.lower(), text.upper()]))
    return draw(st.sampled_from(["", " "])) + text + draw(st.sampled_from(["", " ", "_"]))


MARKET_NAMES = [c.name for c in CARDS] + ["Tesla T4", "A40"]
RAM = [0, 6144, 8192, 12288, 16376, 24564, 24576, 81920]
REL = [0.0, 0.9, 0.95, 0.98, 0.981, 0.9962, 1.0]
INET = [0.0, 99.9, 100.0, 500.0, 906.3]
PRICE = [0.0, 0.03, 0.1, 0.15, 0.3359, 1.28]
VALUE = [0.0, 50.0, 150.0, 185.47, 300.0]
CUDA = [0.0, 11.8, 12.1, 12.2, 12.4, 12.8]
DISK = [0.0, 5.0, 20.0, 40.0, 412.6]


def _num(pool: list[float], lo: float, hi: float) -> st.SearchStrategy[float]:
    return st.one_of(st.sampled_from(pool), st.floats(lo, hi, allow_nan=False))


@st.composite
def market_offers(draw: st.DrawFn) -> Offer:
    return Offer(
        id=draw(st.integers(1, 10**6)), machine_id=1, gpu_name=draw(st.sampled_from(MARKET_NAMES)),
        num_gpus=draw(st.sampled_from([0, 1, 1, 2, 4, 8])),
        gpu_ram_mib=draw(st.one_of(st.sampled_from(RAM), st.integers(0, 10**5))),
        dph_total=draw(_num(PRICE, 0, 5)), dlperf=1.0, dlperf_per_dph=draw(_num(VALUE, 0, 1000)),
        reliability=draw(_num(REL, 0, 1)), inet_down_mbps=draw(_num(INET, 0, 10**4)),
        cuda=draw(_num(CUDA, 0, 13)), verified=draw(st.booleans()), geolocation=draw(st.sampled_from(GEOS)),
        disk_space_gb=draw(_num(DISK, 0, 1000)),
    )


@st.composite
def fleet_filters(draw: st.DrawFn, offer: Offer) -> tuple[OfferFilters, set[str]]:
    """Filters, and the country codes its geolocation entries name (worked out here, from the emulator's GEOS)."""

    def opt(strategy: st.SearchStrategy[Any], at: float) -> Any:
        """No constraint, the offer's own value (the boundary), or anything."""
        return draw(st.one_of(st.none(), st.just(at), strategy))

    names = draw(st.lists(st.sampled_from(MARKET_NAMES), max_size=2, unique=True))
    if draw(st.booleans()):
        names.append(offer.gpu_name)
    geos = draw(st.lists(st.sampled_from(GEOS), max_size=2, unique=True))
    if draw(st.booleans()):
        geos.append(offer.geolocation)
    entries = [draw(st.sampled_from([g.rpartition(", ")[0], g.rpartition(", ")[2]])) for g in geos]
    entries = [draw(st.sampled_from([e, e.lower(), e.upper()])) for e in entries]
    filters = OfferFilters(
        gpu_names=tuple(dict.fromkeys(_variant(draw, n) for n in names)) if draw(st.booleans()) else (),
        num_gpus_min=draw(st.one_of(st.just(offer.num_gpus), st.integers(0, 3))),
        num_gpus_max=opt(st.integers(1, 8), offer.num_gpus),
        gpu_ram_mib_min=opt(st.one_of(st.sampled_from(RAM), st.integers(0, 10**5)), offer.gpu_ram_mib),
        reliability_min=opt(_num(REL, 0, 1), offer.reliability),
        inet_down_mbps_min=opt(_num(INET, 0, 10**4), offer.inet_down_mbps),
        dph_max=opt(_num(PRICE, 0, 5), offer.dph_total),
        dlperf_per_dph_min=opt(_num(VALUE, 0, 1000), offer.dlperf_per_dph),
        cuda_min=opt(_num(CUDA, 0, 13), offer.cuda),
        verified=draw(st.booleans()),
        geolocations=tuple(dict.fromkeys(entries)) if draw(st.booleans()) else (),
    )
    return filters, {g.rpartition(", ")[2] for g in geos} if filters.geolocations else set()


@settings(max_examples=examples(400), deadline=None)
@given(data=st.data())
def test_query_and_offer_passes_agree(data: st.DataObject) -> None:
    offer = data.draw(market_offers())
    filters, codes = data.draw(fleet_filters(offer))
    disk = data.draw(_num(DISK, 0, 1000))
    query = parsed(filters, disk)
    in_country = not filters.geolocations or offer.geolocation.rpartition(", ")[2] in codes
    assert offers.offer_passes(offer, filters, disk) == (server_accepts(offer, query) and in_country)
    # Every rule the query can express is in it when its filter is set (a field cannot be left out of one side).
    expressed = {k for k in query if k not in ("external", "rentable")}
    for rule in offers.RULES:
        if rule.vast_field is None or rule.key == "verified":
            continue
        if rule.limit(filters, disk) is not None:
            assert rule.vast_field in expressed, rule.key
    assert ("verified" in query) is filters.verified


@settings(max_examples=examples(300), deadline=None)
@given(st.integers(0, 2 * 10**6))
def test_gpu_ram_query_is_never_stricter_than_the_limit(mib: int) -> None:
    sent = parsed(OfferFilters(gpu_ram_mib_min=mib), 0)["gpu_ram"]["gte"]
    assert mib - 1e-6 <= sent <= mib


def test_non_finite_limits_leave_the_query_looser_never_broken() -> None:
    q = offers.vast_query_terms(OfferFilters(cuda_min=math.nan, reliability_min=math.inf), 20)
    assert q == ["num_gpus>=1", "verified=true", "disk_space>=20"]
    assert offers.vast_query_terms(OfferFilters(dph_max=math.nan), 20)[1] == "dph<=0"


def test_gpu_ram_table_covers_the_known_models_and_unknown_names_say_nothing() -> None:
    from reconciler.core.offers import GPU_RAM_GIB, KNOWN_GPU_NAMES, most_gpu_ram_gib

    assert set(GPU_RAM_GIB) == set(KNOWN_GPU_NAMES)
    assert most_gpu_ram_gib(["rtx_3060", "RTX  2060", "Titan V"]) == 12
    assert most_gpu_ram_gib(["A100 SXM4", "RTX 4090"]) == 80
    assert most_gpu_ram_gib(["RTX 3060", "Some Future GPU"]) is None
    assert most_gpu_ram_gib([]) is None
