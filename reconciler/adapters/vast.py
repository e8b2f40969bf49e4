"""The official ``vastai`` SDK behind the ``Provider`` port, with its errors folded into rigsync's tree.

rigsync never speaks HTTP to Vast itself: the SDK (1.9.1) is the client the real service is built for, and the
emulator is proven against the same client. This module adds what a reconciler needs on top:

* errors: ``requests`` exceptions become ``ProviderTransient`` (429, 5xx, connection trouble),
  ``ProviderAuthError`` (401/403) or ``ProviderPermanent`` (other 4xx, ``{"success": false}`` bodies);
* bounded retries on top of the SDK's own three tries, per endpoint (``ENDPOINTS``: the path template each call
  goes to): on 429 and 5xx (Vast sends no Retry-After) and on connection trouble, jittered exponential waits
  (``backoff_schedule``) within ``max_tries`` calls and ``max_total_s`` seconds; when the bound is reached one
  ``ProviderTransient`` line names the endpoint, the tries and the seconds spent. The backoff is carried from
  one call to the next of the same endpoint (the failures in a row, and a time before which it is not asked
  again), and a success resets it, so a burst of 429s is not met by every new call at the shortest wait; renting
  is retried only
  when the request certainly did not act (429, or the connection was never made), because a lost reply to a
  create may already have rented a box and a blind retry would rent a second one;
* silence: the SDK may print, and rigsync's CLI prints JSON on stdout, so SDK calls run with stdout captured;
* the API key comes from ``VAST_API_KEY`` or the vastai key files, never from YAML, and is never logged;
* the key goes to one URL only, the one configured on the controller (``reconciler.settings.endpoint``: ``--api-url``,
  else ``RIGSYNC_API_URL``, else https://console.vast.ai), never one named under desired/; the constructor checks
  it again (``check_api_url``) and hands it to the SDK explicitly (the SDK would otherwise fall back to
  ``VAST_URL``). On a redirect the SDK's session keeps the key only for the same scheme, host and port (or a host
  under vast.ai when it was pointed at vast.ai); anywhere else ``requests`` drops the Authorization header; and a
  plain-http (loopback) URL is refused when a proxy from the environment would carry it off the machine;
* every rented box gets ``RIGSYNC_API_URL`` (this adapter's server URL) in its environment: the one URL its
  watchdog may send the instance's own key to (``reconciler/box/watchdog.py``);
* an instance list that is not one is refused, never read as "no instances": the SDK's ``show_instances`` takes
  ``data.get("instances") or []`` from each page, so a 200 ``{"success": false, "error": "deprecated_endpoint"}``
  would be an empty account (skypilot-org/skypilot#10517). The pages are read here through the SDK's own
  ``show_instances_v1`` (one page, its whole reply) and checked in the market's own shape (``read_instance_list``):
  ``success`` true, an ``instances`` list, the reply's own count, tokens that end; anything else is
  ``ObservationFailed``;
* a box just rented is read back (``show_instance``) and refused, destroyed, when its rental type, GPU or price is
  not what was asked (``rental_mismatch``; ``RentMismatch``): Vast rents on-demand, silently, when a bid is lost on
  the way (vast-cli PR #403). What was asked is the Rent's GPU, count and $/h (``ports.RentalAsk``).

SSH addresses (the "port off by one" quirk): the direct address is ``public_ipaddr`` plus the host port mapped to
``22/tcp``, used whenever present because it is the box's real sshd. The proxy address is ``ssh_host:ssh_port``,
plus one when ``image_runtype`` contains ``jupyter``, as the vastai CLI's ``ssh-url`` does (the API reports the
port one below the real sshd for those runtypes); the SDK's ``ssh_url()`` never adds one and is not used.
rigsync rents with ``runtype="ssh_direc ssh_proxy"`` so its own boxes have a direct address when the offer has
direct ports; without one the box is reached through the proxy. Both addresses carry the instance as the name
its host key is pinned under (``Endpoint.host_key_alias``): behind one proxy host boxes differ by port only, and a
destroyed box's port goes to the next rental.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import math
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import requests

from reconciler.core import offers
from reconciler.core.bounds import MAX_GPUS, bounded_int, bounded_text, finite
from reconciler.core.model import Endpoint, Instance, InstanceStatus, Offer, OfferFilters, PriceIncrease, Ranking
from reconciler.errors import (
    ObservationFailed,
    PriceIncreaseGone,
    ProviderAuthError,
    ProviderError,
    ProviderPermanent,
    ProviderTransient,
    RejectedByProvider,
    RentMismatch,
    UserError,
)
from reconciler.ports import OFFERS_LIMIT, RentalAsk
from reconciler.remote import WATCHDOG_API_URL_ENV
from reconciler.settings.endpoint import DEFAULT_URL, check_api_url, shown_url

T = TypeVar("T")
log = logging.getLogger(__name__)


# contextlib.redirect_stdout swaps the process-wide sys.stdout: two threads doing it at once could leave it
# pointing at a dead buffer, so SDK calls are serialised.
_STDOUT_LOCK = threading.Lock()

_STATUS = {
    "created": InstanceStatus.CREATED,
    "loading": InstanceStatus.LOADING,
    "rebooting": InstanceStatus.LOADING,
    "running": InstanceStatus.RUNNING,
    "stopped": InstanceStatus.STOPPED,
    "frozen": InstanceStatus.STOPPED,
    "exited": InstanceStatus.EXITED,
    "offline": InstanceStatus.OFFLINE,
    "unknown": InstanceStatus.UNKNOWN,
}

# The server-side order; the planner ranks again per the fleet's ``ranking``.
SEARCH_ORDER = "dlperf_usd-"


def load_api_key() -> str:
    """The Vast API key from ``VAST_API_KEY``, ``$XDG_CONFIG_HOME/vastai/vast_api_key`` or ``~/.vast_api_key``."""
    env = os.environ.get("VAST_API_KEY", "").strip()
    if env:
        return env
    xdg = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    candidates = [Path(xdg) / "vastai" / "vast_api_key", Path.home() / ".vast_api_key"]
    for path in candidates:
        try:
            key = path.read_text().strip()
        except OSError:
            continue
        if key:
            return key
    raise ProviderAuthError(
        "no Vast API key found: set VAST_API_KEY, or save the key to "
        f"{candidates[0]} (what `vastai set api-key` does); rigsync never reads it from the desired/ YAML"
    )


# ----------------------------------------------------------------------------------------------- mapping


def _f(rec: dict[str, Any], key: str, default: float = 0.0) -> float:
    v = rec.get(key)
    if isinstance(v, bool) or v is None:
        return default
    try:
        x = float(v)
    except (TypeError, ValueError):
        return default
    return x if math.isfinite(x) else default


def _i(rec: dict[str, Any], key: str, default: int = 0) -> int:
    return int(_f(rec, key, float(default)))


def _s(rec: dict[str, Any], key: str) -> str:
    v = rec.get(key)
    return v.strip() if isinstance(v, str) else ""


# A contract's end as the provider says it, read as untrusted: an epoch second between these, else "not said".
_END_DATE_MIN = 1_000_000_000.0  # 2001-09-09
_END_DATE_MAX = 4_102_444_800.0  # 2100-01-01


def _end_date(rec: dict[str, Any], key: str = "end_date") -> float | None:
    """A contract time of the record (its ``end_date``, or a price increase's ``contract_end_date`` and
    ``ask_end_date``) in epoch seconds, or None when absent, not a finite number, or out of bounds."""
    v = _f(rec, key, math.nan)
    return v if _END_DATE_MIN <= v <= _END_DATE_MAX else None


def offer_from_record(rec: dict[str, Any]) -> Offer:
    """One search result (a Vast offer/bundle record) as a ``model.Offer``."""
    verification = rec.get("verification")
    verified = verification == "verified" if isinstance(verification, str) else bool(rec.get("verified", False))
    reliability = _f(rec, "reliability", _f(rec, "reliability2"))
    return Offer(
        id=_i(rec, "id", _i(rec, "ask_contract_id")),
        machine_id=_i(rec, "machine_id"),
        gpu_name=_s(rec, "gpu_name"),
        num_gpus=_i(rec, "num_gpus"),
        gpu_ram_mib=_i(rec, "gpu_ram"),
        dph_total=_f(rec, "dph_total", math.nan),  # no readable price is not "free": offer_passes refuses NaN
        dlperf=_f(rec, "dlperf"),
        dlperf_per_dph=_f(rec, "dlperf_per_dphtotal"),
        reliability=reliability,
        inet_down_mbps=_f(rec, "inet_down"),
        cuda=_f(rec, "cuda_max_good"),
        verified=verified,
        geolocation=_s(rec, "geolocation"),
        disk_space_gb=_f(rec, "disk_space"),
        min_bid=_f(rec, "min_bid") if rec.get("min_bid") is not None else None,
        storage_dph=max(0.0, _f(rec, "dph_total") - _f(rec, "dph_base")) if rec.get("dph_base") is not None else 0.0,
        end_date=_end_date(rec),
    )


def _ssh_22_port(rec: dict[str, Any]) -> int | None:
    ports = rec.get("ports")
    if not isinstance(ports, dict):
        return None
    bindings = ports.get("22/tcp")
    if not isinstance(bindings, list) or not bindings or not isinstance(bindings[0], dict):
        return None
    try:
        port = int(str(bindings[0].get("HostPort")))
    except (TypeError, ValueError):
        return None
    return port if 0 < port < 65536 else None


def instance_host_key_alias(instance_id: int) -> str:
    """The name a rented box's host key is pinned under: its instance, whichever address reaches it."""
    return f"vast-instance-{instance_id}"


