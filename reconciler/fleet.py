"""Opening a fleet: the one place where rigsync is wired together (the composition root).

It owns three rules nobody else repeats: where a fleet's state lives (``state_dir_for``: ``--state-dir``,
``$RIGSYNC_STATE_DIR``, ``$XDG_STATE_HOME/rigsync/<fleet>/``), which providers rigsync can drive
(``require_supported_provider``), and how adapters are built: every adapter the commands, the daemon and the demo
use is constructed by a function here (``build_adapters``, ``open_git``, ``open_archive``, ``open_lease``,
``open_local_lock``, ``open_provider``, ``open_shell``), so the layers below only see ``reconciler.ports``.

The adapters and the loop are imported by the functions that build them: the commands that read only the checkout
(`rigsync diff`, `review`, ...) import this module for ``open_git`` and must not pay for paramiko, the provider's
SDK or the reconciler at start-up.

`rigsync run` (``FleetDaemon``), the live commands `rigsync plan`/`apply`/`status`, and through the daemon
the demo, all open a fleet here and write back through here, so the wiring cannot drift apart:

* ``open_fleet``: the fleet's cross-cycle memory from the observed files in the checkout (read first, so a
  bad file fails before the provider is contacted), the run archive, the adapters (an injectable factory,
  by default ``build_adapters``: the Vast.ai SDK and SSH), and the ``Reconciler`` holding them.
* ``render_cycle``: the observed/*.yaml documents after a cycle, from the state the next cycle starts from.
* ``write_back``: the one path observed/ takes to disk: the rendered files and the run archive's new lines
  go to the git adapter's writer together, committed when there is a message (`rigsync run`) and left in
  the working tree when there is none (`rigsync apply`, which leaves committing to `rigsync run`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Unpack

from reconciler import ports
from reconciler.adapters.lease import DEFAULT_RENEW_EVERY_S, DEFAULT_STALE_AFTER_S
from reconciler.core.jobenv import ControllerEnv
from reconciler.core.model import (
    CONTROLLER_INTERVAL_S,
    OWN_PROVIDER,
    Desired,
    Fleet,
    Instance,
    Observed,
    Offer,
    OfferFilters,
    PriceIncrease,
)
from reconciler.core.remember import NO_MEMORY, remember
from reconciler.errors import PriceIncreaseGone, ProviderPermanent, UserError
from reconciler.ports import Provider, RentalAsk, Shell

if TYPE_CHECKING:
    from reconciler.adapters.archive import ShardedRunArchive
    from reconciler.adapters.git import GitOptions, GitRepo
    from reconciler.adapters.lease import GitLease, LocalLock
    from reconciler.adapters.ssh import SshShell
    from reconciler.core.actions import Plan
    from reconciler.loop import Reconciler, SystemClock
    from reconciler.observed.documents import ReconcilerStatus
    from reconciler.settings.object_store import StoreConfig

# (fleet, state dir, the controller's provider URL or None for its default) -> the adapters
AdapterFactory = Callable[[Fleet, Path, str | None], tuple[Provider, Shell]]

SUPPORTED_PROVIDERS = ("vast",)  # markets rigsync rents from
POOL_PROVIDERS = (*SUPPORTED_PROVIDERS, OWN_PROVIDER)  # what a pool may say: a market, or the lab's own machines


def state_dir_for(fleet: Fleet, override: str | os.PathLike[str] | None = None) -> Path:
    """Where rigsync keeps its SSH key, pinned host keys and lock: never inside the repository."""
    if override:
        base = Path(override)
    elif os.environ.get("RIGSYNC_STATE_DIR"):
        base = Path(os.environ["RIGSYNC_STATE_DIR"])
    else:
        xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        base = Path(xdg) / "rigsync"
    path = base / fleet.name
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def require_supported_provider(fleet: Fleet) -> None:
    """The one place that says which providers rigsync can drive (a UserError for any other): the fleet rents from
    Vast.ai, and each pool is either rented from it or the lab's own machines over SSH (``provider: ssh``), which
    rigsync never rents and never destroys."""
    if fleet.provider not in SUPPORTED_PROVIDERS:
        raise UserError(f"unknown provider {fleet.provider!r}: only 'vast' is supported")
    for pool in fleet.pools:
        if pool.provider not in POOL_PROVIDERS:
            raise UserError(f"pool {pool.name}: unknown provider {pool.provider!r}: 'vast' or 'ssh'")
        if pool.own and not pool.hosts:
            raise UserError(f"pool {pool.name}: provider ssh needs its hosts")


def build_adapters(fleet: Fleet, state_dir: Path, api_url: str | None = None) -> tuple[Provider, Shell]:
    """The real adapters: the official vastai SDK and paramiko, with rigsync's own key on the account.

    ``api_url`` is the provider URL configured on the controller (the CLI's ``--api-url``, or a caller's own);
    None: ``RIGSYNC_API_URL`` or https://console.vast.ai (``reconciler.settings.endpoint``). Never a URL
    from desired/: the account's key goes where this URL says. A fleet whose pools are all the lab's own machines
    (``provider: ssh``) gets ``NoMarket``: no Vast key is read and no Vast API is called.
    """
    from reconciler.adapters.ssh import ensure_keypair

    require_supported_provider(fleet)
    key_path, public = ensure_keypair(state_dir)
    provider = open_provider(fleet, controller_url(api_url))
    provider.ensure_ssh_key(public)
    return provider, open_shell(key_path, state_dir / "known_hosts")


def controller_url(api_url: str | None) -> str:
    """``api_url``, or the controller's configured one when None (an explicit URL is checked by VastProvider)."""
    from reconciler.settings.endpoint import controller_api_url

    return controller_api_url() if api_url is None else api_url


