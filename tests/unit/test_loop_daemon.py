"""``FleetDaemon.run_forever`` survives a cycle that raises a library exception, and still ends on an interrupt.

The daemon's cycle (git, adapters, the reconciler) is replaced by a script of cycles, so only the loop around it
runs: no git repository, no lease, no watcher threads.
"""

from __future__ import annotations

import logging
import threading
import types
from collections.abc import Callable

import pytest

from reconciler.daemon import DaemonConfig, DaemonCycle, FleetDaemon
from reconciler.errors import HostUnreachable, LeaseLost


def _daemon(script: list[Callable[[], DaemonCycle]]) -> tuple[FleetDaemon, list[str]]:
    d = FleetDaemon.__new__(FleetDaemon)  # no repository: only run_forever's loop is under test
    d.config = DaemonConfig(interval_s=0.0, max_backoff_s=0.01)
    d.stop_event = threading.Event()
    d.wake_event = threading.Event()
    d.reconciler = None
    events: list[str] = []
    steps = iter(script)
    d.acquire = lambda: "lease: taken"  # type: ignore[method-assign]
    d._watch = lambda: (lambda: events.append("watch stopped"))  # type: ignore[method-assign]
    d.release = lambda: events.append("released")  # type: ignore[method-assign]

    def cycle() -> DaemonCycle:
        events.append("cycle")
        return next(steps)()

    d.cycle = cycle  # type: ignore[method-assign]
    return d, events


def _raise(exc: BaseException) -> Callable[[], DaemonCycle]:
    def step() -> DaemonCycle:
        raise exc

    return step


def test_the_daemon_keeps_going_after_a_library_exception_in_a_cycle(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    def done() -> DaemonCycle:
        d.stop_event.set()  # as SIGTERM would
        return DaemonCycle(desired_commit=None, acted=True, commit=None, counts={}, failures=0, desired_errors=())

    d, events = _daemon([
        _raise(KeyError("new_contract")),  # the provider's SDK
        _raise(OSError("Socket is closed")),  # the SSH library
        _raise(HostUnreachable("10.0.0.1: no answer")),  # one of ours, transient
        done,
    ])
    with caplog.at_level(logging.ERROR, logger="rigsync.run"):
        code = d.run_forever()

    assert code == 0
    assert events == ["cycle", "cycle", "cycle", "cycle", "watch stopped", "released"]
    out = capsys.readouterr().out
    assert "cycle: unexpected KeyError: 'new_contract'; retrying in" in out
    assert "cycle: unexpected OSError: Socket is closed; retrying in" in out
    assert "cycle: transient: 10.0.0.1: no answer; retrying in" in out
    tracebacks = [r.exc_info[0] for r in caplog.records if r.exc_info]
    assert tracebacks == [KeyError, OSError]  # library surprises are logged with their traceback, ours are not


def test_a_keyboard_interrupt_in_a_cycle_still_ends_the_daemon() -> None:
    d, events = _daemon([_raise(KeyError("x")), _raise(KeyboardInterrupt())])
    with pytest.raises(KeyboardInterrupt):
        d.run_forever()
    assert events == ["cycle", "cycle", "watch stopped", "released"]


def test_once_reports_a_failed_cycle() -> None:
    d, events = _daemon([_raise(KeyError("x"))])
    d.local_lock = type("Lock", (), {"release": lambda self: events.append("unlocked")})()
    assert d.run_forever(once=True) == 1
    assert events == ["cycle", "unlocked"]


def test_a_lost_lease_ends_the_daemon_loudly_without_retrying_or_writing_the_lease(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    d, events = _daemon([_raise(LeaseLost("the lease's fencing deadline passed 3s ago"))])
    d.lease_lost = None
    d.git = type("Git", (), {"drop_unpushed": lambda self: events.append("dropped unpushed") or "tip"})()
    d.local_lock = type("Lock", (), {"release": lambda self: events.append("unlocked")})()
    del d.release  # the real release: it must not touch the lease once it is lost (it may be someone else's)
    with caplog.at_level(logging.ERROR, logger="rigsync.run"), pytest.raises(LeaseLost):
        d.run_forever()
    assert events == ["cycle", "dropped unpushed", "watch stopped", "unlocked"]  # one cycle: no retry, no commit
    assert "cycle: LEASE LOST: the lease's fencing deadline passed 3s ago" in capsys.readouterr().out
    assert any("LEASE LOST" in r.getMessage() for r in caplog.records)


def test_one_failed_cycle_with_once_says_it_exits_not_that_it_retries(capsys: pytest.CaptureFixture[str]) -> None:
    d, events = _daemon([_raise(HostUnreachable("10.0.0.1: no answer"))])
    d.local_lock = types.SimpleNamespace(release=lambda: events.append("lock released"))  # type: ignore[assignment]
    assert d.run_forever(once=True) == 1
    out = capsys.readouterr().out
    assert "cycle: transient: 10.0.0.1: no answer; exiting (--once)" in out and "retrying" not in out
    assert events == ["cycle", "lock released"]