def instance_from_record(rec: dict[str, Any]) -> Instance:
    """One row of the instance list as a ``model.Instance`` (status folded, SSH addresses resolved)."""
    status_raw = rec.get("actual_status")
    if status_raw is None:
        status = InstanceStatus.CREATED
    else:
        status = _STATUS.get(str(status_raw).lower(), InstanceStatus.UNKNOWN)
    direct = None
    alias = instance_host_key_alias(_i(rec, "id"))
    ip, port = _s(rec, "public_ipaddr"), _ssh_22_port(rec)
    if ip and port:
        direct = Endpoint(host=ip, port=port, host_key_alias=alias)
    proxy = None
    ssh_host, ssh_port = _s(rec, "ssh_host"), _i(rec, "ssh_port")
    if ssh_host and ssh_port > 0:
        if "jupyter" in _s(rec, "image_runtype"):
            ssh_port += 1
        proxy = Endpoint(host=ssh_host, port=ssh_port, host_key_alias=alias)
    label = rec.get("label")
    return Instance(
        id=_i(rec, "id"),
        label=label if isinstance(label, str) else "",
        status=status,
        gpu_name=_s(rec, "gpu_name"),
        num_gpus=_i(rec, "num_gpus"),
        gpu_ram_mib=_i(rec, "gpu_ram"),
        dph_total=_f(rec, "dph_total"),
        start_date=_f(rec, "start_date"),
        machine_id=_i(rec, "machine_id"),
        image=_s(rec, "image_uuid"),
        is_bid=bool(rec.get("is_bid", False)),
        cuda=_f(rec, "cuda_max_good") or None,
        dlperf=_f(rec, "dlperf") or None,
        direct=direct,
        proxy=proxy,
        end_date=_end_date(rec),
    )


