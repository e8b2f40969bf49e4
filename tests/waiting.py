"""The one way a test waits: for a condition, with a bound (never a fixed sleep in the hope that something happened).

``wait_for(what, cond, timeout)`` polls ``cond`` until it returns something truthy and returns that value; after
``timeout`` seconds it fails naming ``what``. The bound only ends a wait that would never end: it is generous, so a
loaded machine makes a test slower, not red. Both tiers import it (tests/ is on sys.path, tests/conftest.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    what: str, cond: Callable[[], T], timeout: float = 60.0, every: float = 0.2, explain: Callable[[], object] = str
) -> T:
    """Poll ``cond`` every ``every`` seconds until it returns something truthy; that value. AssertionError naming
    ``what`` when ``timeout`` seconds pass first, with what ``explain()`` says then (nothing by default)."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what} {explain()}".rstrip())
        time.sleep(every)
