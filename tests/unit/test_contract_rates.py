"""The rates a box bills once this fleet accepted a price increase on it: the average to a horizon (the budget's
burn), the dearest from a moment on (what work and review's places are priced at)."""

from __future__ import annotations

import pytest

from reconciler.core.contract import dearest_rate, mean_rate, rate_from
from reconciler.core.model import Instance, InstanceStatus, PriceIncrease

BOX = Instance(id=12, label="", status=InstanceStatus.RUNNING, gpu_name="RTX 3090", num_gpus=1, gpu_ram_mib=24576,
               dph_total=0.2, start_date=0.0)
INC = PriceIncrease(id=5, instance_id=12, old_dph=0.2, new_dph=0.5, applies_at=1000.0, new_end=5000.0)


def test_the_mean_rate_to_a_horizon_counts_the_new_rate_from_when_it_applies() -> None:
    assert mean_rate(BOX, 0.0, 3600.0) == pytest.approx(0.2)
    assert mean_rate(BOX, 0.0, 2000.0, [INC]) == pytest.approx((0.2 * 1000 + 0.5 * 1000) / 2000)
    assert mean_rate(BOX, 0.0, 1000.0, [INC]) == pytest.approx(0.2)  # applies at the end of the span: not yet
    assert mean_rate(BOX, 1500.0, 1500.0, [INC]) == pytest.approx(0.5)  # an empty span: the rate then


def test_the_dearest_rate_from_a_moment_on_sees_an_increase_ahead_and_only_this_boxs() -> None:
    assert rate_from(BOX, 0.0, [INC]) == pytest.approx(0.5)
    assert rate_from(BOX, 2000.0, [INC]) == pytest.approx(0.5)
    assert rate_from(BOX, 0.0, [PriceIncrease(6, 13, 0.2, 0.9, 10.0)]) == pytest.approx(0.2)
    assert dearest_rate(12, 0.2, [INC]) == pytest.approx(0.5)
    assert dearest_rate(13, 0.2, [INC]) == pytest.approx(0.2)
