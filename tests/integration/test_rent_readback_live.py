"""A rent read back (issue 33), through the real vastai 1.9.1 client against the emulator: a box rented as asked is
kept; one rented on-demand when a bid was asked (vast-cli PR #403, the emulator's ``ignore_bids``), or dearer than
the offer the search found (a host repriced in between), is destroyed at once and the error says why."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator

import pytest
import requests
from vastai import VastAI

from reconciler.adapters.vast import RENT_PRICE_SLACK, VastProvider
from reconciler.core.model import Offer, OfferFilters
from reconciler.emulator import Emulator
from reconciler.errors import RentMismatch
from reconciler.ports import RentalAsk

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

DISK_GB = 10.0


@pytest.fixture
def provider(emulator: Emulator) -> Iterator[VastProvider]:
    yield VastProvider(api_key=emulator.api_key, server_url=emulator.url, sleep=lambda _s: None)
    emulator.ignore_bids(False)
    for iid in emulator.instance_ids():
        emulator.destroy_instance(iid)


def biddable(provider: VastProvider) -> list[Offer]:
    found = provider.search_offers(OfferFilters(verified=False), disk_gb=DISK_GB)
    return [o for o in found if o.min_bid is not None and o.min_bid < o.dph_total - o.storage_dph]


def rent(provider: VastProvider, offer: Offer, bid: float | None) -> int:
    """A rent of ``offer`` as the planner's ``Rent`` asks it: its GPUs, and its $/h (a bid's: the bid plus storage)."""
    dph = offer.dph_total if bid is None else bid + offer.storage_dph
    return provider.create_instance(offer.id, image="x", disk_gb=DISK_GB, label="rigsync:rb:s0", onstart="", env={},
                                    bid_dph=bid, asked=RentalAsk(offer.gpu_name, offer.num_gpus, dph))


def events_of(emu: Emulator, iid: int) -> list[str]:
    return [e["type"] for e in emu.ledger.events if e.get("instance_id") == iid]


def test_a_bid_rented_as_asked_is_kept(emulator: Emulator, provider: VastProvider) -> None:
    offer = biddable(provider)[0]
    assert offer.min_bid is not None
    iid = rent(provider, offer, round(offer.min_bid * 1.2, 4))
    assert emulator.instance(iid)["is_bid"] is True and events_of(emulator, iid) == ["create"]


def test_a_bid_rented_on_demand_is_destroyed_and_said_why(emulator: Emulator, provider: VastProvider) -> None:
    offer = biddable(provider)[0]
    assert offer.min_bid is not None
    bid = round(offer.min_bid * 1.2, 4)
    before = set(emulator.instance_ids())
    assert requests.post(f"{emulator.url}/_emulator/ignore_bids", json={"on": True}, timeout=10,
                         headers={"Authorization": f"Bearer {emulator.api_key}"}).status_code == 200
    with pytest.raises(RentMismatch) as info:
        rent(provider, offer, bid)
    exc = info.value
    assert exc.destroyed and exc.instance_id not in emulator.instance_ids()
    assert set(emulator.instance_ids()) == before  # nothing left billing
    assert events_of(emulator, exc.instance_id) == ["create", "destroy"]
    assert exc.reasons[0] == f"rented on-demand, asked interruptible at a bid of ${bid:.4f}/h"
    assert f"instance {exc.instance_id} is not what was asked" in str(exc) and str(exc).endswith("destroyed it")


def test_a_box_dearer_than_the_offer_searched_is_destroyed(emulator: Emulator, provider: VastProvider) -> None:
    searched = {o.id: o for o in provider.search_offers(OfferFilters(verified=False), disk_gb=DISK_GB)}
    emulator.drift_prices(0.1, seed=11)  # hosts reprice between the search and the rent
    v = VastAI(api_key=emulator.api_key, server_url=emulator.url, quiet=True)
    with contextlib.redirect_stdout(io.StringIO()):
        now = {int(r["id"]): float(r["dph_total"])
               for r in v.search_offers(query="rentable=true", limit=1000, storage=DISK_GB)}
    dearer = [o for oid, o in searched.items() if now.get(oid, 0.0) > o.dph_total * (1 + 2 * RENT_PRICE_SLACK)]
    cheaper = [o for oid, o in searched.items() if 0.0 < now.get(oid, 0.0) < o.dph_total]
    assert dearer and cheaper, "a ±10% drift of 200 offers moves some of them either way"
    with pytest.raises(RentMismatch) as info:
        rent(provider, dearer[0], None)
    assert info.value.reasons == (f"${now[dearer[0].id]:.4f}/h, asked ${dearer[0].dph_total:.4f}/h",)
    assert info.value.instance_id not in emulator.instance_ids()
    kept = rent(provider, cheaper[0], None)  # cheaper than asked: no harm, kept
    assert kept in emulator.instance_ids()
