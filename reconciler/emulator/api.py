"""The HTTP face of the emulator: the Vast.ai REST endpoints the ``vastai`` 1.9.1 client calls, plus ``/_emulator/``.

Shapes follow ``shared/reference/vast-api.md``: JSON bodies with Content-Type exactly ``application/json``
(the CLI rejects a charset suffix), errors as ``{"success": false, "error": ..., "msg": ...}``, a 401 with
``Invalid user key`` for a wrong Bearer key, plain-text 429s, and a clear JSON 404 for unknown endpoints.
The admin endpoints under ``/_emulator/`` inject faults and read the ledger (see README.md).
"""

from __future__ import annotations

import json
import math
import re
import secrets
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from reconciler.emulator.exceptions import ApiError, QueryError
from reconciler.emulator.faults import identity_of, lying_page
from reconciler.emulator.market import CARDS, matches

if TYPE_CHECKING:
    from reconciler.emulator.core import Emulator

Handler = Callable[["Request"], Any]


class Request:
    def __init__(self, method: str, path: str, query: dict[str, str], body: Any, match: re.Match[str],
                 caller_instance: int | None) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.body = body
        self.match = match
        self.caller_instance = caller_instance

    def int_arg(self, name: str) -> int:
        return int(self.match.group(name))

    def json_param(self, name: str, default: Any) -> Any:
        raw = self.query.get(name)
        if raw is None or raw == "":
            return default
        try:
            return json.loads(raw)
        except ValueError:
            raise ApiError(400, "invalid_args", f"query parameter {name} is not valid JSON: {raw[:80]!r}") from None


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
    emulator: Emulator


def make_server(emu: Emulator, port: int) -> Server:
    server = Server(("127.0.0.1", port), _Handler)
    server.emulator = emu
    return server


def _body_dict(req: Request) -> dict[str, Any]:
    if req.body is None:
        return {}
    if not isinstance(req.body, dict):
        raise ApiError(400, "invalid_args", "request body must be a JSON object")
    return req.body


# ---- Vast API routes --------------------------------------------------------------------------------------
def _search(emu: Emulator, req: Request) -> Any:
    try:
        return {"offers": emu.market.search(_body_dict(req))}
    except QueryError as exc:
        raise ApiError(400, "invalid_args", f"Invalid query: {exc}") from None


def _create(emu: Emulator, req: Request) -> Any:
    iid = emu.create_instance(req.int_arg("id"), _body_dict(req))
    return {"success": True, "new_contract": iid}


def _list_v1(emu: Emulator, req: Request) -> Any:
    filters = req.json_param("select_filters", {}) or {}
    order_by = req.json_param("order_by", [{"col": "id", "dir": "asc"}]) or [{"col": "id", "dir": "asc"}]
    try:
        limit = max(1, min(int(req.query.get("limit") or 25), 1000))
    except ValueError:
        raise ApiError(400, "invalid_args", "limit must be an integer") from None
    rows = emu.listed_records()
    if not isinstance(filters, dict):
        raise ApiError(400, "invalid_args", "select_filters must be an object")
    try:
        rows = [r for r in rows if matches(r, filters)]
    except QueryError as exc:
        raise ApiError(400, "invalid_args", f"Invalid select_filters: {exc}") from None
    rows.sort(key=lambda r: r["id"])
    for item in reversed(order_by if isinstance(order_by, list) else []):
        col = str(item.get("col", "id")) if isinstance(item, dict) else "id"
        desc = isinstance(item, dict) and str(item.get("dir", "asc")).lower() == "desc"
        rows.sort(key=_col_key(col), reverse=desc)
    start = 0
    after = req.query.get("after_token")
    if after:
        try:
            start = int(after)
        except ValueError:
            raise ApiError(400, "invalid_args", f"invalid after_token {after!r}") from None
    page = rows[start:start + limit]
    nxt = str(start + limit) if start + limit < len(rows) else None
    labels: dict[str, int] = {}
    for r in rows:
        if r.get("label"):
            labels[r["label"]] = labels.get(r["label"], 0) + 1
    return _as_listed(emu, {"success": True, "instances_found": len(rows), "total_instances": len(rows),
                            "next_token": nxt, "label_counts": labels, "instances": page}, start)