def build_query(filters: OfferFilters, disk_gb: float) -> str:
    """The SDK's search query string for ``filters``, from the one filter table in ``reconciler.core.offers``.

    The query may be looser than the filters (geolocation is checked client-side only), never stricter; every
    result is re-checked with ``offers.offer_passes``.
    """
    return " ".join(offers.vast_query_terms(filters, disk_gb))


# ------------------------------------------------------------------------------------------------ errors


def _body_message(resp: requests.Response | None) -> tuple[str, str]:
    """(error code, human message) from an error body; never includes request headers (the key lives there)."""
    if resp is None:
        return "", ""
    try:
        body = resp.json()
    except ValueError:
        return "", resp.text.strip()[:200]
    if isinstance(body, dict):
        code = str(body.get("error") or "")
        msg = body.get("msg") or body.get("detail") or body.get("error") or ""
        return code, str(msg)[:300]
    return "", str(body)[:200]


def _classify(exc: BaseException, what: str, url: str = "") -> ProviderError:
    if isinstance(exc, requests.HTTPError):
        resp = exc.response
        status = resp.status_code if resp is not None else 0
        code, msg = _body_message(resp)
        detail = f"{what}: HTTP {status}" + (f": {msg}" if msg else "")
        if status in (401, 403):
            return ProviderAuthError(f"{detail} (the Vast API key was rejected: check VAST_API_KEY)")
        if status == 429 or status >= 500:
            return ProviderTransient(detail)
        return RejectedByProvider(detail, status=status, code=code)
    if isinstance(exc, requests.ConnectionError | requests.Timeout):
        at = f" at {shown_url(url)}" if url else ""
        return ProviderTransient(f"{what}: cannot reach the Vast API{at}: {type(exc).__name__}")
    if isinstance(exc, requests.RequestException):
        return ProviderPermanent(f"{what}: request failed: {type(exc).__name__}: {exc}")
    return ProviderTransient(f"{what}: unreadable reply from the Vast API: {type(exc).__name__}")


# The path template each call goes to: its backoff and its bound are its own, and the line saying the bound was
# reached names it.
ENDPOINTS = {
    "search offers": "POST /api/v0/bundles/",
    "list instances": "GET /api/v1/instances/",
    "show instance": "GET /api/v0/instances/{id}/",
    "rent offer": "PUT /api/v0/asks/{id}/",
    "destroy instance": "DELETE /api/v0/instances/{id}/",
    "list ssh keys": "GET /api/v0/ssh/",
    "add ssh key": "POST /api/v0/ssh/",
    "show user": "GET /api/v0/users/current/",
    "show charges": "GET /api/v1/invoices/",
    "pending price increases": "GET /api/v0/instances/pending-price-increases/",
    "accept price increase": "PUT /api/v0/instances/accept-price-increase/",
    "reject price increase": "PUT /api/v0/instances/reject-price-increase/",
}
FIRST_WAIT_S = 0.5
MAX_WAIT_S = 8.0
MAX_STRIKES = 8  # doublings carried between calls (the waits are capped at MAX_WAIT_S long before)


def backoff_schedule(
    max_tries: int, max_total_s: float, rng: random.Random, *, first_s: float = FIRST_WAIT_S, cap_s: float = MAX_WAIT_S
) -> list[float]:
    """The waits between tries of one call: the n-th is ``first_s * 2**n`` (at most ``cap_s``) times a jitter in
    [0.5, 1), so callers rate-limited together do not come back together; at most ``max_tries - 1`` waits, and
    never more than ``max_total_s`` in all (a wait that would cross it is not taken: the call gives up instead)."""
    waits: list[float] = []
    total = 0.0
    for n in range(max(0, max_tries - 1)):
        wait = min(cap_s, first_s * 2.0**n) * rng.uniform(0.5, 1.0)
        if total + wait > max_total_s:
            break
        waits.append(wait)
        total += wait
    return waits


def endpoint_of(what: str) -> str:
    """The endpoint a call named ``what`` goes to (``what`` itself when it is not in ``ENDPOINTS``)."""
    for name, endpoint in ENDPOINTS.items():
        if what == name or what.startswith(name + " "):
            return endpoint
    return what


def _refuse_clear_text_proxy(url: str) -> None:
    """Plain http (allowed only to loopback) must not leave the machine through a proxy from the environment.

    The SDK's ``requests`` session honours ``HTTP_PROXY``/``ALL_PROXY`` (less ``NO_PROXY``): a loopback http URL
    would then hand the key, in clear text, to the proxy. (Over https a proxy only tunnels the encrypted bytes.)
    """
    if not url.lower().startswith("http://"):
        return
    if requests.utils.select_proxy(url, requests.utils.get_environ_proxies(url)):
        host = urlsplit(url).hostname or ""
        raise UserError(
            f"the provider URL {url} is plain http and a proxy from the environment (HTTP_PROXY or ALL_PROXY) "
            f"would carry the API key to that proxy in clear text: add {host} to NO_PROXY, or unset the proxy"
        )


