"""``rigsync ssh BOX|RUN``: an interactive shell on a box, as rigsync itself reaches it.

BOX is an instance id (a number, always: a run prefix of digits alone needs its sweep, ``tdmpc-9165``); RUN a run id
or unique prefix (``observed.attempts``), meaning the box its latest attempt runs on. The box must be listed by the
provider, owned by the fleet (``model.owned_by``) and running. The command replaces itself (``os.execvp``) with the
system OpenSSH client using rigsync's key and only the host key pinned in rigsync's ``known_hosts``
(``adapters.ssh.openssh_argv``: ``StrictHostKeyChecking=yes``), so a box that answers with another key is refused
exactly as the reconciler refuses it.

A box whose host key was never pinned (this state dir has not probed it yet) is pinned first the way the reconciler
pins every box, trust on first use through ``SshShell`` (a connection running ``true``): the reconciler would do the
same on its next probe, so refusing would only send the user to `rigsync status` to make that same first contact.
A key that differs from the pin is refused, never replaced. ``--print`` prints the command (shell-quoted) instead
of running it (append ``-- COMMAND`` to that to run one command on the box).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys

from reconciler.adapters.ssh import is_pinned, openssh_argv
from reconciler.cli._boxes import BoxAccess, FleetFacts, read_fleet_facts
from reconciler.cli._common import add_live_args, api_url_of
from reconciler.core.model import Instance, RunPhase
from reconciler.errors import HostKeyMismatch, HostUnreachable, UserError

PIN_TIMEOUT_S = 20.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Open an interactive shell on one of the fleet's boxes with rigsync's SSH key and its pinned host "
        "key (the system ssh client, StrictHostKeyChecking=yes). With --print, the command is printed: append "
        "`-- COMMAND` to it to run one command non-interactively."
    )
    p.add_argument("target", metavar="BOX|RUN",
                   help="an instance id (a number), or a run id or unique prefix (the box its live attempt is on)")
    p.add_argument("--print", action="store_true", dest="print_only",
                   help="print the ssh command (shell-quoted) instead of running it")
    add_live_args(p)
    p.set_defaults(handler=run)


def box_of(facts: FleetFacts, target: str) -> tuple[int, str]:
    """(instance id, what it is to the user) for BOX or RUN; a ``UserError`` when a run is not running."""
    text = target.strip()
    if text.isdigit():
        return int(text), f"box {int(text)}"
    run = facts.index.resolve_run(text)
    latest = run.latest()
    if latest is None:
        raise UserError(f"run {run.run_id} has not been launched yet ({run.phase or RunPhase.PENDING.value})")
    running = not latest.finished and run.phase in (None, RunPhase.RUNNING.value)
    if not running:
        where = f" on box {latest.instance_id}" if latest.instance_id is not None else ""
        phase = run.phase or (latest.record.phase.value if latest.record else "finished")
        raise UserError(
            f"run {run.run_id} is not running ({phase}): its last attempt {latest.name} ran{where}; "
            f"`rigsync logs {latest.name}` prints its output"
        )
    if latest.instance_id is None:
        raise UserError(f"rigsync does not know which box attempt {latest.name} runs on")
    return latest.instance_id, f"box {latest.instance_id} (attempt {latest.name})"


def run(args: argparse.Namespace) -> int:
    api_url = api_url_of(args)
    facts = read_fleet_facts(args)
    instance_id, what = box_of(facts, args.target)
    boxes = BoxAccess(facts, api_url)
    try:
        instance = boxes.listed(instance_id)
        if instance is None:
            raise UserError(f"{what} is not in the provider's instance list (destroyed?)")
        instance = boxes.running(boxes.owned(instance))
        argv = _argv(boxes, instance)
    finally:
        boxes.close()
    if args.print_only:
        print(shlex.join(argv))
        return 0
    if shutil.which(argv[0]) is None:
        raise UserError("no `ssh` client on PATH: install OpenSSH's client (e.g. apt-get install openssh-client)")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(argv[0], argv)
    raise AssertionError("unreachable")  # pragma: no cover: execv does not return


def _argv(boxes: BoxAccess, instance: Instance) -> list[str]:
    endpoint = instance.ssh
    assert endpoint is not None  # BoxAccess.running checked it
    key = boxes.key_path
    if not is_pinned(boxes.known_hosts, endpoint):
        try:
            boxes.shell().run(endpoint, "true", timeout=PIN_TIMEOUT_S)
        except HostKeyMismatch as exc:
            raise UserError(f"box {instance.id}: {exc}") from exc
        except HostUnreachable as exc:
            raise UserError(f"box {instance.id} ({endpoint.host}:{endpoint.port}) is unreachable: {exc}") from exc
        print(f"rigsync: pinned box {instance.id}'s host key in {boxes.known_hosts} (first contact)", file=sys.stderr)
    return openssh_argv(endpoint, private_key=key, known_hosts=boxes.known_hosts)
