"""The box-side files in reconciler/box/: every script passes shellcheck, the probe runs on its own."""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler import box, remote
from reconciler.remote import commands

PKG = Path(box.__file__).resolve().parent
SCRIPTS = sorted(PKG.glob("*.sh"))
PROBE = PKG / "probe.py"


def _shellcheck(args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("shellcheck")
    if exe is None:
        pytest.fail("shellcheck is not installed: the README setup command installs it (apt-get)")
    return subprocess.run([exe, *args], input=stdin, capture_output=True, text=True, timeout=120, check=False)


def test_the_box_side_scripts_exist() -> None:
    names = {p.name for p in SCRIPTS}
    assert names >= {"lib.sh", "probe.sh", "launch.sh", "wrapper.sh", "kill.sh", "bootstrap.sh", "ship_code.sh",
                     "watchdog_start.sh", "watchdog_run.sh"}


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_script_passes_shellcheck(path: Path) -> None:
    res = _shellcheck([str(path)])
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("path", [p for p in SCRIPTS if p.name != "lib.sh"], ids=lambda p: p.name)
def test_script_as_shipped_passes_shellcheck(path: Path) -> None:
    """What runs on a box is lib.sh followed by the script: checked as one, function definitions included."""
    res = _shellcheck(["-"], stdin=commands._script(path.name))
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_disabled_checks_say_why(path: Path) -> None:
    for n, line in enumerate(path.read_text().splitlines(), 1):
        m = re.search(r"#\s*shellcheck\s+disable=\S+(.*)$", line)
        if m:
            assert re.match(r"\s+#\s*\S", m.group(1)), f"{path.name}:{n}: a disabled check needs a reason comment"


def test_box_files_do_not_name_the_root_directory() -> None:
    """``$HOME/rigsync`` is defined once, as ``remote.ROOT``; the box-side files get it as RIGSYNC_ROOT."""
    assert remote.ROOT == "$HOME/rigsync"
    for path in [*SCRIPTS, PROBE, PKG / "watchdog.py"]:
        text = path.read_text()
        assert "HOME/rigsync" not in text and '"rigsync"' not in text, path.name


def test_probe_keeps_to_python_3_8_and_the_standard_library() -> None:
    tree = ast.parse(PROBE.read_text(), feature_version=(3, 8))
    imported: set[str] = set()
    for node in ast.walk(tree):
        assert not isinstance(node, ast.Match), "no match statements on the box"
        if isinstance(node, ast.Import):
            imported.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.module.startswith("reconciler.box."):
            imported.add(node.module.split(".")[0])
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


def _run_probe(env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    """The probe as shipped (its bundle), without site-packages: only the standard library is there."""
    cmd = [sys.executable, "-S", "-c", commands._program("probe.py")]
    return subprocess.run(cmd, env=env, capture_output=True, timeout=60, check=False)


def test_probe_file_runs_standalone(tmp_path: Path) -> None:
    root = tmp_path / "rigsync"
    run = root / "runs" / "r1.0"
    run.mkdir(parents=True)
    (run / "meta.json").write_text(json.dumps({"gpu_mask": [0], "metric_key": "loss", "metric_goal": "min"}))
    (run / "exit_code").write_text("0\n")
    (run / "metrics.jsonl").write_text('{"loss": 2}\n{"loss": 1}\n')
    (root / "code" / "abc").mkdir(parents=True)
    empty = tmp_path / "bin"  # no nvidia-smi here: the probe still answers, with gpu_error
    empty.mkdir()
    res = _run_probe({"HOME": str(tmp_path), "PATH": str(empty), "RIGSYNC_ROOT": str(root)})
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["v"] == remote.PROBE_FORMAT and doc["gpus"] == [] and "nvidia-smi" in doc["gpu_error"]
    assert doc["python"] == sys.executable
    p = remote.parse_probe(1, res.stdout, gpus_listed=1)
    assert p.code_commits == ("abc",)
    assert [(r.run_id, r.attempt, r.exit_code, r.best_metric) for r in p.runs] == [("r1", 0, 0, 1.0)]


def test_probe_without_a_root_says_so(tmp_path: Path) -> None:
    res = _run_probe({"HOME": str(tmp_path), "PATH": os.defpath})
    assert res.returncode == 0, res.stderr
    p = remote.parse_probe(1, res.stdout, gpus_listed=1)
    assert not p.reachable and p.unusable is not None and "RIGSYNC_ROOT is not set" in p.unusable


def test_the_probe_shipped_is_the_file() -> None:
    assert commands._text("probe.py") == PROBE.read_text()
    assert repr(PROBE.read_text()) in commands._program("probe.py")
    assert repr((PKG / "boxlib.py").read_text()) in commands._program("probe.py")
    assert shlex.quote(commands._program("probe.py")) in remote.probe_script()
