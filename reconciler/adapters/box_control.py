"""``BoxControl`` over the ``Shell`` port: the run protocol's programs (``reconciler.remote``) run on boxes.

The probe, launch, kill, bootstrap and ship-code commands are built by ``reconciler.remote`` and run with
``Shell.run``/``Shell.run_many`` (paramiko in production, ``adapters.ssh.SshShell``); this module only turns
exit codes and output into the port's answers and errors (a launch's answer read as its process group,
``remote.launched``). The SSH integration tests drive it against real sshd
boxes; the unit tests drive ``observe()``/``apply()`` through an in-memory ``BoxControl`` instead.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import replace

from reconciler import remote
from reconciler.core.bounds import COMMAND_STDERR_BYTES, PROBE_STDOUT_BYTES, bounded_text
from reconciler.core.model import BoxProbe, Endpoint, Instance
from reconciler.errors import HostKeyMismatch, LaunchLockHeld, LaunchRefused, OutputOverBound, RemoteCommandFailed
from reconciler.failpoints import failpoint
from reconciler.ports import (
    ATTEMPT_TAR,
    BootstrapCache,
    CheckpointUploaded,
    CommandResult,
    Download,
    HarvestStream,
    Launched,
    LaunchJob,
    Shell,
    Upload,
)
from reconciler.remote.commands import TRANSFER_EXITS, fetch_resume_script, upload_script, url_lines
from reconciler.remote.launched import launch_answer
from reconciler.remote.parse import parse_upload

COMMAND_TIMEOUT_S = 60.0
SPOOL_IN_MEMORY_BYTES = 4 << 20  # a harvest stream past this goes to a temporary file as it arrives
HARVEST_SLACK = 64 << 20  # tar headers and the manifest on top of a harvest's capped file data


class ShellBoxes:
    """rigsync's boxes reached through a ``Shell``. Holds no state of its own (the shell pools connections)."""

    def __init__(self, shell: Shell, *, command_timeout: float = COMMAND_TIMEOUT_S) -> None:
        self.shell = shell
        self.command_timeout = command_timeout

    # ------------------------------------------------------------------------------------------ observe

    def probe_many(self, boxes: Sequence[Instance], *, timeout: float, epoch: int = 0) -> list[BoxProbe]:
        script = remote.probe_script(epoch)
        answers: dict[int, BoxProbe] = {}
        targets: dict[int, tuple[Endpoint, str]] = {}
        for box in boxes:
            if box.ssh is None:
                answers[box.id] = BoxProbe(instance_id=box.id, reachable=False, error="no ssh address yet")
            else:
                targets[box.id] = (box.ssh, script)
        listed = {box.id: box.num_gpus for box in boxes}
        results = self.shell.run_many(targets, timeout=timeout, max_stdout=PROBE_STDOUT_BYTES) if targets else {}
        for instance_id in targets:
            answers[instance_id] = _probe_from(instance_id, results.get(instance_id), listed[instance_id])
        return [answers[box.id] for box in boxes]

    # -------------------------------------------------------------------------------------------- apply

    def drain(self, box: Instance) -> None:
        _checked(self._run(box, remote.drain_script()))

    def mark_harvested(self, box: Instance, run_id: str, attempt: int) -> None:
        _checked(self._run(box, remote.harvested_script(run_id, attempt)))

    def launch(self, box: Instance, job: LaunchJob) -> Launched:
        script = remote.launch_script(
            run_id=job.run_id,
            attempt=job.attempt,
            gpu_mask=job.gpu_mask,
            command=job.command,
            code_commit=job.code_commit,
            desired_commit=job.desired_commit,
            metrics_file=job.metrics_file,
            metric_key=job.metric_key,
            metric_goal=job.metric_goal.value,
            max_runtime_s=job.max_runtime_s,
            sweep=job.sweep,
            params=dict(job.params),
            seed=job.seed,
            env_records=len(job.env.names),
            epoch=job.epoch,
            queued=job.queued,
        )
        # The job's environment goes on the channel's stdin, never into the command line (``launch.sh``).
        res = self._run(box, script, stdin=job.env.stdin() or None)
        if res.exit_code == remote.LAUNCH_LOCK_EXIT:
            raise LaunchLockHeld(_text(res.stderr) or "run directory already exists")
        if res.exit_code == remote.FENCED_EXIT:
            fence = _fence_in(res.stderr)
            raise LaunchRefused(
                f"the box refused epoch {job.epoch}: its fence is epoch {fence} (another controller holds the fleet)"
            )
        if res.exit_code == remote.DRAINING_EXIT and job.queued:
            raise LaunchRefused("the box is draining: it takes no new queue entries")
        failpoint("boxes.launch.locked")
        answer = _checked(res)
        # The process group a kill may signal, as this launch saw it (never a pid read back from the box later).
        return Launched(queued=answer == "queued") if job.queued else launch_answer(res.stdout)

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
        script = remote.kill_script(
            run_id, attempt, exit_code=exit_code, reason=reason, pid=pid, pid_started=pid_started
        )
        _checked(self._run(box, script))

    def bootstrap(self, box: Instance, script: str, script_hash: str, cache: BootstrapCache | None = None) -> str:
        if cache is None:
            return _checked(self._run(box, remote.bootstrap_script(script, script_hash)))
        download, upload = cache.download, cache.upload
        command = remote.bootstrap_script(
            script, script_hash, cache_key=cache.key, cache_paths=cache.paths,
            restore=None if download is None else (download.size, download.sha256), upload=upload is not None,
        )
        urls = url_lines([t.url for t in (download, upload) if t is not None])
        return _checked(self._run(box, command, stdin=urls))

    def ship_code(self, box: Instance, commit: str, tar: bytes) -> None:
        _checked(self._run(box, remote.ship_code_script(commit), stdin=tar))

    def harvest(
        self, box: Instance, run_id: str, attempt: int, *, what: str, patterns: Sequence[str], cap_bytes: int
    ) -> HarvestStream:
        script = remote.harvest_script(run_id, attempt, what=what, patterns=patterns, cap_bytes=cap_bytes)
        if box.ssh is None:
            raise RemoteCommandFailed(f"instance {box.id} has no ssh address")
        # The stream may be hundreds of MiB: it is spooled to a temporary file as it arrives (in memory only while
        # small), never held whole. The deadline is a minute plus one per 2 MiB/s of the cap.
        # The store closes it once unpacked (``LocalStore.put_attempt``): a context manager here would close it early.
        spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY_BYTES, prefix="rigsync-harvest-")  # noqa: SIM115
        try:
            res = self.shell.run(
                box.ssh,
                script,
                timeout=self.command_timeout + cap_bytes / (2 << 20),
                max_stdout=cap_bytes + HARVEST_SLACK,
                stdout_sink=spool,
            )
            if res.exit_code != 0:
                raise RemoteCommandFailed(f"harvest exited {res.exit_code}: {_stderr_tail(res.stderr)}")
        except BaseException:
            spool.close()
            raise
        spool.seek(0)
        return spool

    def stage_resume(self, box: Instance, run_id: str, attempt: int, tar: bytes) -> None:
        _checked(self._run(box, remote.stage_resume_script(run_id, attempt), stdin=tar))

    # -- direct transfers: the box moves the data itself (``box/transfer.py``); the presigned URLs travel on the
    # -- command's stdin only (``remote.commands.url_lines``) and are scrubbed from anything an error quotes

    def upload_harvest(
        self, box: Instance, run_id: str, attempt: int, *, patterns: Sequence[str], cap_bytes: int,
        uploads: Mapping[str, Upload],
    ) -> None:
        if ATTEMPT_TAR not in uploads:
            raise ValueError(f"upload_harvest needs the {ATTEMPT_TAR} upload")
        files = [name for name in uploads if name != ATTEMPT_TAR]
        script = upload_script(run_id, attempt, what="run", patterns=patterns, cap_bytes=cap_bytes, files=files)
        urls = [uploads[ATTEMPT_TAR].url, *(uploads[name].url for name in files)]
        self._transfer("upload", box, script, urls, cap_bytes)

    def upload_checkpoint(
        self, box: Instance, run_id: str, attempt: int, *, path: str, cap_bytes: int, upload: Upload
    ) -> CheckpointUploaded:
        script = upload_script(run_id, attempt, what="checkpoint", patterns=[path], cap_bytes=cap_bytes)
        answer, problem = parse_upload(self._transfer("checkpoint upload", box, script, [upload.url], cap_bytes))
        if answer is None:
            raise RemoteCommandFailed(f"checkpoint upload of {run_id}.{attempt}: {problem}")
        return answer

    def stage_resume_from(self, box: Instance, run_id: str, attempt: int, download: Download) -> None:
        script = fetch_resume_script(run_id, attempt, size=download.size, sha256=download.sha256)
        self._transfer("checkpoint download", box, script, [download.url], download.size)

    def _transfer(self, what: str, box: Instance, script: str, urls: Sequence[str], size: int) -> bytes:
        """Run a transfer command with ``urls`` on its stdin; its stdout. ``RemoteCommandFailed`` when it failed,
        naming the transfer's exit (``TRANSFER_EXITS``) and the tail of its stderr, with no URL in either."""
        if box.ssh is None:
            raise RemoteCommandFailed(f"instance {box.id} has no ssh address")
        res = self.shell.run(box.ssh, script, stdin=url_lines(urls), timeout=self.command_timeout + size / (2 << 20))
        if res.exit_code != 0:
            why = TRANSFER_EXITS.get(res.exit_code, "")
            text = _stderr_tail(res.stderr)
            for url in urls:  # the box's own words: it holds the URLs, and may echo them
                text = text.replace(url, "<url>")
                query = url.partition("?")[2]
                text = text.replace(query, "<query>") if query else text
            raise RemoteCommandFailed(f"{what} exited {res.exit_code}{f' ({why})' if why else ''}: {text}")
        return res.stdout

    def forget(self, box: Instance) -> None:
        for endpoint in (box.direct, box.proxy):
            if endpoint is not None:
                self.shell.forget(endpoint)

    def _run(self, box: Instance, command: str, *, stdin: bytes | None = None) -> CommandResult:
        if box.ssh is None:
            raise RemoteCommandFailed(f"instance {box.id} has no ssh address")
        return self.shell.run(box.ssh, command, stdin=stdin, timeout=self.command_timeout)