def _certainly_not_sent(exc: BaseException) -> bool:
    """True when the server certainly did not act on the request (safe to retry a non-idempotent call)."""
    if isinstance(exc, requests.HTTPError):
        return exc.response is not None and exc.response.status_code == 429
    return isinstance(exc, requests.ConnectTimeout) or (
        isinstance(exc, requests.ConnectionError) and "NewConnectionError" in repr(exc)
    )


# ------------------------------------------------------------------------- the instance list, as the market says it

LIST_PAGE_ROWS = 25  # rows asked per page, as the SDK's show_instances asks
MAX_LIST_PAGES = 400  # 10,000 boxes: a list still going after this many pages is a page token that never ends


@dataclass(frozen=True)
class InstancePage:
    """One page of ``GET /api/v1/instances/``: its rows, the token of the next page (None: the last), and how many
    rows the whole list holds by the reply's own count (``instances_found``, else ``total_instances``)."""

    rows: list[dict[str, Any]]
    next_token: str | None
    count: int


def _observation_failed(what: str, reason: str) -> ObservationFailed:
    return ObservationFailed(f"list instances: {what} (not read as an empty list)", reason=reason)


def _said(reply: dict[str, Any]) -> str:
    """What a refusing reply says (its ``error`` and ``msg``), short, on one line, its control characters shown."""
    parts = [str(reply.get(k))[:200] for k in ("error", "msg") if reply.get(k)]
    return bounded_text(" ".join(" ".join(parts).split()), 240) or "nothing more"


def instance_page(reply: Any) -> InstancePage:
    """One page read in the market's own shape ``{"success": true, "instances": [...], "instances_found": N,
    "next_token": ...}``, or ``ObservationFailed``: not an object, ``success`` not true, no list, no count, a row
    that is not an object with a positive integer ``id``."""
    if not isinstance(reply, dict):
        raise _observation_failed(f"the reply is {type(reply).__name__}, not an object", "no_list")
    if reply.get("success") is not True:
        raise _observation_failed(f"the reply says success={reply.get('success')!r} ({_said(reply)})",
                                  "success_false")
    rows = reply.get("instances")
    if not isinstance(rows, list):
        raise _observation_failed("the reply has no instances list", "no_list")
    counts = [bounded_int(reply.get(k), 0, 1 << 31) for k in ("instances_found", "total_instances")]
    count = next((c for c in counts if c is not None), None)
    if count is None:
        raise _observation_failed("the reply does not say how many instances the list holds", "no_list")
    for n, row in enumerate(rows):
        if not isinstance(row, dict) or bounded_int(row.get("id"), 1, 1 << 63) is None:
            raise _observation_failed(f"row {n} of a page is not an instance with an id", "bad_row")
    token = reply.get("next_token")
    if token is not None and (isinstance(token, bool) or not isinstance(token, str | int)):
        raise _observation_failed(f"next_token is {type(token).__name__}", "no_list")
    return InstancePage(rows, str(token) if token not in (None, "") else None, count)


def read_instance_list(fetch: Callable[[str | None], Any], max_pages: int = MAX_LIST_PAGES) -> list[dict[str, Any]]:
    """Every row of the instance list, ``fetch(after_token)`` giving each page's reply (None: the first page), or
    ``ObservationFailed``: a page not in the market's shape (``instance_page``), a token given twice, a page with
    no rows that names a next one, more than ``max_pages`` pages, an id listed twice, or more or fewer rows in all
    than the last page's own count (a page cut short)."""
    rows: list[dict[str, Any]] = []
    ids: set[int] = set()
    tokens: set[str] = set()
    token: str | None = None
    for _ in range(max_pages):
        page = instance_page(fetch(token))
        for row in page.rows:
            if row["id"] in ids:
                raise _observation_failed(f"instance {row['id']} is listed twice", "endless_pages")
            ids.add(row["id"])
        rows.extend(page.rows)
        if len(rows) > page.count:
            raise _observation_failed(f"{len(rows)} rows read, the list says it holds {page.count}", "endless_pages")
        if page.next_token is None:
            if len(rows) < page.count:
                raise _observation_failed(f"the pages hold {len(rows)} rows, the list says {page.count}", "cut_short")
            return rows
        if not page.rows or page.next_token in tokens:
            raise _observation_failed("a page token that never ends (a page with no rows, or a token given twice, "
                                      "names a next page)", "endless_pages")
        tokens.add(page.next_token)
        token = page.next_token
    raise _observation_failed(f"more than {max_pages} pages", "endless_pages")


# ------------------------------------------------------------------------------------- a rent, read back

READ_BACK_WAITS_S = (0.5, 1.0, 2.0)  # a box the provider does not know yet is asked again after each of these
RENT_PRICE_SLACK = 0.02  # a box may cost this fraction more than asked (a host's repricing since the search)


