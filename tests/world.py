"""The integration tests' world: a fleet repository made from the example under desired/, with its bare remote.

Tests used to start from the demo's repository maker and edit YAML with regular expressions; this builder is
theirs instead. ``fleet_repo()`` gives a working clone and its bare remote holding the example desired/,
experiments/ and schemas/ with short timeouts (boxes on the emulator boot in a second), committed and pushed.
Edits go through a real YAML round trip (``FleetRepo.edit``), so a test says which key it changes, not which
line. The example is committed once per test process into a template that each world copies.

The emulator itself is the ``emulator`` fixture (tests/integration/conftest.py); ``emulator_env`` points the
console script at it.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from gitutil import git

ROOT = Path(__file__).resolve().parents[1]
FLEET = "desired/fleet.yaml"
BUDGET = "desired/budget.yaml"
SWEEPS = "desired/sweeps"
# the example's timeouts are for real boxes; emulated ones boot in about a second
SHORT_TIMEOUTS = {"idle_timeout": "20s", "unreachable_grace": "8s", "heartbeat_stale": "12s", "boot_timeout": "2m"}
CHECKPOINT_EVERY = "1s"  # the example's runs last seconds: sync their checkpoints every second
RIGSYNC = Path(sys.executable).parent / "rigsync"  # the console script of the running environment


@dataclass(frozen=True)
class FleetRepo:
    """A working clone (``work``) and its bare remote (``remote``) on disk."""

    work: Path
    remote: Path

    def path(self, rel: str) -> Path:
        return self.work / rel

    def read(self, rel: str) -> Any:
        return yaml.safe_load(self.path(rel).read_text())

    def write(self, rel: str, content: str | Mapping[str, Any]) -> Path:
        """Write a file: text as it is, a mapping as YAML."""
        path = self.path(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content if isinstance(content, str) else dump(content))
        return path

    def edit(self, rel: str, change: Callable[[Any], object]) -> None:
        """Load ``rel`` as YAML, let ``change`` mutate the document in place (its return value is ignored), dump."""
        doc = self.read(rel)
        change(doc)
        self.write(rel, doc)

    def edit_fleet(self, **values: Any) -> None:
        """Set top-level keys of desired/fleet.yaml; ``min``/``max`` go under ``instances``."""

        def change(doc: dict[str, Any]) -> None:
            for key, value in values.items():
                if key in ("min", "max"):
                    doc.setdefault("instances", {})[key] = value
                else:
                    doc[key] = value

        self.edit(FLEET, change)

    def set_sweeps(self, sweeps: Mapping[str, str]) -> None:
        """Replace every sweep with ``sweeps`` (file stem -> YAML text)."""
        for old in self.path(SWEEPS).glob("*.yaml"):
            old.unlink()
        for stem, text in sweeps.items():
            self.write(f"{SWEEPS}/{stem}.yaml", text)

    def git(self, *args: str) -> str:
        return git(self.work, *args)

    def commit(self, message: str, *, push: bool = True) -> str:
        """Commit everything in the working tree (new files too), push unless told not to; the new HEAD."""
        self.git("add", "-A")
        self.git("commit", "-q", "-m", message)
        if push:
            self.git("push", "-q", "origin", "main")
        return self.git("rev-parse", "HEAD")


def dump(doc: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(doc), sort_keys=False, allow_unicode=True, width=1000)


_template: FleetRepo | None = None


def _build_template() -> FleetRepo:
    """The example fleet, committed as a human would (then with short timeouts) and pushed: built once."""
    base = Path(tempfile.mkdtemp(prefix="rigsync-world-"))
    atexit.register(shutil.rmtree, base, ignore_errors=True)
    repo = FleetRepo(base / "fleet", base / "fleet.remote.git")
    git(base, "init", "-q", "--bare", "-b", "main", str(repo.remote))
    git(base, "clone", "-q", str(repo.remote), str(repo.work))
    repo.git("checkout", "-q", "-b", "main")
    skip = shutil.ignore_patterns("__pycache__")
    for part in ("desired", "experiments", "schemas"):
        shutil.copytree(ROOT / part, repo.work / part, ignore=skip)
    repo.git("add", "-A")
    repo.git("commit", "-q", "-m", "example fleet: TD-MPC-shaped sweep on cheap consumer GPUs")
    repo.edit(FLEET, lambda d: d.update(SHORT_TIMEOUTS))
    for sweep in sorted(repo.path(SWEEPS).glob("*.yaml")):
        rel = str(sweep.relative_to(repo.work))
        if (repo.read(rel) or {}).get("checkpoint"):
            repo.edit(rel, lambda d: d["checkpoint"].update(every=CHECKPOINT_EVERY))
    repo.commit("test world: short timeouts, checkpoints every " + CHECKPOINT_EVERY)
    return repo


def fleet_repo(work: Path) -> FleetRepo:
    """A fresh copy of the example fleet at ``work`` (empty or absent), its bare remote beside it as
    ``<name>.remote.git``; committed and pushed, nothing else changed."""
    global _template
    if _template is None:
        _template = _build_template()
    remote = work.parent / f"{work.name}.remote.git"
    if work.exists() and any(work.iterdir()):
        raise FileExistsError(f"{work} is not empty")
    work.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(_template.remote, remote)
    shutil.copytree(_template.work, work, symlinks=True, dirs_exist_ok=True)
    repo = FleetRepo(work, remote)
    repo.git("remote", "set-url", "origin", str(remote))
    return repo


def remote_file(remote: Path, path: str, rev: str = "refs/heads/main") -> str | None:
    """A file as the bare repository ``remote`` has it at ``rev`` (None when it is not there)."""
    proc = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=remote, capture_output=True, text=True, check=False)
    return proc.stdout if proc.returncode == 0 else None


def remote_archive(remote: Path) -> list[dict[str, Any]]:
    """Every line of the run archive (observed/runs/) at the tip of ``remote``'s main: attempts and the boxes'
    overhead lines (``kind: overhead``)."""
    names = git(remote, "ls-tree", "--name-only", "refs/heads/main", "observed/runs/").split()
    return [json.loads(line) for n in names for line in (remote_file(remote, n) or "").splitlines() if line.strip()]


def emulator_env(emu: Any, **paths: Path) -> dict[str, str]:
    """This process's environment pointed at the emulator ``emu``: its API key and URL, plus
    ``RIGSYNC_<NAME>`` for each path given (``state_dir=...`` -> ``RIGSYNC_STATE_DIR``)."""
    env = {**os.environ, "VAST_API_KEY": emu.api_key, "RIGSYNC_API_URL": emu.url}
    env.update({f"RIGSYNC_{name.upper()}": str(path) for name, path in paths.items()})
    return env


def rigsync(
    env: Mapping[str, str], *args: str, timeout: float = 180, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The console script with stdin from /dev/null (not a terminal), as in CI or an agent's shell; it never
    ends in a traceback."""
    result = subprocess.run(
        [str(RIGSYNC), *args], env=dict(env), stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=timeout, cwd=cwd,
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


class ShiftedClock:
    """The wall clock moved by ``offset`` seconds, which a test sets (or ``advance``s) to cross a moment without
    waiting for it: a daemon's clock (``FleetDaemon(clock=...)``) and, through ``now``, an emulator's."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset

    def now(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)
