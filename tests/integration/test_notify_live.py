"""Notifications through real receivers on loopback: a webhook (``json://``, an ``http.server``) and e-mail
(``mailto://``, an aiosmtpd SMTP server), driven by the real daemon over the emulator's boxes.

A sweep that finishes is told once to each destination across cycles and a restart of the controller; the keys it
remembers (observed/notified.txt) hold no URL; a destination that accepts connections and never answers does not
slow the cycles, and what it did not take is not remembered as sent.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from gitutil import git
from test_run_daemon import World, world_factory

from reconciler.adapters.notifier import NOTIFIED, URLS_ENV, read_sent
from reconciler.daemon import FleetDaemon

pytestmark = pytest.mark.integration
__all__ = ["world_factory"]  # test_run_daemon's fixture: a fleet repo over the emulator, its boxes destroyed after


class Webhook:
    """An HTTP server on loopback keeping every JSON body POSTed to it."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        bodies = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length", "0"))
                bodies.append(json.loads(self.rfile.read(n)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"json://127.0.0.1:{self.server.server_port}/"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Mailbox:
    """An SMTP server on loopback (aiosmtpd) keeping every message it is handed."""

    def __init__(self) -> None:
        self.messages: list[bytes] = []
        messages = self.messages

        class Handler:
            async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
                messages.append(bytes(envelope.content))
                return "250 OK"

        self.port = free_port()
        self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port)
        self.controller.start()

    @property
    def url(self) -> str:
        return f"mailto://127.0.0.1:{self.port}?from=rigsync@example.com&to=ops@example.com&mode=insecure"

    def close(self) -> None:
        self.controller.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def notified_world(
    world_factory: Callable[..., World], monkeypatch: pytest.MonkeyPatch, name: str, urls: str
) -> World:
    """A fleet of one short run that asks to be told when its sweep finishes, with ``urls`` on the controller."""
    monkeypatch.setenv(URLS_ENV, urls)
    w = world_factory(name, seconds=1.0)
    fleet = w.work / "desired" / "fleet.yaml"
    fleet.write_text(fleet.read_text() + "\nnotify:\n  events: [sweep_finished, box_lost]\n")
    git(w.work, "commit", "-q", "-am", "notify: tell people when a sweep finishes")
    git(w.work, "push", "-q", "origin", "main")
    return w


def cycles_until(d: FleetDaemon, done: Callable[[], bool], timeout: float = 120.0) -> list[float]:
    """Run cycles until ``done``; the wall time of each."""
    walls: list[float] = []
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"not done after {len(walls)} cycles"
        walls.append(d.cycle().wall_s)
        time.sleep(0.3)
    return walls


def test_a_finished_sweep_is_told_once_by_webhook_and_mail_across_cycles_and_a_restart(
    world_factory: Callable[..., World], monkeypatch: pytest.MonkeyPatch
) -> None:
    hook, mail = Webhook(), Mailbox()
    try:
        w = notified_world(world_factory, monkeypatch, "t-notify", f"{hook.url}, {mail.url}")
        d = w.daemon()
        d.acquire()
        try:
            cycles_until(d, lambda: bool(hook.bodies) and bool(mail.messages))
            for _ in range(2):  # the same finished sweep, seen again: not sent again
                d.cycle()
        finally:
            assert d.notifier is not None
            d.notifier.close()
            d.release()
        sent = read_sent(w.work)
        assert sent == {"sweep_finished:t-notify:tdmpc:1"}
        restarted = w.daemon()  # a new controller process on the same checkout: it remembers the keys
        restarted.acquire()
        try:
            for _ in range(3):
                restarted.cycle()
        finally:
            assert restarted.notifier is not None
            restarted.notifier.close()
            restarted.release()
        assert len(hook.bodies) == 1, hook.bodies
        assert len(mail.messages) == 1
        assert hook.bodies[0]["title"] == "rigsync t-notify: sweep tdmpc finished"
        assert "1 succeeded" in hook.bodies[0]["message"]
        assert b"Subject: rigsync t-notify: sweep tdmpc finished" in mail.messages[0]
        # only keys are remembered and committed: no URL, no port of a destination
        remembered = (w.work / NOTIFIED).read_text()
        assert "127.0.0.1" not in remembered and "json://" not in remembered
    finally:
        hook.close()
        mail.close()


def test_a_destination_that_never_answers_does_not_slow_a_cycle(
    world_factory: Callable[..., World], monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = socket.socket()  # accepts connections (the kernel's backlog) and never answers a byte
    sink.bind(("127.0.0.1", 0))
    sink.listen(16)
    port = sink.getsockname()[1]
    try:
        w = notified_world(world_factory, monkeypatch, "t-notify-down", f"json://127.0.0.1:{port}/?rto=60&cto=60")
        d = w.daemon()
        d.acquire()
        try:
            walls = cycles_until(d, lambda: bool(d.notifier and d.notifier.waiting()))
            started = time.monotonic()
            for _ in range(2):
                walls.append(d.cycle().wall_s)
            assert time.monotonic() - started < 30, "cycles waited for a destination that never answers"
            assert max(walls) < 30
            assert d.notifier is not None
            d.notifier.close(timeout_s=0.5)
            assert read_sent(w.work) == frozenset(), "an event the destination never took was remembered as sent"
        finally:
            d.release()
    finally:
        sink.close()
