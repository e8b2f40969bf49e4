"""rigsync on boxes behind one SSH proxy host: each reached, each pinned apart, a reused port pinned fresh.

On Vast several instances sit behind one proxy host (``ssh5.vast.ai``) on different ports, a box without a direct
port is reached only there, a jupyter runtype lists its port one below the sshd, and a destroyed box's port goes
to the next rental. The emulator does all of that (``reuse_proxy_ports``, ``set_runtype``); rigsync's real
provider, shell and reconciler run against it. A pin by address alone would take the next tenant of a port for a
changed host key (or, worse, the other way round); rigsync pins a rented box by its instance.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import world

from reconciler.adapters.box_control import ShellBoxes
from reconciler.adapters.ssh import SshShell, _host_id, openssh_argv
from reconciler.adapters.vast import VastProvider
from reconciler.cli._common import load_local_desired, open_reconciler
from reconciler.core.model import AttemptOutcome, Endpoint, Instance, OfferFilters, Ownership
from reconciler.emulator import Emulator
from reconciler.emulator.testing import KeyPair
from reconciler.errors import HostKeyMismatch
from reconciler.loop import CycleResult, Reconciler

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def emu(ssh_keypair: KeyPair) -> Iterator[Emulator]:
    with Emulator(seed=7, offers=200, boot_delay=0.2, reuse_proxy_ports=True) as e:
        e.add_ssh_key(ssh_keypair.public)
        yield e


def rent(emu: Emulator, provider: VastProvider, n: int, tag: str, runtype: str | None = None) -> list[Instance]:
    """``n`` running boxes rented through rigsync's provider (its own runtype, or ``runtype`` forced)."""
    offers = provider.search_offers(OfferFilters(verified=False), disk_gb=10)
    emu.set_runtype(runtype)
    try:
        ids = [provider.create_instance(o.id, image="img", disk_gb=10, label=f"rigsync:proxy:{tag}{k}", onstart="",
                                        env={}) for k, o in enumerate(offers[:n])]
    finally:
        emu.set_runtype(None)
    emu.wait_running(ids, timeout=20)
    listed = {i.id: i for i in provider.list_instances()}
    return [listed[i] for i in ids]


def pins(kh: Path) -> dict[str, str]:
    """known_hosts as {name: key}."""
    return {line.split()[0]: line.split()[2] for line in kh.read_text().splitlines() if line.strip()}


def whoami(shell: SshShell, box: Instance) -> str:
    assert box.ssh is not None
    return shell.run(box.ssh, "echo $CONTAINER_ID", timeout=10).stdout.decode().strip()


def test_boxes_behind_one_proxy_are_pinned_apart_and_a_reused_port_is_pinned_fresh(
    emu: Emulator, ssh_keypair: KeyPair, tmp_path: Path
) -> None:
    provider = VastProvider(api_key=emu.api_key, server_url=emu.url)
    kh = tmp_path / "known_hosts"
    a, b = rent(emu, provider, 2, "ab", runtype="ssh_proxy")  # no direct port: the proxy is the only way in
    assert a.proxy is not None and b.proxy is not None
    for box in (a, b):
        assert box.direct is None and box.ssh == box.proxy and box.proxy is not None
        assert box.proxy.host == emu.proxy.ip
    assert a.proxy.port != b.proxy.port
    with SshShell(private_key=ssh_keypair.private_path, known_hosts=kh, connect_timeout=3) as shell:
        probes = ShellBoxes(shell).probe_many([a, b], timeout=15)
        assert all(p.reachable and not p.host_key_changed for p in probes), probes
        assert (whoami(shell, a), whoami(shell, b)) == (str(a.id), str(b.id))
    first = pins(kh)
    assert set(first) == {_host_id(a.proxy), _host_id(b.proxy)} and len(set(first.values())) == 2
    # Box a is destroyed behind the controller's back (its watchdog, a person, while rigsync was down): nothing
    # forgot its pin, and an address pin as rigsync wrote them before aliases is left too.
    provider.destroy_instance(a.id)
    with kh.open("a") as f:
        f.write(f"[{a.proxy.host}]:{a.proxy.port} ssh-ed25519 {first[_host_id(a.proxy)]}\n")
    [c] = rent(emu, provider, 1, "c", runtype="ssh_proxy")
    assert c.proxy is not None and (c.proxy.host, c.proxy.port) == (a.proxy.host, a.proxy.port)  # a's port, reused
    try:
        with SshShell(private_key=ssh_keypair.private_path, known_hosts=kh, connect_timeout=3) as shell:
            boxes = ShellBoxes(shell)
            pc, pb = boxes.probe_many([c, b], timeout=15)
            assert pc.reachable and not pc.host_key_changed, pc.error  # the old pins do not block the new box
            assert pb.reachable and not pb.host_key_changed, pb.error
            assert (whoami(shell, c), whoami(shell, b)) == (str(c.id), str(b.id))
            now = pins(kh)
            assert now[_host_id(c.proxy)] not in (first[_host_id(a.proxy)], first[_host_id(b.proxy)])
            assert now[_host_id(b.proxy)] == first[_host_id(b.proxy)]  # the surviving box: its pin untouched
            # Forgetting the destroyed box drops every pin it had: its instance's and its address's.
            boxes.forget(a)
            assert set(pins(kh)) == {_host_id(b.proxy), _host_id(c.proxy)}
            # c's host key changes behind the proxy: refused as host_key_changed; b is unaffected.
            emu.rekey(c.id)
            shell.close()  # open connections drop, as a reinstall drops them
            pc, pb = boxes.probe_many([c, b], timeout=15)
            assert pc.host_key_changed and not pc.reachable, pc
            assert pb.reachable and not pb.host_key_changed, pb.error
    finally:
        for box in (b, c):
            provider.destroy_instance(box.id)


