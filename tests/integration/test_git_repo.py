"""GitRepo against real bare repositories on disk: reading desired at a commit, committing observed/, pushing."""

from __future__ import annotations

import functools
import io
import tarfile
import threading
from pathlib import Path

import pytest
import yaml
from gitutil import git

from reconciler.adapters.git import GitRepo
from reconciler.adapters.lease import GitLease, LeaseState
from reconciler.adapters.lease import to_yaml as lease_to_yaml
from reconciler.core.model import Budget, Desired, Fleet, Sweep
from reconciler.errors import LeaseHeld, LeaseRace, PushRejected, RepoError

pytestmark = pytest.mark.integration
T0 = 1_790_000_000.0

HUMAN = ("Human", "human@example.test")
sh = functools.partial(git, identity=HUMAN)


@pytest.fixture()
def world(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A bare remote with one human commit, a human clone and rigsync's clone."""
    remote = tmp_path / "remote.git"
    sh(tmp_path, "init", "--quiet", "--bare", "--initial-branch=main", str(remote))
    human = tmp_path / "human"
    sh(tmp_path, "clone", "--quiet", str(remote), str(human))
    sh(human, "checkout", "--quiet", "-b", "main")
    (human / "desired" / "sweeps").mkdir(parents=True)
    (human / "desired" / "fleet.yaml").write_text("name: demo\n")
    (human / "desired" / "sweeps" / "a.yaml").write_text("name: a\n")
    (human / "train.py").write_text("print('hi')\n")
    sh(human, "add", ".")
    sh(human, "commit", "--quiet", "-m", "desired: first fleet")
    sh(human, "push", "--quiet", "origin", "main")
    mine = tmp_path / "rigsync"
    sh(tmp_path, "clone", "--quiet", str(remote), str(mine))
    return remote, human, mine


def log(repo: Path, ref: str = "HEAD") -> list[str]:
    return sh(repo, "log", "--format=%an|%cn|%s", ref).splitlines()


def test_fetch_reads_desired_at_the_commit_not_the_working_tree(world: tuple[Path, Path, Path]) -> None:
    _, human, mine = world
    g = GitRepo(mine)
    tip = g.fetch()
    assert tip == sh(human, "rev-parse", "HEAD")
    (mine / "desired" / "fleet.yaml").write_text("name: dirty-working-tree\n")
    files = g.desired_files(tip)
    assert files == {"desired/fleet.yaml": b"name: demo\n", "desired/sweeps/a.yaml": b"name: a\n"}

    (human / "desired" / "fleet.yaml").write_text("name: demo2\n")
    sh(human, "commit", "--quiet", "-am", "desired: rename")
    sh(human, "push", "--quiet", "origin", "main")
    tip2 = g.fetch()
    assert tip2 != tip
    assert g.desired_files(tip2)["desired/fleet.yaml"] == b"name: demo2\n"
    assert g.desired_files(tip)["desired/fleet.yaml"] == b"name: demo\n"
    with pytest.raises(RepoError):
        g.desired_files("0" * 40)


def test_archive_is_a_tar_of_the_paths_at_the_commit(world: tuple[Path, Path, Path]) -> None:
    _, _, mine = world
    g = GitRepo(mine)
    tip = g.fetch()
    (mine / "train.py").write_text("uncommitted\n")
    with tarfile.open(fileobj=io.BytesIO(g.archive(tip, ["train.py"]))) as tar:
        names = tar.getnames()
        member = tar.extractfile("train.py")
        assert member is not None
        assert member.read() == b"print('hi')\n"
    assert names == ["train.py"]


def test_commit_only_when_something_changed_with_rigsync_identity(world: tuple[Path, Path, Path]) -> None:
    _, _, mine = world
    g = GitRepo(mine)
    assert g.commit_observed({}, {}, "observe: nothing yet") is None
    assert g.commit_observed({"observed/status.yaml": None}, {}, "observe: nothing yet") is None
    first = g.commit_observed({"observed/status.yaml": "a: 1\n"}, {}, "observe: first")
    assert first is not None and first == g.head()
    assert log(mine)[0] == "rigsync|rigsync|observe: first"
    assert sh(mine, "log", "-1", "--format=%ae %ce") == "rigsync@localhost rigsync@localhost"
    # The same content again: no commit.
    assert g.commit_observed({"observed/status.yaml": "a: 1\n"}, {}, "observe: again") is None
    assert g.head() == first
    # A deletion is a change; deleting what is absent is not.
    assert g.commit_observed({"observed/status.yaml": None}, {}, "observe: drop") is not None
    assert g.commit_observed({"observed/status.yaml": None}, {}, "observe: drop again") is None
    # Appends and files written by others under observed/ (the archive) are committed too.
    runs = mine / "observed" / "runs"
    runs.mkdir(parents=True)
    (runs / "2026-11.jsonl").write_text('{"run_id":"r","attempt":1}\n')
    sha = g.commit_observed({}, {"observed/runs/2026-11.jsonl": b'{"run_id":"r","attempt":2}\n'}, "observe: 2 runs")
    assert sha is not None
    shown = sh(mine, "show", "HEAD:observed/runs/2026-11.jsonl").splitlines()
    assert shown == ['{"run_id":"r","attempt":1}', '{"run_id":"r","attempt":2}']
    custom = GitRepo(mine, author_name="fleet-bot", author_email="bot@example.test")
    custom.commit_observed({"observed/x.yaml": "x\n"}, {}, "observe: x")
    assert log(mine)[0] == "fleet-bot|fleet-bot|observe: x"


@pytest.mark.parametrize(
    "path", ["desired/fleet.yaml", "observed/../desired/fleet.yaml", "/etc/passwd", "train.py", "observed"]
)
def test_refuses_to_write_outside_observed(world: tuple[Path, Path, Path], path: str) -> None:
    _, _, mine = world
    g = GitRepo(mine)
    before = g.head()
    with pytest.raises(RepoError, match="only under observed/"):
        g.commit_observed({"observed/ok.yaml": "ok\n", path: "x\n"}, {}, "observe: bad")
    with pytest.raises(RepoError, match="only under observed/"):
        g.commit_observed({}, {path: b"x\n"}, "observe: bad")
    assert g.head() == before
    assert not (mine / "observed" / "ok.yaml").exists()  # refused before anything was written
    assert (mine / "desired" / "fleet.yaml").read_text() == "name: demo\n"


def test_human_push_between_commit_and_push_both_survive(world: tuple[Path, Path, Path]) -> None:
    remote, human, mine = world
    g = GitRepo(mine)
    g.commit_observed({"observed/status.yaml": "cycle: 1\n"}, {}, "observe: cycle 1")
    (human / "desired" / "fleet.yaml").write_text("name: demo\nmax: 3\n")
    sh(human, "commit", "--quiet", "-am", "desired: bigger fleet")
    sh(human, "push", "--quiet", "origin", "main")
    human_sha = sh(human, "rev-parse", "HEAD")

    g.push()
    subjects = [line.split("|")[2] for line in log(remote, "main")]
    assert subjects == ["observe: cycle 1", "desired: bigger fleet", "desired: first fleet"]
    # The human's commit is on the remote unchanged (not rewritten), ours is rebased on top.
    assert sh(remote, "rev-parse", "main~1") == human_sha
    assert (mine / "desired" / "fleet.yaml").read_text() == "name: demo\nmax: 3\n"
    assert sh(remote, "show", "main:observed/status.yaml") == "cycle: 1"


def test_sync_to_remote_fast_forwards_and_replays_unpushed_commits(world: tuple[Path, Path, Path]) -> None:
    _, human, mine = world
    g = GitRepo(mine)
    (human / "desired" / "sweeps" / "b.yaml").write_text("name: b\n")
    sh(human, "add", ".")
    sh(human, "commit", "--quiet", "-m", "desired: sweep b")
    sh(human, "push", "--quiet", "origin", "main")
    g.sync_to_remote()
    assert g.head() == sh(human, "rev-parse", "HEAD")
    assert (mine / "desired" / "sweeps" / "b.yaml").exists()

    g.commit_observed({"observed/status.yaml": "x: 1\n"}, {}, "observe: x")
    (human / "desired" / "sweeps" / "c.yaml").write_text("name: c\n")
    sh(human, "add", ".")
    sh(human, "commit", "--quiet", "-m", "desired: sweep c")
    sh(human, "push", "--quiet", "origin", "main")
    g.sync_to_remote()
    assert (mine / "desired" / "sweeps" / "c.yaml").exists()
    assert [line.split("|")[2] for line in log(mine)][:2] == ["observe: x", "desired: sweep c"]


def test_rebase_resolves_observed_conflicts_by_path(world: tuple[Path, Path, Path]) -> None:
    """A concurrent writer under observed/: archive lines are unioned, snapshots keep rigsync's version."""
    remote, human, mine = world
    g = GitRepo(mine)
    g.commit_observed({"observed/status.yaml": "v: 0\n"}, {}, "observe: base")
    g.push()
    sh(human, "pull", "--quiet", "origin", "main")
    (human / "observed" / "status.yaml").write_text("v: human\n")
    (human / "observed" / "runs").mkdir(parents=True)
    (human / "observed" / "runs" / "2026-11.jsonl").write_text("theirs\n")
    sh(human, "add", ".")
    sh(human, "commit", "--quiet", "-m", "someone else")
    sh(human, "push", "--quiet", "origin", "main")
    g.commit_observed(
        {"observed/status.yaml": "v: rigsync\n"}, {"observed/runs/2026-11.jsonl": b"ours\n"}, "observe: cycle"
    )
    g.push()
    assert sh(remote, "show", "main:observed/status.yaml") == "v: rigsync"
    assert sorted(sh(remote, "show", "main:observed/runs/2026-11.jsonl").splitlines()) == ["ours", "theirs"]


def test_the_lease_is_a_compare_and_swap_on_its_own_ref_never_on_main(world: tuple[Path, Path, Path]) -> None:
    remote, human, mine = world
    main_before = sh(remote, "rev-parse", "main")
    a, b = GitRepo(mine), GitRepo(human)
    assert a.lease_ref == "refs/heads/rigsync/lease/main"
    assert a.read_lease() == (None, None)
    v1 = a.swap_lease(None, "holder: a\n", "lease: acquired by a")
    assert v1 is not None and b.read_lease() == (v1, "holder: a\n")
    with pytest.raises(LeaseRace, match="moved"):  # b expected no lease: a's is there
        b.swap_lease(None, "holder: b\n", "lease: acquired by b")
    v2 = a.swap_lease(v1, "holder: a\nheartbeat: 2\n", "lease: heartbeat")
    with pytest.raises(LeaseRace):  # b read v1 and lost the race to a's heartbeat
        b.swap_lease(v1, "holder: b\n", "lease: taken over")
    assert sh(remote, "show", f"{a.lease_ref}:lease.yaml") == "holder: a\nheartbeat: 2"
    assert sh(remote, "rev-list", "--count", a.lease_ref) == "1", "each lease is a parentless commit"
    with pytest.raises(LeaseRace):  # a release expecting an old version removes nothing
        b.swap_lease(v1, None, "lease: released")
    assert a.swap_lease(v2, None, "lease: released") is None
    assert a.read_lease() == (None, None)
    assert sh(remote, "rev-parse", "main") == main_before, "no lease write touched main"


def _race_for_the_lease(clones: list[Path]) -> dict[int, str]:
    """Every clone's ``GitLease.acquire`` at once: all read the lease together (a barrier), then all push."""
    barrier = threading.Barrier(len(clones), timeout=30)
    outcome: dict[int, str] = {}

    def race(n: int, clone: Path) -> None:
        g = GitRepo(clone)
        real_read = g.read_lease
        reads: list[int] = []

        def read_together() -> tuple[str | None, str | None]:
            got = real_read()
            if not reads:  # the first read of every racer happens before any of them pushes
                barrier.wait()
            reads.append(1)
            return got

        g.read_lease = read_together  # type: ignore[method-assign]
        lease = GitLease(g, holder=f"racer{n}", host=f"host{n}", pid=n, stale_after=300)
        try:
            outcome[n] = "won: " + lease.acquire(T0).message
        except LeaseHeld as exc:
            outcome[n] = f"refused after {len(reads)} reads: {exc}"

    threads = [threading.Thread(target=race, args=(n, c)) for n, c in enumerate(clones)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return outcome


def test_two_actors_racing_for_the_lease_ref_exactly_one_wins(world: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """Racers read the same stale (then free) lease and push their takeover at once: exactly one lands; the others'
    compare-and-swap fails, they read the winner's fresh lease and refuse, naming it."""
    remote, _, mine = world
    g = GitRepo(mine)
    clones = [mine]
    for n in range(1, 3):
        clone = tmp_path / f"racer{n}"
        sh(tmp_path, "clone", "--quiet", str(remote), str(clone))
        clones.append(clone)
    stale = lease_to_yaml(LeaseState("old", "hostO", 1, T0 - 1000, T0 - 1000))
    for start in ("stale", "free", "stale"):
        version, _ = g.read_lease()
        if start == "stale":
            g.swap_lease(version, stale, "lease: a stale one")
        else:
            g.swap_lease(version, None, "lease: released")
        outcome = _race_for_the_lease(clones)
        winners = [n for n, o in outcome.items() if o.startswith("won")]
        assert len(outcome) == len(clones) and len(winners) == 1, outcome
        holder = yaml.safe_load(sh(remote, "show", f"{g.lease_ref}:lease.yaml"))["holder"]
        assert holder == f"racer{winners[0]}"
        for n, o in outcome.items():
            if n != winners[0]:
                assert f"held by racer{winners[0]}" in o, outcome


def test_concurrent_pushers_race_and_all_land(world: tuple[Path, Path, Path], tmp_path: Path) -> None:
    remote, _, _ = world
    clones = []
    for i in range(4):
        path = tmp_path / f"pusher{i}"
        sh(tmp_path, "clone", "--quiet", str(remote), str(path))
        clones.append(GitRepo(path))
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(clones))

    def work(i: int, g: GitRepo) -> None:
        try:
            barrier.wait()
            for cycle in range(3):
                g.commit_observed({f"observed/p{i}.yaml": f"cycle: {cycle}\n"}, {}, f"observe: p{i} c{cycle}")
                g.push(max_tries=30)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i, g)) for i, g in enumerate(clones)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    subjects = [line.split("|")[2] for line in log(remote, "main")]
    assert sorted(s for s in subjects if s.startswith("observe:")) == sorted(
        f"observe: p{i} c{c}" for i in range(4) for c in range(3)
    )
    assert "desired: first fleet" in subjects
    for i in range(4):
        assert sh(remote, "show", f"main:observed/p{i}.yaml") == "cycle: 2"


