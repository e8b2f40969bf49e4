"""A notification is sent once across a takeover (issue 33): claimed in the cycle's commit, with the lease's holder
and epoch, before it is sent, and never sent by a controller other than the holder that claimed it."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from reconciler.adapters.notifier import CLAIMS, NOTIFIED, Claimed, Notifier, claims_text, parse_claims, read_sent
from reconciler.core.model import NotifyEvent
from reconciler.core.notify import Claim, Event, may_send, to_claim
from reconciler.daemon import with_claims

# two controllers: B took the fleet over from A
A = Claim("rigsync@a:/srv/fleet", 1_700_000_000_000)
B = Claim("rigsync@b:/home/ops/fleet clone", 1_700_000_900_000)


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
    assert may_send("x", set(), {"x": A}, A.holder) and not may_send("x", set(), {"x": A}, B.holder)
    assert not may_send("x", {"x"}, {"x": A}, A.holder) and not may_send("w", set(), {"x": A}, A.holder)
    # the same holder, restarted after releasing its lease (a new epoch), still sends its own claims
    assert may_send("x", set(), {"x": Claim(A.holder, 1)}, A.holder)


def test_the_claims_file_holds_one_claim_a_line() -> None:
    text = claims_text({"b:k 2": B, "a:k": A})
    assert text.splitlines()[0] == f'{{"epoch": {A.epoch}, "holder": "{A.holder}", "key": "a:k"}}'
    noise = '\nnot json\n{"key": "c", "holder": "h", "epoch": true}\n{"key": "d"}\n[1]\n'
    assert parse_claims(text + noise) == {"a:k": A, "b:k 2": B}


def test_a_cycle_claims_new_events_and_sends_them_as_their_holder(tmp_path: Path) -> None:
    got: list[str] = []
    n = Notifier(tmp_path, [lambda e: got.append(e.key) or True])
    claimed = n.claim([event("a"), event("b")], A, committed="")
    assert claimed == Claimed(("a", "b"), claims_text({"a": A, "b": A}), True)
    assert n.offer([event("a"), event("b")], holder=A.holder) == 2
    _drained(n)
    assert sorted(got) == ["a", "b"]
    n.save()
    # the next cycle: both delivered, so their claims leave the file (committed with notified.txt)
    assert n.claim([event("a"), event("b")], A, committed=claimed.text or "") == Claimed((), None, True)
    n.close(5)
    assert read_sent(tmp_path) == {"a", "b"}


def test_an_event_another_controller_claimed_is_never_sent_and_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    got: list[str] = []
    n = Notifier(tmp_path, [lambda e: got.append(e.key) or True])
    claimed = n.claim([event("a"), event("b")], B, committed=claims_text({"a": A}))  # A claimed a, then stopped
    assert claimed.keys == ("b",) and claimed.text == claims_text({"a": A, "b": B})
    with caplog.at_level(logging.WARNING, logger="rigsync.notify"):
        assert n.offer([event("a"), event("b")], holder=B.holder) == 1
        assert n.offer([event("a")], holder=B.holder) == 0
    n.close(5)
    assert got == ["b"]
    said = [r.getMessage() for r in caplog.records if "not sent again" in r.getMessage()]
    assert said == [f"notification a was claimed by {A.holder} (lease epoch {A.epoch}), which may have sent it: "
                    "not sent again"]


def test_an_unclaimed_event_is_not_sent_by_a_holder(tmp_path: Path) -> None:
    got: list[str] = []
    n = Notifier(tmp_path, [lambda e: got.append(e.key) or True])
    assert n.offer([event("a")], holder=A.holder) == 0  # not claimed in a pushed commit yet
    assert n.offer([event("lease_lost")]) == 1  # no holder: what only this controller produces, sent unclaimed
    n.close(5)
    assert got == ["lease_lost"]


def test_a_delivery_recorded_by_another_controller_is_not_claimed_again(tmp_path: Path) -> None:
    (tmp_path / "observed").mkdir()
    (tmp_path / NOTIFIED).write_text("a\n")  # what the remote's notified.txt said after the sync
    n = Notifier(tmp_path, [lambda e: True])
    assert n.claim([event("a")], B, committed=claims_text({"a": A})) == Claimed((), None, True)
    n.close(1)
    assert not (tmp_path / CLAIMS).exists()  # the daemon writes the claims file with its commit, never the notifier


def test_a_claim_makes_the_cycle_commit_and_says_so() -> None:
    assert with_claims(None, None) is None and with_claims("rented 1", Claimed((), None, True)) == "rented 1"
    claimed = Claimed(("sweep_finished:f:s:1",), claims_text({"sweep_finished:f:s:1": A}), True)
    said = "notify: claimed sweep_finished:f:s:1 (sent once this commit is pushed)"
    assert with_claims(None, claimed) == said
    assert with_claims("archived 1 run", claimed) == f"archived 1 run\n\n{said}"
