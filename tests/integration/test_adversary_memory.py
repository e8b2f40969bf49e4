"""Issue 20, point 5: the controller's memory stays flat whatever its boxes send.

``rigsync run`` (the console script, a real process) runs a fleet of 3 boxes on the emulator where every channel
floods (``adversary.flood``): a probe that never stops printing, a probe of 400 MiB in one line, an nvidia-smi
that never stops, and a job with a 200 MB metrics line and 200 MB of stdout and stderr. The process's peak RSS
(VmHWM from /proc/<pid>/status, sampled every 0.1 s) must stay under 300 MiB, the issue's bound for up to 10
boxes; a controller past 1.5 GiB is killed by the sampler so the test fails instead of the machine.
``bench/flood_rss.py`` prints the same figure beside an honest fleet's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from adversary.flood import run_fleet

from reconciler.emulator import Emulator

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

RSS_BOUND_MIB = 300.0
BOXES = 3


def test_peak_rss_stays_under_the_bound_while_every_channel_floods(emulator: Emulator, tmp_path: Path) -> None:
    figures = run_fleet(emulator, tmp_path, "adv-flood", flooded=True, boxes=BOXES, seconds=120.0, until_settled=True)
    print("flood_rss:", json.dumps(figures))
    assert len(figures["poisoned"]) >= 2, f"the floods never reached the boxes: {figures}"
    assert not figures["killed_at_ceiling"], f"the controller passed {figures['ceiling_mib']} MiB: {figures}"
    assert figures["peak_rss_mib"] < RSS_BOUND_MIB, f"peak RSS {figures['peak_rss_mib']} MiB: {figures}"
    assert figures["alive_at_end"], f"the controller died under the flood: {figures}"
    assert figures["cycles"] >= 5, f"the controller stopped cycling under the flood: {figures}"
    assert figures["exit_code"] == 0, figures
