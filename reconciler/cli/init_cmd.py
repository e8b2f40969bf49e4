"""``rigsync init DIR``: a ready fleet repository, so nobody copies one by hand from rigsync's source tree.

It writes desired/ (fleet, budget, one commented example sweep and the stand-in script it runs), the schemas
where the ``$schema`` lines of those files find them (``schemas/``), the review workflow for pull requests and a
scheduled ``rigsync run --once`` workflow (inert until enabled), a ``.pre-commit-config.yaml`` using the
``rigsync-validate`` hook this repository publishes, and a ``.gitignore``. The templates are package data under
``reconciler/example/fleet/`` (a leading ``dot-`` in their names stands for ``.``, so packaging keeps them).

Nothing is overwritten, ever: a non-empty DIR is refused unless ``--force``, and with ``--force`` only missing
files are added; a file that exists with other content is refused (all of them listed, before anything is
written). A DIR that is not inside a git work tree becomes a repository with one initial commit; inside one, the
files are left for the user to review and commit.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from reconciler import __version__
from reconciler.errors import UserError

# Where rigsync is published: the generated workflows install it from here and the pre-commit config fetches
# its hook from here, unless the fleet repository sets the RIGSYNC_SPEC variable.
RIGSYNC_REPO = "https://github.com/rigsync/rigsync"
SCHEMAS = ("fleet", "budget", "sweep")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Write a fleet repository into DIR: desired/ with a commented example sweep, the schemas, the "
        "review workflow, an optional scheduled `rigsync run --once` workflow, .pre-commit-config.yaml and "
        ".gitignore; `git init` it with an initial commit when it is not inside a repository already."
    )
    p.add_argument("dir", type=Path, help="the directory (created when missing)")
    p.add_argument(
        "--force", action="store_true",
        help="write into a non-empty DIR: add the missing files, keep identical ones, refuse if any differs",
    )
    p.add_argument("--name", default=None, help="the fleet's name (default: DIR's name when it is a valid one)")
    p.set_defaults(handler=run)


def _templates() -> dict[str, bytes]:
    """Relative path in the new repository -> content, from the package data (``dot-`` -> ``.``)."""
    out: dict[str, bytes] = {}
    root = resources.files("reconciler") / "example" / "fleet"

    def walk(node: Traversable, prefix: str) -> None:
        for child in sorted(node.iterdir(), key=lambda c: c.name):
            if child.name == "__pycache__":
                continue
            name = "." + child.name.removeprefix("dot-") if child.name.startswith("dot-") else child.name
            if child.is_dir():
                walk(child, f"{prefix}{name}/")
            else:
                out[f"{prefix}{name}"] = child.read_bytes()

    walk(root, "")
    schemas = resources.files("reconciler") / "schemas"
    for name in SCHEMAS:
        out[f"schemas/{name}.schema.json"] = (schemas / f"{name}.schema.json").read_bytes()
    return out


def _fill(files: dict[str, bytes], fleet: str) -> dict[str, bytes]:
    subs = {
        "@RIGSYNC_REPO@": RIGSYNC_REPO,
        "@RIGSYNC_VERSION@": __version__,
        "@RIGSYNC_SPEC@": f"rigsync @ git+{RIGSYNC_REPO}@v{__version__}",
    }
    out = {}
    for path, blob in files.items():
        if path.endswith((".yml", ".yaml")):
            text = blob.decode("utf-8")
            for key, value in subs.items():
                text = text.replace(key, value)
            if path == "desired/fleet.yaml":
                text = re.sub(r"^name: my-fleet\b", f"name: {fleet}", text, count=1, flags=re.M)
            blob = text.encode("utf-8")
        out[path] = blob
    return out


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)


def run(args: argparse.Namespace) -> int:
    target: Path = args.dir
    if target.exists() and not target.is_dir():
        raise UserError(f"{target}: exists and is not a directory")
    fleet = args.name or target.resolve().name.lower()
    if not _NAME.match(fleet):
        if args.name:
            raise UserError(f"--name {args.name!r}: a fleet name is lowercase letters, digits, '-' and '_'")
        fleet = "my-fleet"
    existing = [p for p in target.iterdir() if p.name != ".git"] if target.is_dir() else []
    if existing and not args.force:
        raise UserError(
            f"{target}: not empty ({len(existing)} entr{'y' if len(existing) == 1 else 'ies'}); rigsync init never "
            "overwrites: use an empty directory, or --force to add only the files that are missing"
        )
    files = _fill(_templates(), fleet)
    differ: list[str] = []
    same: list[str] = []
    new: list[str] = []
    for rel, blob in files.items():
        dest = target / rel
        if dest.is_symlink() or (dest.exists() and not dest.is_file()):
            differ.append(rel)
        elif dest.exists():
            (same if dest.read_bytes() == blob else differ).append(rel)
        else:
            new.append(rel)
    if differ:
        raise UserError(
            f"{target}: these files exist with other content; rigsync init never overwrites (move them away "
            f"first): {', '.join(sorted(differ))}"
        )
    for rel in new:
        dest = target / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(files[rel])
        if rel.endswith(".sh"):
            dest.chmod(0o755)
    for rel in sorted(new):
        print(f"wrote {target / rel}")
    for rel in sorted(same):
        print(f"kept  {target / rel} (already the same)")
    inside = _git(target, "rev-parse", "--is-inside-work-tree").stdout.strip() == "true"
    if inside:
        if new:
            print(f"{target} is inside a git repository: review the new files and commit them")
    else:
        _commit(target)
        print(f"{target}: new git repository, initial commit made")
    print(
        f"next: rigsync validate --repo {target}; rigsync review --repo {target} --base HEAD~1 after an edit; "
        f"rigsync demo --repo {target} runs it on the built-in emulator"
    )
    return 0


def _commit(target: Path) -> None:
    """``git init`` on the branch `rigsync run` tracks by default, and the first commit (as rigsync when the user
    has no identity configured)."""
    from reconciler.adapters.git import DEFAULT_AUTHOR_EMAIL, DEFAULT_BRANCH  # git's defaults, only when committing

    env_identity: list[str] = []
    if not _git(target.parent, "config", "user.email").stdout.strip():
        env_identity = ["-c", "user.name=rigsync init", "-c", f"user.email={DEFAULT_AUTHOR_EMAIL}"]
    steps = (
        ("init", "-q", "-b", DEFAULT_BRANCH),
        ("add", "-A"),
        (*env_identity, "commit", "-q", "-m", "rigsync init: fleet repository with an example sweep"),
    )
    for step in steps:
        proc = subprocess.run(["git", *step], cwd=target, capture_output=True, text=True, check=False,
                              env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
        if proc.returncode != 0:
            raise UserError(f"git {' '.join(step)} in {target} failed: {proc.stderr.strip()}")
