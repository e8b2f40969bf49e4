"""The notification rules (``reconciler.core.notify``) and the notifier's once-only, never-waiting sending."""

from __future__ import annotations

import logging
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from fakes import desired_state
from test_loader_cases import example_files
from test_loop_daemon import _daemon, _raise

from reconciler.adapters.notifier import NOTIFIED, Notifier, apprise_destinations, notify_urls, read_sent
from reconciler.core.actions import Destroy, Noop, Plan, ReasonCode, Requeue, SweepEstimate
from reconciler.core.model import AttemptOutcome, AttemptRecord, Desired, NotifyEvent, Observed
from reconciler.core.notify import Event, cycle_events, lease_lost_events
from reconciler.desired import load_desired
from reconciler.errors import DesiredStateInvalid, LeaseLost

ALL = tuple(NotifyEvent)


def wanting(desired: Desired, *events: NotifyEvent) -> Desired:
    return replace(desired, fleet=replace(desired.fleet, notify_events=events))


def record(run_id: str, phase: AttemptOutcome = AttemptOutcome.SUCCEEDED) -> AttemptRecord:
    return AttemptRecord(run_id=run_id, attempt=1, sweep="s", phase=phase)


def kinds(events: tuple[Event, ...]) -> list[str]:
    return [e.kind.value for e in events]


def test_a_sweep_finishes_once_every_run_is_settled_by_the_archive() -> None:
    desired = wanting(desired_state(2), *ALL)
    half = Observed(history=(record("r0"),))
    assert cycle_events(desired, half, Plan(actions=())) == ()
    done = Observed(history=(record("r0"), record("r1", AttemptOutcome.FAILED), record("r1", AttemptOutcome.FAILED)))
    done = replace(done, history=(*done.history[:2], replace(done.history[2], attempt=2), record("r1")))
    (event,) = cycle_events(desired, done, Plan(actions=()))
    assert event.kind is NotifyEvent.SWEEP_FINISHED
    assert event.key == "sweep_finished:lab:s:2"
    assert "2 succeeded" in event.body
    # the same facts a cycle later give the same key: sent once
    assert cycle_events(desired, done, Plan(actions=())) == (event,)


def test_events_the_fleet_does_not_ask_for_are_not_produced() -> None:
    desired = desired_state(1)
    done = Observed(history=(record("r0"),))
    assert cycle_events(desired, done, Plan(actions=())) == ()
    assert cycle_events(wanting(desired, NotifyEvent.CAP_REACHED), done, Plan(actions=())) == ()
    assert lease_lost_events(desired, "me", 3, "taken over") == ()
    (lost,) = lease_lost_events(wanting(desired, NotifyEvent.LEASE_LOST), "me", 3, "taken over")
    assert lost.key == "lease_lost:lab:me:3" and "taken over" in lost.body


def test_plan_decisions_become_events_by_their_reason_code() -> None:
    desired = wanting(desired_state(3), *ALL)
    estimate = SweepEstimate("s", 3, 0, 3.0, 1.0, "expected_runtime", 0, 9.0, 12.0, 2.0, 1, -7.0, -4.0)
    plan = Plan(
        actions=(
            Destroy("host key differs", code=ReasonCode.HOST_KEY_CHANGED, instance_id=11),
            Destroy("stopped: outbid", code=ReasonCode.PROVIDER_STOPPED, instance_id=12),
            Destroy("offline", code=ReasonCode.PROVIDER_DEAD, instance_id=13),
            Requeue("box gone", code=ReasonCode.BOX_VANISHED, run_id="r2", attempt=1, instance_id=14),
            Destroy("idle", code=ReasonCode.IDLE_TIMEOUT, instance_id=15),
        ),
        noops=(
            Noop("blocked: 3 of 3", code=ReasonCode.BLOCKED, subject="run/r1"),
            Noop("max_instances reached", code=ReasonCode.INSTANCE_COUNT_CAP, subject="run/r0"),
            Noop("max_instances reached", code=ReasonCode.INSTANCE_COUNT_CAP, subject="run/r2"),
            Noop("running", code=ReasonCode.RUNNING, subject="run/r0"),
        ),
        estimates=(estimate,),
    )
    events = cycle_events(desired, Observed(), plan)
    assert {e.key for e in events} == {
        "host_key_changed:lab:11",
        "box_preempted:lab:12",
        "box_lost:lab:13",
        "box_lost:lab:14",
        "runs_blocked:lab:run/r1",
        "cap_reached:lab:instance_count_cap:d35173d",  # one per cap and desired revision, not per run
        "budget_forecast_over:lab:s:d35173d",
    }
    over = next(e for e in events if e.kind is NotifyEvent.BUDGET_FORECAST_OVER)
    assert "$9.00" in over.body and "$4.00 more" in over.body
    # a forecast that may still fit (over only at the dearest price) is not an event
    fits = replace(plan, actions=(), noops=(), estimates=(replace(estimate, budget_left_high=1.0),))
    assert cycle_events(desired, Observed(), fits) == ()
    only = wanting(desired, NotifyEvent.BOX_LOST)
    assert kinds(cycle_events(only, Observed(), plan)) == ["box_lost", "box_lost"]


