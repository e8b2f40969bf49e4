"""The small Protocols the loop talks through; adapters implement them, tests fake them.

Only these shapes cross the boundary between the pure core and the world. Each adapter wraps its library's
exceptions in ``reconciler.errors``, raised ``from`` the library's, so callers never see requests, paramiko or git
exceptions (and where one slips through anyway, ``apply()`` turns it into that action's failed outcome).

The files rigsync keeps are ports too: ``RunArchive`` (the history the planner reads, exactly-once appends),
``LaunchJournal`` (launches written down before they happen) and ``Lease`` (the fence's view of the fleet's
lease, over ``LeaseStore``). Their adapters, of the same names, live in ``reconciler.adapters``; only the
composition root (``reconciler.fleet``) constructs them.

``observe()`` and ``apply()`` talk to the market through ``Provider`` and to the boxes through ``BoxControl``:
what is done to a box, in the run protocol's own words (probe, launch, kill, bootstrap, ship code), not shell
commands. The real ``BoxControl`` (``adapters.boxes.ShellBoxes``) runs ``reconciler.remote``'s programs over the
lower-level ``Shell`` port (SSH); the unit tests drive the real ``observe()``/``apply()`` over an in-memory box
world instead, without having to interpret bash.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, BinaryIO, Protocol, TypeVar

from reconciler.core.jobenv import JobEnv
from reconciler.core.model import (
    AttemptRecord,
    BoxProbe,
    Endpoint,
    InFlight,
    Instance,
    MetricGoal,
    Offer,
    OfferFilters,
    OverheadRecord,
    PriceIncrease,
    Scalar,
)

# what a box answers, read by the run protocol's controller side (``reconciler.remote``): the ports' answers too
from reconciler.remote.launched import Launched as Launched
from reconciler.remote.parse import CheckpointUploaded as CheckpointUploaded

R = TypeVar("R", AttemptRecord, OverheadRecord)
T = TypeVar("T")


# A harvest's tar stream: bytes (small ones, the unit tier's fakes) or a file positioned at its start (a real box's,
# spooled to disk as it arrives, so that hundreds of MiB never sit in the controller's memory).
HarvestStream = bytes | IO[bytes]

# The ports' defaults, which every implementation takes from here
OFFERS_LIMIT = 200  # the offers one search asks the market for (``Provider.search_offers``)
COMMAND_TIMEOUT_S = 30.0  # one command on one box (``Shell.run``)
FANOUT_TIMEOUT_S = 10.0  # each box's command in a parallel round (``Shell.run_many``)


@dataclass(frozen=True)
class CommandResult:
    """One command's answer from a box: ``stdout`` whole (within its bound), ``stderr`` its last bytes only."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    # when the answer was in, on the controller's clock (None: the shell did not say); not part of what was answered
    answered_at: float | None = field(default=None, compare=False)


@dataclass(frozen=True)
class RentalAsk:
    """What a rent asked for (``actions.Rent``): the box the provider's read-back must find. ``dph`` is its whole
    $/h (a bid's: the bid plus storage)."""

    gpu_name: str
    num_gpus: int
    dph: float


