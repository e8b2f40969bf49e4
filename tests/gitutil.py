"""The one way tests run git: the real git CLI, checked, with a fixed identity and no system config.

Every test that makes or inspects a repository goes through ``git()`` so that a failing git call names its
stderr, and no test depends on the machine's git configuration or the user's identity.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

# who commits when a test commits (a later ``-c user.name=...`` in the arguments overrides it)
RESEARCHER = ("A Researcher", "researcher@example.invalid")
_IDENTITY_VARS = ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL")


def git(repo: Path, *args: str, identity: tuple[str, str] = RESEARCHER, timeout: float = 60) -> str:
    """``git -C repo args``, its stdout stripped; a failure raises ``CalledProcessError`` noting git's stderr."""
    env = {k: v for k, v in os.environ.items() if k not in _IDENTITY_VARS}
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    name, email = identity
    cmd = ["git", "-c", f"user.name={name}", "-c", f"user.email={email}", "-C", str(repo), *args]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, timeout=timeout)
    except subprocess.CalledProcessError as e:
        e.add_note(f"git {' '.join(args)} in {repo}: {e.stderr.strip()}")
        raise
    return proc.stdout.strip()