def test_the_loader_reads_notify_events_and_refuses_urls_without_quoting_them() -> None:
    files = dict(example_files())
    fleet = files["desired/fleet.yaml"].decode()
    ok = {**files, "desired/fleet.yaml": (fleet + "\nnotify:\n  events: [sweep_finished, box_lost]\n").encode()}
    assert load_desired(ok).fleet.notify_events == (NotifyEvent.SWEEP_FINISHED, NotifyEvent.BOX_LOST)
    assert load_desired(files).fleet.notify_events == ()
    bad = {**files, "desired/fleet.yaml": (fleet + "\nnotify: 'ntfy://secret-topic'\n").encode()}
    try:
        load_desired(bad)
    except DesiredStateInvalid as exc:
        text = str(exc) + " ".join(str(e) for e in exc.errors)
        assert "RIGSYNC_NOTIFY_URLS" in text and "secret-topic" not in text
    else:
        raise AssertionError("a URL in desired/ was accepted")


def test_urls_come_from_the_controller_split_on_commas_and_spaces() -> None:
    env = {"RIGSYNC_NOTIFY_URLS": " json://a/ ,mailto://u:p@h\n ntfy://t "}
    assert notify_urls(env) == ("json://a/", "mailto://u:p@h", "ntfy://t")
    assert notify_urls({}) == ()


def event(key: str) -> Event:
    return Event(NotifyEvent.SWEEP_FINISHED, key, "t", "b")


def test_the_notifier_sends_each_key_once_and_a_restart_remembers_only_keys(tmp_path: Path) -> None:
    got: list[str] = []
    n = Notifier(tmp_path, [lambda e: got.append(e.key) or True])
    n.offer([event("a"), event("a"), event("b")])
    n.close(5)
    assert sorted(got) == ["a", "b"]
    assert (tmp_path / NOTIFIED).read_text() == "a\nb\n"
    again = Notifier(tmp_path, [lambda e: got.append(e.key) or True])
    assert again.offer([event("a"), event("c")]) == 1
    again.close(5)
    assert sorted(got) == ["a", "b", "c"]
    assert read_sent(tmp_path) == {"a", "b", "c"}


def test_a_failed_send_is_not_remembered_so_a_later_cycle_retries(tmp_path: Path) -> None:
    answers = iter([False, True])
    n = Notifier(tmp_path, [lambda e: next(answers)])
    n.offer([event("a")])
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and n.offer([event("a")]) == 0:
        time.sleep(0.01)
    n.close(5)
    assert read_sent(tmp_path) == {"a"}


def test_an_event_one_destination_missed_is_retried_to_that_destination_only(tmp_path: Path) -> None:
    webhook: list[str] = []
    mail_answers = iter([False, True])
    mail: list[str] = []

    def flaky_mail(e: Event) -> bool:
        ok = next(mail_answers)
        if ok:
            mail.append(e.key)
        return ok

    n = Notifier(tmp_path, [lambda e: webhook.append(e.key) or True, flaky_mail])
    n.offer([event("a")])
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and n.waiting():
        time.sleep(0.01)
    assert webhook == ["a"] and mail == [] and "a" not in n.sent()  # not everywhere yet: not remembered as sent
    assert n.offer([event("a")]) == 1  # a later cycle sees the same fact
    n.close(5)
    assert webhook == ["a"], "the destination that took it first was sent it again"
    assert mail == ["a"]
    assert read_sent(tmp_path) == {"a"}


def test_a_stuck_destination_never_makes_offer_wait(tmp_path: Path) -> None:
    release = threading.Event()
    n = Notifier(tmp_path, [lambda e: release.wait(30)], queue_size=2)
    started = time.monotonic()
    queued = n.offer([event(str(i)) for i in range(50)])
    assert time.monotonic() - started < 0.5
    assert queued <= 3  # the one being sent and the queue's two
    n.close(0.2)
    assert read_sent(tmp_path) == frozenset()
    release.set()


def test_a_failing_destination_is_logged_without_its_url(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:  # a port nothing listens on: connection refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    caplog.set_level(logging.DEBUG)
    n = Notifier(tmp_path, apprise_destinations([f"json://127.0.0.1:{port}/secret-path", "nosuch://token-here"]))
    n.offer([event("a")])
    n.close(10)
    assert read_sent(tmp_path) == frozenset()
    assert "not delivered" in caplog.text and "nosuch" in caplog.text
    assert "secret-path" not in caplog.text and "token-here" not in caplog.text and str(port) not in caplog.text


def test_a_lost_lease_is_told_before_the_daemon_exits(tmp_path: Path) -> None:
    got: list[Event] = []
    d, _ = _daemon([_raise(LeaseLost("taken over by rigsync@other"))])
    d.lease_lost = None
    d.git = type("Git", (), {"drop_unpushed": lambda self: "tip"})()
    d.local_lock = type("Lock", (), {"release": lambda self: None})()
    d.lease = type("Lease", (), {"holder": "rigsync@me", "epoch": 7})()
    d.last_valid = wanting(desired_state(1), NotifyEvent.LEASE_LOST)
    d.notifier = Notifier(tmp_path, [lambda e: got.append(e) or True])
    del d.release
    with pytest.raises(LeaseLost):
        d.run_forever()
    assert [e.key for e in got] == ["lease_lost:lab:rigsync@me:7"]  # the daemon's exit let the queue drain
    assert "taken over by rigsync@other" in got[0].body
    assert read_sent(tmp_path) == {"lease_lost:lab:rigsync@me:7"}