class Provider(Protocol):
    """A GPU market: Vast.ai through its official SDK, or the emulator behind the same API."""

    def search_offers(self, filters: OfferFilters, disk_gb: float, limit: int = OFFERS_LIMIT) -> list[Offer]: ...

    def list_instances(self) -> list[Instance]: ...

    def create_instance(
        self,
        offer_id: int,
        *,
        image: str,
        disk_gb: float,
        label: str,
        onstart: str,
        env: dict[str, str],
        bid_dph: float | None = None,
        asked: RentalAsk | None = None,
    ) -> int: ...

    def destroy_instance(self, instance_id: int) -> None: ...

    def ensure_ssh_key(self, public_key: str) -> None: ...

    def account_credit(self) -> float:
        """What the account can still spend, $ (Vast stops every box of an account at zero). ``ProviderError``
        when the provider cannot say."""
        ...

    def billed_costs(self, since: float, now: float) -> dict[int, float]:
        """What the provider billed each instance of the account from ``since`` (counted from the start of its
        UTC day) up to ``now``, $, by instance id; destroyed instances keep their charges, so a read after a
        destroy is that box's final bill. An instance the provider has no charge for is absent. ``ProviderError``
        when the provider cannot say."""
        ...

    def pending_price_increases(self) -> list[PriceIncrease]:
        """The hosts' pending price increases on the account's contracts. ``ProviderError`` when the provider cannot
        say."""
        ...

    def answer_price_increase(self, pending_id: int, *, accept: bool) -> None:
        """Accept or reject one pending increase. ``PriceIncreaseGone`` when it is no longer pending (the provider's
        404 ``no_pending_price_increase``, or a legacy 409)."""
        ...


class Shell(Protocol):
    """Runs commands on boxes over SSH."""

    def run(
        self,
        endpoint: Endpoint,
        command: str,
        *,
        stdin: bytes | None = None,
        timeout: float = COMMAND_TIMEOUT_S,
        max_stdout: int | None = None,
        stdout_sink: IO[bytes] | None = None,
    ) -> CommandResult:
        """``max_stdout``: a command printing more than this many bytes (``bounds.COMMAND_STDOUT_BYTES`` when None)
        fails with ``OutputOverBound`` (a ``RemoteCommandFailed``), and reading stops there instead of filling the
        controller's memory (a box is a stranger's machine). Of stderr only the last ``bounds.COMMAND_STDERR_BYTES``
        are kept. ``stdout_sink``: stdout is written there as it arrives, under the same bound, and the result's
        ``stdout`` is empty (a harvest stream never sits whole in memory)."""
        ...

    def run_many(
        self, targets: dict[int, tuple[Endpoint, str]], *, timeout: float = FANOUT_TIMEOUT_S,
        max_stdout: int | None = None,
    ) -> dict[int, CommandResult | Exception]:
        """``run`` on many boxes in parallel; each box's error (``OutputOverBound`` too) is its answer."""
        ...

    def forget(self, endpoint: Endpoint) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class LaunchJob:
    """Everything a box needs to start one attempt of a run (and what its ``meta.json`` records)."""

    run_id: str
    attempt: int
    gpu_mask: tuple[int, ...]
    command: str  # rendered, every substituted value shell-quoted
    code_commit: str | None
    desired_commit: str | None
    sweep: str
    params: tuple[tuple[str, Scalar], ...]
    seed: int
    metrics_file: str
    metric_key: str | None
    metric_goal: MetricGoal
    max_runtime_s: float
    # the job's own environment, secrets resolved: sent on the SSH channel's stdin, never in a command line or a
    # file; its repr shows names only (``reconciler.core.jobenv.JobEnv``)
    env: JobEnv = field(default_factory=JobEnv)
    # queued: given to the box's queue behind its slot's current attempt (started by the box when the slot frees)
    queued: bool = False
    # the lease epoch of the controller sending it: the box refuses it when it was shown a newer one (0: no lease)
    epoch: int = 0