def _as_listed(emu: Emulator, reply: dict[str, Any], start: int) -> dict[str, Any]:
    """The list's reply as it goes out: as the list fault set now answers it (``faults.py``), if one is."""
    fault = emu.list_faults.take()
    if fault is None:
        return reply
    emu.ledger.log("list_lied", None, fault=fault[0], start=start)
    return lying_page(fault[0], fault[1], reply, start)


def _col_key(col: str) -> Callable[[dict[str, Any]], tuple[int, Any]]:
    def key(r: dict[str, Any]) -> tuple[int, Any]:
        v = r.get(col)
        if v is None:
            return (0, 0)
        return (1, float(v)) if isinstance(v, (int, float)) else (2, str(v))

    return key


def _list_v0(emu: Emulator, req: Request) -> Any:
    rows = emu.listed_records()
    reply = _as_listed(emu, {"success": True, "next_token": None, "instances": rows}, 0)
    return {k: v for k, v in reply.items() if k not in ("success", "next_token")} if reply.get("success") else reply


def _show(emu: Emulator, req: Request) -> Any:
    try:
        return {"instances": emu.instance(req.int_arg("id"))}
    except ApiError:
        return {"instances": None}


def _put_instance(emu: Emulator, req: Request) -> Any:
    iid = req.int_arg("id")
    body = _body_dict(req)
    emu._get(iid)
    if "label" in body:
        emu.label_instance(iid, str(body["label"] or ""))
    state = body.get("state")
    if state == "stopped":
        emu.stop_instance(iid)
    elif state == "running":
        emu.start_instance(iid)
    elif state is not None:
        raise ApiError(400, "invalid_args", f"Invalid state {state!r}: use running or stopped.")
    if "label" not in body and state is None:
        raise ApiError(400, "invalid_args", "Nothing to change: send state or label.")
    return {"success": True}


def _delete_instance(emu: Emulator, req: Request) -> Any:
    emu.destroy_instance(req.int_arg("id"))
    return {"success": True}


def _attach_ssh(emu: Emulator, req: Request) -> Any:
    key = _body_dict(req).get("ssh_key")
    if not isinstance(key, str):
        raise ApiError(400, "invalid_args", "ssh_key (an OpenSSH public key line) is required.")
    emu.attach_ssh_key(req.int_arg("id"), key)
    return {"success": True, "msg": "ssh key attached"}


def _detach_ssh(emu: Emulator, req: Request) -> Any:
    emu._get(req.int_arg("id"))
    return {"success": True}


def _ssh_list(emu: Emulator, req: Request) -> Any:
    return emu.ssh_keys()


def _ssh_add(emu: Emulator, req: Request) -> Any:
    key = _body_dict(req).get("ssh_key")
    if not isinstance(key, str):
        raise ApiError(400, "invalid_args", "ssh_key (an OpenSSH public key line) is required.")
    rec = emu.add_ssh_key(key)
    return {"success": True, "key": rec, "id": rec["id"]}


def _ssh_update(emu: Emulator, req: Request) -> Any:
    key = _body_dict(req).get("ssh_key")
    if not isinstance(key, str):
        raise ApiError(400, "invalid_args", "ssh_key (an OpenSSH public key line) is required.")
    emu.update_ssh_key(req.int_arg("id"), key)
    return {"success": True}


def _ssh_delete(emu: Emulator, req: Request) -> Any:
    emu.delete_ssh_key(req.int_arg("id"))
    return {"success": True}


def _gpu_names(emu: Emulator, req: Request) -> Any:
    return {"gpu_names": sorted(c.name for c in CARDS)}


