"""Opening a fleet: the one place where rigsync is wired together (the composition root).

`rigsync run` (``FleetDaemon``), the live commands `rigsync plan`/`apply`/`status`, and through the daemon
the demo, all open a fleet here and write back through here, so the wiring cannot drift apart:

* ``open_fleet``: the fleet's cross-cycle memory from the observed files in the checkout (read first, so a
  bad file fails before the provider is contacted), the run archive, the adapters (an injectable factory,
  by default ``loop.build_adapters``: the Vast.ai SDK and SSH), and the ``Reconciler`` holding them.
* ``render_cycle``: the observed/*.yaml documents after a cycle, from the state the next cycle starts from.
* ``write_back``: the one path observed/ takes to disk: the rendered files and the run archive's new lines
  go to the git adapter's writer together, committed when there is a message (`rigsync run`) and left in
  the working tree when there is none (`rigsync apply`, which leaves committing to `rigsync run`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from reconciler.actions import Plan
from reconciler.adapters.git import GitRepo
from reconciler.adapters.store import LocalStore, data_dir_for
from reconciler.archive import RunArchive
from reconciler.launch_journal import LaunchJournal, merge_in_flight
from reconciler.loop import DESTROY_LATENCY_S, Reconciler, SystemClock, build_adapters, state_dir_for
from reconciler.model import CONTROLLER_INTERVAL_S, Desired, Fleet, Observed
from reconciler.observed.documents import ReconcilerStatus, render_observed
from reconciler.observed.memory import read_fleet_memory
from reconciler.observed.tree import read_observed
from reconciler.ports import Provider, Shell
from reconciler.views.status_md import STATUS_MD, read_status_md, render_status_md

# (fleet, state dir, the controller's provider URL or None for its default) -> the adapters
AdapterFactory = Callable[[Fleet, Path, str | None], tuple[Provider, Shell]]


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
) -> Reconciler:
    """A ``Reconciler`` for ``fleet`` acting through the checkout at ``checkout``.

    Memory comes from the observed files in the working tree: spend as last billed, per box, so the next
    read of the provider's bills adds only what is new (without it a restarted rigsync would count money
    from zero and the daily and total caps would not bind). ``state_dir`` overrides where rigsync keeps its
    SSH key and pinned host keys (``state_dir_for``). ``cycle_s`` is how often this controller decides: the
    budget projects spend to the next decision, so a longer cycle stops work earlier. ``api_url`` is the provider
    URL configured on the controller, handed to the adapter factory (None: its default, ``RIGSYNC_API_URL`` or
    Vast.ai); desired/ never names one. ``data_dir`` overrides where harvested results and checkpoints go
    (``adapters.store.data_dir_for``: ``--data-dir``, ``$RIGSYNC_DATA_DIR``, ``$XDG_DATA_HOME/rigsync``).
    """
    checkout = Path(checkout)
    git = git if git is not None else GitRepo(checkout)
    clock = clock if clock is not None else SystemClock()
    memory = read_fleet_memory(checkout, now=clock.now())
    state = state_dir_for(fleet, state_dir)
    provider, shell = adapters(fleet, state, api_url)
    archive = RunArchive(checkout)
    # Launches a crash kept out of observed/runs.yaml: known again before anything is planned.
    journal = LaunchJournal(state)
    written = journal.read()
    if written:
        archived = {r.key for r in archive.records()}
        memory = replace(memory, in_flight=merge_in_flight(memory.in_flight, written, archived))
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
        store=LocalStore(data_dir_for(fleet.name, data_dir)),
    )


def render_cycle(
    rec: Reconciler, desired: Desired, observed: Observed, plan: Plan, status: ReconcilerStatus, checkout: Path
) -> tuple[dict[str, str], dict[str, str]]:
    """(the observed files as they are in the checkout now, the ones this cycle renders), keyed by path."""
    previous = read_observed(checkout)
    rendered = render_observed(
        desired=desired,
        observed=rec.observed_after_apply(observed),
        plan=plan,
        status=status,
        now=rec.clock.now(),
        previous=previous,
    )
    # each settled attempt's learning curve (reconciler/curves.py), written once beside the documents
    rendered.update(rec.take_curves())
    rendered[STATUS_MD] = render_status_md(rendered, rec.history, desired)  # the page for people (reconciler/views/)
    previous.update(read_status_md(checkout))
    return previous, rendered


def write_back(git: GitRepo, archive: RunArchive, files: Mapping[str, str | None], message: str | None) -> str | None:
    """Hand ``files`` and the archive's new lines to the one writer; commit them when ``message`` is given.

    Returns the new commit (None when nothing changed, or when only writing). The archive's journal is
    emptied only once the writer has taken its lines (``RunArchive.hand_off``).
    """
    if message is None:
        archive.hand_off(lambda appends: git.write_observed(files, appends))
        return None
    return archive.hand_off(lambda appends: git.commit_observed(files, appends, message))
