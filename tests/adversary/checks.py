"""What the adversary corpus asserts about a controller after hostile boxes: one home for each check.

* ``strict_observed``: every file under ``observed/`` at the remote's tip is strict text: JSON and JSON lines parse
  with non-finite numbers refused, YAML loads safely with no NaN or infinity, no raw control or bidi character,
  none of the controller's own paths, and none over ``MAX_OBSERVED_BYTES``.
* ``cycles`` / ``repeated_failures``: the daemon's log read as cycles, and any action that failed the same way in
  two cycles running.
* ``data_dir_problems``: what in the data dir escaped it or should not be there (symlinks out, FIFOs, devices,
  a sparse file made dense).
* ``RssWatch``: the peak RSS (VmHWM) of a process, sampled; it kills the process past a hard ceiling so that a
  controller without bounds cannot take the shared machine down with it.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import signal
import stat
import subprocess
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

MAX_OBSERVED_BYTES = 256 << 10
# C0 controls but tab and newline, DEL, C1, and the bidi formatting characters
_BAD_CHARS = re.compile("[\x00-\x08\x0b-\x1f\x7f\x80-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
CYCLE = re.compile(r"cycle: (.*)$")
FAILED = re.compile(r"^\S+ \S+ \S+ \S+ (\S+ \S+ failed.*)$")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} in strict JSON")


def _non_finite(doc: Any, where: str) -> list[str]:
    out: list[str] = []
    if isinstance(doc, float) and not math.isfinite(doc):
        out.append(f"{where}: {doc}")
    elif isinstance(doc, dict):
        for k, v in doc.items():
            out += _non_finite(k, where) + _non_finite(v, f"{where}.{k}")
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _non_finite(v, f"{where}[{i}]")
    return out


def bad_char(text: str) -> str | None:
    """The first raw control or bidi character in ``text`` as ``U+XXXX at N``, or None."""
    m = _BAD_CHARS.search(text)
    return None if m is None else f"U+{ord(m.group()):04X} at {m.start()}"


# a number drawn that is not one: NaN, Infinity, inf in an attribute value (a coordinate, a path, a style)
_NON_NUMBER = re.compile(r'\s[\w:-]+="[^"<>]*\b(?:NaN|-?Infinity|-?inf)\b')


def page_problems(html: str, forbidden: Iterable[str] = ()) -> list[str]:
    """What is wrong with a rendered page: non-numbers drawn, raw control or bidi characters, controller paths."""
    problems: list[str] = []
    m = _NON_NUMBER.search(html)
    if m:
        problems.append(f"a non-finite coordinate drawn: {m.group()[:120]!r}")
    bad = bad_char(html)
    if bad:
        problems.append(f"raw character {bad}")
    problems += [f"carries the controller path {p}" for p in forbidden if p and p in html]
    return problems


def remote_files(remote: Path, prefix: str = "observed/", rev: str = "refs/heads/main") -> dict[str, bytes]:
    names = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", rev, prefix], cwd=remote, capture_output=True, text=True, check=True
    ).stdout.split()
    return {
        n: subprocess.run(["git", "show", f"{rev}:{n}"], cwd=remote, capture_output=True, check=True).stdout
        for n in names
    }


def strict_observed(remote: Path, forbidden: Iterable[str]) -> list[str]:
    """Every problem with observed/ at the remote tip (empty when it is all strict, escaped, bounded text)."""
    problems: list[str] = []
    forbidden = [f for f in forbidden if f]
    files = remote_files(remote)
    if not files:
        problems.append("observed/ is empty at the remote")
    for name, raw in files.items():
        if len(raw) > MAX_OBSERVED_BYTES:
            problems.append(f"{name}: {len(raw)} bytes, over {MAX_OBSERVED_BYTES}")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            problems.append(f"{name}: not UTF-8 ({exc})")
            continue
        bad = bad_char(text)
        if bad:
            problems.append(f"{name}: raw character {bad}")
        for path in forbidden:
            if path in text:
                problems.append(f"{name}: carries the controller path {path}")
        try:
            if name.endswith(".json"):
                problems += _non_finite(json.loads(text, parse_constant=_refuse_constant), name)
            elif name.endswith(".jsonl"):
                for i, line in enumerate(text.splitlines(), 1):
                    if line.strip():
                        problems += _non_finite(json.loads(line, parse_constant=_refuse_constant), f"{name}:{i}")
            elif name.endswith((".yaml", ".yml")):
                problems += _non_finite(yaml.safe_load(text), name)
        except (ValueError, yaml.YAMLError) as exc:
            problems.append(f"{name}: not strict: {str(exc)[:200]}")
    return problems


def cycles(log: str) -> list[str]:
    """The daemon's cycle lines, in order."""
    return [m.group(1) for m in map(CYCLE.search, log.splitlines()) if m]


def repeated_failures(log: str) -> list[str]:
    """Action failures (``<kind> <target> failed: ...``) that came back the same in the next cycle."""
    per_cycle: list[set[str]] = [set()]
    for line in log.splitlines():
        if CYCLE.search(line):
            per_cycle.append(set())
            continue
        m = re.search(r"(\w+ \S+ failed\b.*)$", line)
        if m:
            per_cycle[-1].add(m.group(1)[:300])
    out: list[str] = []
    for a, b in itertools.pairwise(per_cycle):
        out += sorted(a & b)
    return sorted(set(out))


def data_dir_problems(data: Path) -> list[str]:
    """Symlinks that lead out of ``data``, FIFOs, device nodes and sockets under it, and dense big files."""
    problems: list[str] = []
    real_root = os.path.realpath(data)
    for base, dirs, files in os.walk(data):
        for name in dirs + files:
            p = os.path.join(base, name)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                target = os.path.realpath(p)
                if not (target == real_root or target.startswith(real_root + os.sep)):
                    problems.append(f"{p}: symlink out of the data dir to {os.readlink(p)}")
            elif (
                stat.S_ISFIFO(st.st_mode)
                or stat.S_ISCHR(st.st_mode)
                or stat.S_ISBLK(st.st_mode)
                or stat.S_ISSOCK(st.st_mode)
            ):
                problems.append(f"{p}: special file (mode {oct(st.st_mode)})")
            elif stat.S_ISREG(st.st_mode) and st.st_blocks * 512 > 300 << 20:
                problems.append(f"{p}: {st.st_blocks * 512} bytes on disk")
    return problems


def file_count(path: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(path))


def vm_hwm_kib(pid: int) -> int | None:
    """A process's peak resident set (VmHWM), KiB; None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass
class RssWatch:
    """Samples ``pid``'s VmHWM every ``every`` seconds; past ``ceiling_mib`` it SIGKILLs the process (and says so)."""

    pid: int
    ceiling_mib: float = 1536.0
    every: float = 0.1
    peak_kib: int = 0
    killed: bool = False
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> RssWatch:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def sample(self) -> None:
        hwm = vm_hwm_kib(self.pid)
        if hwm is None:
            return
        self.peak_kib = max(self.peak_kib, hwm)
        if hwm / 1024 > self.ceiling_mib and not self.killed:
            self.killed = True
            os.kill(self.pid, signal.SIGKILL)

    def stop(self) -> float:
        """Stop sampling (after one last sample); the peak in MiB."""
        self.sample()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        return self.peak_kib / 1024