def _user(emu: Emulator, req: Request) -> Any:
    # A credit-only account: ``credit`` is what is left of the deposits after everything billed (it goes below
    # zero only by storage, once Vast stopped the boxes at zero); ``balance`` is what is owed beyond it.
    credit = emu.credit_usd()
    return {"id": 1, "username": "emulator", "email": "emulator@127.0.0.1", "fullname": "rigsync emulator",
            "credit": credit, "balance": min(0.0, credit), "balance_threshold": 0.0,
            "balance_threshold_enabled": False, "billing_creditonly": True, "can_pay": credit > 0,
            "got_signup_credit": True, "host_agreement_accepted": False, "has_billing": True,
            "ssh_key": (emu.ssh_keys() or [{"public_key": None}])[0]["public_key"]}


# ---- billing ------------------------------------------------------------------------------------------------
DAY = 86400


def _range(filters: Any, col: str) -> tuple[float, float]:
    if not isinstance(filters, dict) or not isinstance(filters.get(col), dict):
        raise ApiError(400, "invalid_args", f"select_filters.{col} (a range: gte, lte in unix seconds) is required")
    rng = filters[col]
    try:
        lo = float(rng["gte"]) if rng.get("gte") is not None else float("-inf")
        hi = float(rng["lte"]) if rng.get("lte") is not None else float("inf")
    except (TypeError, ValueError):
        raise ApiError(400, "invalid_args", f"select_filters.{col}: gte and lte must be unix seconds") from None
    return lo, hi


def _in_filter(filters: dict[str, Any], col: str) -> set[str] | None:
    spec = filters.get(col)
    if spec is None:
        return None
    if not isinstance(spec, dict) or not isinstance(spec.get("in"), list):
        raise ApiError(400, "invalid_args", f"select_filters.{col}: expected {{\"in\": [...]}}")
    return {str(v) for v in spec["in"]}


def _page(req: Request, rows: list[dict[str, Any]]) -> dict[str, Any]:
    try:
        limit = max(1, min(int(req.query.get("limit") or 20), 100))
        start = int(req.query.get("after_token") or 0)
    except ValueError:
        raise ApiError(400, "invalid_args", "limit and after_token must be integers") from None
    if req.json_param("latest_first", False):
        rows = rows[::-1]
    page = rows[start:start + limit]
    nxt = str(start + limit) if start + limit < len(rows) else None
    return {"success": True, "count": len(page), "total": len(rows), "next_token": nxt, "results": page}


def _item(kind: str, start: float, end: float, usd: float, hours: float) -> dict[str, Any]:
    rate = usd / hours if hours > 0 else 0.0
    return {"start": start, "end": end, "type": kind, "source": None,
            "description": f"{hours:.3f} hours at ${rate:.3f}/hour", "amount": usd, "metadata": {}, "items": []}


