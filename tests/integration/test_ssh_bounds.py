"""SshShell's byte bounds against a real sshd box: a flood of output is stopped at the bound, quickly, in flat memory.

A rented box is a stranger's machine and may print without end. The shell reads a command's stdout up to its
bound and stops there (``OutputOverBound``, the channel closed), keeps only the tail of stderr, and the box may
not send much past the bound either (the channel's window): the controller's peak RSS barely moves, whether the
box prints 200 MB or never stops.
"""

from __future__ import annotations

import contextlib
import json
import resource
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from adversary.boxes import LIAR_PATH, make_liar

from reconciler.adapters.box_control import ShellBoxes
from reconciler.adapters.ssh import SshShell
from reconciler.adapters.vast import VastProvider
from reconciler.core.bounds import COMMAND_STDERR_BYTES, COMMAND_STDOUT_BYTES, PROBE_STDOUT_BYTES
from reconciler.core.model import Endpoint, Instance, OfferFilters
from reconciler.emulator import Emulator
from reconciler.emulator.testing import KeyPair
from reconciler.errors import OutputOverBound
from reconciler.ports import CommandResult

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

FLOOD_200MB = "head -c 200000000 /dev/zero"
ENDLESS = "yes rigsync-flood"
BIG_BOUND = 8 << 20  # a caller's own larger bound (a harvest's, a log slice's)
RSS_SLACK = 48 << 20  # the peak may grow by at most this while a box floods: the bound, a window, buffers


@pytest.fixture(scope="module")
def instance(emulator: Emulator) -> Iterator[Instance]:
    provider = VastProvider(api_key=emulator.api_key, server_url=emulator.url)
    (offer, *_) = provider.search_offers(OfferFilters(verified=False), disk_gb=10)
    iid = provider.create_instance(offer.id, image="img", disk_gb=10, label="rigsync:bounds:0", onstart="", env={})
    emulator.wait_running([iid])
    (inst,) = [i for i in provider.list_instances() if i.id == iid]
    yield inst
    provider.destroy_instance(iid)


@pytest.fixture
def box(instance: Instance) -> Endpoint:
    assert instance.ssh is not None
    return instance.ssh


@pytest.fixture
def shell(ssh_keypair: KeyPair, tmp_path: Path) -> Iterator[SshShell]:
    s = SshShell(private_key=ssh_keypair.private_path, known_hosts=tmp_path / "known_hosts", connect_timeout=3)
    yield s
    s.close()


def _peak_rss() -> int:
    """This process's peak RSS in bytes, reset first when the kernel allows it (``clear_refs`` 5)."""
    status = Path("/proc/self/status").read_text()
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _reset_peak() -> None:
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def _growth(fn: Callable[[], object]) -> tuple[int, float, object]:
    """How much ``fn`` raised the peak RSS, how long it took, and what it returned or raised."""
    _reset_peak()
    before = _peak_rss()
    t0 = time.monotonic()
    try:
        got: object = fn()
    except OutputOverBound as exc:
        got = exc
    return _peak_rss() - before, time.monotonic() - t0, got


def test_two_hundred_megabytes_are_stopped_at_the_bound(shell: SshShell, box: Endpoint) -> None:
    assert shell.run(box, "echo warm").stdout == b"warm\n"  # the connection is made outside the measure
    grew, took, got = _growth(lambda: shell.run(box, FLOOD_200MB, timeout=60))
    assert isinstance(got, OutputOverBound) and f"output over {COMMAND_STDOUT_BYTES} bytes" in str(got)
    assert took < 10 and grew < RSS_SLACK, (took, grew)
    print(f"200 MB flood: stopped after {took:.2f}s, peak RSS +{grew >> 10} KiB")
    assert shell.run(box, "echo still").stdout == b"still\n", "the pooled connection still serves the box"


def test_endless_output_is_stopped_at_a_caller_s_larger_bound(shell: SshShell, box: Endpoint) -> None:
    shell.run(box, "true")
    grew, took, got = _growth(lambda: shell.run(box, ENDLESS, timeout=60, max_stdout=BIG_BOUND))
    assert isinstance(got, OutputOverBound) and f"output over {BIG_BOUND} bytes" in str(got)
    assert took < 20 and grew < BIG_BOUND + RSS_SLACK, (took, grew)
    print(f"endless output, bound {BIG_BOUND >> 20} MiB: stopped after {took:.2f}s, peak RSS +{grew >> 10} KiB")
    assert shell.run(box, "echo still").exit_code == 0


def test_run_many_returns_the_overflow_as_that_box_s_answer(shell: SshShell, box: Endpoint) -> None:
    res = shell.run_many({1: (box, ENDLESS), 2: (box, "echo fine")}, timeout=30, max_stdout=4096)
    assert isinstance(res[1], OutputOverBound) and "output over 4096 bytes" in str(res[1])
    assert isinstance(res[2], CommandResult) and res[2].stdout == b"fine\n"


def test_only_the_tail_of_a_flood_of_stderr_is_kept(shell: SshShell, box: Endpoint) -> None:
    command = "head -c 50000000 /dev/zero >&2; echo the-end >&2; echo done"
    grew, _, got = _growth(lambda: shell.run(box, command, timeout=60))
    assert isinstance(got, CommandResult) and got.exit_code == 0 and got.stdout == b"done\n"
    assert len(got.stderr) == COMMAND_STDERR_BYTES and got.stderr.endswith(b"\0the-end\n")
    assert grew < RSS_SLACK, grew


def test_an_honest_command_s_output_is_whole(shell: SshShell, box: Endpoint) -> None:
    res = shell.run(box, f"head -c {COMMAND_STDOUT_BYTES} /dev/zero; echo oops >&2; exit 3")
    assert (res.exit_code, res.stdout, res.stderr) == (3, b"\0" * COMMAND_STDOUT_BYTES, b"oops\n")


def test_a_probe_answer_past_its_bound_makes_the_box_unusable(
    shell: SshShell, instance: Instance, emulator: Emulator
) -> None:
    """A run's metrics record swollen to 2.3 MB is cut on the box itself (the real probe keeps at most 64 keys of a
    line under 64 KiB): its answer stays usable. A probe replaced by a liar that prints 2 MiB is past
    ``PROBE_STDOUT_BYTES``: unusable, not unreachable, and the controller's memory stays flat."""
    run = emulator.host_root(instance.id) / "rigsync" / "runs" / "fat.1"
    run.mkdir(parents=True)
    try:
        record = {f"k{i}": "v" * 100 for i in range(20_000)}  # one line of about 2.3 MB
        (run / "metrics.jsonl").write_text(json.dumps(record) + "\n")
        (swollen,) = ShellBoxes(shell).probe_many([instance], timeout=30)
        assert swollen.reachable and swollen.unusable is None, swollen
        make_liar(emulator, instance.id, "flood", flood_mib=2)
        grew, took, got = _growth(lambda: ShellBoxes(shell).probe_many([instance], timeout=30))
        assert isinstance(got, list)
        (probe,) = got
        assert not probe.reachable and probe.unusable == f"probe: output over {PROBE_STDOUT_BYTES} bytes"
        assert probe.error == probe.unusable and grew < RSS_SLACK, (probe, grew)
        print(f"liar's probe: unusable after {took:.2f}s, peak RSS +{grew >> 10} KiB")
    finally:
        shutil.rmtree(run)
        (emulator.host_root(instance.id) / LIAR_PATH).unlink(missing_ok=True)
    (honest,) = ShellBoxes(shell).probe_many([instance], timeout=30)
    assert honest.reachable and honest.unusable is None and len(honest.gpus) == instance.num_gpus
