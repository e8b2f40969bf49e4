"""Benchmark the emulator: bring-up time of 1 and 50 real SSH boxes, and API latency under 8 concurrent clients.

Prints one JSON object. Loopback only; bounded loops; run as root (the boxes are sshd in namespaces).
"""

from __future__ import annotations

import json
import statistics
import threading
import time

import requests
from vastai import VastAI

from reconciler.emulator import Emulator


def bring_up(emu: Emulator, n: int) -> float:
    v = VastAI(api_key=emu.api_key, server_url=emu.url)
    offers = v.search_offers(query="num_gpus=1", order="dph_total", limit=n, no_default=True)
    if len(offers) < n:
        offers = v.search_offers(query="", order="dph_total", limit=n, no_default=True)
    t0 = time.perf_counter()
    ids = [int(v.create_instance(id=o["id"], image="bench", disk=10)["new_contract"]) for o in offers[:n]]
    emu.wait_running(ids, timeout=120)
    elapsed = time.perf_counter() - t0
    for i in ids:
        v.destroy_instance(id=i)
    return elapsed


def api_latency(emu: Emulator, clients: int = 8, per_client: int = 100) -> dict[str, float]:
    samples: dict[str, list[float]] = {"search": [], "list": [], "show": []}
    lock = threading.Lock()
    headers = {"Authorization": f"Bearer {emu.api_key}"}
    some_id = emu.instance_ids()[0]

    def worker() -> None:
        s = requests.Session()
        mine: dict[str, list[float]] = {k: [] for k in samples}
        for i in range(per_client):
            kind = ("search", "list", "show")[i % 3]
            t = time.perf_counter()
            if kind == "search":
                r = s.post(f"{emu.url}/api/v0/bundles/", headers=headers, timeout=30,
                           json={"num_gpus": {"eq": "1"}, "verified": {"eq": True}, "order": [["score", "desc"]],
                                 "limit": 20, "allocated_storage": 10})
            elif kind == "list":
                r = s.get(f"{emu.url}/api/v1/instances/", headers=headers, timeout=30,
                          params={"select_filters": "{}", "limit": "25"})
            else:
                r = s.get(f"{emu.url}/api/v0/instances/{some_id}/", headers=headers, timeout=30)
            r.raise_for_status()
            mine[kind].append(time.perf_counter() - t)
        with lock:
            for k, v in mine.items():
                samples[k].extend(v)

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    every = [x for v in samples.values() for x in v]
    out = {f"{k}_median_ms": round(statistics.median(v) * 1000, 2) for k, v in samples.items()}
    out["all_median_ms"] = round(statistics.median(every) * 1000, 2)
    out["all_p95_ms"] = round(sorted(every)[int(len(every) * 0.95)] * 1000, 2)
    out["requests"] = len(every)
    out["requests_per_s"] = round(len(every) / wall, 1)
    return out


def main() -> None:
    with Emulator(seed=0, offers=400, boot_delay=0.0) as emu:
        one = bring_up(emu, 1)
        fifty = bring_up(emu, 50)
        v = VastAI(api_key=emu.api_key, server_url=emu.url)
        offers = v.search_offers(query="num_gpus=1", limit=10)
        ids = [int(v.create_instance(id=o["id"], image="bench", disk=10)["new_contract"]) for o in offers]
        emu.wait_running(ids)
        latency = api_latency(emu)
        total_usd = emu.ledger.total_usd()
    print(json.dumps({
        "boot_delay_s": 0.0,
        "bring_up_1_running_s": round(one, 3),
        "bring_up_50_running_s": round(fifty, 3),
        "api_concurrent_clients": 8,
        "api_instances_listed": len(ids),
        **{f"api_{k}": v for k, v in latency.items()},
        "ledger_total_usd": round(total_usd, 6),
        "processes_after_teardown": emu.alive_processes(),
    }, indent=2))


if __name__ == "__main__":
    main()