def open_provider(fleet: Fleet | None, api_url: str) -> Provider:
    """The fleet's market: ``NoMarket`` when every pool is the lab's own, else the Vast SDK with the account's
    key (a missing key is one line naming the Vast pools that need it). No key is uploaded to the account here.
    None: the account itself, for no fleet in particular (`rigsync fleets` without a checkout)."""
    from reconciler.adapters.vast import VastProvider, load_api_key
    from reconciler.errors import ProviderAuthError

    if fleet is None:
        return VastProvider(api_key=load_api_key(), server_url=api_url)
    require_supported_provider(fleet)
    market = [p.name for p in fleet.pools if not p.own]
    if fleet.pools and not market:
        return NoMarket()
    try:
        key = load_api_key()
    except ProviderAuthError as exc:
        if not market or len(market) == len(fleet.pools):
            raise
        raise ProviderAuthError(f"pool {', '.join(market)} (provider vast) needs a Vast API key: {exc}") from exc
    return VastProvider(api_key=key, server_url=api_url)


class NoMarket:
    """The ``Provider`` of a fleet of only the lab's own machines: nothing rented, nothing listed, nothing billed."""

    calls = 0

    def search_offers(self, filters: OfferFilters, disk_gb: float, limit: int = ports.OFFERS_LIMIT) -> list[Offer]:
        return []

    def list_instances(self) -> list[Instance]:
        return []

    def create_instance(
        self, offer_id: int, *, image: str, disk_gb: float, label: str, onstart: str, env: dict[str, str],
        bid_dph: float | None = None,
        asked: RentalAsk | None = None,
    ) -> int:
        raise ProviderPermanent("this fleet has no market pool (every pool is provider ssh): nothing can be rented")

    def destroy_instance(self, instance_id: int) -> None:
        raise ProviderPermanent("this fleet has no market pool (every pool is provider ssh): nothing can be destroyed")

    def ensure_ssh_key(self, public_key: str) -> None:
        return None

    def account_credit(self) -> float:
        raise ProviderPermanent("this fleet has no market account (every pool is provider ssh)")

    def billed_costs(self, since: float, now: float) -> dict[int, float]:
        return {}

    def pending_price_increases(self) -> list[PriceIncrease]:
        return []

    def answer_price_increase(self, pending_id: int, *, accept: bool) -> None:
        raise PriceIncreaseGone(f"price increase {pending_id}: this fleet has no market account", status=404,
                                code="no_pending_price_increase")


def open_shell(private_key: Path, known_hosts: Path) -> SshShell:
    """An SSH shell with rigsync's key and pinned host keys (paramiko)."""
    from reconciler.adapters.ssh import SshShell

    return SshShell(private_key=private_key, known_hosts=known_hosts)


def open_git(checkout: Path, **options: Unpack[GitOptions]) -> GitRepo:
    """The git adapter over the checkout at ``checkout`` (raises ``RepoError`` when it is not one); ``options``
    left out take the adapter's defaults."""
    from reconciler.adapters.git import GitRepo

    return GitRepo(Path(checkout), **options)


def open_archive(checkout: Path) -> ShardedRunArchive:
    """The run archive of the checkout: its shards under observed/runs/ and its journal in ``.git/``."""
    from reconciler.adapters.archive import ShardedRunArchive

    return ShardedRunArchive(Path(checkout))


def open_lease(
    git: GitRepo,
    *,
    holder: str,
    host: str,
    pid: int,
    stale_after: float = DEFAULT_STALE_AFTER_S,
    renew_every: float = DEFAULT_RENEW_EVERY_S,
) -> GitLease:
    """The fleet's lease on its own ref of ``git``'s remote."""
    from reconciler.adapters.lease import GitLease

    return GitLease(git, holder=holder, host=host, pid=pid, stale_after=stale_after, renew_every=renew_every)


def open_local_lock(checkout: Path) -> LocalLock:
    """The checkout's local lock (not yet taken)."""
    from reconciler.adapters.lease import LocalLock, lock_path

    return LocalLock(lock_path(Path(checkout)))