def _probe_from(instance_id: int, result: CommandResult | Exception | None, gpus_listed: int) -> BoxProbe:
    """One box's probe: unreachable when the answer never came (the transport failed), unusable when it came and
    cannot be used (over its bound, or whatever ``remote.parse_probe`` refuses)."""
    if result is None:
        return BoxProbe(instance_id=instance_id, reachable=False, error="no answer from the shell")
    if isinstance(result, HostKeyMismatch):  # not merely unreachable: untrusted (the planner's host_key_changed)
        return BoxProbe(instance_id=instance_id, reachable=False, error=one_line(result), host_key_changed=True)
    if isinstance(result, OutputOverBound):
        return remote.unusable_probe(instance_id, f"output over {PROBE_STDOUT_BYTES} bytes")
    if isinstance(result, Exception):
        return BoxProbe(instance_id=instance_id, reachable=False, error=bounded_text(one_line(result)))
    if result.exit_code != 0:
        err = result.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
        text = bounded_text(f"probe exited {result.exit_code}: {err[0]}")
        return BoxProbe(instance_id=instance_id, reachable=False, error=text)
    probe = remote.parse_probe(instance_id, result.stdout, gpus_listed=gpus_listed)
    return replace(probe, answered_at=result.answered_at) if probe.reachable else probe


def _fence_in(stderr: bytes) -> str:
    """The fence a refusal names (``... older than the box's fence N``): its digits, or ``?``."""
    words = _text(stderr[-COMMAND_STDERR_BYTES:]).rsplit("fence ", 1)[-1].split()
    return words[0] if words and words[0].isdigit() and len(words[0]) <= 18 else "?"


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace").strip()


def _stderr_tail(raw: bytes) -> str:
    """The end of a command's stderr, as an error message may carry it: the box's text, escaped and bounded."""
    return bounded_text(_text(raw)[-300:], 300)


def _checked(res: CommandResult) -> str:
    """The command's stdout, or ``RemoteCommandFailed`` with the tail of its stderr when it exited non-zero."""
    if res.exit_code != 0:
        raise RemoteCommandFailed(f"exit {res.exit_code}: {_stderr_tail(res.stderr)}")
    return _text(res.stdout)


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message`` — how an error is shown in a probe or an outcome."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