def test_a_box_with_a_direct_port_shows_one_key_on_both_addresses(
    emu: Emulator, ssh_keypair: KeyPair, tmp_path: Path
) -> None:
    provider = VastProvider(api_key=emu.api_key, server_url=emu.url)
    kh = tmp_path / "known_hosts"
    d, other = rent(emu, provider, 2, "d")  # rigsync's own runtype: ssh_direc ssh_proxy
    try:
        assert d.direct is not None and d.proxy is not None and d.ssh == d.direct
        assert d.proxy.host == emu.proxy.ip and d.direct.host != d.proxy.host
        assert other.proxy is not None
        with SshShell(private_key=ssh_keypair.private_path, known_hosts=kh, connect_timeout=3) as shell:
            assert shell.run(d.direct, "echo $CONTAINER_ID").stdout == f"{d.id}\n".encode()
            assert shell.run(d.proxy, "echo $CONTAINER_ID").stdout == f"{d.id}\n".encode()
            assert list(pins(kh)) == [_host_id(d.direct)] == [_host_id(d.proxy)]  # one pin, the box's
            # Were d's proxy address to answer with another box's key, it would be refused, not pinned anew.
            wrong = Endpoint(other.proxy.host, other.proxy.port, host_key_alias=d.proxy.host_key_alias)
            with pytest.raises(HostKeyMismatch, match="does not match the one pinned for vast-instance-"):
                shell.run(wrong, "true")
            # `rigsync ssh`'s OpenSSH command accepts that pin on either address, and refuses the wrong one.
            for ep, want in ((d.direct, 0), (d.proxy, 0), (wrong, 255)):
                argv = openssh_argv(ep, private_key=ssh_keypair.private_path, known_hosts=kh)
                r = subprocess.run([*argv, "-o", "BatchMode=yes", "echo $CONTAINER_ID"], capture_output=True,
                                   text=True, timeout=30)
                assert r.returncode == want, (ep, r.stderr)
                assert want or r.stdout == f"{d.id}\n"
            ShellBoxes(shell).forget(d)  # apply's destroy path: both addresses, one pin
            assert pins(kh) == {}
    finally:
        for box in (d, other):
            provider.destroy_instance(box.id)


SWEEP = """\
name: proxied
priority: 10
code: [experiments]
command: >-
  {{ python }} experiments/train.py --task {{ task }} --lr {{ lr }} --seed {{ seed }}
  --out {{ run_dir }}/metrics.jsonl --seconds 20 --evals 4
grid:
  task: [walker-walk]
  lr: [3.0e-4, 1.0e-3]
seeds: [1]
resources:
  gpus: 1
  min_gpu_ram_gib: 4
max_runtime: 5m
retries: 2
metrics:
  file: metrics.jsonl
  key: episode_reward
  goal: max
"""


