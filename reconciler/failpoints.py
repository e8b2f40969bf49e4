"""Failpoints: kill -9 of rigsync itself at a named step, for crash tests (in the style of FreeBSD fail(9), fail-rs).

``failpoint(name)`` does nothing unless the environment variable ``RIGSYNC_FAILPOINTS`` (read once, at the first
call) names that point. The variable is a comma-separated list of ``name`` or ``name:n``; ``name:n`` means "on
the n-th time this point is reached in this process" (``name`` alone: the first time). When it triggers, the
process sends itself SIGKILL: no ``finally``, no ``atexit``, no lease release, exactly what ``kill -9`` leaves.

    RIGSYNC_FAILPOINTS=apply.rent.after:2 rigsync run ...     # dies right after its second rent returns

The points (each one line at its site; keep them there):

``apply.rent.after``
    ``reconciler/apply.py``: a rent returned an instance id, before anything about it is committed to git.
``boxes.launch.locked``
    ``reconciler/adapters/box_control.py``: the launch script ran on the box. The launch lock (the attempt's ``mkdir``)
    and the wrapper's ``pid`` are taken and written by that one remote script (``box/launch.sh``) in one SSH
    call, so no controller-side point lies between the two; this is the nearest one: the box holds the lock, the
    run is alive and its pid written, and rigsync has not yet recorded the attempt as in flight.
``git.rebase.before``
    ``reconciler/adapters/git.py``: fetched, about to replay rigsync's unpushed commits onto the new remote tip.
``git.rebase.after``
    ``reconciler/adapters/git.py``: the rebase finished; the replayed commits are not pushed yet.
``git.push.before``
    ``reconciler/adapters/git.py``: committed locally, about to push.
``git.push.after``
    ``reconciler/adapters/git.py``: the push landed at the remote; the remote-tracking ref is not updated yet.

Zero cost when unset: the parsed table is cached and an unarmed point is one dict lookup.
"""

from __future__ import annotations

import os
import signal

ENV = "RIGSYNC_FAILPOINTS"

POINTS = (
    "apply.rent.after",
    "boxes.launch.locked",
    "git.rebase.before",
    "git.rebase.after",
    "git.push.before",
    "git.push.after",
)

_armed: dict[str, int] | None = None
_hits: dict[str, int] = {}


def parse(spec: str) -> dict[str, int]:
    """``"a:2,b"`` -> ``{"a": 2, "b": 1}``. Unknown names are kept (harmless); a bad count is a ValueError."""
    out: dict[str, int] = {}
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        name, _, count = item.partition(":")
        n = int(count) if count else 1
        if n < 1:
            raise ValueError(f"{ENV}: {item!r}: the count must be at least 1")
        out[name.strip()] = n
    return out


def _table() -> dict[str, int]:
    global _armed
    if _armed is None:
        _armed = parse(os.environ.get(ENV, ""))
    return _armed


def failpoint(name: str) -> None:
    """SIGKILL this process if ``RIGSYNC_FAILPOINTS`` arms ``name`` and this is the armed hit; else nothing."""
    armed = _table()
    if not armed:
        return
    target = armed.get(name)
    if target is None:
        return
    hits = _hits.get(name, 0) + 1
    _hits[name] = hits
    if hits == target:
        os.kill(os.getpid(), signal.SIGKILL)


def reset(spec: str | None = None) -> None:
    """Re-read the table (from ``spec``, or the environment when None) and clear the hit counts (for tests)."""
    global _armed
    _armed = parse(spec) if spec is not None else None
    _hits.clear()
