"""The local result store: where an attempt's outputs live once they have come home from its box.

Boxes are disposable; what a run wrote (stdout/stderr, ``meta.json``, its metrics file, declared artifacts and
checkpoints) is pulled back before the box goes and kept here, outside the repository (git keeps only the small
summaries under ``observed/``). One layout, used by the harvest that writes it and by ``rigsync logs`` that reads
it:

    <data dir>/<fleet>/runs/<run_id>.<attempt>/            what the attempt's run directory held
    <data dir>/<fleet>/checkpoints/<run_id>/                the run's last synced checkpoint

The data dir is ``--data-dir``, else ``$RIGSYNC_DATA_DIR``, else ``$XDG_DATA_HOME/rigsync`` (``~/.local/share``).
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_DIR_ENV = "RIGSYNC_DATA_DIR"


def data_dir_for(fleet: str, override: str | os.PathLike[str] | None = None) -> Path:
    """The fleet's data directory (created, private to the user)."""
    if override:
        base = Path(override)
    elif os.environ.get(DATA_DIR_ENV):
        base = Path(os.environ[DATA_DIR_ENV])
    else:
        xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        base = Path(xdg) / "rigsync"
    path = base / fleet
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def attempt_dir(fleet_data: Path, run_id: str, attempt: int) -> Path:
    """Where one attempt's harvested run directory lives (not created here)."""
    return fleet_data / "runs" / f"{run_id}.{attempt}"


def checkpoint_dir(fleet_data: Path, run_id: str) -> Path:
    """Where a run's last synced checkpoint lives (not created here)."""
    return fleet_data / "checkpoints" / run_id