def test_a_sweep_runs_on_jupyter_boxes_behind_the_proxy_across_a_controller_restart(
    emu: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two proxy-only jupyter boxes (the +1 port) run a sweep; one is destroyed while the controller is down and
    its port goes to the replacement, which a new controller (same state, same known_hosts) reaches and pins."""
    monkeypatch.setenv("VAST_API_KEY", emu.api_key)
    repo = world.fleet_repo(tmp_path / "fleet")
    # Two boxes at most and no box-side queue: the run lost with its box needs a new rental, not the other box.
    repo.edit_fleet(name="itproxy", max=2, queue_ahead="0s", idle_timeout="1s", unreachable_grace="3s",
                    heartbeat_stale="8s", boot_timeout="1m")
    repo.set_sweeps({"proxied": SWEEP})
    repo.commit("test: two runs on proxied boxes", push=False)
    desired = load_local_desired(repo.work)
    state = str(tmp_path / "state")
    emu.set_runtype("jupyter ssh_proxy")
    probes_seen: list[tuple[int, bool, bool]] = []

    def mine() -> list[int]:
        return [i for i in emu.instance_ids()
                if (own := Ownership.parse(str(emu.instance(i).get("label") or ""))) and own.fleet == "itproxy"]

    def cycle(rec: Reconciler, n: int, until: Callable[[CycleResult], bool]) -> list[CycleResult]:
        out: list[CycleResult] = []
        deadline = time.monotonic() + 120
        for _ in range(n):
            res = rec.cycle(desired)
            out.append(res)
            probes_seen.extend((p.instance_id, p.reachable, p.host_key_changed) for p in res.observed.probes)
            if until(res):
                return out
            assert time.monotonic() < deadline, (
                f"no convergence: plan {[(a.kind.value, a.target, a.code.value) for a in res.plan.actions]}, "
                f"history {[(h.run_id[:12], h.attempt, h.phase.value, h.reason) for h in rec.history]}, "
                f"probes {[(p.instance_id, p.reachable, p.error) for p in res.observed.probes]}, boxes {mine()}")
            time.sleep(0.3)
        raise AssertionError(f"not done after {n} cycles")

    live: list[int] = []

    def two_live(res: CycleResult) -> bool:
        live[:] = [p.instance_id for p in res.observed.probes if p.reachable and any(r.pid_alive for r in p.runs)]
        return len(live) == 2

    try:
        rec = open_reconciler(repo.work, desired, state, emu.url)
        try:
            cycle(rec, 200, two_live)
        finally:
            rec.shell.close()
        assert sorted(mine()) == sorted(live)
        a, b = live
        ra, rb = emu.instance(a), emu.instance(b)
        assert ra["ssh_host"] == rb["ssh_host"] == emu.proxy.ip and "22/tcp" not in ra["ports"]
        assert ra["image_runtype"] == "jupyter ssh_proxy" and ra["ssh_port"] != rb["ssh_port"]
        kh = next(Path(state).rglob("known_hosts"))
        assert {f"vast-instance-{a}", f"vast-instance-{b}"} <= set(pins(kh))
        emu.destroy_instance(a)  # while no controller runs: nothing forgets its pin
        rec = open_reconciler(repo.work, desired, state, emu.url)

        def done(res: CycleResult) -> bool:
            ok = {h.run_id for h in rec.history if h.phase is AttemptOutcome.SUCCEEDED}
            wanted = {r.id for r in desired.runs if r.promotion_threshold is None}
            return len(wanted) == 2 and wanted <= ok and not res.plan.actions and not mine()

        replaced: dict[int, int] = {}

        def done_and_watch(res: CycleResult) -> bool:
            for iid in mine():
                if iid not in (a, b):
                    replaced[iid] = int(emu.instance(iid)["ssh_port"])
            return done(res)

        try:
            cycle(rec, 300, done_and_watch)
        finally:
            rec.shell.close()
    finally:
        emu.set_runtype(None)
        for iid in mine():
            emu.destroy_instance(iid)
    assert replaced and int(ra["ssh_port"]) in replaced.values()  # the replacement got a's proxy port
    new = next(i for i, p in replaced.items() if p == int(ra["ssh_port"]))
    assert any(i == new and reachable for i, reachable, _ in probes_seen)  # reached, through the proxy (+1)
    assert not any(changed for _, _, changed in probes_seen)  # nobody was taken for a changed host key