def _charges(emu: Emulator, req: Request) -> Any:
    """``show invoices-v1 --charges``: per instance, what it was billed on the UTC days in ``select_filters.day``.

    Charges are kept per instance per UTC day (Vast bills per second; a day's row grows until the day ends):
    a day is selected when its 00:00 lies in ``[gte, lte]``, and an instance's row sums its selected days, so
    ``lte`` = now (or today's date) includes today's charges up to this second.
    """
    filters = req.json_param("select_filters", {})
    lo, hi = _range(filters, "day")
    types = _in_filter(filters, "type")
    if types is not None and "instance" not in types:
        return _page(req, [])
    first_day = math.ceil(lo / DAY) * DAY if math.isfinite(lo) else float("-inf")
    last_day = math.floor(hi / DAY) * DAY if math.isfinite(hi) else float("inf")
    if first_day > last_day:
        return _page(req, [])
    rows = []
    for c, label in emu.charges(first_day, last_day + DAY):
        if c.usd <= 0:
            continue
        d0 = math.floor(c.start / DAY) * DAY
        d1 = max(d0, math.floor(math.nextafter(c.end, -math.inf) / DAY) * DAY)  # the day of the last billed second
        days = int((d1 - d0) // DAY) + 1
        items = []
        if c.gpu_usd > 0:
            items.append(_item("gpu", d0, d1, c.gpu_usd, c.gpu_hours))
        if c.storage_usd > 0:
            items.append(_item("storage", d0, d1, c.storage_usd, c.storage_hours))
        rows.append({"start": d0, "end": d1, "type": "instance", "source": f"instance-{c.instance_id}",
                     "description": f"Instance {c.instance_id} Charges - {days} day{'s' if days != 1 else ''}",
                     "amount": c.usd, "metadata": {"label": label or None, "template_id": None}, "items": items})
    rows.sort(key=lambda r: (r["start"], r["source"]))
    return _page(req, rows)


def _invoices(emu: Emulator, req: Request) -> Any:
    """``show invoices-v1 --invoices``: the account's credit purchases (the emulator's deposits)."""
    filters = req.json_param("select_filters", {})
    lo, hi = _range(filters, "when")
    services = _in_filter(filters, "service")
    rows = []
    if services is None or "stripe_payments" in services:
        for n, (when, usd) in enumerate(emu.ledger.deposits, start=1):
            if lo <= when <= hi:
                # Amounts are the account ledger's: a payment into the account is negative (the CLI flips the sign).
                rows.append({"start": when, "end": when, "type": "credit", "source": "stripe",
                             "description": "Credit purchase", "amount": -usd,
                             "metadata": {"invoice_id": n}, "items": []})
    return _page(req, rows)


def _invoices_v0(emu: Emulator, req: Request) -> Any:
    """The deprecated ``show invoices``: charges (``inc_charges``) and payments in ``[sdate, edate]``."""
    try:
        lo = float(req.query.get("sdate") or 0.0)
        hi = float(req.query.get("edate") or emu.clock())
    except ValueError:
        raise ApiError(400, "invalid_args", "sdate and edate must be unix seconds") from None
    rows: list[dict[str, Any]] = []
    charged = 0.0
    if req.json_param("inc_charges", True):
        for c, _label in emu.charges(lo, hi):
            if c.usd <= 0:
                continue
            charged += c.usd
            hours = max(c.gpu_hours, c.storage_hours)  # how long it billed (storage bills every second it exists)
            rows.append({"id": c.instance_id, "instance_id": c.instance_id, "type": "charge",
                         "description": f"Instance {c.instance_id}: {c.gpu_hours:.3f} h active, "
                                        f"{c.storage_hours:.3f} h storage",
                         "quantity": round(hours, 6), "rate": round(c.usd / hours, 6) if hours else 0.0,
                         "amount": c.usd, "timestamp": c.end})
    for n, (when, usd) in enumerate(emu.ledger.deposits, start=1):
        if lo <= when <= hi:
            rows.append({"id": n, "type": "payment", "description": "Credit purchase", "quantity": 1, "rate": usd,
                         "amount": usd, "timestamp": when})
    rows.sort(key=lambda r: r["timestamp"])
    return {"invoices": rows, "current": {"charges": charged, "service_fee": 0.0, "total": charged}}


def _pending_increases(emu: Emulator, req: Request) -> Any:
    rows = emu.pending_increases(req.caller_instance)
    return {"success": True, "count": len(rows), "truncated": False, "pending_price_increases": rows}


def _answer_increase(emu: Emulator, req: Request) -> Any:
    body = _body_dict(req)
    pid = body.get("pending_price_increase_id")
    if set(body) != {"pending_price_increase_id"} or isinstance(pid, bool) or not isinstance(pid, int):
        raise ApiError(400, "invalid_args",
                       "body must be exactly {\"pending_price_increase_id\": int} (extra keys are forbidden)")
    accept = req.match.group("verb") == "accept"
    contract = emu.answer_increase(pid, accept=accept, caller_instance=req.caller_instance)
    return {"success": True, "pending_price_increase_id": pid, "contract_id": contract}


def _filters(emu: Emulator, req: Request) -> Any:
    return {"filters": []}


# ---- admin routes -----------------------------------------------------------------------------------------
def _admin_state(emu: Emulator, req: Request) -> Any:
    return emu.admin_state()


def _admin_ledger(emu: Emulator, req: Request) -> Any:
    return emu.ledger.snapshot()


def _admin_events(emu: Emulator, req: Request) -> Any:
    return {"events": emu.ledger.events}


def _admin_instance(emu: Emulator, req: Request) -> Any:
    action = req.match.group("action")
    iid = req.int_arg("id")
    actions: dict[str, Callable[[int], None]] = {
        "vanish": emu.vanish, "hang": emu.hang, "resume": emu.resume, "outbid": emu.outbid,
        "never_boot": emu.never_boot, "hide": emu.hide, "unhide": emu.unhide,
    }
    actions[action](iid)
    return {"success": True}


def _admin_end_date(emu: Emulator, req: Request) -> Any:
    at = _body_dict(req).get("at")
    try:
        value = float(at) if at is not None and not isinstance(at, bool) else math.nan
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value):
        raise ApiError(400, "invalid_args", "body: {\"at\": epoch seconds}")
    emu.set_end_date(req.int_arg("id"), value)
    return {"success": True, "end_date": value}