def test_push_gives_up_with_push_rejected_and_never_forces(world: tuple[Path, Path, Path]) -> None:
    remote, _, mine = world
    # A remote hook that rejects every update looks like a lost race forever.
    hook = remote / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\necho 'cannot lock ref refs/heads/main: busy' >&2\nexit 1\n")
    hook.chmod(0o755)
    g = GitRepo(mine)
    before = sh(remote, "rev-parse", "main")
    g.commit_observed({"observed/status.yaml": "x\n"}, {}, "observe: x")
    with pytest.raises(PushRejected, match="after 2 tries"):
        g.push(max_tries=2)
    assert sh(remote, "rev-parse", "main") == before


def test_push_error_that_is_not_a_race_is_a_repo_error(world: tuple[Path, Path, Path]) -> None:
    _, _, mine = world
    g = GitRepo(mine, remote="nowhere")
    g.commit_observed({"observed/status.yaml": "x\n"}, {}, "observe: x")
    with pytest.raises(RepoError) as info:
        g.push()
    assert not isinstance(info.value, PushRejected)


def test_not_a_checkout(tmp_path: Path) -> None:
    with pytest.raises(RepoError, match="not a git checkout"):
        GitRepo(tmp_path / "nothing")


def test_desired_commit_ignores_rigsyncs_own_observed_commits(world: tuple[Path, Path, Path]) -> None:
    _, human, mine = world
    g = GitRepo(mine)
    desired_sha = sh(human, "rev-parse", "HEAD")
    g.commit_observed({"observed/status.yaml": "x\n"}, {}, "observe: x")
    g.push()
    tip = g.fetch()
    assert tip != desired_sha
    assert g.desired_commit(tip) == desired_sha
    sh(human, "pull", "--quiet", "--rebase", "origin", "main")
    (human / "desired" / "fleet.yaml").write_text("name: other\n")
    sh(human, "commit", "--quiet", "-am", "desired: other")
    sh(human, "push", "--quiet", "origin", "main")
    assert g.desired_commit(g.fetch()) == sh(human, "rev-parse", "HEAD")