class BoxControl(Protocol):
    """What rigsync does to one of its boxes. Every method addresses a box by its ``Instance`` (its id and address).

    Errors are ``ShellError``s: ``HostUnreachable`` (transient: no answer, connection dropped),
    ``RemoteCommandFailed`` (permanent: the box answered no, or has no address yet) and its ``LaunchLockHeld``
    (this attempt's run directory already exists: it was launched before).
    """

    def probe_many(self, boxes: Sequence[Instance], *, timeout: float, epoch: int = 0) -> list[BoxProbe]:
        """One probe per box, in parallel, in ``boxes`` order. Never raises for one box: a box that cannot be
        probed (no address, no answer within ``timeout``, garbled output) is an unreachable probe saying why.
        ``epoch``: the controller's lease epoch, which raises each box's fence (0: no lease, only read)."""
        ...

    def launch(self, box: Instance, job: LaunchJob) -> Launched:
        """Take the launch lock (atomic mkdir of the attempt's run directory) and start the run detached;
        returns launch's answer read: the wrapper's pid and start tick, both or neither (``remote.launched``).
        ``LaunchLockHeld`` if this attempt was launched before. ``job.queued``: the attempt joins its slot's queue on
        the box instead (``Launched.queued``). ``LaunchRefused`` if the box's fence is newer than ``job.epoch`` or
        (queued) the box is draining."""
        ...

    def kill(
        self,
        box: Instance,
        run_id: str,
        attempt: int,
        *,
        exit_code: int,
        reason: str,
        pid: int | None = None,
        pid_started: int | None = None,
    ) -> None:
        """End the attempt and record ``exit_code`` (unless it already has one) and ``reason``. A signal goes only to
        the process group its launch recorded (``pid`` with start tick ``pid_started``, while that process still has
        that start); without them the end is recorded and the box's wrapper ends its own command. An attempt the box
        never saw is tombstoned."""
        ...

    def drain(self, box: Instance) -> None:
        """Mark the box draining: it takes no more queue entries, and ends itself once its queue is dry, nothing
        runs and every finished attempt on it is harvested."""
        ...

    def mark_harvested(self, box: Instance, run_id: str, attempt: int) -> None:
        """The attempt's harvest was stored: mark its run directory, so that a draining box can end itself."""
        ...

    def bootstrap(self, box: Instance, script: str, script_hash: str, cache: BootstrapCache | None = None) -> str:
        """Start the fleet's bootstrap script detached, once per box per hash: ``ok`` (done before),
        ``running`` (a live run holds the lock) or ``started <pid>``. With ``cache`` the box restores the cache
        object instead of running the script (``cache.download``; a failed restore runs it), or uploads what the
        script built (``cache.upload``), and then answers ``ok cache SIZE SHA256`` once, when the bootstrap that
        uploaded is first found done (``remote.bootstrap_cache_uploaded`` reads it)."""
        ...

    def ship_code(self, box: Instance, commit: str, tar: bytes) -> None:
        """Unpack ``tar`` (the code paths at ``commit``) into the box's ``code/<commit>/`` atomically (idempotent)."""
        ...

    def forget(self, box: Instance) -> None:
        """The box is gone: drop its pooled connections and pinned host keys (its address will be reused)."""
        ...

    def harvest(
        self, box: Instance, run_id: str, attempt: int, *, what: str, patterns: Sequence[str], cap_bytes: int
    ) -> HarvestStream:
        """A tar stream of the attempt's results (``what="run"``: stdout.log, stderr.log, meta.json and the files
        ``patterns`` match in its run directory) or of its checkpoint (``what="checkpoint"``: the files under
        ``patterns``), at most ``cap_bytes`` of file data, ending with the ``.rigsync-harvest.json`` manifest
        (``reconciler/box/harvest.py``). ``RemoteCommandFailed`` if the box has no such attempt."""
        ...

    def stage_resume(self, box: Instance, run_id: str, attempt: int, tar: bytes) -> None:
        """Put a checkpoint (a tar) where the attempt about to launch finds it: its run directory's ``resume/``,
        named by ``RIGSYNC_RESUME_DIR`` in the run's environment."""
        ...

    # -- direct transfers: the box moves the data to and from the store itself (``Presigner``), the controller sends
    # -- only presigned URLs (on the command's stdin, never its argv) and reads back sizes and SHA-256 sums

    def upload_harvest(
        self, box: Instance, run_id: str, attempt: int, *, patterns: Sequence[str], cap_bytes: int,
        uploads: Mapping[str, Upload],
    ) -> None:
        """Harvest the attempt's run directory on the box (as ``harvest(what="run")`` would stream it) and upload it
        with ``uploads``: the tar to ``uploads[ATTEMPT_TAR]``, and each other name's file of the run directory (the
        manifest is ``MANIFEST``) to its own URL; a file the run did not write is skipped. ``RemoteCommandFailed``
        when an upload is refused or the box has no such attempt."""
        ...

    def upload_checkpoint(
        self, box: Instance, run_id: str, attempt: int, *, path: str, cap_bytes: int, upload: Upload
    ) -> CheckpointUploaded:
        """Pack the attempt's checkpoint directory (as ``harvest(what="checkpoint")``) and upload it to ``upload``;
        what the box uploaded. ``RemoteCommandFailed`` when the upload did not complete."""
        ...

    def stage_resume_from(self, box: Instance, run_id: str, attempt: int, download: Download) -> None:
        """As ``stage_resume``, with the checkpoint downloaded by the box from the store: checked against the
        recorded size and SHA-256 before it is unpacked. ``RemoteCommandFailed`` on a mismatch or a failed
        download (the attempt then starts fresh)."""
        ...