def _admin_raise_price(emu: Emulator, req: Request) -> Any:
    b = _body_dict(req)
    try:
        dph, end = float(b["dph"]), float(b["ask_end_date"])
    except (KeyError, TypeError, ValueError):
        raise ApiError(400, "invalid_args", "body: {\"dph\": float, \"ask_end_date\": unix seconds}") from None
    return {"success": True, "pending_price_increase_id": emu.raise_price(req.int_arg("id"), dph, end)}


def _admin_fail_next(emu: Emulator, req: Request) -> Any:
    b = _body_dict(req)
    try:
        emu.fail_next(str(b["path_prefix"]), int(b.get("n", 1)), int(b.get("status", 429)))
    except (KeyError, TypeError, ValueError):
        raise ApiError(400, "invalid_args", "body: {\"path_prefix\": str, \"n\": int, \"status\": int}") from None
    return {"success": True}


def _admin_list_fault(emu: Emulator, req: Request) -> Any:
    b = _body_dict(req)
    fault, n, error = b.get("fault"), b.get("n"), b.get("error", "deprecated_endpoint")
    if (fault is not None and not isinstance(fault, str)) or not isinstance(error, str) or (
        n is not None and (isinstance(n, bool) or not isinstance(n, int))
    ):
        raise ApiError(400, "invalid_args", "body: {\"fault\": str or null, \"n\": int or null, \"error\": str}")
    emu.set_list_fault(fault, n, error)
    return {"success": True}


def _admin_switch(setter: Callable[[Emulator], Callable[[bool], None]]) -> RouteFn:
    """An admin route that turns a fault on or off: body ``{"on": bool}`` (default true)."""

    def route(emu: Emulator, req: Request) -> Any:
        on = _body_dict(req).get("on", True)
        if not isinstance(on, bool):
            raise ApiError(400, "invalid_args", "body: {\"on\": bool}")
        setter(emu)(on)
        return {"success": True}

    return route


def _admin_rate_limit(emu: Emulator, req: Request) -> Any:
    b = _body_dict(req)
    try:
        per_s = float(b["per_s"]) if b.get("per_s") is not None else None
        emu.rate_limit(per_s, int(b.get("burst", 1)), str(b.get("path_prefix", "/api/")))
    except (KeyError, TypeError, ValueError):
        raise ApiError(400, "invalid_args",
                       "body: {\"per_s\": float or null, \"burst\": int, \"path_prefix\": str}") from None
    return {"success": True}