def rental_mismatch(rec: dict[str, Any], asked: RentalAsk | None, bid_dph: float | None) -> tuple[str, ...]:
    """How the instance record ``rec`` of a box just rented differs from the rental asked for, one phrase each
    (empty: it is what was asked). The rental type always: a bid (``bid_dph``) must come back ``is_bid`` true, an
    on-demand rent must not. With what the rent asked (None: the caller did not say, not checked) the GPU model
    and count, and the price: at most ``RENT_PRICE_SLACK`` above the asked $/h."""
    wrong: list[str] = []
    is_bid = rec.get("is_bid")
    if bid_dph is not None and is_bid is not True:
        kind = "on-demand" if is_bid is False else "of an unsaid rental type"
        wrong.append(f"rented {kind}, asked interruptible at a bid of ${bid_dph:.4f}/h")
    elif bid_dph is None and is_bid is True:
        wrong.append("rented interruptible, asked on-demand")
    if asked is None:
        return tuple(wrong)
    gpus, gpu = _i(rec, "num_gpus"), _s(rec, "gpu_name")
    if (gpus, gpu) != (asked.num_gpus, asked.gpu_name):
        wrong.append(f"{gpus}x {bounded_text(gpu, 80) or '(no GPU named)'}, asked {asked.num_gpus}x {asked.gpu_name}")
    want, got = asked.dph, _f(rec, "dph_total", math.nan)
    if not got <= want * (1.0 + RENT_PRICE_SLACK) + 1e-6:  # NaN (no readable price) is not cheap
        wrong.append(f"${got:.4f}/h, asked ${want:.4f}/h")
    return tuple(wrong)


