"""A notification is sent once across a takeover (issue 33), through the real daemon over the emulator's boxes and
a real webhook on loopback (``test_notify_live.Webhook``).

Controller A finishes a sweep and tells the webhook, then stops as a frozen or killed controller does: no more
cycles, no release. What it delivered after its last commit is in its own checkout only (``notified.txt`` is
committed with the next commit it never makes). Controller B, on another clone, takes the stale lease over and runs
cycles that see the same finished sweep: it finds A's claim in git (committed and pushed before A sent, naming A as
its holder) and sends nothing. Before issue 33, B read a ``notified.txt`` without the key and told the webhook a
second time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from test_notify_live import Webhook, cycles_until, notified_world
from test_run_daemon import LEASE_AGE_S, World, age_the_lease, world_factory

from reconciler.adapters.notifier import CLAIMS, NOTIFIED, parse_claims
from reconciler.core.notify import Claim
from reconciler.daemon import DaemonConfig, FleetDaemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
__all__ = ["world_factory"]  # test_run_daemon's fixture: a fleet repo over the emulator, its boxes destroyed after

STALE_S = 6.0
KEY = "sweep_finished:t-notify-take:tdmpc:1"


def test_a_takeover_does_not_send_again_what_the_old_holder_claimed(
    world_factory: Callable[..., World], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    hook = Webhook()
    try:
        w = notified_world(world_factory, monkeypatch, "t-notify-take", hook.url)
        a = w.daemon(lease_stale_s=STALE_S, lease_renew_s=1.0)
        a.acquire()
        cycles_until(a, lambda: bool(hook.bodies))
        assert a.notifier is not None
        a.notifier.close(5)  # A stops here: its thread is gone, it never cycles or releases again
        epoch_a = a.lease.epoch
        claims = parse_claims(w.remote_file(CLAIMS) or "")
        assert claims.get(KEY) == Claim(a.lease.holder, epoch_a), f"A sent before its claim was pushed: {claims}"
        assert KEY not in (w.remote_file(NOTIFIED) or ""), "A's delivery was committed: no window left to test"

        age_the_lease(w.clone("ager"), LEASE_AGE_S)  # A's lease as stale as a dead holder's, without waiting it out
        other = w.clone("other")
        b = FleetDaemon(other, config=DaemonConfig(interval_s=1.0, lease_stale_s=STALE_S, lease_renew_s=1.0),
                        state_dir=str(w.tmp / "state-b"), api_url=w.emu.url)
        with caplog.at_level(logging.WARNING, logger="rigsync.notify"):
            assert "taken over" in b.acquire()
            assert b.lease.epoch != epoch_a
            try:
                for _ in range(3):  # the same finished sweep, seen by B's cycles
                    b.cycle()
            finally:
                assert b.notifier is not None
                b.notifier.close(5)  # whatever B's cycles queued is delivered (or not) by now
                b.release()
        assert len(hook.bodies) == 1, f"told {len(hook.bodies)} times across the takeover: {hook.bodies}"
        said = f"notification {KEY} was claimed by {a.lease.holder} (lease epoch {epoch_a})"
        assert any(said in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
        assert parse_claims(w.remote_file(CLAIMS) or "")[KEY].epoch == epoch_a  # B left A's claim as it was
    finally:
        hook.close()
