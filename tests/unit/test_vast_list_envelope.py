"""The Vast adapter reads the instance list in the market's own shape and refuses a reply that is not one (issue 33):
no list, ``success: false`` with HTTP 200, a page token that never ends, a page cut short. Each is
``ObservationFailed``, never an empty list. Pure page checks first, then the adapter over a stand-in SDK (the
integration tier drives the real one against the emulator's faults)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests

from reconciler.adapters import vast
from reconciler.errors import ObservationFailed, ProviderAuthError, ProviderTransient, TransientError


def row(iid: int, **extra: Any) -> dict[str, Any]:
    return {"id": iid, "actual_status": "running", "label": f"rigsync:f:s{iid}", "start_date": 1.0e9, **extra}


def page(rows: list[dict[str, Any]], count: int | None = None, token: Any = None, **extra: Any) -> dict[str, Any]:
    reply = {"success": True, "instances_found": len(rows) if count is None else count, "total_instances": 0,
             "next_token": token, "instances": rows}
    reply.update(extra)
    return reply


def failure(reply: Any) -> ObservationFailed:
    with pytest.raises(ObservationFailed) as info:
        vast.instance_page(reply)
    return info.value


# ----------------------------------------------------------------------------------------------- one page


def test_a_page_in_the_markets_shape_is_read() -> None:
    got = vast.instance_page(page([row(1), row(2)], count=7, token="abc"))
    assert [r["id"] for r in got.rows] == [1, 2] and got.next_token == "abc" and got.count == 7
    last = vast.instance_page(page([], token=""))
    assert last.rows == [] and last.next_token is None and last.count == 0
    assert vast.instance_page(page([row(3)], token=25)).next_token == "25"  # an integer token is a token
    counted = {"success": True, "total_instances": 1, "instances": [row(4)]}  # the other count, no token at all
    assert vast.instance_page(counted).count == 1


def test_success_false_with_http_200_is_an_observation_failure_naming_what_it_said() -> None:
    exc = failure({"success": False, "error": "deprecated_endpoint", "msg": "use /api/v1/instances/"})
    assert exc.reason == "success_false"
    assert "deprecated_endpoint" in str(exc) and "use /api/v1/instances/" in str(exc)
    assert "\n" not in str(exc) and str(exc).startswith("list instances: ")
    assert failure({"error": "deprecated_endpoint"}).reason == "success_false"  # no success flag is not success
    assert failure({**page([row(1)]), "success": "true"}).reason == "success_false"  # nor is a string
    shown = str(failure({"success": False, "error": "e\x1b]8;;http://x\x07", "msg": "m" * 5000}))
    assert "\x1b" not in shown and "\\x1b" in shown and len(shown) < 400  # a stranger's text, shown and bounded


@pytest.mark.parametrize(
    "reply",
    [
        None,
        [row(1)],  # a bare list is not the market's shape
        "instances",
        {"success": True, "instances_found": 0},  # no list: the SDK would read []
        {"success": True, "instances_found": 0, "instances": None},
        {"success": True, "instances_found": 1, "instances": {"1": row(1)}},
        {"success": True, "instances": []},  # no count
        {"success": True, "instances_found": -1, "instances": []},
        {"success": True, "instances_found": True, "instances": []},
        {"success": True, "instances_found": "2", "instances": []},
        {**page([row(1)]), "next_token": True},
        {**page([row(1)]), "next_token": {"after": 1}},
    ],
)
def test_a_reply_without_a_whole_list_is_refused(reply: Any) -> None:
    assert failure(reply).reason == "no_list"


@pytest.mark.parametrize("bad", ["row", None, {"label": "no id"}, row(0), row(-3), {"id": True}, {"id": "12"},
                                 {"id": 1.5}])
def test_a_row_that_is_not_an_instance_with_an_id_is_refused(bad: Any) -> None:
    exc = failure(page([row(1), bad]))
    assert exc.reason == "bad_row" and "row 1" in str(exc)


# ------------------------------------------------------------------------------------------------ paging


class Pages:
    """``fetch(token)`` over a list of replies, each for the token it expects (None: the first page)."""

    def __init__(self, *replies: tuple[str | None, Any]) -> None:
        self.replies = list(replies)
        self.asked: list[str | None] = []

    def __call__(self, token: str | None) -> Any:
        self.asked.append(token)
        expected, reply = self.replies.pop(0)
        assert token == expected
        return reply


def read_failure(fetch: Pages, max_pages: int = vast.MAX_LIST_PAGES) -> ObservationFailed:
    with pytest.raises(ObservationFailed) as info:
        vast.read_instance_list(fetch, max_pages)
    return info.value


def test_every_page_is_read_following_its_token() -> None:
    fetch = Pages((None, page([row(1), row(2)], 5, "t2")), ("t2", page([row(3), row(4)], 5, "t3")),
                  ("t3", page([row(5)], 5)))
    assert [r["id"] for r in vast.read_instance_list(fetch)] == [1, 2, 3, 4, 5]
    assert fetch.asked == [None, "t2", "t3"]
    assert vast.read_instance_list(Pages((None, page([])))) == []  # an empty account, said so in the right shape


def test_a_page_cut_short_is_refused() -> None:
    # the first page names no next one, yet the list says it holds 3: what the SDK would return as two boxes
    exc = read_failure(Pages((None, page([row(1), row(2)], 3))))
    assert exc.reason == "cut_short" and "2 rows" in str(exc) and "says 3" in str(exc)
    exc = read_failure(Pages((None, page([row(1)], 3, "t2")), ("t2", page([row(3)], 3))))  # a middle page lost a row
    assert exc.reason == "cut_short"


def test_a_page_token_that_never_ends_is_refused() -> None:
    # the last page names itself again: the SDK's show_instances would loop forever
    again = Pages((None, page([row(1)], 2, "t2")), ("t2", page([row(2)], 2, "t2")))
    assert read_failure(again).reason == "endless_pages"
    # past the end every page is empty and names the next one
    empty = Pages((None, page([row(1)], 1, "t2")), ("t2", page([], 1, "t3")))
    assert read_failure(empty).reason == "endless_pages"
    # a token that starts the list over: the same rows again
    over = Pages((None, page([row(1), row(2)], 4, "t2")), ("t2", page([row(1), row(2)], 4, "t3")))
    exc = read_failure(over)
    assert exc.reason == "endless_pages" and "instance 1 is listed twice" in str(exc)
    # more rows than the list says it holds
    assert read_failure(Pages((None, page([row(1), row(2)], 1, "t2")))).reason == "endless_pages"


def test_a_list_longer_than_the_page_bound_is_refused() -> None:
    fetch = Pages(*[(None if n == 0 else f"t{n}", page([row(n + 1)], 10, f"t{n + 1}")) for n in range(3)])
    exc = read_failure(fetch, max_pages=3)
    assert exc.reason == "endless_pages" and "more than 3 pages" in str(exc)


def test_observation_failed_is_a_transient_provider_error() -> None:
    exc = ObservationFailed("x", reason="no_list")
    assert isinstance(exc, ProviderTransient) and isinstance(exc, TransientError)


# ------------------------------------------------------------------------------ the adapter over a stand-in


class Sdk:
    """Stands in for the SDK object (``show_instances_v1`` only); the integration tier uses the real one."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.params: list[dict[str, Any]] = []

    def show_instances_v1(self, params: dict[str, Any]) -> Any:
        self.params.append(dict(params))
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


