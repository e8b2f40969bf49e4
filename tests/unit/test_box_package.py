"""The box-side package (reconciler/box/) runs on a box with only python3: Python 3.8 syntax, the standard library
and its own siblings, and its programs as shipped (bundles) run without site-packages. The activity rule is one
function, the one the probe reports and the watchdog decides by."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reconciler import box
from reconciler.box import watchdog
from reconciler.box.boxlib import Activity, boot_time, box_activity, box_started_at
from reconciler.remote import commands, parse_probe

PKG = Path(box.__file__).resolve().parent
MODULES = sorted(PKG.glob("*.py"))
SIBLINGS = {p.stem for p in MODULES if p.name != "__init__.py"}


def test_the_box_package_holds_the_programs_and_their_helper() -> None:
    assert {p.name for p in MODULES} >= {"__init__.py", "boxlib.py", "probe.py", "watchdog.py", "harvest.py"}


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_a_box_module_keeps_to_python_3_8_and_the_standard_library(path: Path) -> None:
    tree = ast.parse(path.read_text(), feature_version=(3, 8))
    for node in ast.walk(tree):
        assert not isinstance(node, ast.Match), "no match statements on the box"
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: a relative import does not survive the bundle"
            names = [node.module or ""]
        for name in names:
            if name.startswith("reconciler"):
                # a sibling, imported by the full name the bundle registers on the box
                parts = name.split(".")
                sibling = parts[:2] == ["reconciler", "box"] and len(parts) == 3 and parts[2] in SIBLINGS
                assert sibling, (path.name, name)
            else:
                assert name.split(".")[0] in sys.stdlib_module_names, (path.name, name)


@pytest.mark.parametrize("name", ["probe.py", "watchdog.py", "harvest.py"])
def test_a_bundle_is_python_3_8_and_carries_what_its_program_imports(name: str) -> None:
    bundle = commands._program(name)
    ast.parse(bundle, feature_version=(3, 8))
    assert repr(commands._text(name)) in bundle
    if name != "harvest.py":
        assert repr(commands._text("boxlib.py")) in bundle


def _run_probe(tmp_path: Path, root: Path) -> subprocess.CompletedProcess[bytes]:
    """The probe's bundle, run as on a box: no site-packages, no nvidia-smi on the PATH."""
    empty = tmp_path / "bin"
    empty.mkdir(exist_ok=True)
    env = {"HOME": str(tmp_path), "PATH": str(empty), "RIGSYNC_ROOT": str(root)}
    res = subprocess.run([sys.executable, "-S", "-c", commands._program("probe.py")], env=env,
                         capture_output=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    return res


def test_the_probe_reports_the_activity_rule_the_watchdog_reads(tmp_path: Path) -> None:
    now = time.time()
    root = tmp_path / "rigsync"
    done = root / "runs" / "a.0"
    done.mkdir(parents=True)
    (done / "started_at").write_text(f"{now - 50:.6f}\n")
    (done / "ended_at").write_text(f"{now - 40:.6f}\n")
    (done / "heartbeat").touch()
    os.utime(done / "heartbeat", (now - 30, now - 30))  # the heartbeat counts, as the watchdog always counted it
    os.utime(done, (now - 45, now - 45))
    boot = root / "bootstrap"
    boot.mkdir()
    (boot / "h.failed").write_text("1\n")
    os.utime(boot / "h.failed", (now - 20, now - 20))  # a failed bootstrap counts too
    assert box_activity(str(root)) == Activity(False, pytest.approx(now - 20, abs=0.01))
    assert box_activity(str(root), now).last_at == now, "the box's start, when given, is activity"
    res = _run_probe(tmp_path, root)
    # the probe counts from the kernel's boot, long before these files (the machine is up for more than a minute)
    assert json.loads(res.stdout)["last_activity_at"] == pytest.approx(now - 20, abs=0.01)
    assert parse_probe(1, res.stdout, gpus_listed=1).last_activity_at == pytest.approx(now - 20, abs=0.01)
    assert not (root / "watchdog" / "started_at").exists(), "the probe only reads the box's start"


def test_the_probe_and_the_watchdog_read_the_same_box_start(tmp_path: Path) -> None:
    now = time.time()
    root = tmp_path / "rigsync"
    (root / "runs").mkdir(parents=True)
    assert box_started_at(str(root), now) == boot_time(now), "no watchdog has recorded a start: the kernel's boot"
    assert watchdog.record_start(str(root), now - 5) == pytest.approx(now - 5, abs=1e-5)
    assert watchdog.record_start(str(root), now) == pytest.approx(now - 5, abs=1e-5), "kept across restarts"
    assert box_started_at(str(root), now) == pytest.approx(now - 5, abs=1e-5)
    res = _run_probe(tmp_path, root)
    assert json.loads(res.stdout)["last_activity_at"] == pytest.approx(now - 5, abs=1e-5)


def _python38() -> str | None:
    """A Python 3.8 to run the bundles with: ``$RIGSYNC_TEST_PYTHON38``, ``python3.8`` on the PATH, or one that
    pyenv installed (this machine kind has one under ``~/.pyenv/versions``; the shim alone may not run it)."""
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    candidates = [os.environ.get("RIGSYNC_TEST_PYTHON38"), shutil.which("python3.8")]
    candidates += [str(p) for p in sorted(pyenv.glob("3.8*/bin/python3.8"))]
    for exe in filter(None, candidates):
        ok = subprocess.run([exe, "-c", "import sys; assert sys.version_info[:2] == (3, 8)"], capture_output=True,
                            timeout=30, check=False)
        if ok.returncode == 0:
            return exe
    return None


def test_the_bundles_run_on_python_3_8(tmp_path: Path) -> None:
    exe = _python38()
    assert exe is not None, (
        "no Python 3.8 found (the oldest Python a box may have): set RIGSYNC_TEST_PYTHON38 to one, or install it"
    )
    root = tmp_path / "rigsync"
    (root / "runs" / "r1.0").mkdir(parents=True)
    env = {"HOME": str(tmp_path), "PATH": os.defpath, "RIGSYNC_ROOT": str(root)}
    res = subprocess.run([exe, "-S", "-c", commands._program("probe.py")], env=env, capture_output=True,
                         timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    assert [r.run_id for r in parse_probe(1, res.stdout, gpus_listed=1).runs] == ["r1"]
    bad = subprocess.run([exe, "-S", "-c", commands._program("watchdog.py"), "none", "0", "60"], env=env,
                         capture_output=True, timeout=60, check=False)
    assert bad.returncode == 2, bad.stderr  # it ran as far as reading its arguments
