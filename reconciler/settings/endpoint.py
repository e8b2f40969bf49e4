"""Where the provider API key may be sent: the one rule, and where the URL comes from.

The account's API key goes to the provider URL configured on the controller, never to one named under desired/
(those files arrive by pull request: a URL there could send the key anywhere). In order:

* ``--api-url URL`` on the commands that talk to the provider (`rigsync run`, `plan`, `apply`, `status`),
* else the environment variable ``RIGSYNC_API_URL`` (the same name the box's watchdog gets, with the same URL),
* else https://console.vast.ai.

``check_api_url`` is the rule every such URL passes, wherever it comes from (also the one handed to
``VastProvider`` in process): https, or plain http only to a loopback host (127.0.0.0/8, ::1, localhost: the
local emulator), because over plain http anyone on the path reads the key; no ``user:password@``, query or
fragment. A URL that breaks it is a ``UserError`` naming the flag or variable and why, raised before any
request is made. The rule itself is ``check_url``: the result store's endpoint (``storeconfig``) passes it too.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from urllib.parse import urlsplit

from reconciler.errors import UserError
from reconciler.remote import WATCHDOG_API_URL_ENV

DEFAULT_URL = "https://console.vast.ai"
API_URL_ENV = WATCHDOG_API_URL_ENV  # one name on the controller (this URL) and on the box (for its watchdog)
API_URL_FLAG = "--api-url"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _shown(url: str) -> str:
    """``url`` for a message: without what could be a secret (user:password@, the query, the fragment)."""
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return "(unparsable)"
    netloc = parts.netloc if "@" not in parts.netloc else "***@" + parts.netloc.rpartition("@")[2]
    shown = f"{parts.scheme}://{netloc}{parts.path}" if parts.scheme else parts.path
    shown += "?***" if parts.query else ""
    shown += "#***" if parts.fragment else ""
    return repr(shown[:200])


def shown_url(url: str) -> str:
    """``url`` as a message may show it: no user:password@, no query, no fragment (quoted)."""
    return _shown(url)


def check_url(url: str, source: str, *, what: str, carries: str, credentials_from: str) -> str:
    """``url`` as a base URL a credential may be sent to, without a trailing slash; a ``UserError`` if it is not.

    The one rule for every such URL (the provider's, ``check_api_url``; the result store's endpoint,
    ``storeconfig``): https, or plain http only to a loopback host; no ``user:password@``, query or fragment; a
    host; a real port. ``source`` names where the URL came from (the flag or the variable), ``what`` what it is
    for ("provider URL"), ``carries`` what plain http would expose ("the API key") and ``credentials_from`` where
    the credentials do come from, for the message, which never repeats the parts of the URL that could hold a
    secret.
    """
    def refuse(why: str) -> UserError:
        return UserError(f"{source}: {_shown(url)} is not a usable {what}: {why}")

    text = url.strip()
    if not text:
        raise refuse("it is empty")
    if any(c.isspace() or ord(c) < 0x20 or c == "\x7f" for c in text):
        raise refuse("it contains whitespace or control characters")
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise refuse(f"it does not parse ({exc})") from exc
    scheme = parts.scheme.lower()
    if scheme not in ("https", "http"):
        raise refuse("it must start with https:// (or http:// to a loopback host such as 127.0.0.1)")
    if "@" in parts.netloc:
        raise refuse(f"credentials (user:password@) do not belong in it; {credentials_from}")
    if parts.query or parts.fragment or text.endswith(("?", "#")):
        raise refuse("a query (?...) or fragment (#...) is not allowed in it")
    host = (parts.hostname or "").lower()
    if not host:
        raise refuse("it has no host")
    if scheme == "http" and not _is_loopback(host):
        raise refuse(
            "plain http is allowed only to a loopback host (127.0.0.0/8, ::1, localhost): anyone on the path "
            f"could read {carries}; use https://"
        )
    if port == 0:
        raise refuse("port 0 is not a port")
    return text.rstrip("/")


def check_api_url(url: str, source: str) -> str:
    """``url`` as a base URL the API key may be sent to (``check_url``'s rule); a ``UserError`` if it is not."""
    return check_url(
        url, source, what="provider URL", carries="the API key", credentials_from="the API key comes from VAST_API_KEY"
    )


def controller_api_url(flag: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The provider URL this controller sends the API key to: ``--api-url``, else ``RIGSYNC_API_URL``, else Vast.ai.

    Checked by ``check_api_url``. Never a URL from desired/: those files arrive by pull request.
    """
    env = os.environ if environ is None else environ
    if flag is not None:
        return check_api_url(flag, API_URL_FLAG)
    from_env = env.get(API_URL_ENV)
    if from_env is not None:
        return check_api_url(from_env, f"the environment variable {API_URL_ENV}")
    return DEFAULT_URL
