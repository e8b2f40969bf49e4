"""The pending-price-increase rows are untrusted: the parser is total (a bad row is skipped, never an exception) and
prices a good one as the instance's total $/h after the increase."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reconciler.adapters.vast import price_increases_from_reply

LISTED = {12: (0.200, 20.0, 1), 14: (0.800, 50.0, 4)}  # instance 12: $0.200/h, 20 GB, 1 GPU; 14: 4 GPUs


def row(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "pending_price_increase_id": 5, "contract_id": 12, "host_id": 3,
        "old_gpu_costpersec": 0.18 / 3600, "new_gpu_costpersec": 0.22 / 3600,
        "old_disk_ram_costpersec": None, "new_disk_ram_costpersec": None,
        "new_bwu_cost": None, "old_bwu_cost": None, "new_bwd_cost": None, "old_bwd_cost": None,
        "new_platform_fee": None, "old_platform_fee": None,
        "contract_end_date": 1_800_000_000.0, "ask_end_date": 1_800_086_400.0, "created_at": 1_799_999_000.0,
    }
    base.update(over)
    return base


def parse(*rows: Any) -> list[Any]:
    return price_increases_from_reply({"success": True, "pending_price_increases": list(rows)}, LISTED)


def test_a_good_row_is_the_instances_total_after_the_gpu_and_storage_deltas() -> None:
    [inc] = parse(row(old_disk_ram_costpersec=0.1 / 720 / 3600, new_disk_ram_costpersec=0.2 / 720 / 3600))
    storage_delta = 0.1 / 720 * 20.0
    assert inc.id == 5 and inc.instance_id == 12 and inc.old_dph == 0.2
    assert math.isclose(inc.new_dph, 0.2 + 0.04 + storage_delta, rel_tol=1e-9)
    assert inc.applies_at == 1_800_000_000.0 and inc.new_end == 1_800_086_400.0 and inc.created_at == 1_799_999_000.0


def test_the_gpu_price_is_per_gpu_as_the_cli_shows_it() -> None:
    [inc] = parse(row(contract_id=14, old_gpu_costpersec=0.19 / 3600, new_gpu_costpersec=0.24 / 3600))
    assert math.isclose(inc.new_dph, 0.8 + 4 * 0.05, rel_tol=1e-9)


def test_null_new_prices_are_unchanged_and_a_null_ask_end_is_not_said() -> None:
    [inc] = parse(row(new_gpu_costpersec=None, old_gpu_costpersec=None, ask_end_date=None, created_at=None))
    assert inc.new_dph == 0.2 and inc.new_end is None and inc.created_at is None


@pytest.mark.parametrize("bad", [
    "nope", None, [], row(pending_price_increase_id=None), row(pending_price_increase_id=True),
    row(pending_price_increase_id=-3), row(pending_price_increase_id="5"), row(contract_id=99),
    row(contract_id=None), row(new_gpu_costpersec=float("nan")), row(new_gpu_costpersec=float("inf")),
    row(new_gpu_costpersec=-1.0), row(old_gpu_costpersec=None), row(old_gpu_costpersec="0.1"),
    row(new_gpu_costpersec=1e300), row(new_gpu_costpersec=-0.3 / 3600),  # a total below zero
    row(contract_end_date=None), row(contract_end_date=float("nan")), row(contract_end_date=-5.0),
    row(ask_end_date=1_000.0), row(ask_end_date=1e12), row(ask_end_date=float("inf")), row(ask_end_date="tomorrow"),
    row(new_disk_ram_costpersec=1e-6, old_disk_ram_costpersec=None),
])
def test_a_hostile_row_is_skipped_and_the_good_ones_kept(bad: Any) -> None:
    good = row(pending_price_increase_id=6)
    assert [p.id for p in parse(bad, good)] == [6]


def test_an_instance_without_a_usable_price_or_disk_skips_its_rows() -> None:
    listed = {12: (math.nan, 20.0, 1), 13: (0.3, math.nan, 1), 15: (0.3, 20.0, 0)}
    reply = {"pending_price_increases": [row(), row(pending_price_increase_id=7, contract_id=13,
                                                    new_disk_ram_costpersec=1e-8, old_disk_ram_costpersec=0.0),
                                      row(pending_price_increase_id=8, contract_id=15)]}
    assert price_increases_from_reply(reply, listed) == []


def test_a_duplicate_id_is_read_once_and_a_reply_without_rows_is_empty() -> None:
    assert [p.id for p in parse(row(), row(contract_id=12, new_gpu_costpersec=0.5))] == [5]
    for reply in (None, [], {}, {"pending_price_increases": None}, {"pending_price_increases": "x"}):
        assert price_increases_from_reply(reply, LISTED) == []


hostile = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5) | st.just([])


@given(st.lists(st.dictionaries(st.sampled_from(sorted(row())), hostile, max_size=6), max_size=4))
def test_the_parser_never_raises_and_every_price_it_keeps_is_finite(changes: list[dict[str, Any]]) -> None:
    for inc in parse(*(row(**c) for c in changes)):
        assert math.isfinite(inc.new_dph) and inc.new_dph > 0 and math.isfinite(inc.applies_at)
        assert inc.new_end is None or inc.new_end >= inc.applies_at
