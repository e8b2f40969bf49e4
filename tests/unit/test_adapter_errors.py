"""No library exception escapes an adapter, and each keeps the library's exception as its cause.

Every adapter is driven against something that fails for real (a path that is no git checkout, a closed port on
loopback, corrupt files) and must raise one of rigsync's errors (``errors.RigsyncError``) raised ``from`` the
library's exception, so the cause reaches a DEBUG log (``errors.cause_chain``) while a person sees one line.
Only 127.0.0.0/8 is ever contacted. Also here: every class of ``reconciler.errors`` is in its docstring's tree.
"""

from __future__ import annotations

import inspect
import logging
import re
import tarfile
from pathlib import Path

import paramiko
import pytest
import requests
from git.exc import GitError
from gitutil import git

from reconciler import errors
from reconciler.adapters.archive import ShardedRunArchive
from reconciler.adapters.git import GitRepo
from reconciler.adapters.launch_journal import JOURNAL, FileLaunchJournal
from reconciler.adapters.lease import LocalLock
from reconciler.adapters.ssh import SshShell, ensure_keypair
from reconciler.adapters.store import LocalStore
from reconciler.adapters.vast import VastProvider
from reconciler.core.model import Endpoint, InFlight
from reconciler.errors import RigsyncError, cause_chain
from reconciler.observed.codec import RUNS_DIR

CLOSED = "127.0.0.1"  # port 1 on loopback: nothing listens there, the connection is refused at once


def raised(fn: object, *args: object, **kw: object) -> RigsyncError:
    assert callable(fn)
    with pytest.raises(RigsyncError) as info:
        fn(*args, **kw)
    return info.value


def causes(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    current = exc.__cause__
    while current is not None:
        out.append(current)
        current = current.__cause__
    return out


def caused_by(exc: RigsyncError, library: type[BaseException] | tuple[type[BaseException], ...]) -> None:
    """``exc`` is ours and somewhere down its ``__cause__`` chain is the library's exception."""
    chain = causes(exc)
    assert chain, f"{type(exc).__name__}: {exc}: raised without its cause"
    assert any(isinstance(c, library) for c in chain), [type(c) for c in chain]
    assert not isinstance(exc, library)
    assert type(chain[0]).__name__ in cause_chain(exc)


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "commit", "-q", "--allow-empty", "-m", "first")
    return repo


def test_git_repo_on_a_path_that_does_not_exist(tmp_path: Path) -> None:
    caused_by(raised(GitRepo, tmp_path / "nowhere"), GitError)


def test_git_repo_on_a_directory_that_is_no_checkout(tmp_path: Path) -> None:
    caused_by(raised(GitRepo, tmp_path), GitError)


def test_git_repo_commands_that_fail(checkout: Path) -> None:
    git = GitRepo(checkout, remote="origin")
    caused_by(raised(git.rev, "no-such-ref"), GitError)
    caused_by(raised(git.read_lease), GitError)  # no remote named origin


def test_ssh_to_a_closed_loopback_port(tmp_path: Path) -> None:
    key, _ = ensure_keypair(tmp_path)
    shell = SshShell(private_key=key, known_hosts=tmp_path / "known_hosts")
    try:
        exc = raised(shell.run, Endpoint(CLOSED, 1), "true", timeout=5)
    finally:
        shell.close()
    assert isinstance(exc, errors.HostUnreachable)
    caused_by(exc, OSError)


def test_ssh_with_a_corrupt_key_or_known_hosts(tmp_path: Path) -> None:
    bad_key = tmp_path / "id_bad"
    bad_key.write_text("not a key\n")
    caused_by(raised(SshShell, private_key=bad_key, known_hosts=tmp_path / "kh"), (paramiko.SSHException, ValueError))
    (tmp_path / "keys").mkdir()
    key, _ = ensure_keypair(tmp_path / "keys")
    known = tmp_path / "known_hosts"
    known.mkdir()  # a directory where the file should be: unreadable as a known_hosts file
    caused_by(raised(SshShell, private_key=key, known_hosts=known), OSError)


def test_vast_api_on_a_closed_loopback_port() -> None:
    provider = VastProvider(
        api_key="k", server_url=f"http://{CLOSED}:1", max_tries=1, max_total_s=1.0, sdk_retry=1, sleep=lambda s: None
    )
    exc = raised(provider.list_instances)
    assert isinstance(exc, errors.ProviderTransient)
    caused_by(exc, requests.RequestException)


def test_corrupt_archive_shard(tmp_path: Path) -> None:
    shard = tmp_path / RUNS_DIR / "2026-11.jsonl"
    shard.parent.mkdir(parents=True)
    shard.write_text('{"run_id": "r1", "attempt": "not a number"}\n{not json}\n')
    (tmp_path / ".git").mkdir()
    exc = raised(len, ShardedRunArchive(tmp_path))
    assert isinstance(exc, errors.ArchiveCorrupt)
    caused_by(exc, ValueError)
    caused_by(raised(list, ShardedRunArchive(tmp_path).records()), ValueError)


def test_archive_journal_that_cannot_be_written(tmp_path: Path) -> None:
    from test_archive import rec

    (tmp_path / ".git").mkdir()
    journal = tmp_path / "journal"
    journal.mkdir()  # a directory where the journal file should be
    archive = ShardedRunArchive(tmp_path, journal=journal)
    caused_by(raised(archive.append, [rec()]), OSError)


def test_launch_journal_that_cannot_be_written(tmp_path: Path) -> None:
    (tmp_path / JOURNAL).mkdir()  # a directory where the journal file should be
    (tmp_path / JOURNAL).with_suffix(".tmp").mkdir()
    journal = FileLaunchJournal(tmp_path)
    flight = InFlight(run_id="r1", attempt=1, instance_id=7, gpu_mask=(0,), launched_at=1.0)
    for exc in (raised(journal.note, flight), raised(journal.reset, [flight])):
        assert isinstance(exc, errors.LaunchJournalError)
        caused_by(exc, OSError)


def test_local_lock_held_twice(tmp_path: Path) -> None:
    first = LocalLock(tmp_path / "lock").acquire()
    try:
        exc = raised(LocalLock(tmp_path / "lock").acquire)
        assert isinstance(exc, errors.LeaseHeld)
        caused_by(exc, OSError)
    finally:
        first.release()


def test_store_with_a_corrupt_harvest(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "data")
    caused_by(raised(store.put_attempt, "r1", 1, b"not a tar archive at all" * 100), tarfile.TarError)


def test_every_error_class_is_in_the_docstring_tree() -> None:
    doc = errors.__doc__ or ""
    tree = {m.group(1) for m in re.finditer(r"[├└]── (\w+)", doc)}
    ours = {
        name
        for name, obj in vars(errors).items()
        if inspect.isclass(obj) and issubclass(obj, Exception) and obj.__module__ == errors.__name__
    }
    assert ours - tree == set(), f"classes missing from errors.py's tree: {sorted(ours - tree)}"


def test_the_cause_shows_at_debug_never_in_the_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    from reconciler.cli import main

    caplog.set_level(logging.DEBUG, logger="rigsync.cli")
    # no git checkout: the git adapter raises RepoError from gitpython's, review turns it into a UserError
    assert main(["review", "--repo", str(tmp_path), "--base", "HEAD~1"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rigsync: error: ")
    assert "InvalidGitRepositoryError" not in err
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG and r.name == "rigsync.cli"]
    assert any("InvalidGitRepositoryError" in m for m in debug), debug
