"""Git as rigsync's interface: read desired/ at a commit, write observed/ back, push without ever forcing.

The checkout is rigsync's own clone of the fleet repository. Humans change ``desired/`` by pushing to the
remote; rigsync reads it at the remote tip (a commit, never the working tree), and commits only under
``observed/``. Pushing is optimistic: on a non-fast-forward or a ref-lock race it fetches, rebases its own
commits onto the new tip and tries again, so a human's commit is never lost and nothing is force-pushed.

Rebase conflicts can only come from two writers touching ``observed/`` at once. They are resolved by path
through repository-local attributes (``.git/info/attributes``, never committed): the run archive shards are
merged as a union of lines (the archive de-duplicates by run id + attempt on load) and the rendered snapshots
take rigsync's newer version.

The fleet's lease is not on the tracked branch: it lives on its own ref, ``refs/heads/rigsync/lease/<branch>``, one
parentless commit holding ``lease.yaml``, replaced only by compare-and-swap pushes (``--force-with-lease`` naming
the sha it replaces; ``ports.LeaseStore``, the rules in ``reconciler.adapters.lease``). A push of the branch can
carry a new heartbeat in the same ``--atomic`` push, so the branch moves only while the lease is still the one we wrote.

gitpython exceptions are wrapped in ``RepoError``/``PushRejected`` here; callers never see them.
"""

from __future__ import annotations

import contextlib
import random
import tempfile
import time
from collections.abc import Container, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypedDict

import git
from git.exc import GitCommandError, InvalidGitRepositoryError, NoSuchPathError

from reconciler.adapters.lease import LEASE_FILE
from reconciler.core.model import Desired
from reconciler.core.textsafe import visible
from reconciler.desired.desired_tree import (
    MAX_DESIRED_DEPTH,
    MAX_DESIRED_ENTRIES,
    MAX_FILE_BYTES,
    TreeFiles,
    folder_is_symlink,
    symlink_refused,
    too_big,
    too_deep,
    too_many_entries,
)
from reconciler.errors import LeaseRace, PushRejected, RepoError
from reconciler.failpoints import failpoint
from reconciler.observed.codec import OBSERVED_DIR
from reconciler.observed.observed_tree import write_observed

OBSERVED_PREFIX = OBSERVED_DIR + "/"
DESIRED_PREFIX = "desired/"
LEASE_REF_PREFIX = "refs/heads/rigsync/lease/"
# The git defaults of rigsync's checkout (`rigsync run --branch/--author`, ``DaemonConfig``, ``fleet.open_git``):
# the one place they are written.
DEFAULT_REMOTE = "origin"
DEFAULT_BRANCH = "main"  # the tracked branch; `rigsync init` and the demo create their repositories on it
DEFAULT_AUTHOR_NAME = "rigsync"
DEFAULT_AUTHOR_EMAIL = "rigsync@localhost"


class GitOptions(TypedDict, total=False):
    """What a caller may choose of a ``GitRepo``'s remote, branch and identity; the rest are the defaults above."""

    remote: str
    branch: str
    author_name: str
    author_email: str
_LEASE_SEEN = "refs/rigsync/lease-seen"  # local: the lease as last fetched
_ARCHIVE_PATHS = (f"{OBSERVED_DIR}/runs", f"{OBSERVED_DIR}/curves")  # append-only records, never probe noise

_ATTRIBUTES = (
    "# written by rigsync: how its rebase resolves concurrent edits under observed/\n"
    "observed/runs/*.jsonl merge=union\n"
    "observed/*.yaml merge=rigsync-replayed\n"
)
# During a rebase %B is the commit being replayed (rigsync's own): its rendering is the newer one.
_MERGE_CONFIG = (
    "merge.rigsync-replayed.name=rigsync: keep the replayed observed file",
    "merge.rigsync-replayed.driver=cat %B > %A",
)

# Messages from git (and the remote side) that mean "someone else moved the branch; rebase and retry".
_RACE_MARKERS = (
    "non-fast-forward",
    "fetch first",
    "cannot lock ref",
    "failed to update ref",
    "[rejected]",
    "[remote rejected]",
    "incorrect old value",
    "is at ",  # "... is at <sha> but expected <sha>"
    "unable to update local ref",
)


_SYMLINK_MODE = 0o120000


