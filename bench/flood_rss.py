"""Benchmark: the controller's peak RSS with an honest fleet and with a fleet whose boxes flood every channel.

Issue 20, point 5. Both runs are ``rigsync run`` (the console script) against a fresh emulator with real sshd
boxes, for ``--seconds`` each, sampled by ``tests/adversary``'s ``RssWatch`` (VmHWM of the process): the honest
fleet runs honest jobs; the flooded one (``tests/adversary/flood.py``) has a probe that never stops printing, a
probe of ``--flood-mib`` MiB, an nvidia-smi that never stops, and a job with a 200 MB metrics line and 200 MB
of stdout and stderr. A controller past ``--ceiling-mib`` is killed by the sampler (``killed_at_ceiling``).

Prints one JSON document: each run's figures, and ``flooded_over_honest`` (the ratio of the peaks).

Run: ``.venv/bin/python bench/flood_rss.py [--boxes 3] [--seconds 60]`` (needs root for the emulated boxes).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from adversary.flood import run_fleet  # noqa: E402

from reconciler.emulator import Emulator  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--boxes", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--flood-mib", type=int, default=400)
    ap.add_argument("--ceiling-mib", type=float, default=1536.0)
    args = ap.parse_args(argv)
    out: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="flood-rss-") as tmp:
        for flooded in (False, True):
            key = "flooded" if flooded else "honest"
            with Emulator(seed=7, offers=200, boot_delay=0.2) as emu:
                figures = run_fleet(
                    emu,
                    Path(tmp) / key,
                    f"bench-{key}",
                    flooded=flooded,
                    boxes=args.boxes,
                    seconds=args.seconds,
                    flood_mib=args.flood_mib,
                    ceiling_mib=args.ceiling_mib,
                )
                figures.pop("log")  # in the temporary directory, gone when this ends
                out[key] = figures
    honest, flooded_fig = out["honest"], out["flooded"]
    assert isinstance(honest, dict) and isinstance(flooded_fig, dict)
    out["flooded_over_honest"] = round(flooded_fig["peak_rss_mib"] / max(honest["peak_rss_mib"], 1.0), 2)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
