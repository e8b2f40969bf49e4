"""The fake ``nvidia-smi`` installed on every emulated box.

A real box answers GPU questions through ``nvidia-smi``; rigsync's probes decide whether a GPU is free from
its memory-used figure. The fake derives that figure live from the box's own process table (each box has its
own PID namespace and ``/proc``): a process whose environment sets ``CUDA_VISIBLE_DEVICES`` counts as a GPU
user of the first listed device, holding ``EMULATOR_GPU_MEM_MIB`` (default 1024) MiB. Shells and ``nohup``
wrappers are not counted, because on a real GPU only the process that opened a CUDA context holds memory.

The script text below is written to the box's ``/usr/local/bin/nvidia-smi``; it reads the box's GPU list from
``/usr/local/bin/.gpus.json``. It runs under the box's ``python3``, so it uses the standard library only.
"""

from __future__ import annotations

SCRIPT = r'''#!/usr/bin/env python3
"""Fake nvidia-smi for the rigsync emulator (see reconciler/emulator/nvidia_smi.py)."""
import json
import os
import sys

CONF = os.path.join(os.path.dirname(os.path.realpath(__file__)), ".gpus.json")
NOT_GPU = {"sh", "bash", "dash", "zsh", "nohup", "setsid", "env", "timeout", "sshd", "nvidia-smi"}
IDLE_MIB = 1


def gpus():
    with open(CONF) as fh:
        return json.load(fh)


def users(count):
    """(pid, gpu_index, mib, name) for every process holding a GPU."""
    out = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = dict(
                    kv.split(b"=", 1) for kv in fh.read().split(b"\0") if b"=" in kv
                )
            with open(f"/proc/{entry}/comm") as fh:
                comm = fh.read().strip()
            with open(f"/proc/{entry}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "Z" or comm in NOT_GPU:
            continue
        cvd = env.get(b"CUDA_VISIBLE_DEVICES")
        if cvd is None:
            continue
        first = cvd.decode(errors="replace").split(",")[0].strip()
        if not first.isdigit() or int(first) >= count:
            continue
        try:
            mib = int(env.get(b"EMULATOR_GPU_MEM_MIB", b"1024"))
        except ValueError:
            mib = 1024
        out.append((int(entry), int(first), mib, comm))
    return sorted(out)


FIELDS = {
    "index": ("index", None),
    "name": ("name", None),
    "gpu_name": ("name", None),
    "uuid": ("uuid", None),
    "gpu_uuid": ("gpu_uuid", None),
    "memory.used": ("memory.used [MiB]", "MiB"),
    "memory.total": ("memory.total [MiB]", "MiB"),
    "memory.free": ("memory.free [MiB]", "MiB"),
    "utilization.gpu": ("utilization.gpu [%]", "%"),
    "utilization.memory": ("utilization.memory [%]", "%"),
    "temperature.gpu": ("temperature.gpu", None),
    "driver_version": ("driver_version", None),
    "count": ("count", None),
    "pci.bus_id": ("pci.bus_id", None),
    "gpu_bus_id": ("pci.bus_id", None),
    "pid": ("pid", None),
    "process_name": ("process_name", None),
    "used_memory": ("used_gpu_memory [MiB]", "MiB"),
    "used_gpu_memory": ("used_gpu_memory [MiB]", "MiB"),
}
GPU_FIELDS = {"index", "name", "gpu_name", "uuid", "gpu_uuid", "memory.used", "memory.total", "memory.free",
              "utilization.gpu", "utilization.memory", "temperature.gpu", "driver_version", "count", "pci.bus_id"}
APP_FIELDS = {"pid", "process_name", "gpu_uuid", "gpu_name", "gpu_bus_id", "used_memory", "used_gpu_memory"}


def gpu_rows(conf, procs):
    rows = []
    for i, g in enumerate(conf):
        mine = [p for p in procs if p[1] == i]
        used = IDLE_MIB + sum(p[2] for p in mine)
        total = int(g["memory_mib"])
        used = min(used, total)
        rows.append({
            "index": i, "name": g["name"], "gpu_name": g["name"], "uuid": g["uuid"], "gpu_uuid": g["uuid"],
            "memory.used": used, "memory.total": total, "memory.free": total - used,
            "utilization.gpu": 97 if mine else 0, "utilization.memory": 41 if mine else 0,
            "temperature.gpu": 71 if mine else 34, "driver_version": g.get("driver", "550.127.05"),
            "count": len(conf), "pci.bus_id": f"00000000:{i + 1:02X}:00.0",
        })
    return rows


def app_rows(conf, procs):
    rows = []
    for pid, idx, mib, comm in procs:
        g = conf[idx]
        rows.append({"pid": pid, "process_name": comm, "gpu_uuid": g["uuid"], "gpu_name": g["name"],
                     "gpu_bus_id": f"00000000:{idx + 1:02X}:00.0", "used_memory": mib, "used_gpu_memory": mib})
    return rows


def csv(rows, fields, allowed, fmt):
    for f in fields:
        if f not in FIELDS or f not in allowed:
            print(f'Field "{f}" is not a valid field to query.', file=sys.stderr)
            print("", file=sys.stderr)
            return 2
    opts = {o.strip() for o in fmt.split(",")}
    if "csv" not in opts:
        print(f'"{fmt}" is not a valid format', file=sys.stderr)
        return 2
    if "noheader" not in opts:
        print(", ".join(FIELDS[f][0] if "nounits" not in opts else FIELDS[f][0].split(" [")[0] for f in fields))
    for row in rows:
        cells = []
        for f in fields:
            unit = FIELDS[f][1]
            val = str(row[f])
            if unit and "nounits" not in opts:
                val = f"{val} {unit}"
            cells.append(val)
        print(", ".join(cells))
    return 0


def table(conf, procs):
    rows = gpu_rows(conf, procs)
    print("+-----------------------------------------------------------------------------+")
    print("| NVIDIA-SMI 550.127.05   (rigsync emulator)          CUDA Version: 12.4     |")
    print("|-------------------------------+----------------------+----------------------+")
    for r in rows:
        mem = f"{r['memory.used']}MiB / {r['memory.total']}MiB"
        print(f"| {r['index']:>3}  {r['name']:<24} | {mem:>20} | {r['utilization.gpu']:>3}%      Default |")
    print("+-----------------------------------------------------------------------------+")
    print("| Processes:                                                                  |")
    for a in app_rows(conf, procs):
        print(f"|  GPU {a['gpu_bus_id'][-7:-5]}  PID {a['pid']:>7}  {a['process_name']:<28} {a['used_memory']:>6}MiB |")
    print("+-----------------------------------------------------------------------------+")
    return 0


def main(argv):
    conf = gpus()
    fmt = "csv"
    query_gpu = query_apps = None
    select = None
    it = iter(argv)
    for arg in it:
        key, eq, val = arg.partition("=")
        if key in ("--query-gpu", "--query-compute-apps", "--format", "-i", "--id") and not eq:
            val = next(it, "")
        if key == "--query-gpu":
            query_gpu = val
        elif key == "--query-compute-apps":
            query_apps = val
        elif key == "--format":
            fmt = val
        elif key in ("-i", "--id"):
            select = {int(x) for x in val.split(",") if x.strip().isdigit()}
        elif key in ("-L", "--list-gpus"):
            for i, g in enumerate(conf):
                print(f"GPU {i}: {g['name']} (UUID: {g['uuid']})")
            return 0
        else:
            print(f'Invalid combination of input arguments. Please run "nvidia-smi -h" for help. ({arg})',
                  file=sys.stderr)
            return 2
    procs = users(len(conf))
    if query_gpu is not None:
        rows = [r for r in gpu_rows(conf, procs) if select is None or r["index"] in select]
        return csv(rows, [f.strip() for f in query_gpu.split(",") if f.strip()], GPU_FIELDS, fmt)
    if query_apps is not None:
        rows = [a for a, p in zip(app_rows(conf, procs), procs) if select is None or p[1] in select]
        return csv(rows, [f.strip() for f in query_apps.split(",") if f.strip()], APP_FIELDS, fmt)
    return table(conf, procs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
'''
