"""``observed/throughput.yaml``: each sweep's progress rate learned from the run archive, for review and sharing.

The rates the planner ranks offers by (``reconciler.core.throughput``) come from the archive in git, so every controller
of a fleet learns the same ones; this file shows them, per sweep, per GPU model and per machine, with the attempts
behind each. It is the archive's part only (live attempts count in the plan, never here), sorted and rounded, so it
changes only when the archive does and an unchanged archive makes no commit. It is never read back: the archive is
the source. Format described by ``schemas/observed-throughput.schema.json``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from reconciler.core.model import AttemptRecord
from reconciler.core.offers import normalize_gpu_name
from reconciler.core.throughput import Rate, archive_samples, learn
from reconciler.observed.codec import FORMAT_VERSION

HEADER = (
    "rigsync learned throughput: per sweep, its progress units per second of one run per GPU model and machine, "
    "from the run archive (attempts with progress > 0 and a positive duration, resumed ones left out)"
)


def _sig(x: float) -> float:
    return float(f"{x:.6g}")


def _rate(rate: Rate) -> dict[str, Any]:
    return {
        "units_per_s": _sig(rate.per_s),
        "units": _sig(rate.units),
        "seconds": round(rate.seconds, 1),
        "attempts": rate.attempts,
    }


def throughput_document(history: Iterable[AttemptRecord]) -> dict[str, Any]:
    """The file's content as a mapping (``dump_yaml`` writes it): sweeps by name, GPU models by name, machines by
    id; rates to 6 significant digits."""
    rates = learn(archive_samples(history, normalize_gpu_name))
    sweeps = []
    for name, found in sorted(rates.sweeps.items()):
        sweeps.append(
            {
                "sweep": name,
                "gpus": [{"gpu_name": g, **_rate(r)} for g, r in sorted(found.gpus.items())],
                "machines": [
                    {"machine_id": m, "gpu_name": found.machine_gpu.get(m, ""), **_rate(r)}
                    for m, r in sorted(found.machines.items())
                ],
            }
        )
    return {"format_version": FORMAT_VERSION, "sweeps": sweeps}
