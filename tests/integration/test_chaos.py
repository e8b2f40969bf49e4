"""Chaos, bounded: one small seeded schedule of bench/chaos.py's faults over a real sweep, zero invariant violations.

The same engine as ``bench/chaos.py`` (which runs >= 200 faults and prints the figures): a fresh emulator with real
sshd boxes, a fleet repository with a bare remote, ``rigsync run`` as real subprocesses killed -9 at failpoints, a
second daemon refused by the lease, a lease taken over from a SIGSTOPped daemon, human pushes, box and API faults.
After the schedule the fleet must converge and every invariant hold (see the bench's docstring for each one). The
JSON table is printed (``pytest -s`` shows it); how fast recovery was is a figure, not an assertion. The module's four
schedules run side by side, each a process of its own (the ``schedules`` fixture).

Queues are on (the bench's ``queue_ahead``): the queue faults (a daemon killed with queues full, a stale
controller's late enqueue, a box vanishing with a queue) are drawn too, and a controller whose boxes never show a
queue entry reports them "not applicable" instead of failing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "bench"))

import chaos  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

# lease_expiry and stale_enqueue have their own tests below (a takeover needs a quiet moment to be attributed); the
# random schedule draws from every other kind.
SMALL_KINDS = tuple(k for k in chaos.KINDS if k not in ("lease_expiry", "stale_enqueue"))
CAP_KINDS = ("vanish", "outbid", "hang_resume", "kill_rent", "kill_launch", "kill_random", "api_5xx")
# Bounds, not figures: how long the fleet may take to converge after its last fault on a loaded machine, and how long
# a lease lives where no fault takes it over (a restarted daemon resumes its own lease; a short one only lets a slow
# cycle lose it).
CONVERGE_S = 300.0
LEASE_S = 30.0
CONFIGS = {
    "small": chaos.Config(seed=11, faults=15, runs=6, gap_s=(0.4, 1.0), lease_stale_s=LEASE_S,
                          converge_timeout_s=CONVERGE_S, occasion_wait_s=8.0, kinds=SMALL_KINDS),
    "lease": chaos.Config(seed=5, faults=1, runs=4, lease_stale_s=4.0, converge_timeout_s=CONVERGE_S,
                          kinds=("lease_expiry",)),
    "cap": chaos.Config(seed=3, faults=8, runs=10, gap_s=(0.4, 1.0), lease_stale_s=LEASE_S,
                        converge_timeout_s=CONVERGE_S, occasion_wait_s=8.0, kinds=CAP_KINDS, max_total_usd=0.0007,
                        max_daily_usd=0.0007),
    "queue": chaos.Config(seed=7, faults=3, runs=6, gap_s=(0.4, 1.0), lease_stale_s=4.0,
                          converge_timeout_s=CONVERGE_S, occasion_wait_s=8.0, kinds=chaos.QUEUE_KINDS),
}


class Running:
    """One of ``CONFIGS`` run by ``chaos.run_schedules`` in a process of its own (its JSON table on stdout, its
    narration on stderr, both to files); ``result()`` waits for it."""

    def __init__(self, name: str, tmp: Path) -> None:
        self.out, self.err = tmp / f"{name}.json", tmp / f"{name}.log"
        code = ("import json, signal, sys; sys.path[:0] = sys.argv[1:3]; import chaos, test_chaos; "
                "signal.signal(signal.SIGTERM, lambda n, f: sys.exit(128 + n)); "  # its daemons and boxes end with it
                "cfg = test_chaos.CONFIGS[sys.argv[3]]; "
                "print(json.dumps(chaos.run_schedules(cfg, schedules=1, faults=cfg.faults, baseline=False)))")
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-c", code, str(ROOT / "bench"), str(HERE), name],
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=err)

    def result(self) -> dict[str, object]:
        code = self.proc.wait(timeout=CONVERGE_S + 300)
        narration = self.err.read_text(errors="replace")
        assert code == 0, f"the schedule's driver exited {code}: {narration[-6000:]}"
        out: dict[str, object] = json.loads(self.out.read_text())
        print(narration, file=sys.stderr)
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # the bench's SIGTERM handler ends its daemons and boxes
            self.proc.wait(timeout=120)


TEST_CONFIG = {  # which of CONFIGS each test reads
    "test_a_small_seeded_schedule_keeps_every_invariant": "small",
    "test_a_daemon_whose_lease_was_taken_over_does_not_act_or_push": "lease",
    "test_a_binding_total_cap_holds_under_faults": "cap",
    "test_queue_faults_keep_every_invariant": "queue",
}


@pytest.fixture(scope="module")
def schedules(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Running]]:
    """The schedules this session runs from this module, started together: each is a process with an emulator,
    boxes, a remote and daemons of its own, and spends most of its time waiting on them, so they share the machine's
    time instead of taking turns."""
    tmp = tmp_path_factory.mktemp("chaos")
    names = {TEST_CONFIG[item.name] for item in request.session.items if item.module is request.module}
    started = {name: Running(name, tmp) for name in sorted(names)}
    yield started
    for running in started.values():
        running.stop()


def _table(out: dict[str, object]) -> str:
    keep = ("schedules_detail", "faults_injected", "faults_by_kind", "faults_skipped_by_kind",
            "faults_not_applicable_by_kind", "not_applicable_why", "queue_entries_seen", "queue_entries_without_epoch",
            "stale_enqueues", "unattended", "violations_by_invariant",
            "violation_details", "recovery_cycles", "money", "wall_s")
    return json.dumps({k: out[k] for k in keep if k in out}, indent=2)


def _result(schedules: dict[str, Running], name: str) -> dict[str, object]:
    out = schedules[name].result()
    print(_table(out))
    return out


def test_a_small_seeded_schedule_keeps_every_invariant(schedules: dict[str, Running]) -> None:
    out = _result(schedules, "small")
    assert out["violations_total"] == 0, _table(out)
    assert out["faults_injected"] >= CONFIGS["small"].faults, _table(out)
    kinds = out["faults_by_kind"]
    assert isinstance(kinds, dict)
    assert any(k.startswith("kill_") for k in kinds), "no kill -9 at a failpoint fired"
    assert all(d["converged"] for d in out["schedules_detail"]), _table(out)  # type: ignore[attr-defined]


def test_a_daemon_whose_lease_was_taken_over_does_not_act_or_push(
    schedules: dict[str, Running],
) -> None:
    out = _result(schedules, "lease")
    assert out["faults_by_kind"] == {"lease_expiry": 1}, _table(out)
    assert out["violations_total"] == 0, _table(out)


def test_a_binding_total_cap_holds_under_faults(schedules: dict[str, Running]) -> None:
    """on_exceed: drain with a total cap below what the sweep costs: work stops, and the ledger stays under the cap
    through box faults and kills at failpoints (the runs the cap holds back are counted as held, not lost)."""
    out = _result(schedules, "cap")
    assert out["violations_total"] == 0, _table(out)
    money = out["money"]
    assert isinstance(money, dict)
    assert money["runs_held_by_budget"] > 0, "the cap never bound: the test proves nothing " + _table(out)
    assert money["max_ledger_vs_total_cap"] <= 1.0, _table(out)


def test_queue_faults_keep_every_invariant(schedules: dict[str, Running]) -> None:
    """A daemon killed -9 with queues full, a stale controller's late enqueue (SIGSTOP, a takeover, the old epoch's
    enqueue replayed over SSH), a box vanishing with a queue: 0 violations, and each one injected or, without a
    box-side queue, reported not applicable."""
    cfg = CONFIGS["queue"]
    out = _result(schedules, "queue")
    assert out["violations_total"] == 0, _table(out)
    kinds, na, skipped = out["faults_by_kind"], out["faults_not_applicable_by_kind"], out["faults_skipped_by_kind"]
    assert isinstance(kinds, dict) and isinstance(na, dict) and isinstance(skipped, dict)
    drawn = {k: n for k, n in kinds.items() if k != "human_push"}  # the driver's own pushes keep work available
    assert set(drawn) <= set(chaos.QUEUE_KINDS), _table(out)
    assert sum(drawn.values()) + sum(na.values()) + sum(skipped.values()) >= cfg.faults, _table(out)
    if out["queue_entries_seen"]:
        assert not na, _table(out)
        assert sum(drawn.values()) >= 2, "a queue was seen but its faults found no occasion " + _table(out)
    assert all(d["converged"] for d in out["schedules_detail"]), _table(out)  # type: ignore[attr-defined]