@dataclass(frozen=True)
class Harvested:
    """What came home from a box into the local store (the manifest of one harvest)."""

    files: tuple[tuple[str, int], ...]  # (path in the run directory, bytes)
    skipped: tuple[tuple[str, int | None, str], ...]  # (path, bytes if known, why)
    bytes: int
    cap: int
    resumed_from: int | None = None  # the attempt whose checkpoint this attempt resumed from


@dataclass(frozen=True)
class StoredCheckpoint:
    """A run's last complete checkpoint sync in the local store."""

    run_id: str
    attempt: int  # the attempt it was synced from
    synced_at: float
    tar: bytes  # its files, as a tar stream (what ``BoxControl.stage_resume`` ships)


ATTEMPT_TAR = "harvest.tar"  # an attempt's whole harvest (harvest.py's stream, manifest last) as one store object
HARVEST_MANIFEST = ".rigsync-harvest.json"  # the harvest's manifest (``reconciler/box/harvest.py``), as a name


@dataclass(frozen=True)
class Upload:
    """One presigned PUT: whoever holds ``url`` may write exactly the object ``key`` (nothing else, no other verb),
    until ``expires_at``. The URL is a bearer credential for that one key: never logged, never on a command line
    (boxes read it from stdin), never committed."""

    key: str
    url: str = field(repr=False)
    expires_at: float


@dataclass(frozen=True)
class Download:
    """One presigned GET of an object, with the size and SHA-256 the controller recorded when it was uploaded: the
    box checks both before it trusts (unpacks) the file (``reconciler/box/transfer.py get``)."""

    key: str
    url: str = field(repr=False)
    size: int
    sha256: str
    expires_at: float


@dataclass(frozen=True)
class BootstrapCache:
    """A pool's bootstrap cache for one box's bootstrap: the key (``identity.bootstrap_cache_key``), the paths the
    script builds, a presigned GET of the recorded cache object to restore (None: there is none yet) and a
    presigned PUT for the box to upload what the script built (None: no upload)."""

    key: str
    paths: tuple[str, ...]
    download: Download | None
    upload: Upload | None


