"""Benchmark: what one observe fan-out costs over SSH, for 1 and for N emulated boxes, cold and warm.

Rents boxes from the emulator through the real SDK, then runs the real probe script on every box with
``SshShell.run_many``. Cold = a fresh ``SshShell`` (TCP + SSH handshake + auth per box); warm = the same shell
again (pooled connections, the steady state of the reconcile loop). Each figure is the median of ``--reps``.

Prints one JSON document: per host count the cold and warm wall time (seconds), connections made, and
``warm_noop_s`` (the same fan-out running a trivial command: the SSH cost alone, without the on-box work of the
probe, whose fake ``nvidia-smi`` is itself a Python program on the emulated boxes), and the ratios warm/cold
and N-host/1-host (how close the fan-out is to parallel on this machine's cores).

Run: ``.venv/bin/python bench/probe_fanout.py [--hosts 50] [--reps 3]`` (needs root for the emulated boxes).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from reconciler import remote
from reconciler.adapters.ssh import SshShell
from reconciler.adapters.vast import VastProvider
from reconciler.core.model import Endpoint, OfferFilters
from reconciler.emulator import Emulator
from reconciler.emulator.testing import make_keypair
from reconciler.ports import CommandResult


def _fanout(shell: SshShell, targets: dict[int, tuple[Endpoint, str]]) -> float:
    t0 = time.perf_counter()
    results = shell.run_many(targets, timeout=60)
    elapsed = time.perf_counter() - t0
    for iid, r in results.items():
        if not isinstance(r, CommandResult) or r.exit_code != 0:
            raise SystemExit(f"probe of instance {iid} failed: {r}")
        remote.parse_probe(iid, r.stdout)
    return elapsed


def measure(targets: dict[int, tuple[Endpoint, str]], key: Path, work: Path, reps: int) -> dict[str, Any]:
    cold, warm, noop, connects = [], [], [], 0
    noop_targets = {iid: (ep, "echo {}") for iid, (ep, _) in targets.items()}  # SSH round trip only
    for rep in range(reps):
        with SshShell(private_key=key, known_hosts=work / f"kh-{len(targets)}-{rep}", max_workers=64) as shell:
            cold.append(_fanout(shell, targets))
            connects = shell.connects
            warm.append(statistics.median(_fanout(shell, targets) for _ in range(reps)))
            noop.append(statistics.median(_fanout(shell, noop_targets) for _ in range(reps)))
            if shell.connects != connects:
                raise SystemExit("warm probes opened new connections: the pool is not reused")
    c, w, n = statistics.median(cold), statistics.median(warm), statistics.median(noop)
    return {"hosts": len(targets), "cold_s": round(c, 4), "warm_s": round(w, 4),
            "warm_over_cold": round(w / c, 3), "warm_noop_s": round(n, 4), "connections": connects}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=50)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rigsync-bench-"))
    kp = make_keypair(work / "key")
    with Emulator(seed=3, offers=max(200, args.hosts * 3), boot_delay=0.2) as emu:
        emu.add_ssh_key(kp.public)
        provider = VastProvider(api_key=emu.api_key, server_url=emu.url)
        offers = provider.search_offers(OfferFilters(verified=False), disk_gb=10, limit=args.hosts * 3)
        if len(offers) < args.hosts:
            raise SystemExit(f"the emulated market has only {len(offers)} offers")
        t0 = time.perf_counter()
        ids = [
            provider.create_instance(o.id, image="bench", disk_gb=10, label=f"rigsync:bench:{n}", onstart="", env={})
            for n, o in enumerate(offers[: args.hosts])
        ]
        emu.wait_running(ids, timeout=300)
        boot_s = time.perf_counter() - t0
        script = remote.probe_script()
        targets: dict[int, tuple[Endpoint, str]] = {}
        for inst in provider.list_instances():
            if inst.id in ids and inst.ssh is not None:
                targets[inst.id] = (inst.ssh, script)
        one = dict(list(targets.items())[:1])
        r1 = measure(one, kp.private_path, work, args.reps)
        rn = measure(targets, kp.private_path, work, args.reps)
        for i in ids:
            provider.destroy_instance(i)
    print(json.dumps({
        "bench": "probe_fanout",
        "rent_and_boot_s": round(boot_s, 3),
        "one": r1,
        "many": rn,
        "ratios": {
            "cold_many_over_one": round(rn["cold_s"] / r1["cold_s"], 3),
            "warm_many_over_one": round(rn["warm_s"] / r1["warm_s"], 3),
            "cold_over_warm_many": round(rn["cold_s"] / rn["warm_s"], 3),
        },
    }, indent=2))


if __name__ == "__main__":
    main()
