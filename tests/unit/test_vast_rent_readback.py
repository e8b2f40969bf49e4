"""After a create the Vast adapter reads the new box back and refuses, destroying it, a box whose rental type, GPU or
price is not what was asked (issue 33; vast-cli PR #403: a spot search followed by a create without a bid rents
on-demand, silently). Pure check first, then the adapter over a stand-in SDK."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
import requests

from reconciler.adapters import vast
from reconciler.core.model import Offer
from reconciler.errors import RentMismatch
from reconciler.ports import RentalAsk

OFFER = Offer(id=501, machine_id=9, gpu_name="RTX 4090", num_gpus=2, gpu_ram_mib=24564, dph_total=0.8,
              dlperf=60.0, dlperf_per_dph=75.0, reliability=0.99, inet_down_mbps=800.0, cuda=12.4, verified=True,
              geolocation="Sweden, SE", disk_space_gb=400.0, min_bid=0.3, storage_dph=0.02)


ASK = RentalAsk(OFFER.gpu_name, OFFER.num_gpus, OFFER.dph_total)  # an on-demand rent of OFFER, as a Rent asks it
BID_ASK = RentalAsk(OFFER.gpu_name, OFFER.num_gpus, 0.36 + OFFER.storage_dph)  # a bid of 0.36: the bid plus storage


def record(**fields: Any) -> dict[str, Any]:
    return {"id": 77, "is_bid": False, "gpu_name": "RTX 4090", "num_gpus": 2, "dph_total": 0.8, **fields}


# ------------------------------------------------------------------------------------------------- pure


def test_a_box_as_asked_passes() -> None:
    assert vast.rental_mismatch(record(), ASK, None) == ()
    assert vast.rental_mismatch(record(is_bid=True, dph_total=0.38), BID_ASK, 0.36) == ()  # the bid plus storage
    assert vast.rental_mismatch(record(dph_total=0.8 * 1.019), ASK, None) == ()  # a host's small repricing
    assert vast.rental_mismatch(record(dph_total=0.5), ASK, None) == ()  # cheaper than asked is no harm


def test_a_bid_rented_on_demand_is_named() -> None:
    wrong = vast.rental_mismatch(record(is_bid=False, dph_total=0.8), BID_ASK, 0.36)
    assert wrong == ("rented on-demand, asked interruptible at a bid of $0.3600/h", "$0.8000/h, asked $0.3800/h")
    assert vast.rental_mismatch(record(is_bid=None, dph_total=0.38), BID_ASK, 0.36) == (
        "rented of an unsaid rental type, asked interruptible at a bid of $0.3600/h",
    )
    assert vast.rental_mismatch(record(is_bid=True), ASK, None) == ("rented interruptible, asked on-demand",)
    assert vast.rental_mismatch(record(is_bid=False), None, 0.36)  # the rental type is checked without the ask


def test_another_gpu_or_a_dearer_price_is_named() -> None:
    assert vast.rental_mismatch(record(gpu_name="RTX 3060"), ASK, None) == ("2x RTX 3060, asked 2x RTX 4090",)
    assert vast.rental_mismatch(record(num_gpus=1), ASK, None) == ("1x RTX 4090, asked 2x RTX 4090",)
    assert vast.rental_mismatch(record(gpu_name=None), ASK, None) == ("2x (no GPU named), asked 2x RTX 4090",)
    assert vast.rental_mismatch(record(dph_total=0.83), ASK, None) == ("$0.8300/h, asked $0.8000/h",)
    assert vast.rental_mismatch(record(dph_total="n/a"), ASK, None)  # no readable price is not a cheap one
    assert vast.rental_mismatch(record(dph_total=math.inf), ASK, None)
    # without what the rent asked (a caller that does not say) only the rental type can be checked
    assert vast.rental_mismatch(record(gpu_name="RTX 3060", dph_total=9.0), None, None) == ()


# ------------------------------------------------------------------------------ the adapter over a stand-in


def offer_record(o: Offer) -> dict[str, Any]:
    return {"id": o.id, "machine_id": o.machine_id, "gpu_name": o.gpu_name, "num_gpus": o.num_gpus,
            "gpu_ram": o.gpu_ram_mib, "dph_total": o.dph_total, "dph_base": o.dph_total - o.storage_dph,
            "dlperf": o.dlperf, "dlperf_per_dphtotal": o.dlperf_per_dph, "reliability": o.reliability,
            "inet_down": o.inet_down_mbps, "cuda_max_good": o.cuda, "verification": "verified",
            "geolocation": o.geolocation, "disk_space": o.disk_space_gb, "min_bid": o.min_bid}


class Sdk:
    """Stands in for the SDK: one offer to find, a create that rents ``rents_as``, a show that says so."""

    def __init__(self, rents_as: dict[str, Any] | None, *, shows_none: int = 0, destroy_fails: bool = False) -> None:
        self.rents_as = rents_as
        self.shows_none = shows_none
        self.destroy_fails = destroy_fails
        self.created: list[dict[str, Any]] = []
        self.shown: list[int] = []
        self.destroyed: list[int] = []

    def search_offers(self, **kw: Any) -> Any:
        return [offer_record(OFFER)]

    def create_instance(self, **kw: Any) -> Any:
        self.created.append(kw)
        return {"success": True, "new_contract": 77}

    def show_instance(self, id: int) -> Any:
        self.shown.append(id)
        if self.shows_none > 0:
            self.shows_none -= 1
            return None
        return self.rents_as

    def destroy_instance(self, id: int) -> Any:
        if self.destroy_fails:
            resp = requests.Response()
            resp.status_code = 400
            resp._content = b'{"success": false, "error": "invalid_args", "msg": "cannot"}'
            raise requests.HTTPError("400", response=resp)
        self.destroyed.append(id)
        return {"success": True}


def provider(sdk: Sdk, sleeps: list[float] | None = None) -> vast.VastProvider:
    p = vast.VastProvider(api_key="k", server_url="http://127.0.0.1:9",
                          sleep=(sleeps.append if sleeps is not None else lambda _s: None))
    p._sdk = sdk  # type: ignore[assignment]
    p._sdk_once = sdk  # type: ignore[assignment]
    return p


def rent(p: vast.VastProvider, bid: float | None = None, asked: RentalAsk | str | None = "as the Rent says") -> int:
    ask = (BID_ASK if bid is not None else ASK) if isinstance(asked, str) else asked
    return p.create_instance(OFFER.id, image="img", disk_gb=10.0, label="rigsync:f:s0", onstart="", env={},
                             bid_dph=bid, asked=ask)


def test_a_box_as_asked_is_kept() -> None:
    sdk = Sdk(record(id=77, is_bid=True, dph_total=0.38))
    p = provider(sdk)
    assert rent(p, bid=0.36) == 77
    assert sdk.created[0]["price"] == 0.36 and sdk.shown == [77] and sdk.destroyed == []


def test_a_bid_rented_on_demand_is_destroyed_and_said_why() -> None:
    sdk = Sdk(record(id=77, is_bid=False, dph_total=0.8))
    p = provider(sdk)
    with pytest.raises(RentMismatch) as info:
        rent(p, bid=0.36)
    exc = info.value
    assert sdk.destroyed == [77] and exc.destroyed and exc.instance_id == 77
    assert exc.reasons == ("rented on-demand, asked interruptible at a bid of $0.3600/h", "$0.8000/h, asked $0.3800/h")
    assert str(exc) == (f"rent offer {OFFER.id}: instance 77 is not what was asked (rented on-demand, asked "
                        "interruptible at a bid of $0.3600/h; $0.8000/h, asked $0.3800/h): destroyed it")


def test_another_gpu_is_destroyed_when_the_caller_said_what_it_asked() -> None:
    sdk = Sdk(record(id=77, gpu_name="RTX 3060"))
    p = provider(sdk)
    assert rent(p, asked=None) == 77  # a caller that does not say what it asked: only the rental type is checked
    with pytest.raises(RentMismatch, match=r"2x RTX 3060, asked 2x RTX 4090"):
        rent(p)
    assert sdk.destroyed == [77]


def test_a_box_that_cannot_be_destroyed_is_said_to_be_still_rented() -> None:
    sdk = Sdk(record(id=77, is_bid=True), destroy_fails=True)
    p = provider(sdk)
    with pytest.raises(RentMismatch, match=r"could not destroy it, it is still rented") as info:
        rent(p)
    assert not info.value.destroyed


def test_a_box_not_readable_yet_is_asked_again_then_kept_unchecked(caplog: pytest.LogCaptureFixture) -> None:
    sleeps: list[float] = []
    sdk = Sdk(record(id=77, is_bid=True), shows_none=2)
    p = provider(sdk, sleeps)
    with pytest.raises(RentMismatch):  # the third read found it, and it is not what was asked
        rent(p)
    assert sleeps == list(vast.READ_BACK_WAITS_S[:2]) and sdk.shown == [77, 77, 77]

    sleeps.clear()
    sdk = Sdk(record(id=77, is_bid=True), shows_none=99)
    p = provider(sdk, sleeps)
    with caplog.at_level(logging.WARNING, logger=vast.log.name):
        assert rent(p) == 77  # never readable: kept (a rented box forgotten would bill unseen), and said so
    assert sleeps == list(vast.READ_BACK_WAITS_S) and len(sdk.shown) == len(vast.READ_BACK_WAITS_S) + 1
    assert "not readable right after its rent" in caplog.text and sdk.destroyed == []


def test_a_record_the_sdk_cannot_post_process_is_an_unreadable_reply_not_a_crash() -> None:
    class Crashing(Sdk):
        def show_instance(self, id: int) -> Any:
            self.shown.append(id)
            raise KeyError("start_date")

    sdk = Crashing(None)
    p = provider(sdk)
    assert rent(p) == 77 and sdk.destroyed == []
    assert len(sdk.shown) == 5  # retried as an unreadable (transient) reply, within the call's bound