class Presigner(Protocol):
    """A result store that boxes reach themselves (``adapters.s3store.S3Store``): the controller mints presigned URLs
    scoped to one attempt's keys (or one bootstrap cache key), boxes upload and download with them, and no large
    data crosses the controller. Keys are the store's own layout; a box can write only the keys it was given. Every
    ``ttl_s`` is clamped by the store to what presigning allows (a minute to seven days for SigV4)."""

    def attempt_uploads(self, run_id: str, attempt: int, names: Sequence[str], *, ttl_s: float) -> dict[str, Upload]:
        """Presigned PUTs for an attempt's harvest, keyed by name: ``ATTEMPT_TAR`` (everything harvested) and each
        of ``names`` (run-directory files the controller reads back on their own: stdout.log, stderr.log, the
        harvest manifest, the sweep's metrics file), which ``read_attempt``/``open_attempt`` then serve."""
        ...

    def attempt_uploaded(self, run_id: str, attempt: int) -> Harvested:
        """The harvest a box uploaded, as its manifest object says (read bounded and checked as ``LocalStore``
        checks one); ``StoreError`` when the manifest or the tar is not there."""
        ...

    def checkpoint_upload(self, run_id: str, attempt: int, *, at: float, ttl_s: float) -> Upload:
        """A presigned PUT for one checkpoint sync of the attempt (a key of its own: an interrupted upload never
        touches the checkpoint a resume would use)."""
        ...

    def checkpoint_uploaded(
        self, run_id: str, attempt: int, upload: Upload, *, size: int, sha256: str, at: float, keep: int
    ) -> bool:
        """Make the uploaded sync the run's checkpoint when the object is there with ``size`` bytes (recording size
        and SHA-256 for the box that resumes); False (the last one stays) otherwise. Then keep only the newest
        ``keep`` syncs of the run."""
        ...

    def checkpoint_download(self, run_id: str, *, ttl_s: float) -> tuple[int, Download] | None:
        """(the attempt it came from, a presigned GET) of the run's current checkpoint; None when there is none."""
        ...

    def cache_upload(self, key: str, *, ttl_s: float) -> Upload:
        """A presigned PUT for the bootstrap cache object ``key`` (``identity.bootstrap_cache_key``)."""
        ...

    def cache_uploaded(self, key: str, upload: Upload, *, size: int, sha256: str) -> bool:
        """Record the cache object (size, SHA-256) when it is there with ``size`` bytes; False otherwise."""
        ...

    def cache_download(self, key: str, *, ttl_s: float) -> Download | None:
        """A presigned GET of the recorded cache object ``key``; None when there is none (or it is not whole)."""
        ...


class ResultStore(Protocol):
    """Where attempts' outputs and runs' checkpoints live once they leave their box: the local directory
    (``adapters.store.LocalStore``, data streamed through the controller) or an S3-compatible object store
    (``adapters.s3store.S3Store``, which boxes reach themselves: ``presigner``)."""

    @property
    def presigner(self) -> Presigner | None:
        """The store's presigned transfers when boxes reach it themselves; None: data comes through the controller
        (``put_attempt``, ``put_checkpoint``, ``checkpoint``)."""
        ...

    def expire(self, now: float, *, keep_harvests_s: float | None) -> int:
        """Delete harvests older than ``keep_harvests_s`` (None: keep all); how many attempts' harvests went."""
        ...

    def put_attempt(self, run_id: str, attempt: int, tar: HarvestStream) -> Harvested:
        """Unpack a harvest into the attempt's directory, replacing an earlier harvest of it whole (idempotent)."""
        ...

    def read_attempt(self, run_id: str, attempt: int, name: str, *, tail: int | None = None) -> bytes | None:
        """A harvested file (its last ``tail`` bytes when given); None when it did not come home."""
        ...

    def read_range(self, run_id: str, attempt: int, name: str, offset: int, length: int) -> tuple[bytes, int] | None:
        """At most ``length`` bytes of a harvested file from ``offset``, and the file's whole size; None when it did
        not come home (``rigsync logs`` reads a large log so, a slice at a time)."""
        ...

    def harvested(self, run_id: str, attempt: int) -> Harvested | None:
        """The account of the attempt's stored harvest (what came home, what was left behind and why); None when
        nothing of it is in the store."""
        ...

    def open_attempt(self, run_id: str, attempt: int, name: str) -> BinaryIO | None:
        """A harvested file opened for reading (the caller closes it), to read in bounded pieces; None when it did
        not come home."""
        ...

    def put_checkpoint(self, run_id: str, attempt: int, tar: HarvestStream, *, at: float) -> Harvested:
        """Keep this sync as the run's checkpoint if it is complete (nothing skipped); else keep the last one."""
        ...

    def checkpoint(self, run_id: str) -> StoredCheckpoint | None:
        """The run's last complete checkpoint sync, its files as a tar; None when there is none."""
        ...

    def checkpoint_synced(self, run_id: str) -> tuple[int, float] | None:
        """(the attempt it came from, when) of the run's last complete checkpoint sync, without reading it."""
        ...


