"""A notification is sent once across a takeover (issue 33): claimed in the cycle's commit with the lease epoch
before it is sent, and never sent by a controller whose epoch did not claim it."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from reconciler.adapters.notifier import CLAIMS, NOTIFIED, Claimed, Notifier, claims_text, parse_claims, read_sent
from reconciler.core.model import NotifyEvent
from reconciler.core.notify import Event, may_send, to_claim
from reconciler.daemon import with_claims

A, B = 1_700_000_000_000, 1_700_000_900_000  # two holdings of the lease: B took the fleet over from A


def event(key: str) -> Event:
    return Event(NotifyEvent.SWEEP_FINISHED, key, "t", "b")


def _drained(n: Notifier) -> None:
    deadline = time.monotonic() + 5
    while n.waiting() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not n.waiting()


def test_the_rules_claim_what_nobody_claimed_and_send_only_ones_own_claims() -> None:
    events = [event("x"), event("y"), event("x"), event("z")]
    assert to_claim(events, {"z"}, {"y": A}) == ("x",)
    assert may_send("x", set(), {"x": A}, A) and not may_send("x", set(), {"x": A}, B)
    assert not may_send("x", {"x"}, {"x": A}, A) and not may_send("w", set(), {"x": A}, A)


def test_the_claims_file_holds_epoch_and_key_a_line() -> None:
    text = claims_text({"b:k 2": B, "a:k": A})
    assert text == f"{A} a:k\n{B} b:k 2\n"
    assert parse_claims(text + "garbage\n-1 neg\n\n") == {"a:k": A, "b:k 2": B}


def test_a_cycle_claims_new_events_and_sends_them_under_its_own_epoch(tmp_path: Path) -> None:
    got: list[str] = []
    n = Notifier(tmp_path, [lambda e: got.append(e.key) or True])
    claimed = n.claim([event("a"), event("b")], A, committed="")
    assert claimed == Claimed(("a", "b"), f"{A} a\n{A} b\n", True)
    assert n.offer([event("a"), event("b")], epoch=A) == 2
    _drained(n)
    assert sorted(got) == ["a", "b"]
    n.save()
    # the next cycle: both delivered, so their claims leave the file (committed with notified.txt)
    assert n.claim([event("a"), event("b")], A, committed=claimed.text or "") == Claimed((), None, True)
    n.close(5)
    assert read_sent(tmp_path) == {"a", "b"}


def test_an_event_another_holding_claimed_is_never_sent_and_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    got: list[str] = []
    n = Notifier(tmp_path, [lambda e: got.append(e.key) or True])
    claimed = n.claim([event("a"), event("b")], B, committed=f"{A} a\n")  # A claimed a, and stopped: maybe sent
    assert claimed.keys == ("b",) and claimed.text == f"{A} a\n{B} b\n"
    with caplog.at_level(logging.WARNING, logger="rigsync.notify"):
        assert n.offer([event("a"), event("b")], epoch=B) == 1
        assert n.offer([event("a")], epoch=B) == 0
    n.close(5)
    assert got == ["b"]
    said = [r.getMessage() for r in caplog.records if "claimed by an earlier holding" in r.getMessage()]
    assert said == [f"notification a was claimed by an earlier holding of the lease (epoch {A}), which may have sent "
                    "it: not sent again"]


def test_an_unclaimed_event_is_not_sent_under_an_epoch(tmp_path: Path) -> None:
    got: list[str] = []
    n = Notifier(tmp_path, [lambda e: got.append(e.key) or True])
    assert n.offer([event("a")], epoch=A) == 0  # a claim not in a pushed commit yet
    assert n.offer([event("lease_lost")]) == 1  # no epoch: what only this controller produces, sent unclaimed
    n.close(5)
    assert got == ["lease_lost"]


def test_a_delivery_recorded_by_another_controller_is_not_claimed_again(tmp_path: Path) -> None:
    (tmp_path / "observed").mkdir()
    (tmp_path / NOTIFIED).write_text("a\n")  # what the remote's notified.txt said after the sync
    n = Notifier(tmp_path, [lambda e: True])
    assert n.claim([event("a")], B, committed=f"{A} a\n") == Claimed((), None, True)
    n.close(1)
    assert not (tmp_path / CLAIMS).exists()  # the daemon writes the claims file with its commit, never the notifier


def test_a_claim_makes_the_cycle_commit_and_says_so() -> None:
    assert with_claims(None, None) is None and with_claims("rented 1", Claimed((), None, True)) == "rented 1"
    claimed = Claimed(("sweep_finished:f:s:1",), "1 sweep_finished:f:s:1\n", True)
    said = "notify: claimed sweep_finished:f:s:1 (sent once this commit is pushed)"
    assert with_claims(None, claimed) == said
    assert with_claims("archived 1 run", claimed) == f"archived 1 run\n\n{said}"
