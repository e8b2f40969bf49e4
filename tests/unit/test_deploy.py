"""The deployment recipes, as far as this machine can try them: the systemd unit passes ``systemd-analyze verify``
(with its ExecStart pointed at this environment's console script), the container's command is one rigsync's own
parser accepts, and what README's "Deploying" names exists."""

from __future__ import annotations

import configparser
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from reconciler.cli import build_parser, run_cmd

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "rigsync.service"
CONTAINERFILE = ROOT / "deploy" / "Containerfile"
SCRIPT = next(iter(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]))


def _unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None, comment_prefixes=("#", ";"))
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # systemd keys are case-sensitive
    parser.read_string(UNIT.read_text())
    return parser


def test_unit_runs_the_console_script_as_its_own_user() -> None:
    unit = _unit()
    service = unit["Service"]
    argv = shlex.split(service["ExecStart"])
    assert Path(argv[0]).name == SCRIPT and argv[0].startswith("/")
    args = build_parser().parse_args(argv[1:])
    assert args.handler is run_cmd.run and not args.once and args.repo == Path(service["WorkingDirectory"])
    assert service["User"] == "rigsync" and service["Restart"] == "on-failure"
    assert service["EnvironmentFile"].startswith("/etc/")  # the key lives there, never in the unit or in git
    assert "VAST_API_KEY=" not in "".join(line for line in UNIT.read_text().splitlines() if not line.startswith("#"))
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_unit_verifies(tmp_path: Path) -> None:
    """``systemd-analyze verify`` checks every key and that ExecStart is executable: point it at ours."""
    exe = shutil.which("systemd-analyze")
    text = UNIT.read_text()
    argv0 = shlex.split(_unit()["Service"]["ExecStart"])[0]
    local = tmp_path / "rigsync.service"
    local.write_text(text.replace(argv0, str(Path(sys.executable).parent / SCRIPT)))
    if exe is None:  # no systemd here: the parse above is what can be checked
        assert Path(sys.executable).parent.joinpath(SCRIPT).is_file()
        return
    proc = subprocess.run([exe, "verify", str(local)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    bad = tmp_path / "bad.service"
    bad.write_text(text.replace(argv0, "/nonexistent/rigsync"))
    assert subprocess.run([exe, "verify", str(bad)], capture_output=True, timeout=60).returncode != 0


def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", CONTAINERFILE.read_text())
    out = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_container_runs_rigsync_run_without_secrets() -> None:
    ins = _instructions()
    get = {k: v for k, v in ins}
    assert get["FROM"].startswith("python:3.11")
    entry, cmd = json.loads(get["ENTRYPOINT"]), json.loads(get["CMD"])
    assert entry == [SCRIPT]
    args = build_parser().parse_args(cmd)
    assert args.handler is run_cmd.run and args.repo == Path("/fleet")
    assert get["USER"] not in ("root", "0")
    env = dict(re.findall(r"(\w+)=(\S+)", get["ENV"]))
    assert env["RIGSYNC_STATE_DIR"] == "/state" and env["RIGSYNC_DATA_DIR"] == "/data"
    assert set(json.loads(get["VOLUME"])) == {"/fleet", "/state", "/data"}
    assert not any("VAST_API_KEY" in v for k, v in ins if k in ("ENV", "ARG"))
    for k, v in ins:
        if k == "COPY":
            for src in v.split()[:-1]:
                assert (ROOT / src).exists(), src


def test_readme_deploying_names_what_exists() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Deploying", 1)[1].split("\n## ", 1)[0]
    for path in ("deploy/rigsync.service", "deploy/Containerfile"):
        assert f"]({path})" in section and (ROOT / path).is_file()
    assert "docker build -t rigsync -f deploy/Containerfile ." in section
    for name in ("VAST_API_KEY", "RIGSYNC_SSH_KEY", "observed/known_hosts"):
        assert name in section
    workflow = (ROOT / "reconciler/example/fleet/dot-github/workflows/rigsync-run.yml").read_text()
    for name in ("secrets.VAST_API_KEY", "secrets.RIGSYNC_SSH_KEY", "observed/known_hosts", "run --once"):
        assert name in workflow
