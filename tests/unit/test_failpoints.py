"""reconciler.failpoints: an armed point SIGKILLs the process on its n-th hit; an unarmed one does nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from reconciler import failpoints

PROGRAM = """
import sys
from reconciler.failpoints import failpoint
for i in range(1, 4):
    print(i, flush=True)
    failpoint("demo.point")
print("survived", flush=True)
"""


def _run(spec: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != failpoints.ENV}
    if spec is not None:
        env[failpoints.ENV] = spec
    return subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=30,
                          check=False)


def test_unarmed_points_do_nothing() -> None:
    assert _run(None).stdout.split() == ["1", "2", "3", "survived"]
    assert _run("other.point:1").stdout.split() == ["1", "2", "3", "survived"]


def test_the_nth_hit_is_a_sigkill() -> None:
    proc = _run("x,demo.point:2")
    assert proc.returncode == -signal.SIGKILL
    assert proc.stdout.split() == ["1", "2"]


def test_parse() -> None:
    assert failpoints.parse("a:2, b ,") == {"a": 2, "b": 1}
    with pytest.raises(ValueError):
        failpoints.parse("a:0")


def test_every_documented_point_is_in_the_code() -> None:
    from pathlib import Path

    root = Path(failpoints.__file__).parent
    text = "".join(p.read_text() for p in root.rglob("*.py") if p.name != "failpoints.py")
    for name in failpoints.POINTS:
        assert f'failpoint("{name}")' in text, name
        assert name in (failpoints.__doc__ or "")
