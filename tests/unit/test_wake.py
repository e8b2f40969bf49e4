"""``Plan.wake_at`` (``plan.wake``) and the daemon's sleep until it: the earliest end that matters now, a few seconds
after; the interval otherwise; never a sleep so short that a wrong forecast spins the loop."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from plan_case_io import load_case

from reconciler.core.actions import Plan
from reconciler.core.model import Budget, Desired, Fleet, FleetMemory, Observed
from reconciler.daemon import MIN_WAKE_S, DaemonConfig, DaemonCycle, FleetDaemon, sleep_until
from reconciler.loop import CycleResult
from reconciler.plan import plan
from reconciler.plan.wake import BOOT_POLL_S, WAKE_MARGIN_S

CASES = Path(__file__).parent / "plan_cases"


def _plan(case: dict[str, Any], tmp_path: Path) -> tuple[Plan, float]:
    path = tmp_path / "case.json"
    path.write_text(json.dumps(case))
    c = load_case(path)
    return plan(c.desired, c.observed, c.controller, c.now), c.now


def _case(name: str) -> dict[str, Any]:
    return dict(json.loads((CASES / f"{name}.json").read_text()))


def test_a_draining_boxs_last_attempt_end_is_the_wake(tmp_path: Path) -> None:
    got, now = _plan(_case("drain_tail"), tmp_path)
    assert got.wake_at == now + 30.0 + WAKE_MARGIN_S  # r1: expected 600s, 570s in
    case = _case("drain_tail")
    case["observed"]["probes"][0]["draining"] = True  # drained already: still its last attempt's end
    got, now = _plan(case, tmp_path)
    assert not got.actions and got.wake_at == now + 30.0 + WAKE_MARGIN_S


def test_no_wake_when_no_end_matters_now(tmp_path: Path) -> None:
    got, _ = _plan(_case("steady_state"), tmp_path)  # nothing waits for its GPU, and it is not draining
    assert got.wake_at is None
    case = _case("drain_tail")
    case["desired"]["fleet"]["suspend"] = True
    got, _ = _plan(case, tmp_path)
    assert got.wake_at is None  # suspended: nothing to act on sooner


def test_a_slot_with_work_queued_behind_it_needs_no_wake(tmp_path: Path) -> None:
    case = _case("wait_for_busy_gpu")
    case["desired"]["fleet"]["max_instances"] = 1  # runs wait for a GPU (nothing can be rented)
    got, now = _plan(case, tmp_path)
    assert got.wake_at == now + 100.0 + WAKE_MARGIN_S  # the slot frees with nothing queued while runs wait
    case["observed"]["probes"][0]["queued"] = [{"run_id": "r2", "gpu_mask": [0]}]
    case["observed"]["in_flight"].append({"run_id": "r2", "instance_id": 1, "launched_ago": 10, "queued": True})
    got, _ = _plan(case, tmp_path)
    assert got.wake_at is None  # the box starts r2 itself the moment r1 ends


def test_sleep_until_is_the_interval_or_sooner_never_below_the_floor() -> None:
    assert sleep_until(None, 100.0, 60.0) == 60.0
    assert sleep_until(100.0 + 600.0, 100.0, 60.0) == 60.0
    assert sleep_until(100.0 + 20.0, 100.0, 60.0) == 20.0
    assert sleep_until(100.0 - 30.0, 100.0, 60.0) == MIN_WAKE_S  # overdue: a wrong forecast cannot spin the loop
    assert sleep_until(float("nan"), 100.0, 60.0) == 60.0
    assert sleep_until(100.0 + 1.0, 100.0, 2.0) == 2.0  # never past the interval, even below the floor


class _Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


class _Waits(threading.Event):
    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.timeouts.append(timeout)
        return False


def test_the_daemon_sleeps_until_the_plans_wake_at() -> None:
    clock = _Clock(1000.0)
    d = FleetDaemon.__new__(FleetDaemon)  # no repository: only run_forever's loop is under test
    d.config = DaemonConfig(interval_s=60.0)
    d.clock = clock  # type: ignore[assignment]
    d.stop_event = threading.Event()
    d.wake_event = waits = _Waits()
    d.reconciler = None
    d.acquire = lambda: "lease: taken"  # type: ignore[method-assign]
    d._watch = lambda: (lambda: None)  # type: ignore[method-assign]
    d.release = lambda: None  # type: ignore[method-assign]
    wakes = iter([1000.0 + 15.0, None, 1000.0 - 50.0, None])

    def cycle() -> DaemonCycle:
        wake = next(wakes)
        p = Plan(actions=(), wake_at=wake)
        desired = Desired(Fleet(name="lab"), Budget(), (), ())
        result = CycleResult(desired, Observed(), p, None, FleetMemory(), clock.t, clock.t)
        if len(waits.timeouts) == 2:
            d.stop_event.set()
        return DaemonCycle(None, True, None, {}, 0, (), result=result)

    d.cycle = cycle  # type: ignore[method-assign]
    assert d.run_forever() == 0
    assert waits.timeouts == [15.0, 60.0, MIN_WAKE_S]


def test_an_overdue_end_asks_for_no_sooner_wake(tmp_path: Path) -> None:
    case = _case("drain_tail")
    case["observed"]["probes"][0]["draining"] = True
    case["observed"]["probes"][0]["runs"][0]["started_ago"] = 900  # expected 600s: 5m overdue
    case["observed"]["probes"][1]["runs"][0]["started_ago"] = 900
    got, _ = _plan(case, tmp_path)
    assert got.wake_at is None


def test_a_booting_box_predicted_ready_is_the_wake_while_its_runs_wait(tmp_path: Path) -> None:
    case = _case("booting_within_timeout")
    case["observed"]["instances"] = [
        {"id": 1, "status": "loading", "start_ago": 15},
        {"id": 2, "start_ago": 600},  # a box of the pool that was ready 20s after its rent: the pool's measure
    ]
    case["observed"]["probes"] = [{"instance_id": 2, "runs": [{"run_id": "r0"}]}]
    case["observed"]["in_flight"] = [{"run_id": "r0", "instance_id": 2}]
    case["observed"]["memory"] = [{"instance_id": 2, "first_seen_ago": 600, "ready_ago": 580, "pool": "default"}]
    case["desired"]["runs"] = [{"id": "r0"}, {"id": "r1"}]
    case["desired"]["fleet"]["queue_ahead_s"] = 0
    got, now = _plan(case, tmp_path)
    assert got.wake_at == now - 15 + 20.0  # the loading box: rented 15s ago, ready 20s after a rent
    case["observed"]["instances"][0]["start_ago"] = 2  # predicted ready in 18s: looked at again within BOOT_POLL_S
    got, now = _plan(case, tmp_path)
    assert got.wake_at == now + BOOT_POLL_S
    case["observed"]["instances"][0]["start_ago"] = 30  # past its predicted readiness: polled, never sooner
    got, now = _plan(case, tmp_path)
    assert got.wake_at == now + BOOT_POLL_S
    case["observed"]["instances"][0]["status"] = "running"  # up, reachable and bootstrapped: nothing to poll for
    case["observed"]["probes"].append({"instance_id": 1})
    got, now = _plan(case, tmp_path)
    assert got.wake_at is None or got.wake_at > now + 30.0