def open_fleet(
    checkout: Path,
    fleet: Fleet,
    *,
    git: GitRepo | None = None,
    state_dir: str | None = None,
    adapters: AdapterFactory = build_adapters,
    clock: SystemClock | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    cycle_s: float = CONTROLLER_INTERVAL_S,
    destroy_latency_s: float | None = None,
    api_url: str | None = None,
    data_dir: str | None = None,
    store: StoreConfig | None = None,
    controller_env: ControllerEnv | None = None,
) -> Reconciler:
    """A ``Reconciler`` for ``fleet`` acting through the checkout at ``checkout``.

    Memory comes from the observed files in the working tree: spend as last billed, per box, so the next
    read of the provider's bills adds only what is new (without it a restarted rigsync would count money
    from zero and the daily and total caps would not bind). ``state_dir`` overrides where rigsync keeps its
    SSH key and pinned host keys (``state_dir_for``). ``cycle_s`` is how often this controller decides: the
    budget projects spend to the next decision, so a longer cycle stops work earlier. ``api_url`` is the provider
    URL configured on the controller, handed to the adapter factory (None: its default, ``RIGSYNC_API_URL`` or
    Vast.ai); desired/ never names one. ``data_dir`` overrides where harvested results and checkpoints go
    (``adapters.store.data_dir_for``: ``--data-dir``, ``$RIGSYNC_DATA_DIR``, ``$XDG_DATA_HOME/rigsync``), unless
    ``store`` names an S3-compatible store (``--store``, ``$RIGSYNC_STORE``: ``adapters.s3store``), which boxes then
    reach themselves with presigned URLs; like the API URL, it is the controller's setting, never desired/'s.
    ``controller_env`` is what sweeps' ``${NAME}`` resolve to (None: this process's environment, its allowlist
    checked now: ``jobenv.ControllerEnv``).
    """
    from reconciler.adapters.launch_journal import FileLaunchJournal
    from reconciler.adapters.s3store import open_store
    from reconciler.loop import DESTROY_LATENCY_S, Reconciler, SystemClock
    from reconciler.observed.memory import read_restored
    from reconciler.observed.suggestions import read_suggestions

    checkout = Path(checkout)
    git = git if git is not None else open_git(checkout)
    clock = clock if clock is not None else SystemClock()
    restored = read_restored(checkout, now=clock.now())
    state = state_dir_for(fleet, state_dir)
    provider, shell = adapters(fleet, state, api_url)
    archive = open_archive(checkout)
    # Launches a crash kept out of observed/runs.yaml: known again before anything is planned.
    journal = FileLaunchJournal(state)
    written = journal.read()
    if written:
        archived = frozenset(r.key for r in archive.records())
        restored = replace(restored, journal=tuple(written), archived=archived)
    memory = remember(NO_MEMORY, restored)
    return Reconciler(
        provider=provider,
        shell=shell,
        archive=archive,
        journal=journal,
        code_tar=git.archive,
        memory=memory,
        clock=clock,
        should_stop=should_stop,
        cycle_s=cycle_s,
        destroy_latency_s=DESTROY_LATENCY_S if destroy_latency_s is None else destroy_latency_s,
        store=open_store(store, fleet.name, data_dir),
        controller_env=controller_env if controller_env is not None else ControllerEnv(os.environ),
        suggestions=read_suggestions(checkout),
    )


def render_cycle(
    rec: Reconciler, desired: Desired, observed: Observed, plan: Plan, status: ReconcilerStatus, checkout: Path
) -> tuple[dict[str, str], dict[str, str]]:
    """(the observed files as they are in the checkout now, the ones this cycle renders), keyed by path."""
    from reconciler.observed.codec import SUGGESTIONS
    from reconciler.observed.documents import render_observed
    from reconciler.observed.observed_tree import read_observed
    from reconciler.views.status_md import STATUS_MD, read_status_md, render_status_md

    desired = rec.with_suggestions(desired)
    previous = read_observed(checkout)
    rendered = render_observed(
        desired=desired,
        observed=rec.observed_after_apply(observed),
        plan=plan,
        status=status,
        now=rec.clock.now(),
        previous=previous,
    )
    # each settled attempt's learning curve (reconciler/core/curves.py), written once beside the documents
    rendered.update(rec.take_curves())
    # the bayes searches' configurations made (reconciler/observed/suggestions.py), once there are any
    suggestions = rec.suggestions_file()
    if suggestions is not None:
        rendered[SUGGESTIONS] = suggestions
    # the page for people (reconciler/views/)
    rendered[STATUS_MD] = render_status_md(rendered, rec.history, desired, rec.overheads)
    previous.update(read_status_md(checkout))
    return previous, rendered


def write_back(
    git: GitRepo, archive: ports.RunArchive, files: Mapping[str, str | None], message: str | None
) -> str | None:
    """Hand ``files`` and the archive's new lines to the one writer; commit them when ``message`` is given.

    Returns the new commit (None when nothing changed, or when only writing). The archive's journal is
    emptied only once the writer has taken its lines (``ShardedRunArchive.hand_off``).
    """
    if message is None:
        archive.hand_off(lambda appends: git.write_observed(files, appends))
        return None
    return archive.hand_off(lambda appends: git.commit_observed(files, appends, message))
