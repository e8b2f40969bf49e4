"""VastProvider against the emulator through the real vastai 1.9.1 SDK: rent, list, destroy, errors, retries."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import pytest

from reconciler.adapters import vast
from reconciler.adapters.vast import VastProvider
from reconciler.core.model import InstanceStatus, OfferFilters
from reconciler.emulator import Emulator
from reconciler.emulator.testing import KeyPair
from reconciler.errors import ProviderAuthError, ProviderPermanent, ProviderTransient

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def provider(emulator: Emulator) -> VastProvider:
    return VastProvider(api_key=emulator.api_key, server_url=emulator.url, sleep=lambda _s: None)


@pytest.fixture
def cleanup(emulator: Emulator, provider: VastProvider) -> Iterator[list[int]]:
    ids: list[int] = []
    yield ids
    for i in ids:
        provider.destroy_instance(i)


def test_search_returns_filtered_offers_best_value_first(provider: VastProvider) -> None:
    offers = provider.search_offers(OfferFilters(verified=False), disk_gb=10)
    assert offers, "the emulated market should have offers"
    values = [o.dlperf_per_dph for o in offers]
    assert values == sorted(values, reverse=True)
    gpu = offers[0].gpu_name
    narrow = provider.search_offers(
        OfferFilters(gpu_names=(gpu,), verified=False, dph_max=offers[0].dph_total + 0.001), disk_gb=10
    )
    assert narrow and all(o.gpu_name == gpu and o.dph_total <= offers[0].dph_total + 0.001 for o in narrow)
    assert all(o.verified for o in provider.search_offers(OfferFilters(verified=True), disk_gb=10))
    geo = offers[0].geolocation.split(",")[-1].strip()
    assert all(geo in o.geolocation for o in provider.search_offers(
        OfferFilters(verified=False, geolocations=(geo,)), disk_gb=10))


def test_rent_list_destroy_round_trip(
    emulator: Emulator, provider: VastProvider, cleanup: list[int], capsys: pytest.CaptureFixture[str]
) -> None:
    offer = provider.search_offers(OfferFilters(verified=False), disk_gb=10)[0]
    new_id = provider.create_instance(
        offer.id, image="pytorch/pytorch:latest", disk_gb=10, label="rigsync:test:slot0", onstart="", env={"A": "1"}
    )
    cleanup.append(new_id)
    listed = {i.id: i for i in provider.list_instances()}
    assert new_id in listed and listed[new_id].label == "rigsync:test:slot0"
    assert listed[new_id].gpu_name == offer.gpu_name and listed[new_id].num_gpus == offer.num_gpus
    emulator.wait_running([new_id])
    inst = {i.id: i for i in provider.list_instances()}[new_id]
    assert inst.status is InstanceStatus.RUNNING
    assert inst.direct is not None and inst.proxy is not None and inst.ssh == inst.direct
    assert inst.direct.port != inst.proxy.port  # both addresses exist and differ, as on Vast

    provider.destroy_instance(new_id)
    assert new_id not in {i.id for i in provider.list_instances()}
    provider.destroy_instance(new_id)  # already gone: still success
    assert capsys.readouterr().out == ""  # nothing the SDK printed reached stdout


def test_wrong_key_is_an_auth_error(emulator: Emulator) -> None:
    bad = VastProvider(api_key="not-the-key", server_url=emulator.url, sleep=lambda _s: None)
    with pytest.raises(ProviderAuthError) as exc:
        bad.list_instances()
    assert "not-the-key" not in str(exc.value)
    assert bad.calls == 1  # permanent: never retried


def test_injected_429s_are_retried_until_success(emulator: Emulator, provider: VastProvider) -> None:
    # 4 failures: the SDK's own 3 tries absorb three, our retry the fourth.
    emulator.fail_next("/api/v0/bundles", 4, 429)
    offers = provider.search_offers(OfferFilters(verified=False), disk_gb=10)
    assert offers
    assert provider.calls == 2


def test_persistent_5xx_gives_up_bounded(emulator: Emulator, provider: VastProvider) -> None:
    emulator.fail_next("/api/v1/instances", 15, 503)  # 5 of our tries x 3 SDK tries
    with pytest.raises(ProviderTransient):
        provider.list_instances()
    assert provider.calls == 5
    assert provider.list_instances() is not None  # the rule is used up: the API answers again


def test_unknown_offer_is_permanent_and_not_retried(provider: VastProvider) -> None:
    with pytest.raises(ProviderPermanent) as exc:
        provider.create_instance(999_999_999, image="x", disk_gb=10, label="rigsync:t:s", onstart="", env={})
    assert not isinstance(exc.value, ProviderTransient)
    assert provider.calls == 1


def test_rent_is_not_retried_on_5xx(emulator: Emulator, provider: VastProvider) -> None:
    offer = provider.search_offers(OfferFilters(verified=False), disk_gb=10)[0]
    before = set(emulator.instance_ids())
    emulator.fail_next(f"/api/v0/asks/{offer.id}", 1, 502)
    with pytest.raises(ProviderTransient):
        provider.create_instance(offer.id, image="x", disk_gb=10, label="rigsync:t:s", onstart="", env={})
    assert set(emulator.instance_ids()) == before
    assert provider.calls == 2  # the search, then exactly one create attempt


def test_ensure_ssh_key_is_idempotent(emulator: Emulator, provider: VastProvider, ssh_keypair: KeyPair) -> None:
    before = len(emulator.ssh_keys())
    provider.ensure_ssh_key(ssh_keypair.public)  # already on the account (the fixture added it)
    assert len(emulator.ssh_keys()) == before and provider.calls == 1  # listed, not added
    fresh = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGz4u0nq1mPq2M0a3b6jQ0pWlHq9xJb3w8dX0o0o0o0o rigsync"
    provider.ensure_ssh_key(fresh)
    assert provider.calls == 3 and len(emulator.ssh_keys()) == before + 1
    provider.ensure_ssh_key(fresh.replace(" rigsync", " another-comment"))
    assert provider.calls == 4 and len(emulator.ssh_keys()) == before + 1


def test_billing_reads_credit_and_per_instance_bills_through_the_sdk(
    emulator: Emulator, provider: VastProvider, cleanup: list[int], capsys: pytest.CaptureFixture[str]
) -> None:
    offers = provider.search_offers(OfferFilters(verified=False), disk_gb=10)[:3]
    started = time.time()
    ids = [provider.create_instance(o.id, image="x", disk_gb=10, label=f"rigsync:bill:s{n}", onstart="", env={})
           for n, o in enumerate(offers)]
    cleanup.extend(ids[1:])
    emulator.wait_running(ids)
    provider.destroy_instance(ids[0])  # its charges outlive it
    billed = provider.billed_costs(started, time.time())
    assert set(ids) <= set(billed)
    assert billed[ids[0]] == pytest.approx(emulator.ledger.instance_usd(ids[0]), abs=1e-9)
    for iid in ids[1:]:
        assert billed[iid] == pytest.approx(emulator.ledger.instance_usd(iid), abs=1e-4)
    assert sum(billed.values()) == pytest.approx(emulator.ledger.total_usd(), abs=1e-3)  # every instance ever
    assert provider.account_credit() == pytest.approx(emulator.credit_usd(), abs=1e-4)
    assert capsys.readouterr().out == ""
    # Failures are rigsync's errors: 5xx transient (retried, then given up), a reply without credit permanent.
    emulator.fail_next("/api/v0/charges", 15, 503)
    with pytest.raises(ProviderTransient, match="show charges"):
        provider.billed_costs(started, time.time())
    emulator.fail_next("/api/v0/users/current", 2, 429)
    assert provider.account_credit() == pytest.approx(emulator.credit_usd(), abs=1e-4)


def test_billing_pages_through_every_charge(
    emulator: Emulator, provider: VastProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More instances than a page holds: every page is read (``next_token``) and summed."""
    offers = provider.search_offers(OfferFilters(verified=False), disk_gb=10)[:3]
    for o in offers:
        provider.destroy_instance(
            provider.create_instance(o.id, image="x", disk_gb=10, label="rigsync:page:s", onstart="", env={}))
    monkeypatch.setattr(vast, "CHARGES_PAGE", 2)
    calls = provider.calls
    billed = provider.billed_costs(time.time() - 3600, time.time())
    assert len(billed) == len(emulator.ledger.instance_ids()) >= 3
    assert provider.calls - calls == math.ceil(len(billed) / 2)
    assert sum(billed.values()) == pytest.approx(emulator.ledger.total_usd(), abs=1e-3)