class LeaseStore(Protocol):
    """Where the fleet's lease lives, read and replaced only by compare-and-swap (``adapters.git.GitRepo``: its own
    ref on the remote, ``refs/heads/rigsync/lease/<branch>``; the rules over it are ``reconciler.adapters.lease``)."""

    def read_lease(self) -> tuple[str | None, str | None]:
        """(version, text) of the lease as the remote has it now; (None, None) when there is none."""
        ...

    def swap_lease(self, expected: str | None, text: str | None, message: str) -> str | None:
        """Replace the lease with ``text`` (None: delete it) only if its version is still ``expected`` (None: that
        there is none); return the new version. Raises ``errors.LeaseRace`` when ``expected`` no longer holds."""
        ...


class ArchiveAppender(Protocol):
    """The run archive as ``apply()`` uses it: it only appends what the plan settled (attempts, boxes' overheads)."""

    def append(self, records: list[R]) -> list[R]:
        """Archive the records not archived yet, durably before returning; return them."""
        ...


class RunArchive(ArchiveAppender, Protocol):
    """The run archive as the loop uses it (``adapters.archive.RunArchive``: month shards under observed/runs/ and a
    write-ahead journal): the history the planner reads, exactly-once appends, and the hand-off to the one writer."""

    def records(self) -> Iterator[AttemptRecord]:
        """Every archived attempt, each key once (the history ``plan()`` reads)."""
        ...

    def overheads(self) -> Iterator[OverheadRecord]:
        """Every overhead line (one per box that ended: the views' ops tax)."""
        ...

    def pending_lines(self) -> dict[str, bytes]:
        """The lines archived since the last hand-off, per shard path."""
        ...

    def hand_off(self, write: Callable[[dict[str, bytes]], T]) -> T:
        """Give the pending lines to ``write`` (the writer of observed/); once it returned, forget them."""
        ...


class LaunchJournal(Protocol):
    """Launches written down before they happen (``adapters.launch_journal.LaunchJournal``, in the state dir)."""

    def note(self, flight: InFlight) -> None:
        """One launch about to happen, durably."""
        ...

    def reset(self, in_flight: Iterable[InFlight]) -> None:
        """After an apply: exactly the attempts in flight."""
        ...

    def read(self) -> list[InFlight]:
        """Every well-formed entry."""
        ...


class Lease(Protocol):
    """The fleet's lease as the fence uses it (``adapters.lease.Lease``, over a ``LeaseStore``): act only while it is
    certainly ours, renewing it when a heartbeat is due."""

    def check(self, now: float) -> None:
        """Return while this controller may act; raise ``errors.LeaseLost`` when it may not."""
        ...

    def renew_due(self, now: float) -> bool:
        """Whether a heartbeat is due."""
        ...

    def renew(self, now: float) -> bool:
        """Push a heartbeat when one is due; whether one was pushed."""
        ...


Fence = Callable[[], None]
"""Called by ``apply()`` just before every action that changes the world (a box, the market or the archive).

Returns when this controller may still act; raises ``errors.LeaseLost`` when it may not (its lease's fencing
deadline has passed, or another holder took the lease). The daemon's is ``FleetDaemon.fence`` over
``lease.Lease.check``; one-shot commands that hold no lease pass a no-op. Apply knows nothing of git.
"""


def no_fence() -> None:
    """The fence of a caller that holds no lease (``rigsync apply`` checks the lease once, up front)."""


class Clock(Protocol):
    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...