def _desired(code: tuple[str, ...]) -> Desired:
    """A desired state whose one sweep ships ``code`` (pin reads only the code paths)."""
    sweep = Sweep(name="a", command="true", grid=(), seeds=(1,), code_paths=code)
    return Desired(fleet=Fleet(name="demo"), budget=Budget(), sweeps=(sweep,), runs=())


@pytest.mark.parametrize("code", [("train.py",), ()])  # () ships the whole tree: observed/ still never counts
def test_pin_names_the_desired_and_code_revisions_not_the_tip(
    world: tuple[Path, Path, Path], code: tuple[str, ...]
) -> None:
    _, human, mine = world
    first = sh(human, "rev-parse", "HEAD")
    (human / "train.py").write_text("print('v2')\n")
    sh(human, "commit", "--quiet", "-am", "code: v2")
    code_sha = sh(human, "rev-parse", "HEAD")
    sh(human, "push", "--quiet", "origin", "main")
    g = GitRepo(mine)
    g.sync_to_remote()
    g.commit_observed({"observed/status.yaml": "x\n"}, {}, "observe: x")
    g.commit_observed({"observed/fleet.yaml": "y\n"}, {}, "observe: y")
    pinned = g.pin(_desired(code))
    assert (pinned.commit, pinned.code_commit) == (first, code_sha)
    assert g.head() not in (first, code_sha)
    # At an older ref, both are pinned as of that ref.
    old = g.pin(_desired(code), first)
    assert (old.commit, old.code_commit) == (first, first)
    with pytest.raises(RepoError, match="names no commit"):
        g.pin(_desired(code), "no-such-ref")
