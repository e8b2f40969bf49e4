"""Price increases through full cycles over the fakes: read on own boxes, answered through the port, the accepted
ones remembered (and read back from fleet.yaml), a stale one an outcome, a failed read no failure, and each answer
a line of the cycle's commit message."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import jsonschema
import yaml
from fakes import FakeArchive, FakeClock, FakeWorld, Work, desired_state, fake_reconciler, offer

from reconciler.core.actions import AnswerPriceIncrease
from reconciler.core.model import Budget, Desired, PriceIncrease
from reconciler.errors import PriceIncreaseGone, ProviderTransient
from reconciler.loop import CycleResult, Reconciler
from reconciler.observed.codec import FLEET
from reconciler.observed.documents import ReconcilerStatus, render_observed
from reconciler.observed.memory import fleet_memory_from_files
from reconciler.observed.summary import answer_lines, describe_change


def _running(desired: Desired) -> tuple[FakeWorld, Reconciler, int]:
    """A world where the fleet holds one box with a live run."""
    world = FakeWorld([offer(1, dph=0.2), offer(2, dph=0.5)], clock=FakeClock(), boot_s=20.0,
                      work=lambda job: Work(seconds=100_000.0))
    rec = fake_reconciler(world, FakeArchive())
    for _ in range(30):
        rec.cycle(desired)
        if world.live_runs():
            return world, rec, next(iter(world.rentals))
        world.clock.advance(10.0)
    raise AssertionError("no run went live")


def _answers(res: CycleResult) -> list[AnswerPriceIncrease]:
    return [a for a in res.plan.actions if isinstance(a, AnswerPriceIncrease)]


def test_an_increase_that_fits_is_accepted_remembered_and_read_back_and_one_over_a_cap_is_rejected() -> None:
    desired = replace(desired_state(1, max_instances=1), budget=Budget(max_instance_dph=1.0))
    world, rec, iid = _running(desired)
    now = world.clock.now()
    world.price_increases[7] = PriceIncrease(7, iid, 0.2, 0.25, now + 3600.0, now + 90_000.0)
    world.price_increases[8] = PriceIncrease(8, 999, 0.2, 0.25, now + 3600.0)  # not this fleet's box: left alone
    res = rec.cycle(desired)
    assert [(a.pending_id, a.accept) for a in _answers(res)] == [(7, True)]
    assert world.price_answers == [(7, True)] and 8 in world.price_increases
    assert [p.id for p in rec.memory.accepted_increases] == [7]
    lines = answer_lines(res.applied.outcomes if res.applied else [])
    assert len(lines) == 1 and lines[0].startswith(f"accepted price increase on instance {iid}: $0.200/h -> $0.250/h")
    message = describe_change({}, {"x": "y"}, answers=lines)
    assert message is not None and message.endswith("\n\n" + lines[0]) and "1 price increase answered" in message

    # the accepted increase is written to fleet.yaml and read back at start
    files = render_observed(desired=desired, observed=rec.observed_after_apply(res.observed), plan=res.plan,
                            status=ReconcilerStatus(), now=world.clock.now())
    assert "accepted_price_increases" in files[FLEET]
    schema = json.loads((Path(__file__).parents[2] / "schemas" / "observed-fleet.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(yaml.safe_load(files[FLEET]))
    back = fleet_memory_from_files(files)
    assert [(p.id, p.instance_id, p.new_dph, p.new_end) for p in back.accepted_increases] == [
        (7, iid, 0.25, round(now + 90_000.0))]

    world.clock.advance(10.0)
    world.price_increases[9] = PriceIncrease(9, iid, 0.25, 5.0, world.clock.now() + 3600.0)
    res = rec.cycle(desired)
    [answer] = _answers(res)
    assert (answer.pending_id, answer.accept) == (9, False) and "per-box cap $1.000/h" in answer.reason
    assert world.price_answers[-1] == (9, False) and [p.id for p in rec.memory.accepted_increases] == [7]
    [line] = answer_lines(res.applied.outcomes if res.applied else [])
    assert line.startswith(f"rejected price increase on instance {iid}: $0.200/h -> $5.000/h")

    # gone with its box: the accepted increase is forgotten
    world.vanish(iid)
    world.clock.advance(10.0)
    rec.cycle(desired)
    assert rec.memory.accepted_increases == ()


def test_a_stale_increase_is_an_outcome_and_a_failed_read_answers_none() -> None:
    desired = desired_state(1, max_instances=1)
    world, rec, iid = _running(desired)
    world.price_increases[7] = PriceIncrease(7, iid, 0.2, 0.21, world.clock.now() + 3600.0)
    world.fail_next("pending_price_increases", ProviderTransient("GET pending-price-increases: HTTP 503"))
    res = rec.cycle(desired)
    assert res.observed.price_increases == () and _answers(res) == [] and world.price_answers == []
    world.clock.advance(10.0)
    world.fail_next("answer_price_increase", PriceIncreaseGone("gone", status=404, code="no_pending_price_increase"))
    res = rec.cycle(desired)
    [outcome] = [o for o in (res.applied.outcomes if res.applied else []) if isinstance(o.action, AnswerPriceIncrease)]
    assert outcome.ok and outcome.detail.startswith("gone: price increase 7 is no longer pending")
    assert rec.memory.accepted_increases == ()  # not accepted: the provider never took it
    assert answer_lines([outcome]) == [f"price increase 7 on instance {iid}: {outcome.detail}"]
