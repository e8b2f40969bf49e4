"""One master: the local flock and the lease on its own ref (refuse, resume, take over, renew, fence, release).

The lease store here is ``fakes.MemoryLeaseStore`` (the same compare-and-swap contract); the git ref against a real bare
remote is tested in tests/integration/test_git_repo.py."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
import yaml
from fakes import MemoryLeaseStore

from reconciler.adapters.lease import (
    GitLease,
    LeaseState,
    LocalLock,
    acquire,
    fence_deadline,
    fence_margin,
    from_yaml,
    renew,
    to_yaml,
)
from reconciler.errors import LeaseHeld, LeaseLost, ObservedInvalid, RepoError

T0 = 1_790_000_000.0
SCHEMA = json.loads((Path(__file__).parents[2] / "schemas" / "observed-lease.schema.json").read_text())


def held_by(holder: str = "a", heartbeat: float = T0) -> LeaseState:
    return LeaseState(holder=holder, host="hostA", pid=100, acquired_at=T0 - 1000, heartbeat_at=heartbeat)


def test_free_lease_is_acquired() -> None:
    d = acquire(None, holder="b", host="hostB", pid=7, now=T0, stale_after=300)
    assert d.granted and d.changed and not d.takeover
    assert d.state == LeaseState("b", "hostB", 7, T0, T0, epoch=int(T0 * 1000))


def test_fresh_lease_of_another_holder_is_refused_naming_it() -> None:
    d = acquire(held_by("a", T0 - 30), holder="b", host="hostB", pid=7, now=T0, stale_after=300)
    assert not d.granted and d.state is None and not d.changed
    assert "held by a on hostA (pid 100)" in d.message and "30s ago" in d.message


def test_stale_lease_is_taken_over_and_the_takeover_recorded() -> None:
    d = acquire(held_by("a", T0 - 301), holder="b", host="hostB", pid=7, now=T0, stale_after=300)
    assert d.granted and d.takeover and d.changed
    assert d.state is not None and d.state.holder == "b"
    assert d.state.taken_over_from is not None and d.state.taken_over_from.startswith("a on hostA (pid 100)")
    assert "taken over from a" in d.message


def test_own_lease_is_resumed_after_restart_without_takeover() -> None:
    same = acquire(held_by("a", T0 - 10), holder="a", host="hostA", pid=100, now=T0, stale_after=300)
    assert same.granted and not same.changed and same.state == held_by("a", T0 - 10)
    restarted = acquire(held_by("a", T0 - 10), holder="a", host="hostA", pid=555, now=T0, stale_after=300)
    assert restarted.granted and restarted.changed and not restarted.takeover
    assert restarted.state is not None and restarted.state.pid == 555


def test_renew_only_every_renew_every_seconds() -> None:
    s = held_by("a", T0)
    assert renew(s, T0 + 59, renew_every=60) is None
    r = renew(s, T0 + 60, renew_every=60)
    assert r is not None and r.heartbeat_at == T0 + 60


def test_yaml_round_trip_validates() -> None:
    s = LeaseState("a", "hostA", 100, T0 - 1000, T0, taken_over_from="z on hostZ (pid 1)")
    text = to_yaml(s)
    jsonschema.Draft202012Validator(SCHEMA).validate(yaml.safe_load(text))
    assert from_yaml(text) == s
    assert from_yaml("") is None
    with pytest.raises(ObservedInvalid, match="heartbeat_at"):
        from_yaml("holder: a\n")
    with pytest.raises(ObservedInvalid, match=r"lease\.yaml: heartbeat_at"):
        from_yaml("holder: a\nheartbeat_at: soon\n")


def test_lease_over_the_store_second_reconciler_refused_then_takes_over() -> None:
    store = MemoryLeaseStore()
    a = GitLease(store, holder="a", host="hostA", pid=1, stale_after=300, renew_every=60)
    decision = a.acquire(T0)
    assert decision.granted and store.version == "v1" and store.messages == ["lease: lease acquired by a"]
    assert a.renew(T0 + 30) is False and store.version == "v1"  # no heartbeat due: nothing written
    assert a.renew(T0 + 61) is True and store.version == "v2"
    assert from_yaml(store.text or "") == replace(
        held_by("a", T0 + 61), host="hostA", pid=1, acquired_at=T0, epoch=int(T0 * 1000)
    )

    b = GitLease(store, holder="b", host="hostB", pid=2, stale_after=300, renew_every=60)
    with pytest.raises(LeaseHeld, match="held by a on hostA"):
        b.acquire(T0 + 120)
    decision = b.acquire(T0 + 61 + 301)
    assert decision.takeover and "taken over from a on hostA" in store.messages[-1]
    # The old holder notices on its next renewal (its compare-and-swap fails) and stops, naming the new holder.
    with pytest.raises(LeaseLost, match="taken over by b on hostB"):
        a.renew(T0 + 1000)
    assert from_yaml(store.text or "") is not None and from_yaml(store.text or "").holder == "b"  # type: ignore[union-attr]
    assert b.release() is True and store.read_lease() == (None, None)


def test_a_lost_compare_and_swap_decides_again_on_what_the_winner_wrote() -> None:
    """Two acquirers read the same stale lease; the second to push loses the swap, re-reads, and is refused."""
    store = MemoryLeaseStore()
    store.swap_lease(None, to_yaml(held_by("old", T0 - 1000)), "lease: old")
    a = GitLease(store, holder="a", host="hostA", pid=1, stale_after=300)
    b = GitLease(store, holder="b", host="hostB", pid=2, stale_after=300)
    real_read = store.read_lease
    reads: list[tuple[str | None, str | None]] = []

    def read_then_let_a_win() -> tuple[str | None, str | None]:
        got = real_read()
        reads.append(got)
        if len(reads) == 1:  # b has read the stale lease; a takes it over before b pushes
            store.read_lease = real_read  # type: ignore[method-assign]
            a.acquire(T0)
            store.read_lease = read_then_let_a_win  # type: ignore[method-assign]
        return got

    store.read_lease = read_then_let_a_win  # type: ignore[method-assign]
    with pytest.raises(LeaseHeld, match="held by a on hostA"):
        b.acquire(T0)
    assert len(reads) == 2 and b.state is None
    assert from_yaml(store.text or "") is not None and from_yaml(store.text or "").holder == "a"  # type: ignore[union-attr]


def test_renewing_a_removed_lease_is_lease_lost() -> None:
    store = MemoryLeaseStore()
    a = GitLease(store, holder="a", host="hostA", pid=1, stale_after=300, renew_every=60)
    a.acquire(T0)
    store.swap_lease(store.version, None, "deleted by hand")
    with pytest.raises(LeaseLost, match="removed"):
        a.beat(T0 + 10)


def test_local_lock_refuses_a_second_holder(tmp_path: Path) -> None:
    path = tmp_path / "state" / "rigsync.lock"
    with LocalLock(path) as lock:
        assert lock.held
        code = (
            "import sys\nfrom pathlib import Path\nfrom reconciler.adapters.lease import LocalLock\n"
            "from reconciler.errors import LeaseHeld\n"
            "try:\n    LocalLock(Path(sys.argv[1])).acquire()\nexcept LeaseHeld as e:\n    print(e); sys.exit(3)\n"
        )
        proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=False)
        assert proc.returncode == 3, proc.stderr
        assert "another rigsync holds the local lock" in proc.stdout and "pid" in proc.stdout
    assert not lock.held
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_fencing_deadline_is_the_takeover_time_less_a_margin() -> None:
    assert fence_margin(300) == 60 and fence_margin(40) == 10  # min(60 s, a quarter of stale_after)
    assert fence_deadline(T0, 300) == T0 + 240
    assert fence_deadline(T0, 40) == T0 + 30


def test_the_fence_counts_from_the_pushed_heartbeat_and_refuses_after_the_deadline() -> None:
    store = MemoryLeaseStore()
    a = GitLease(store, holder="a", host="hostA", pid=1, stale_after=300, renew_every=60)
    with pytest.raises(LeaseLost, match="no lease of ours"):
        a.check(T0)
    a.acquire(T0)
    a.check(T0 + 239)
    with pytest.raises(LeaseLost, match="fencing deadline passed 1s ago"):
        a.check(T0 + 241)
    assert not a.renew_due(T0 + 149) and a.renew_due(T0 + 150)  # mid-apply: half of stale_after, at least renew

    def failing(expected: str | None, text: str, message: str) -> str | None:
        raise RepoError("the remote is unreachable")

    with pytest.raises(RepoError):  # a heartbeat that did not reach the remote moves nothing
        a.beat(T0 + 100, failing)
    with pytest.raises(LeaseLost):
        a.check(T0 + 241)
    assert a.state is not None and a.state.heartbeat_at == T0
    a.beat(T0 + 100)  # pushed
    a.check(T0 + 339)
    assert a.state is not None and a.state.heartbeat_at == T0 + 100 and store.version == "v2"


def test_release_never_removes_a_lease_someone_else_took_over() -> None:
    store = MemoryLeaseStore()
    a = GitLease(store, holder="a", host="hostA", pid=1, stale_after=300, renew_every=60)
    a.acquire(T0)
    b = GitLease(store, holder="b", host="hostB", pid=2, stale_after=300, renew_every=60)
    b.acquire(T0 + 400)
    assert a.release() is False and store.text is not None and "holder: b" in store.text
    assert b.release() is True and store.text is None


def test_a_heartbeat_after_a_takeover_keeps_the_takeover_on_the_lease_commit() -> None:
    """The lease ref holds one commit, replaced by each write: the takeover must not vanish with the next heartbeat."""
    store = MemoryLeaseStore()
    store.swap_lease(None, to_yaml(held_by("old", T0 - 1000)), "lease: old")
    b = GitLease(store, holder="b", host="hostB", pid=2, stale_after=300, renew_every=60)
    assert b.acquire(T0).takeover
    b.beat(T0 + 1)
    assert store.messages[-1].startswith("lease: heartbeat (taken over from old"), store.messages


def test_every_later_holding_has_a_larger_epoch_and_a_resumed_one_keeps_it() -> None:
    """The epoch a box is told (``InFlight.epoch``) grows with every acquisition and takeover, also across a release
    (which removes the lease), and stays while one holder resumes its own lease."""
    store = MemoryLeaseStore()
    a = GitLease(store, holder="a", host="hostA", pid=1, stale_after=300, renew_every=60)
    a.acquire(T0)
    first = a.epoch
    assert first == int(T0 * 1000) and from_yaml(store.text or "").epoch == first  # type: ignore[union-attr]
    assert a.renew(T0 + 61) and a.epoch == first  # a heartbeat is the same holding
    again = GitLease(store, holder="a", host="hostA", pid=2, stale_after=300, renew_every=60)
    assert again.acquire(T0 + 70).changed and again.epoch == first  # restarted, resumed: the same holding
    b = GitLease(store, holder="b", host="hostB", pid=3, stale_after=300, renew_every=60)
    b.acquire(T0 + 70 + 301)
    assert b.epoch > first
    taken = b.epoch
    assert b.release() and store.read_lease() == (None, None) and b.epoch == 0
    c = GitLease(store, holder="c", host="hostC", pid=4, stale_after=300, renew_every=60)
    c.acquire(T0 + 400)  # the lease was released: acquired afresh
    assert c.epoch > taken
    # a takeover by a controller whose clock is behind still gets a larger epoch than the lease it replaces
    ahead = replace(held_by("a", T0 - 1000), epoch=int(T0 * 1000) + 5)
    d = acquire(ahead, holder="d", host="hostD", pid=5, now=T0, stale_after=300)
    assert d.state is not None and d.state.epoch == int(T0 * 1000) + 6


def test_a_lease_written_before_epochs_reads_its_acquisition_as_its_epoch() -> None:
    text = to_yaml(held_by("a", T0)).replace("epoch: 0\n", "")
    assert "epoch" not in text
    assert from_yaml(text).epoch == int((T0 - 1000) * 1000)  # type: ignore[union-attr]