def _admin_latency(emu: Emulator, req: Request) -> Any:
    try:
        emu.set_latency(float(_body_dict(req)["seconds"]))
    except (KeyError, TypeError, ValueError):
        raise ApiError(400, "invalid_args", "body: {\"seconds\": float}") from None
    return {"success": True}


def _admin_never_boot(emu: Emulator, req: Request) -> Any:
    iid = _body_dict(req).get("instance_id")
    emu.never_boot(int(iid) if iid is not None else None)
    return {"success": True}


def _admin_churn(emu: Emulator, req: Request) -> Any:
    b = _body_dict(req)
    try:
        emu.churn(float(b["rate_per_hour"]), int(b.get("seed", 0)))
    except (KeyError, TypeError, ValueError):
        raise ApiError(400, "invalid_args", "body: {\"rate_per_hour\": float, \"seed\": int}") from None
    return {"success": True}


def _admin_credit(emu: Emulator, req: Request) -> Any:
    try:
        emu.deposit(float(_body_dict(req)["usd"]))
    except (KeyError, TypeError, ValueError):
        raise ApiError(400, "invalid_args", "body: {\"usd\": float}") from None
    return {"success": True, "credit": emu.credit_usd()}


def _admin_drift(emu: Emulator, req: Request) -> Any:
    b = _body_dict(req)
    seed = b.get("seed")
    emu.drift_prices(float(b.get("max_fraction", 0.1)), int(seed) if seed is not None else None)
    return {"success": True}


