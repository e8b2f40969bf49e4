"""Vast records -> model, the query string, error classification and key lookup (no network)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import requests

from reconciler.adapters import vast
from reconciler.core import offers
from reconciler.core.model import Endpoint, InstanceStatus, OfferFilters, Ranking
from reconciler.errors import ProviderAuthError, ProviderPermanent, ProviderTransient

REF = Path("/work/shared/reference")
if not REF.exists():  # CI checkouts carry no shared reference: the records are inlined below as a fallback
    REF = Path(__file__).parent


def _load(name: str) -> dict[str, Any]:
    rec = json.loads((REF / name).read_text())
    assert isinstance(rec, dict)
    return rec


@pytest.fixture
def offer_rec() -> dict[str, Any]:
    return _load("vast-offer.example.json") if (REF / "vast-offer.example.json").exists() else dict(OFFER)


@pytest.fixture
def inst_rec() -> dict[str, Any]:
    return _load("vast-instance.example.json") if (REF / "vast-instance.example.json").exists() else dict(INSTANCE)


OFFER: dict[str, Any] = {
    "id": 24118437, "machine_id": 31245, "num_gpus": 1, "gpu_name": "RTX 4090", "gpu_ram": 24564,
    "dph_total": 0.3359, "dlperf": 62.3, "dlperf_per_dphtotal": 185.47, "reliability": 0.9962,
    "reliability2": 0.9962, "inet_down": 906.3, "cuda_max_good": 12.4, "verification": "verified",
    "geolocation": "Sweden, SE", "disk_space": 412.6,
}
INSTANCE: dict[str, Any] = {
    "id": 29876543, "machine_id": 31245, "actual_status": "running", "label": "train-run-1",
    "image_uuid": "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime", "image_runtype": "ssh_direc ssh_proxy",
    "public_ipaddr": "203.0.113.57", "ssh_host": "ssh7.vast.ai", "ssh_port": 36542,
    "ports": {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": "41201"}]}, "start_date": 1785003600.25,
    "num_gpus": 1, "gpu_name": "RTX 4090", "gpu_ram": 24564, "dph_total": 0.3425, "is_bid": False,
}


def test_offer_record_maps_to_model(offer_rec: dict[str, Any]) -> None:
    o = vast.offer_from_record(offer_rec)
    assert (o.id, o.machine_id, o.gpu_name, o.num_gpus, o.gpu_ram_mib) == (24118437, 31245, "RTX 4090", 1, 24564)
    assert o.dph_total == 0.3359 and o.dlperf == 62.3 and o.dlperf_per_dph == 185.47
    assert o.reliability == 0.9962 and o.inet_down_mbps == 906.3 and o.cuda == 12.4
    assert o.verified and o.geolocation == "Sweden, SE" and o.disk_space_gb == 412.6


def test_instance_record_maps_to_model_with_direct_and_proxy(inst_rec: dict[str, Any]) -> None:
    i = vast.instance_from_record(inst_rec)
    assert i.id == 29876543 and i.status is InstanceStatus.RUNNING and i.label == "train-run-1"
    # Both addresses pin the box's host key under its instance: one key for the box, whichever address reaches it.
    assert i.direct == Endpoint("203.0.113.57", 41201, host_key_alias="vast-instance-29876543")
    assert i.proxy == Endpoint("ssh7.vast.ai", 36542, host_key_alias="vast-instance-29876543")
    assert i.ssh == i.direct
    assert i.image.startswith("pytorch/pytorch") and i.start_date == 1785003600.25


def test_jupyter_runtype_proxy_port_is_one_up_and_missing_ports_mean_proxy(inst_rec: dict[str, Any]) -> None:
    rec = {**inst_rec, "image_runtype": "jupyter_proxy ssh_proxy"}
    rec.pop("ports")
    i = vast.instance_from_record(rec)
    assert i.direct is None and i.ssh == i.proxy
    assert i.proxy == Endpoint("ssh7.vast.ai", 36543, host_key_alias="vast-instance-29876543")
    assert vast.instance_from_record({**inst_rec, "ports": None}).direct is None


@pytest.mark.parametrize(
    ("raw", "status"),
    [(None, InstanceStatus.CREATED), ("loading", InstanceStatus.LOADING), ("frozen", InstanceStatus.STOPPED),
     ("exited", InstanceStatus.EXITED), ("weird", InstanceStatus.UNKNOWN), ("offline", InstanceStatus.OFFLINE)],
)
def test_status_folding(inst_rec: dict[str, Any], raw: str | None, status: InstanceStatus) -> None:
    assert vast.instance_from_record({**inst_rec, "actual_status": raw}).status is status


def test_null_label_is_empty() -> None:
    assert vast.instance_from_record({**INSTANCE, "label": None}).label == ""


def test_query_string_uses_sdk_fields_and_units() -> None:
    f = OfferFilters(
        gpu_names=("RTX 4090", "RTX 3090"), num_gpus_min=1, num_gpus_max=2, gpu_ram_mib_min=24000,
        reliability_min=0.98, inet_down_mbps_min=200, dph_max=0.5, dlperf_per_dph_min=150, cuda_min=12.1,
        verified=True, geolocations=("SE",),
    )
    q = vast.build_query(f, 40)
    assert q == (
        "gpu_name in [RTX_4090,RTX_3090] num_gpus>=1 num_gpus<=2 gpu_ram>=24 reliability>=0.98 inet_down>=200 "
        "dph<=0.5 dlperf_usd>=150 cuda_vers>=12.1 verified=true disk_space>=40"
    )
    from vastai.api.query import offers_alias, offers_fields, offers_mult, parse_query

    parsed = parse_query(q, {}, offers_fields, offers_alias, offers_mult)
    assert parsed["gpu_name"] == {"in": ["RTX 4090", "RTX 3090"]}
    assert parsed["gpu_ram"] == {"gte": 24000.0}
    assert parsed["dph_total"] == {"lte": "0.5"} and parsed["dlperf_per_dphtotal"] == {"gte": "150"}
    assert parsed["cuda_max_good"] == {"gte": "12.1"}
    assert "verified" not in vast.build_query(OfferFilters(verified=False), 0).replace("verified=any", "")


def test_client_side_recheck_is_the_one_definition(offer_rec: dict[str, Any]) -> None:
    """The adapter re-checks with ``offers.offer_passes`` (its own copy is gone): one meaning for every filter."""
    assert not hasattr(vast, "offer_matches") and not hasattr(vast, "geo_matches") and not hasattr(vast, "rank_key")
    o = vast.offer_from_record(offer_rec)
    assert offers.offer_passes(o, OfferFilters(gpu_names=("rtx 4090",), geolocations=("Sweden",)), 20)
    assert offers.offer_passes(o, OfferFilters(gpu_names=("RTX_4090",), geolocations=("se",)), 20)
    assert not offers.offer_passes(o, OfferFilters(geolocations=("DE", "Germany")), 20)
    assert offers.offer_passes(o, OfferFilters(geolocations=("DE", "se")), 20)
    assert not offers.offer_passes(o, OfferFilters(geolocations=("Swe",)), 20)  # no substrings
    assert not offers.offer_passes(o, OfferFilters(dph_max=0.3), 20)
    assert not offers.offer_passes(o, OfferFilters(gpu_ram_mib_min=32000), 20)
    assert not offers.offer_passes(o, OfferFilters(), 500)
    unverified = vast.offer_from_record({**offer_rec, "verification": "unverified"})
    assert not offers.offer_passes(unverified, OfferFilters(verified=True), 20)
    assert offers.offer_passes(unverified, OfferFilters(verified=False), 20)


def test_query_spells_gpu_names_the_market_way() -> None:
    q = vast.build_query(OfferFilters(gpu_names=("rtx 3090", "RTX_4090")), 20)
    assert q.startswith("gpu_name in [RTX_3090,rtx_3090,RTX_4090] ")
    from vastai.api.query import offers_alias, offers_fields, offers_mult, parse_query

    parsed = parse_query(q, {}, offers_fields, offers_alias, offers_mult)
    assert parsed["gpu_name"] == {"in": ["RTX 3090", "rtx 3090", "RTX 4090"]}


class _SearchSdk:
    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.records = records
        self.queries: list[str] = []

    def search_offers(self, *, query: str, order: str, limit: int, storage: float) -> list[dict[str, Any]]:
        self.queries.append(query)
        return self.records


def test_search_rechecks_and_ranks_what_the_server_returned(offer_rec: dict[str, Any]) -> None:
    records = [
        {**offer_rec, "id": 1, "geolocation": "Germany, DE", "dlperf_per_dphtotal": 500},  # wrong country
        {**offer_rec, "id": 2, "gpu_name": "RTX 3090", "dlperf_per_dphtotal": 400},  # wrong model
        {**offer_rec, "id": 3, "geolocation": "Sweden, SE", "dlperf_per_dphtotal": 100},
        {**offer_rec, "id": 4, "geolocation": "Sweden", "dlperf_per_dphtotal": 200},
        {**offer_rec, "id": 5, "dph_total": "nan"},  # no readable price: never "free"
        {**offer_rec, "id": 7, "dph_total": None},
        {**offer_rec, "id": 6, "disk_space": 10},  # too little disk
    ]
    sdk = _SearchSdk(records)
    p = vast.VastProvider(api_key="k", server_url="http://127.0.0.1:9", sleep=lambda _s: None)
    p._sdk = sdk  # type: ignore[assignment]
    found = p.search_offers(OfferFilters(gpu_names=("rtx_4090",), geolocations=("sweden",)), 20)
    assert [o.id for o in found] == [4, 3]  # ranked by DLPerf per $, best first
    assert sdk.queries == ["gpu_name in [RTX_4090,rtx_4090] num_gpus>=1 verified=true disk_space>=20"]


def test_rank_keys() -> None:
    a = vast.offer_from_record({**OFFER, "id": 1, "dph_total": 0.2, "dlperf_per_dphtotal": 100})
    b = vast.offer_from_record({**OFFER, "id": 2, "dph_total": 0.3, "dlperf_per_dphtotal": 300})
    assert sorted([a, b], key=offers.rank_key(Ranking.DLPERF_PER_DPH))[0].id == 2
    assert sorted([b, a], key=offers.rank_key(Ranking.PRICE))[0].id == 1


def _http_error(status: int, body: Any) -> requests.HTTPError:
    resp = requests.Response()
    resp.status_code = status
    resp._content = json.dumps(body).encode() if not isinstance(body, str) else body.encode()
    return requests.HTTPError(f"{status} error", response=resp)


def test_error_classification() -> None:
    assert isinstance(vast._classify(_http_error(401, {"detail": "bad key"}), "x"), ProviderAuthError)
    assert isinstance(vast._classify(_http_error(429, "API requests too frequent"), "x"), ProviderTransient)
    assert isinstance(vast._classify(_http_error(503, {}), "x"), ProviderTransient)
    e = vast._classify(_http_error(404, {"success": False, "error": "invalid_args", "msg": "no_such_ask"}), "rent")
    assert isinstance(e, ProviderPermanent) and "no_such_ask" in str(e)
    assert isinstance(vast._classify(requests.ConnectionError("refused"), "x"), ProviderTransient)


class _FakeSdk:
    """Stands in for the SDK object only to drive the retry loop; the integration tests use the real one."""

    def __init__(self, errors: list[BaseException], result: Any) -> None:
        self.errors = errors
        self.result = result
        self.n = 0

    def show_instances_v1(self, params: dict[str, Any]) -> Any:
        self.n += 1
        if self.errors:
            raise self.errors.pop(0)
        print("the SDK likes to print")
        return {"success": True, "instances_found": len(self.result), "next_token": None, "instances": self.result}


def _provider(sdk: _FakeSdk, sleeps: list[float]) -> vast.VastProvider:
    p = vast.VastProvider(api_key="k", server_url="http://127.0.0.1:9", sleep=sleeps.append)
    p._sdk = sdk  # type: ignore[assignment]
    return p


def test_transient_errors_are_retried_with_backoff_and_bounded(capsys: pytest.CaptureFixture[str]) -> None:
    sleeps: list[float] = []
    sdk = _FakeSdk([_http_error(429, "slow down"), _http_error(502, {})], [INSTANCE])
    p = _provider(sdk, sleeps)
    assert [i.id for i in p.list_instances()] == [29876543]
    assert 0.25 <= sleeps[0] < 0.5 <= sleeps[1] < 1.0 and len(sleeps) == 2 and sdk.n == 3  # jittered, doubling
    assert capsys.readouterr().out == ""  # the SDK's prints never reach our stdout

    sleeps.clear()
    sdk = _FakeSdk([_http_error(503, {}) for _ in range(10)], [])
    with pytest.raises(ProviderTransient, match=r"^GET /api/v1/instances/: gave up after 5 tries"):
        _provider(sdk, sleeps).list_instances()
    assert sdk.n == 5 and sum(sleeps) <= 20


def test_permanent_errors_are_not_retried() -> None:
    sleeps: list[float] = []
    sdk = _FakeSdk([_http_error(403, {"detail": "nope"})], [])
    with pytest.raises(ProviderAuthError):
        _provider(sdk, sleeps).list_instances()
    assert sdk.n == 1 and sleeps == []


def test_load_api_key_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("VAST_API_KEY", raising=False)
    with pytest.raises(ProviderAuthError, match="VAST_API_KEY"):
        vast.load_api_key()
    (tmp_path / ".vast_api_key").write_text("legacy\n")
    assert vast.load_api_key() == "legacy"
    (tmp_path / "xdg" / "vastai").mkdir(parents=True)
    (tmp_path / "xdg" / "vastai" / "vast_api_key").write_text("xdgkey\n")
    assert vast.load_api_key() == "xdgkey"
    monkeypatch.setenv("VAST_API_KEY", "envkey")
    assert vast.load_api_key() == "envkey"
