"""What `rigsync logs` and `rigsync ssh` share: the fleet as last observed, its boxes, rigsync's SSH identity.

* ``FleetFacts``: desired/ from the working tree (the fleet's name, its state and data directories) and the
  ``AttemptIndex`` of the observed files and the run archive: which box each attempt ran on. No credentials.
* ``BoxAccess``: the provider's instance list (for a box's status and SSH address, which observed/ does not keep)
  and an ``SshShell`` with rigsync's key and pinned host keys, both opened only when a box must be reached. It
  never writes to the account (no key upload) and refuses any instance the fleet does not own (``model.owned_by``).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from reconciler.cli._common import load_local_desired
from reconciler.core.model import Desired, Instance, InstanceStatus, owned_by
from reconciler.errors import UserError
from reconciler.fleet import open_archive, open_provider, open_shell, state_dir_for
from reconciler.observed.run_lookup import AttemptIndex, read_attempt_index
from reconciler.ports import Provider

if TYPE_CHECKING:  # paramiko is imported when a box is reached: `rigsync logs` from the local store never needs it
    from reconciler.adapters.ssh import SshShell


@dataclass(frozen=True)
class FleetFacts:
    repo: Path
    desired: Desired
    index: AttemptIndex
    state_dir: Path


def read_fleet_facts(args: argparse.Namespace) -> FleetFacts:
    """desired/ (the fleet), the observed files and the archive of ``--repo``; nothing contacted."""
    repo = Path(args.repo)
    desired = load_local_desired(repo)
    index = read_attempt_index(repo, open_archive(repo).records(), (r.id for r in desired.runs))
    return FleetFacts(repo, desired, index, state_dir_for(desired.fleet, args.state_dir))


class BoxAccess:
    """The fleet's boxes as the provider lists them, and an SSH shell to them; opened on first use, closed once."""

    def __init__(self, facts: FleetFacts, api_url: str) -> None:
        self.facts = facts
        self.api_url = api_url
        self._provider: Provider | None = None
        self._listed: dict[int, Instance] | None = None
        self._shell: SshShell | None = None

    @property
    def fleet(self) -> str:
        return self.facts.desired.fleet.name

    @property
    def key_path(self) -> Path:
        from reconciler.adapters.ssh import KEY_FILE

        path = self.facts.state_dir / KEY_FILE
        if not path.is_file():
            raise UserError(
                f"rigsync has no SSH key in {self.facts.state_dir}: no box of this fleet was rented from this state "
                "dir (pass --state-dir, or set RIGSYNC_STATE_DIR, to the one `rigsync run` uses)"
            )
        return path

    @property
    def known_hosts(self) -> Path:
        return self.facts.state_dir / "known_hosts"

    def listed(self, instance_id: int) -> Instance | None:
        """The instance as the provider lists it now; None when it is not listed (destroyed)."""
        if self._listed is None:
            self._provider = open_provider(self.facts.desired.fleet, self.api_url)
            self._listed = {i.id: i for i in self._provider.list_instances()}
        return self._listed.get(instance_id)

    def owned(self, instance: Instance) -> Instance:
        """``instance`` if this fleet owns it; rigsync never connects to anything else."""
        if owned_by(self.fleet, instance.label) is None:
            raise UserError(
                f"instance {instance.id} is not rigsync's (label {instance.label!r}, fleet {self.fleet!r}): "
                "refusing to connect to it"
            )
        return instance

    def running(self, instance: Instance) -> Instance:
        if instance.status is not InstanceStatus.RUNNING:
            raise UserError(f"box {instance.id} is not running (the provider says {instance.status.value})")
        if instance.ssh is None:
            raise UserError(f"box {instance.id} has no SSH address yet")
        return instance

    def shell(self) -> SshShell:
        if self._shell is None:
            self._shell = open_shell(self.key_path, self.known_hosts)
        return self._shell

    def close(self) -> None:
        if self._shell is not None:
            self._shell.close()
            self._shell = None