def provider(sdk: Sdk) -> vast.VastProvider:
    p = vast.VastProvider(api_key="k", server_url="http://127.0.0.1:9", sleep=lambda _s: None)
    p._sdk = sdk  # type: ignore[assignment]
    return p


def http_error(status: int, body: Any) -> requests.HTTPError:
    resp = requests.Response()
    resp.status_code = status
    resp._content = str(body).encode() if isinstance(body, str) else json.dumps(body).encode()
    return requests.HTTPError(f"{status}", response=resp)


def test_the_adapter_pages_the_v1_list_as_the_sdk_does_and_maps_every_row() -> None:
    sdk = Sdk(page([row(2), row(1)], 3, "25"), page([row(7)], 3))
    assert [i.id for i in provider(sdk).list_instances()] == [1, 2, 7]
    assert sdk.params[0] == {"select_filters": {}, "order_by": [{"col": "id", "dir": "asc"}], "limit": 25}
    assert sdk.params[1]["after_token"] == "25" and "after_token" not in sdk.params[0]


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ({"success": False, "error": "deprecated_endpoint"}, "success_false"),
        ({"success": True}, "no_list"),
        (http_error(404, {"success": False, "error": "not_found", "msg": "Unknown endpoint"}), "refused"),
        (http_error(410, {"success": False, "error": "deprecated_endpoint"}), "refused"),
    ],
)
def test_the_adapter_never_turns_a_refused_list_into_no_instances(answer: Any, reason: str) -> None:
    p = provider(Sdk(answer))
    with pytest.raises(ObservationFailed) as info:
        p.list_instances()
    assert info.value.reason == reason and p.calls == 1  # not retried within the call: the cycle decides nothing


def test_a_rejected_key_on_the_list_stays_an_auth_error() -> None:
    with pytest.raises(ProviderAuthError) as info:
        provider(Sdk(http_error(401, {"success": False, "error": "auth_error"}))).list_instances()
    assert not isinstance(info.value, ObservationFailed)


def test_the_price_increase_rows_are_priced_from_the_checked_list_too() -> None:
    p = provider(Sdk({"success": False, "error": "deprecated_endpoint"}))

    class Client:
        pass

    p._sdk.client = Client()  # type: ignore[attr-defined]
    pending = {"success": True, "pending_price_increases": [{"pending_price_increase_id": 1, "contract_id": 5}]}
    with pytest.MonkeyPatch.context() as mp:
        from vastai.api import price_increase

        mp.setattr(price_increase, "list_pending", lambda client: pending)
        with pytest.raises(ObservationFailed):
            p.pending_price_increases()