class _TreePaths(Container[str]):
    """Whether a repo-relative path is a file or folder in one commit's tree (looked up, never listed)."""

    def __init__(self, tree: Any) -> None:
        self.tree = tree

    def __contains__(self, path: object) -> bool:
        if not isinstance(path, str) or not path or path.startswith("/"):
            return False
        try:
            self.tree / path.rstrip("/")
        except KeyError:
            return False
        return True


def _stderr(exc: GitCommandError) -> str:
    err = exc.stderr if isinstance(exc.stderr, str) else (exc.stderr or b"").decode("utf-8", "replace")
    return err.strip().removeprefix("stderr: ").strip().strip("'").strip()


class GitRepo:
    """rigsync's checkout of the fleet repository."""

    def __init__(
        self,
        path: Path,
        *,
        remote: str = DEFAULT_REMOTE,
        branch: str = DEFAULT_BRANCH,
        author_name: str = DEFAULT_AUTHOR_NAME,
        author_email: str = DEFAULT_AUTHOR_EMAIL,
    ) -> None:
        self.path = Path(path)
        self.remote = remote
        self.branch = branch
        self.author_name = author_name
        self.author_email = author_email
        try:
            self._repo = git.Repo(self.path)
        except (InvalidGitRepositoryError, NoSuchPathError) as exc:
            raise RepoError(f"{self.path} is not a git checkout") from exc
        self._git: Any = self._repo.git
        # Identity through the environment only: never touch the user's or the repository's config.
        self._env = {
            "GIT_AUTHOR_NAME": author_name,
            "GIT_AUTHOR_EMAIL": author_email,
            "GIT_COMMITTER_NAME": author_name,
            "GIT_COMMITTER_EMAIL": author_email,
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_EDITOR": "true",
        }

    # ------------------------------------------------------------------------------------------- plumbing

    def _run(self, *args: str, binary: bool = False) -> Any:
        """Run one git command with rigsync's identity; wrap failures in RepoError."""
        try:
            return self._git.execute(
                ["git", *args], env=self._env, stdout_as_string=not binary, strip_newline_in_stdout=not binary
            )
        except GitCommandError as exc:
            raise RepoError(f"git {args[0]} failed in {self.path}: {_stderr(exc) or exc}") from exc

    def _install_attributes(self) -> None:
        info = Path(self._repo.git_dir) / "info"
        attrs = info / "attributes"
        try:
            if attrs.exists() and _ATTRIBUTES in attrs.read_text():
                return
            info.mkdir(parents=True, exist_ok=True)
            existing = attrs.read_text() if attrs.exists() else ""
            attrs.write_text(existing + ("\n" if existing and not existing.endswith("\n") else "") + _ATTRIBUTES)
        except OSError as exc:
            raise RepoError(f"cannot write {attrs}: {exc}") from exc

    @property
    def _remote_ref(self) -> str:
        return f"refs/remotes/{self.remote}/{self.branch}"

    @property
    def lease_ref(self) -> str:
        """The remote ref holding the fleet's lease: one per tracked branch, so its name never depends on whether
        desired/ parses (two reconcilers must always race for the same ref)."""
        return LEASE_REF_PREFIX + self.branch

    # -------------------------------------------------------------------------------------------- reading

    def fetch(self) -> str:
        """Fetch the tracked branch; return the sha of its tip on the remote."""
        self._run("fetch", "--quiet", "--no-tags", self.remote, f"+refs/heads/{self.branch}:{self._remote_ref}")
        return str(self._run("rev-parse", "--verify", f"{self._remote_ref}^{{commit}}"))

    def pin(self, desired: Desired, ref: str = "HEAD") -> Desired:
        """``desired`` (as read at ``ref``) with the revisions it is applied as: the one rule for both.

        ``commit`` is the desired revision: the newest commit at or before ``ref`` that changed ``desired/``.
        ``code_commit`` is the newest one that changed the desired state's code paths (what ships to the
        boxes; observed/ never counts as code). Not ``ref`` itself: rigsync's own observed/ and lease commits
        move the branch tip every cycle and must neither look like a new desired state nor make the boxes
        fetch the same code again. `rigsync run`, `plan`/`apply`/`status` and `diff` all pin through here.
        """
        sha = self.rev(ref)
        code_paths = (*desired.code_paths(), f":(exclude){OBSERVED_DIR}")
        return replace(desired, commit=self.desired_commit(sha), code_commit=self.last_commit_touching(sha, code_paths))

    def desired_commit(self, commit: str) -> str:
        """The desired revision at ``commit``: the newest commit at or before it that changed ``desired/``.

        ``pin`` uses it; call it alone only to name a revision whose desired/ did not load.
        """
        return self.last_commit_touching(commit, (DESIRED_PREFIX.rstrip("/"),))

    def last_commit_touching(self, commit: str, paths: Sequence[str]) -> str:
        """The newest commit at or before ``commit`` that changed any of ``paths`` (``commit`` if none did)."""
        sha = str(self._run("log", "-1", "--format=%H", commit, "--", *paths))
        return sha or self.rev(commit)

    def rev(self, ref: str) -> str:
        """The commit sha ``ref`` names; ``RepoError`` when it names none (e.g. a repository without commits)."""
        try:
            return str(self._run("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"))
        except RepoError as exc:
            raise RepoError(f"{ref} names no commit in {self.path}") from exc

    def recover(self) -> list[str]:
        """Clear what a killed rigsync left half-done in its checkout: a rebase in progress, a stale index lock.

        Call it only while holding the checkout's local lock: then no other rigsync is running git here, so
        the lock file and the rebase state can only be leftovers. Returns what was cleared (for the log).
        """
        git_dir = Path(self._repo.git_dir)
        cleared: list[str] = []
        lock = git_dir / "index.lock"
        if lock.exists():
            try:
                lock.unlink()
            except OSError as exc:
                raise RepoError(f"cannot remove the stale {lock}: {exc}") from exc
            cleared.append("a stale index.lock")
        if (git_dir / "rebase-merge").exists() or (git_dir / "rebase-apply").exists():
            self._run("rebase", "--abort")
            cleared.append("an interrupted rebase")
        return cleared

    def drop_unpushed(self) -> str:
        """Move the branch back to the remote tip, dropping rigsync's unpushed commits (keeps local edits)."""
        tip = self.fetch()
        self._run("reset", "--quiet", "--keep", tip)
        return tip

    def remote_head(self) -> str:
        """The remote branch's current sha without fetching objects (cheap enough to poll)."""
        out = str(self._run("ls-remote", self.remote, f"refs/heads/{self.branch}"))
        return out.split()[0] if out else ""

    def head(self) -> str:
        return str(self._run("rev-parse", "--verify", "HEAD^{commit}"))

    def remote_tip(self) -> str | None:
        """The last fetched tip of the tracked branch, or None if it was never fetched."""
        try:
            return str(self._run("rev-parse", "--verify", "--quiet", f"{self._remote_ref}^{{commit}}")) or None
        except RepoError:
            return None

    def files_at(
        self,
        commit: str,
        prefix: str,
        *,
        max_bytes: int | None = None,
        only: Container[str] | None = None,
        bounded: bool = False,
    ) -> TreeFiles:
        """Every blob under ``prefix`` (a directory, ending in ``/``) at ``commit``, keyed by full path.

        A blob over ``max_bytes`` is not read: its size comes from the object header (``git cat-file
        --batch-check``), and it is listed in ``refused`` instead, as are symlinks and submodules, and ``prefix``
        itself when it is a symlink. ``only``, when given, limits which paths are read. The walk is iterative;
        ``bounded`` stops it at the loader's depth and entry limits (what desired/ may hold), saying so in
        ``refused``.
        """
        try:
            tree = self._repo.commit(commit).tree
        except (ValueError, GitCommandError, git.BadName) as exc:
            raise RepoError(f"no such commit {commit!r} in {self.path}") from exc
        top = prefix.rstrip("/")
        out = TreeFiles(repo_paths=_TreePaths(tree))
        try:
            sub = tree / top
        except KeyError:
            return out
        if sub.type != "tree":
            if sub.mode == _SYMLINK_MODE:
                out.refused[top] = folder_is_symlink(top)
            return out
        found: dict[str, bytes] = {}
        stack: list[tuple[Any, int]] = [(sub, 1)]
        seen = 0
        while stack:
            folder, depth = stack.pop()
            for item in folder:
                path = str(item.path)
                seen += 1
                if bounded and seen > MAX_DESIRED_ENTRIES:
                    out.refused[top] = too_many_entries(top)
                    stack.clear()
                    break
                if item.type == "tree":
                    if bounded and depth >= MAX_DESIRED_DEPTH:
                        out.refused[path] = too_deep(top)
                    else:
                        stack.append((item, depth + 1))
                elif only is not None and path not in only:
                    continue
                elif item.type != "blob":
                    out.refused[path] = "not a regular file (a submodule)"
                elif item.mode == _SYMLINK_MODE:
                    out.refused[path] = symlink_refused(top)
                elif max_bytes is not None and item.size > max_bytes:
                    out.refused[path] = too_big(item.size, max_bytes)
                else:
                    found[path] = item.data_stream.read()
        out.update(sorted(found.items()))
        return out

    def desired_files(self, commit: str) -> TreeFiles:
        """Every blob under ``desired/`` at ``commit``, keys ``desired/...``, none read past the loader's size limit;
        what the loader must refuse unread is in ``refused``, and ``repo_paths`` answers from the commit's tree."""
        return self.files_at(commit, DESIRED_PREFIX, max_bytes=MAX_FILE_BYTES, bounded=True)

    def archive(self, commit: str, paths: Sequence[str]) -> bytes:
        """A tar of ``paths`` (``.`` for the whole tree) at ``commit``, as ``git archive`` makes it."""
        data: bytes = self._run("archive", "--format=tar", commit, "--", *paths, binary=True)
        return data

    # -------------------------------------------------------------------------------------------- writing

    def sync_to_remote(self) -> None:
        """Fetch, then replay rigsync's unpushed commits onto the remote tip.

        Afterwards the working tree shows the latest desired/. Only commits not yet on the remote are
        replayed; every commit already there (a human's included) stays as it is.
        """
        tip = self.fetch()
        head = self.head()
        if head == tip:
            return
        if self._is_ancestor(head, tip):
            self._run("merge", "--ff-only", "--quiet", tip)
            return
        if self._is_ancestor(tip, head):
            return  # only local commits ahead: nothing to replay onto
        self._rebase(tip)

    def _is_ancestor(self, a: str, b: str) -> bool:
        try:
            self._git.execute(["git", "merge-base", "--is-ancestor", a, b], env=self._env)
            return True
        except GitCommandError as exc:
            if exc.status == 1:
                return False
            raise RepoError(f"git merge-base failed in {self.path}: {_stderr(exc)}") from exc

    def _rebase(self, onto: str) -> None:
        self._install_attributes()
        cfg: list[str] = []
        for c in _MERGE_CONFIG:
            cfg += ["-c", c]
        failpoint("git.rebase.before")
        try:
            self._git.execute(["git", *cfg, "rebase", "--autostash", "--quiet", onto], env=self._env)
            failpoint("git.rebase.after")
        except GitCommandError as exc:
            conflicted = ""
            try:
                conflicted = str(self._git.execute(["git", "diff", "--name-only", "--diff-filter=U"]))
                self._git.execute(["git", "rebase", "--abort"], env=self._env)
            except GitCommandError:
                pass
            where = ", ".join(conflicted.split()) or _stderr(exc)
            raise RepoError(
                f"cannot rebase rigsync's commits onto {self.remote}/{self.branch} ({where}); "
                "another writer changed the same observed/ files"
            ) from exc

    def write_observed(self, files: Mapping[str, str | None], appends: Mapping[str, bytes]) -> None:
        """Write ``files`` (None deletes) and append ``appends`` in the working tree, without committing.

        The one writer of observed/ (``reconciler.observed.observed_tree.write_observed``): any path outside
        ``observed/`` is refused before anything is written.
        """
        write_observed(self.path, files, appends)

    def commit_observed(
        self, files: Mapping[str, str | None], appends: Mapping[str, bytes], message: str
    ) -> str | None:
        """Write ``files`` and ``appends`` (``write_observed``) and commit everything changed under observed/.

        Returns the new commit's sha, or None (and no commit) when nothing changed. Changes under observed/
        already in the working tree (left by `rigsync apply`, which writes without committing, or by a cycle
        that died between writing and committing) are committed with them.
        """
        self.write_observed(files, appends)
        root = self.path
        if not (root / OBSERVED_PREFIX).exists() and not self._run("ls-files", "--", OBSERVED_PREFIX):
            return None  # nothing under observed/ on disk or in the index: pathspecs would not match
        self._run("add", "--all", "--", OBSERVED_PREFIX.rstrip("/"))
        try:
            self._git.execute(["git", "diff", "--cached", "--quiet", "--", OBSERVED_PREFIX], env=self._env)
            return None
        except GitCommandError as exc:
            if exc.status != 1:
                raise RepoError(f"git diff failed in {root}: {_stderr(exc)}") from exc
        # the message names values from the world (holders, hosts, sweeps): shown to reviewers by `git log`
        message = visible(message, block=True)
        self._run("commit", "--quiet", "--no-verify", "-m", message, "--", OBSERVED_PREFIX.rstrip("/"))
        return self.head()

    def uncommitted(self, paths: Sequence[str]) -> list[str]:
        """The files under ``paths`` whose working-tree content is not HEAD's (modified, staged, deleted, untracked
        and not ignored), as ``path (how)`` lines; observed/ never counts (rigsync writes it)."""
        out = str(
            self._git.execute(
                ["git", "status", "--porcelain", "-z", "--untracked-files=all", "--", *paths,
                 f":(exclude){OBSERVED_DIR}"],
                env=self._env, strip_newline_in_stdout=False,
            )
        )
        found: list[str] = []
        entries = out.split("\0")
        i = 0
        while i < len(entries):
            entry = entries[i]
            i += 1
            if len(entry) < 4:
                continue
            code, path = entry[:2], entry[3:]
            if "R" in code or "C" in code:
                i += 1  # a rename's source path follows
            how = {"?": "untracked", "D": "deleted", "A": "added", "R": "renamed"}.get(code.strip()[:1], "modified")
            found.append(f"{visible(path)} ({how})")
        return sorted(found)

    def archive_uncommitted(self) -> bool:
        """Whether archive shards or curves under observed/ differ from HEAD in the working tree (a cycle that died
        between writing and committing, or `rigsync apply`): lines that must reach a commit whatever else changed."""
        out = str(self._run("status", "--porcelain", "--untracked-files=all", "--", *_ARCHIVE_PATHS))
        return bool(out.strip())

    def unpushed(self) -> bool:
        """Whether HEAD holds commits the remote branch (as last fetched) does not: a push is owed."""
        tip = self.remote_tip()
        head = self.head()
        return tip != head and (tip is None or self._is_ancestor(tip, head))

    def push(self, max_tries: int = 6, lease: tuple[str | None, str, str] | None = None) -> str | None:
        """Push HEAD to the tracked branch; on a race fetch, rebase and retry. Never forces the branch.

        ``lease`` = (expected version, text, message): push a new lease commit in the same ``--atomic`` push,
        replacing the lease only if it is still ``expected``; returns the lease's new version. If the lease moved,
        nothing is pushed and ``LeaseRace`` is raised.
        """
        new_lease = self._lease_commit(lease[1], lease[2]) if lease is not None else None
        last = ""
        rejected: GitCommandError | None = None
        for attempt in range(max_tries):
            cmd = ["git", "push", "--quiet", "--porcelain"]
            if lease is not None:
                cmd += ["--atomic", f"--force-with-lease={self.lease_ref}:{lease[0] or ''}"]
            cmd += [self.remote, f"HEAD:refs/heads/{self.branch}"]
            if new_lease is not None:
                cmd.append(f"{new_lease}:{self.lease_ref}")
            try:
                failpoint("git.push.before")
                self._git.execute(cmd, env=self._env)
                failpoint("git.push.after")
                # A successful push also moves the remote-tracking ref; keep it right for remote_tip().
                self._run("update-ref", self._remote_ref, "HEAD")
                return new_lease
            except GitCommandError as exc:
                rejected = exc
                out = exc.stdout if isinstance(exc.stdout, str) else ""
                last = f"{_stderr(exc)} {out}".strip()
                if lease is not None:
                    current, _ = self.read_lease()
                    if current == new_lease:  # it landed (atomically, with the branch); only the answer was lost
                        self._run("update-ref", self._remote_ref, "HEAD")
                        return new_lease
                    if current != lease[0]:
                        raise LeaseRace(
                            f"the lease at {self.remote} {self.lease_ref} moved (expected {_short(lease[0])}, "
                            f"found {_short(current)}): nothing pushed"
                        ) from exc
                if not any(m in last for m in _RACE_MARKERS):
                    raise RepoError(f"git push to {self.remote} failed: {last}") from exc
            if attempt + 1 < max_tries:
                time.sleep(min(2.0, 0.05 * (2**attempt)) * (0.5 + random.random()))
                self.sync_to_remote()
        raise PushRejected(
            f"push to {self.remote}/{self.branch} still rejected after {max_tries} tries: {last}"
        ) from rejected

    # ---------------------------------------------------------------------------------------------- the lease

    def has_remote(self) -> bool:
        """Whether the checkout names its remote at all (a local-only repository holds no lease)."""
        return self.remote in str(self._run("remote")).split()

    def read_lease(self) -> tuple[str | None, str | None]:
        """(sha, lease.yaml) of the lease ref on the remote, fetched now; (None, None) when there is none."""
        try:
            self._git.execute(
                ["git", "fetch", "--quiet", "--no-tags", self.remote, f"+{self.lease_ref}:{_LEASE_SEEN}"],
                env=self._env,
            )
        except GitCommandError as exc:
            err = _stderr(exc)
            if "couldn't find remote ref" not in err.lower():
                raise RepoError(f"cannot read the lease {self.lease_ref} from {self.remote}: {err or exc}") from exc
            with contextlib.suppress(GitCommandError):
                self._git.execute(["git", "update-ref", "-d", _LEASE_SEEN], env=self._env)
            return None, None
        sha = self.rev(_LEASE_SEEN)
        try:
            text = self._git.execute(
                ["git", "show", f"{sha}:{LEASE_FILE}"], env=self._env, strip_newline_in_stdout=False
            )
        except GitCommandError:
            text = ""  # a ref without the file: a lease nobody can hold (from_yaml reads it as none)
        return sha, str(text)

    def swap_lease(self, expected: str | None, text: str | None, message: str) -> str | None:
        """Replace the lease ref with a new commit of ``text`` (None: delete the ref) if it is still ``expected``.

        One ``--force-with-lease=<ref>:<expected>`` push: the remote compares and swaps under its ref lock, so of
        two writers expecting the same version exactly one lands; the other gets ``LeaseRace``.
        """
        if expected is None and text is None:
            return None
        new = self._lease_commit(text, message) if text is not None else None
        cmd = ["git", "push", "--quiet", "--porcelain", f"--force-with-lease={self.lease_ref}:{expected or ''}"]
        cmd += [self.remote, f"{new or ''}:{self.lease_ref}"]
        try:
            self._git.execute(cmd, env=self._env)
            return new
        except GitCommandError as exc:
            out = exc.stdout if isinstance(exc.stdout, str) else ""
            last = f"{_stderr(exc)} {out}".strip()
            current, _ = self.read_lease()
            if current == new:
                return new  # it landed; only the answer was lost
            if current != expected:
                raise LeaseRace(
                    f"the lease at {self.remote} {self.lease_ref} moved (expected {_short(expected)}, "
                    f"found {_short(current)})"
                ) from exc
            raise RepoError(f"git push of the lease to {self.remote} failed: {last}") from exc

    def _lease_commit(self, text: str, message: str) -> str:
        """A parentless commit holding ``lease.yaml`` = ``text`` (the ref keeps no history of heartbeats)."""
        try:
            with tempfile.TemporaryDirectory(prefix="rigsync-lease-") as tmp:
                blob_file = Path(tmp) / LEASE_FILE
                blob_file.write_text(text, encoding="utf-8")
                blob = str(self._run("hash-object", "-w", "--", str(blob_file)))
                listing = Path(tmp) / "tree"
                listing.write_text(f"100644 blob {blob}\t{LEASE_FILE}\n", encoding="utf-8")
                with open(listing, "rb") as fh:
                    tree = str(self._git.execute(["git", "mktree"], env=self._env, istream=fh)).strip()
        except (OSError, GitCommandError) as exc:
            raise RepoError(f"cannot write a lease commit in {self.path}: {exc}") from exc
        return str(self._run("commit-tree", tree, "-m", visible(message, block=True)))


def _short(sha: str | None) -> str:
    return sha[:12] if sha else "none"