class VastProvider:
    """The ``Provider`` port over the official SDK. ``calls`` counts SDK calls made (for tests and benches)."""

    def __init__(
        self,
        *,
        api_key: str,
        server_url: str = DEFAULT_URL,
        max_tries: int = 5,
        max_total_s: float = 20.0,
        sdk_retry: int = 3,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        if not os.environ.get("VAST_LOG_LEVEL"):
            logging.getLogger("vastai").setLevel(logging.WARNING)
        from vastai import VastAI  # imported here: the package is heavy and only live commands need it

        url = check_api_url(server_url, "the provider URL")
        _refuse_clear_text_proxy(url)
        self.api_url = url  # also handed to every box's watchdog (create_instance): the one URL it may call
        self._sdk = VastAI(api_key=api_key, server_url=url, retry=sdk_retry, quiet=True)
        # Renting is not idempotent: its client makes one HTTP attempt per call and we decide about retries.
        self._sdk_once = VastAI(api_key=api_key, server_url=url, retry=1, quiet=True)
        self._max_tries = max(1, max_tries)
        self._max_total_s = max_total_s
        self._sleep = sleep
        self._rng = rng or random.Random()
        self.calls = 0
        # Backoff carried from one call to the next, per endpoint: how many transient failures in a row it answered
        # (the next call's waits start that many doublings up), and the monotonic time before which it is not asked
        # again. A burst of 429s is then not met by each new call starting over at the first, shortest wait.
        self._strikes: dict[str, int] = {}
        self._not_before: dict[str, float] = {}
        # (offer id, disk GB) -> the offer as the last search found it: what a rent of it asks for (read-back)

    def __repr__(self) -> str:  # never show the key
        return "VastProvider(...)"

    def _call(self, what: str, fn: Callable[[], T], *, idempotent: bool = True, envelope: bool = False) -> T:
        """``fn`` (one SDK call) with rigsync's retries and errors. A reply ``{"success": false}`` is
        ``RejectedByProvider``, unless ``envelope``: then the caller reads the reply whole (``read_instance_list``)."""
        endpoint = endpoint_of(what)
        start = time.monotonic()
        strikes = self._strikes.get(endpoint, 0)
        waits = backoff_schedule(
            self._max_tries, self._max_total_s, self._rng, first_s=FIRST_WAIT_S * 2.0 ** min(strikes, MAX_STRIKES)
        )
        held = self._not_before.get(endpoint, 0.0) - start
        if held > 0:  # the endpoint answered 429 or 5xx lately: its backoff is still running
            held = min(held, self._max_total_s)
            log.info("%s: %s was rate-limited or failing; waiting %.1fs first", what, endpoint, held)
            self._sleep(held)
        for attempt in range(1, self._max_tries + 1):
            try:
                self.calls += 1
                with _STDOUT_LOCK, contextlib.redirect_stdout(io.StringIO()):
                    result = fn()
            except (requests.RequestException, ValueError) as exc:
                err = _classify(exc, what, self.api_url)
                if not isinstance(err, ProviderTransient) or not (idempotent or _certainly_not_sent(exc)):
                    raise err from exc
                self._strike(endpoint)
                spent = time.monotonic() - start
                if attempt > len(waits) or spent + waits[attempt - 1] > self._max_total_s:
                    raise ProviderTransient(
                        f"{endpoint}: gave up after {attempt} tries in {spent:.1f}s "
                        f"(bound: {self._max_tries} tries, {self._max_total_s:g}s): {err}"
                    ) from exc
                delay = waits[attempt - 1]
                log.info("%s: %s; retry %d in %.1fs", what, err, attempt, delay)
                self._sleep(delay)
                continue
            self._strikes.pop(endpoint, None)
            self._not_before.pop(endpoint, None)
            if not envelope and isinstance(result, dict) and result.get("success") is False:
                code, msg = str(result.get("error") or ""), str(result.get("msg") or result.get("error") or "")
                raise RejectedByProvider(f"{what}: rejected: {msg or 'success=false'}", code=code)
            return result
        raise AssertionError("unreachable")

    def _strike(self, endpoint: str) -> None:
        """One more transient failure in a row from ``endpoint``: the next call to it waits out a jittered, doubled
        backoff from now before its first try."""
        strikes = self._strikes.get(endpoint, 0) + 1
        self._strikes[endpoint] = strikes
        wait = min(MAX_WAIT_S, FIRST_WAIT_S * 2.0 ** min(strikes - 1, MAX_STRIKES)) * self._rng.uniform(0.5, 1.0)
        self._not_before[endpoint] = time.monotonic() + wait

    # ------------------------------------------------------------------------------------ Provider port

    def search_offers(self, filters: OfferFilters, disk_gb: float, limit: int = OFFERS_LIMIT) -> list[Offer]:
        query = build_query(filters, disk_gb)
        order = SEARCH_ORDER
        records = self._call(
            "search offers",
            lambda: self._sdk.search_offers(query=query, order=order, limit=limit, storage=max(disk_gb, 1.0)),
        )
        if not isinstance(records, list):
            raise ProviderTransient("search offers: the reply has no offer list")
        found = []
        for rec in records:
            if not isinstance(rec, dict):
                continue
            o = offer_from_record(rec)
            # A server that ignores or loosens a term must not get us a wrong box: the same rules, re-checked.
            if o.id > 0 and offers.offer_passes(o, filters, disk_gb):
                found.append(o)
        found.sort(key=offers.rank_key(Ranking.DLPERF_PER_DPH))
        return found[:limit]

    def list_instances(self) -> list[Instance]:
        """Every instance of the account, or ``ObservationFailed`` when the list answered is not a whole one."""
        return sorted((instance_from_record(r) for r in self._instance_rows()), key=lambda i: i.id)

    def _instance_rows(self) -> list[dict[str, Any]]:
        """The account's instance records, every page of ``GET /api/v1/instances/`` read through the SDK's
        ``show_instances_v1`` (the call its ``show_instances`` pages with, whose reply it does not check)."""

        def fetch(token: str | None) -> Any:
            params: dict[str, Any] = {"select_filters": {}, "order_by": [{"col": "id", "dir": "asc"}],
                                      "limit": LIST_PAGE_ROWS}
            if token is not None:
                params["after_token"] = token
            try:
                return self._call("list instances", functools.partial(self._sdk.show_instances_v1, params),
                                  envelope=True)
            except RejectedByProvider as exc:  # a 4xx other than the key's: the list endpoint itself said no
                raise ObservationFailed(f"list instances: the list was refused: {exc}", reason="refused") from exc

        return read_instance_list(fetch)

    def create_instance(
        self,
        offer_id: int,
        *,
        image: str,
        disk_gb: float,
        label: str,
        onstart: str,
        env: dict[str, str],
        bid_dph: float | None = None,
        asked: RentalAsk | None = None,
    ) -> int:
        # The box's watchdog (reconciler/box/watchdog.py) destroys its instance through this same URL, with the
        # instance's own key: the URL this adapter was configured with, never one the box or desired/ names.
        box_env = {**env, WATCHDOG_API_URL_ENV: self.api_url}

        def create() -> Any:
            return self._sdk_once.create_instance(
                id=offer_id, image=image, disk=disk_gb, label=label, onstart_cmd=onstart or None,
                env=box_env, ssh=True, direct=True, price=bid_dph,  # a price makes it an interruptible bid
            )

        reply = self._call(f"rent offer {offer_id}", create, idempotent=False)
        new_id = reply.get("new_contract") if isinstance(reply, dict) else None
        if isinstance(new_id, bool) or not isinstance(new_id, int | str) or not str(new_id).isdigit():
            raise ProviderPermanent(f"rent offer {offer_id}: the reply has no new_contract id")
        self._check_rental(offer_id, int(new_id), asked, bid_dph)
        return int(new_id)

    def _check_rental(self, offer_id: int, instance_id: int, asked: RentalAsk | None, bid_dph: float | None) -> None:
        """Read the new box back; destroy it and raise ``RentMismatch`` when it is not the rental asked for. A box
        that cannot be read back now is kept (its id is returned: a box rented and forgotten would bill unseen)."""
        rec = self._read_back(instance_id)
        if rec is None:
            log.warning("instance %d (offer %d): not readable right after its rent: its rental type, GPU and price "
                        "were not checked", instance_id, offer_id)
            return
        wrong = rental_mismatch(rec, asked, bid_dph)
        if not wrong:
            return
        destroyed, after = True, "destroyed it"
        try:
            self.destroy_instance(instance_id)
        except ProviderError as exc:
            destroyed, after = False, f"could not destroy it, it is still rented: {exc}"
        message = f"rent offer {offer_id}: instance {instance_id} is not what was asked ({'; '.join(wrong)}): {after}"
        log.warning("%s", message)
        raise RentMismatch(message, instance_id=instance_id, reasons=wrong, destroyed=destroyed)

    def _read_back(self, instance_id: int) -> dict[str, Any] | None:
        """The instance's record (``show_instance``), asked again after each of ``READ_BACK_WAITS_S`` while the
        provider does not know it yet; None when it still does not, or cannot be asked."""
        for wait in (*READ_BACK_WAITS_S, None):
            try:
                rec = self._call(f"show instance {instance_id}", functools.partial(self._show_instance, instance_id))
            except ProviderError as exc:
                log.warning("instance %d: cannot read it back: %s", instance_id, exc)
                return None
            if isinstance(rec, dict):
                return rec
            if wait is not None:
                self._sleep(wait)
        return None

    def _show_instance(self, instance_id: int) -> Any:
        """The SDK's ``show_instance``; a record it cannot post-process (no ``start_date``, no ``extra_env`` pairs)
        is an unreadable reply, not a crash."""
        try:
            return self._sdk.show_instance(id=instance_id)
        except (KeyError, TypeError, AttributeError, IndexError) as exc:
            raise ValueError(f"unreadable instance record: {type(exc).__name__}") from exc

    def destroy_instance(self, instance_id: int) -> None:
        """Destroy; an instance that is already gone counts as destroyed."""
        try:
            self._call(f"destroy instance {instance_id}", lambda: self._sdk.destroy_instance(id=instance_id))
        except ProviderAuthError:
            raise
        except RejectedByProvider as exc:
            if exc.status == 404 or exc.code == "no_such_instance" or "no_such_instance" in str(exc):
                return
            raise

    def ensure_ssh_key(self, public_key: str) -> None:
        """Put ``public_key`` on the account unless it is already there (compared by type and key data)."""
        want = _key_id(public_key)
        if not want:
            raise ProviderPermanent("ensure ssh key: not an OpenSSH public key line")
        existing = self._call("list ssh keys", self._sdk.show_ssh_keys)
        for entry in _key_entries(existing):
            for field in ("public_key", "ssh_key", "key"):
                v = entry.get(field)
                if isinstance(v, str) and _key_id(v) == want:
                    return
        self._call("add ssh key", lambda: self._sdk.create_ssh_key(ssh_key=public_key.strip()))


    def account_credit(self) -> float:
        """The account's ``credit`` from ``show user`` (what is left to spend, $)."""
        user = self._call("show user", self._sdk.show_user)
        credit = user.get("credit") if isinstance(user, dict) else None
        if isinstance(credit, bool) or not isinstance(credit, int | float) or not math.isfinite(credit):
            raise ProviderPermanent("show user: the reply has no numeric credit")
        return float(credit)

    def billed_costs(self, since: float, now: float) -> dict[int, float]:
        """Per instance, what ``show invoices-v1 --charges`` says was billed from ``since``'s UTC day to ``now``.

        Charges are kept per instance per UTC day, so the window starts at 00:00 of ``since``'s day; every page is
        read (``next_token``) and an instance's rows are summed.
        """
        start, end = int(since // 86400 * 86400), max(int(now), int(since // 86400 * 86400))
        out: dict[int, float] = {}
        token: str | None = None
        for _ in range(_MAX_CHARGE_PAGES):
            reply = self._call("show charges", functools.partial(
                self._sdk.show_invoices_v1, charges=True, start_date=start, end_date=end, charge_type=["instance"],
                limit=CHARGES_PAGE, next_token=token,
            ))
            rows = reply.get("results") if isinstance(reply, dict) else None
            if not isinstance(rows, list):
                raise ProviderTransient("show charges: the reply has no results list")
            for row in rows:
                iid, usd = _charge_of(row)
                if iid is not None:
                    out[iid] = out.get(iid, 0.0) + usd
            nxt = reply.get("next_token")
            if not nxt:
                return out
            token = str(nxt)
        raise ProviderPermanent(f"show charges: more than {_MAX_CHARGE_PAGES} pages")

    def pending_price_increases(self) -> list[PriceIncrease]:
        """The hosts' pending increases (``vastai.api.price_increase.list_pending`` on the SDK's client), each row
        parsed by ``price_increases_from_reply`` against the instance list (read only when a row is pending: a
        row's $/h are deltas on its instance's ``dph_total``)."""
        from vastai.api import price_increase as api

        envelope = self._call("pending price increases", lambda: api.list_pending(self._sdk.client))
        if not isinstance(envelope, dict) or not isinstance(envelope.get("pending_price_increases"), list):
            raise ProviderTransient("pending price increases: the reply has no pending_price_increases list")
        if not envelope["pending_price_increases"]:
            return []
        listed = {
            _i(r, "id"): (_f(r, "dph_total", math.nan), _f(r, "disk_space", math.nan), _i(r, "num_gpus"))
            for r in self._instance_rows()
        }
        return price_increases_from_reply(envelope, listed)

    def answer_price_increase(self, pending_id: int, *, accept: bool) -> None:
        """Accept or reject one row (``vastai.api.price_increase.accept``/``reject``: body exactly
        ``{"pending_price_increase_id": id}``). A 404 ``no_pending_price_increase`` or a legacy 409 is
        ``PriceIncreaseGone``. Retried only when the request certainly was not acted on (a lost reply to an accept
        that went through would come back as "gone")."""
        from vastai.api import price_increase as api

        verb = "accept" if accept else "reject"
        call = api.accept if accept else api.reject
        try:
            self._call(f"{verb} price increase {pending_id}", lambda: call(self._sdk_once.client, pending_id),
                       idempotent=False)
        except ProviderAuthError:
            raise
        except RejectedByProvider as exc:
            if exc.status == 409 or exc.code == api.NO_PENDING_PRICE_INCREASE:
                raise PriceIncreaseGone(str(exc), status=exc.status, code=api.NO_PENDING_PRICE_INCREASE) from exc
            raise


# a row's $/h above this is not a price but a lie (the dearest 8-GPU box on Vast is a few tens of $/h)
MAX_ROW_DPH = 10_000.0


def price_increases_from_reply(
    envelope: Any, listed: dict[int, tuple[float, float, int]]
) -> list[PriceIncrease]:
    """The pending rows of a ``pending-price-increases`` reply as ``PriceIncrease``s. Total: an unusable row (an id,
    a price or a date missing, negative or not finite; an instance not in ``listed``, instance id -> (``dph_total``,
    ``disk_space`` GB, ``num_gpus``)) is skipped with a log line, never an exception.

    The new $/h is the instance's total after the increase: ``dph_total + (new_gpu_costpersec -
    old_gpu_costpersec) * 3600 * num_gpus + (new_disk_ram_costpersec - old_disk_ram_costpersec) * 3600 *
    disk_space``. Both are unit prices, as the vastai CLI shows them: ``gpu_costpersec`` per GPU (its column is
    "$/GPU/hr", the value times 3600) and ``disk_ram_costpersec`` per GB (its column "$/GB/mo", the value times a
    month). A null new price is an
    unchanged resource (delta 0); a new price beside a null old one cannot be priced (skipped). Bandwidth
    (per GB moved) and the platform fee are not in a box's $/h and are not counted. ``applies_at`` is
    ``contract_end_date``; ``new_end`` is ``ask_end_date`` (None when null)."""
    rows = envelope.get("pending_price_increases") if isinstance(envelope, dict) else None
    if not isinstance(rows, list):
        return []
    out: dict[int, PriceIncrease] = {}
    for n, row in enumerate(rows[:MAX_PENDING_ROWS]):
        inc, why = _increase_of(row, listed)
        if inc is None:
            log.warning("pending price increase row %d skipped: %s", n, why)
        elif inc.id in out:
            log.warning("pending price increase row %d skipped: id %d listed twice", n, inc.id)
        else:
            out[inc.id] = inc
    if len(rows) > MAX_PENDING_ROWS:
        log.warning("pending price increases: %d rows, only the first %d read", len(rows), MAX_PENDING_ROWS)
    return [out[k] for k in sorted(out)]


MAX_PENDING_ROWS = 1000


def _increase_of(row: Any, listed: dict[int, tuple[float, float, int]]) -> tuple[PriceIncrease | None, str]:
    if not isinstance(row, dict):
        return None, "not an object"
    pid = bounded_int(row.get("pending_price_increase_id"), 1, 1 << 63)
    iid = bounded_int(row.get("contract_id"), 1, 1 << 63)
    if pid is None or iid is None:
        return None, "no usable pending_price_increase_id or contract_id"
    if iid not in listed:
        return None, f"id {pid}: instance {iid} is not listed"
    dph, disk, gpus = listed[iid]
    if not (math.isfinite(dph) and 0 <= dph <= MAX_ROW_DPH):
        return None, f"id {pid}: instance {iid} has no usable dph_total"
    delta = 0.0
    per_gpu = 3600.0 * gpus if 0 < gpus <= MAX_GPUS else math.nan
    for name, per in (("gpu_costpersec", per_gpu), ("disk_ram_costpersec", 3600.0 * disk)):
        raw_old, raw_new = row.get("old_" + name), row.get("new_" + name)
        if raw_new is None:
            continue
        old, new = finite(raw_old), finite(raw_new)
        if old is None or new is None or old < 0 or new < 0:
            return None, f"id {pid}: old_{name}/new_{name} are not finite non-negative numbers"
        if not math.isfinite(per):
            return None, f"id {pid}: instance {iid} has no usable num_gpus or disk_space to price its {name}"
        delta += (new - old) * per
    new_dph = dph + delta
    if not (math.isfinite(new_dph) and 0 < new_dph <= MAX_ROW_DPH):
        return None, f"id {pid}: the new $/h {new_dph!r} is not a price"
    applies = _end_date(row, "contract_end_date")
    if applies is None:
        return None, f"id {pid}: no usable contract_end_date"
    new_end: float | None = None
    if row.get("ask_end_date") is not None:
        new_end = _end_date(row, "ask_end_date")
        if new_end is None or new_end < applies:
            return None, f"id {pid}: ask_end_date is not a time after contract_end_date"
    created = finite(row.get("created_at"), limit=1e11)
    return PriceIncrease(
        id=pid, instance_id=iid, old_dph=dph, new_dph=round(new_dph, 9), applies_at=applies, new_end=new_end,
        created_at=created if created is not None and created >= 0 else None,
    ), ""


_MAX_CHARGE_PAGES = 100
CHARGES_PAGE = 100  # rows per page of show charges (the API's maximum)


def _charge_of(row: Any) -> tuple[int | None, float]:
    """(instance id, $) of one instance charge row (``source`` ``instance-<id>``); (None, 0) for anything else."""
    if not isinstance(row, dict) or row.get("type") not in (None, "instance"):
        return None, 0.0
    source = row.get("source")
    if not isinstance(source, str) or not source.startswith("instance-") or not source[9:].isdigit():
        return None, 0.0
    usd = _f(row, "amount", math.nan)
    if math.isnan(usd):
        raise ProviderPermanent(f"show charges: {source} has no numeric amount")
    return int(source[9:]), usd


def _key_id(line: str) -> str:
    parts = line.split()
    return " ".join(parts[:2]) if len(parts) >= 2 else ""


def _key_entries(reply: Any) -> list[dict[str, Any]]:
    if isinstance(reply, list):
        return [e for e in reply if isinstance(e, dict)]
    if isinstance(reply, dict):
        for v in reply.values():
            if isinstance(v, list):
                return [e for e in v if isinstance(e, dict)]
    return []