RouteFn = Callable[["Emulator", Request], Any]
_ID = r"(?P<id>\d+)"
# (method, pattern, handler, needs_auth, instance_key_ok)
ROUTES: list[tuple[str, re.Pattern[str], RouteFn, bool, bool]] = [
    (m, re.compile(p + r"/?$"), h, auth, inst_ok)
    for m, p, h, auth, inst_ok in [
        ("POST", r"/api/v0/bundles", _search, True, False),
        ("PUT", rf"/api/v0/asks/{_ID}", _create, True, False),
        ("GET", r"/api/v1/instances", _list_v1, True, False),
        ("GET", r"/api/v0/instances", _list_v0, True, False),
        ("GET", r"/api/v0/instances/filters", _filters, True, False),
        # before the {id} routes; a per-instance key sees and answers only its own contract's rows
        ("GET", r"/api/v0/instances/pending-price-increases", _pending_increases, True, True),
        ("PUT", r"/api/v0/instances/(?P<verb>accept|reject)-price-increase", _answer_increase, True, True),
        ("GET", rf"/api/v0/instances/{_ID}", _show, True, True),
        ("PUT", rf"/api/v0/instances/{_ID}", _put_instance, True, True),
        ("DELETE", rf"/api/v0/instances/{_ID}", _delete_instance, True, True),
        ("POST", rf"/api/v0/instances/{_ID}/ssh", _attach_ssh, True, True),
        ("DELETE", rf"/api/v0/instances/{_ID}/ssh/(?P<key>[^/]+)", _detach_ssh, True, True),
        ("GET", r"/api/v0/ssh", _ssh_list, True, False),
        ("POST", r"/api/v0/ssh", _ssh_add, True, False),
        ("PUT", rf"/api/v0/ssh/{_ID}", _ssh_update, True, False),
        ("DELETE", rf"/api/v0/ssh/{_ID}", _ssh_delete, True, False),
        ("GET", r"/api/v0/gpu_names/unique", _gpu_names, False, False),
        ("GET", r"/api/v0/users/current", _user, True, False),
        ("GET", r"/api/v0/users/me/invoices", _invoices_v0, True, False),
        ("GET", r"/api/v0/charges", _charges, True, False),
        ("GET", r"/api/v1/invoices", _invoices, True, False),
        ("GET", r"/_emulator/state", _admin_state, True, False),
        ("GET", r"/_emulator/ledger", _admin_ledger, True, False),
        ("GET", r"/_emulator/events", _admin_events, True, False),
        ("POST", rf"/_emulator/instances/{_ID}/(?P<action>vanish|hang|resume|outbid|never_boot|hide|unhide)",
         _admin_instance, True, False),
        ("POST", rf"/_emulator/instances/{_ID}/end_date", _admin_end_date, True, False),
        ("POST", rf"/_emulator/instances/{_ID}/raise_price", _admin_raise_price, True, False),
        ("POST", r"/_emulator/fail_next", _admin_fail_next, True, False),
        ("POST", r"/_emulator/latency", _admin_latency, True, False),
        ("POST", r"/_emulator/never_boot", _admin_never_boot, True, False),
        ("POST", r"/_emulator/churn", _admin_churn, True, False),
        ("POST", r"/_emulator/drift", _admin_drift, True, False),
        ("POST", r"/_emulator/credit", _admin_credit, True, False),
        ("POST", r"/_emulator/list_fault", _admin_list_fault, True, False),
        ("POST", r"/_emulator/hide_new", _admin_switch(lambda emu: emu.hide_new), True, False),
        ("POST", r"/_emulator/ignore_bids", _admin_switch(lambda emu: emu.ignore_bids), True, False),
        ("POST", r"/_emulator/rate_limit", _admin_rate_limit, True, False),
    ]
]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, payload: Any, content_type: str = "application/json") -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            try:
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                # The caller is gone before its reply: a box whose watchdog destroyed it dies mid-request,
                # as a real client may. Nothing to tell it, and not an error of the server's.
                self.close_connection = True

    def _error(self, status: int, error: str, msg: str) -> None:
        self._send(status, {"success": False, "error": error, "msg": msg})

    def _dispatch(self) -> None:
        emu = self.server.emulator
        parts = urlsplit(self.path)
        path = parts.path.replace("//", "/")
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        is_api = path.startswith("/api/")
        if is_api and emu.latency > 0:
            time.sleep(emu.latency)
        if is_api:
            status = emu.take_failure(path)
            if status is not None:
                if status == 429:
                    self._send(429, b"API requests too frequent", "text/plain")
                else:
                    self._error(status, "server_error", f"Injected failure: HTTP {status}")
                return
        route = None
        path_known = False
        for method, pattern, fn, auth, inst_ok in ROUTES:
            m = pattern.match(path)
            if m is None:
                continue
            path_known = True
            if method == self.command:
                route = (m, fn, auth, inst_ok)
                break
        if route is None:
            if path_known:
                self._error(405, "method_not_allowed", f"{self.command} is not allowed on {path}")
            else:
                self._error(404, "not_found", f"Unknown endpoint: {self.command} {path}")
            return
        m, fn, auth, inst_ok = route
        caller = None
        header = self.headers.get("Authorization", "")
        key = header[7:].strip() if header.startswith("Bearer ") else query.get("api_key", "")
        if is_api and not emu.rate_limits.allow(identity_of(key), self.command, path):
            emu.ledger.log("rate_limited", None, identity=identity_of(key), path=path)
            self._send(429, b"API requests too frequent", "text/plain")
            return
        if auth:
            if not key:
                self._error(401, "auth_error", "Invalid user key")
                return
            if not secrets.compare_digest(key.encode(), emu.api_key.encode()):
                caller = emu.instance_key_owner(key)
                # an instance key reaches only its own instance's routes (those without an id scope by caller)
                named = m.groupdict().get("id")
                if caller is None or not inst_ok or (named is not None and int(named) != caller):
                    self._error(401, "auth_error", "Invalid user key")
                    return
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                self._error(400, "invalid_args", "Request body is not valid JSON.")
                return
        req = Request(self.command, path, query, body, m, caller)
        try:
            result = fn(emu, req)
        except ApiError as exc:
            self._error(exc.status, exc.error, exc.msg)
            return
        except Exception as exc:  # a bug in the emulator must answer, not hang the client
            self._error(500, "server_error", f"emulator error: {type(exc).__name__}: {exc}")
            return
        self._send(200, result)

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()
