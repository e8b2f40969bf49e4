"""Hostile boxes: what a test writes into an emulated box's own directories to make it lie, hang or flood.

Each emulated instance sees ``<box dir>/root`` as its ``/root`` and ``<box dir>/bin`` as its ``/usr/local/bin``
(reconciler/emulator/sshd_boxes.py), and the test can write both from the host. The probe runs under the first of
``remote.PYTHON_CANDIDATES`` that runs (``box/probe.sh``); the first is ``$HOME/venv/bin/python``, so a liar put
there is the one that answers. It passes every other use through to the box's real python3 (the job's own
``{{ python }}`` and the other box programs), so only the probe's answer is forged.

``sentinel`` starts an unrelated process inside a box's namespace (``nsenter`` into its PID 1's namespaces): if
anything on the box runs ``kill -- -1``, the sentinel dies with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from reconciler.emulator import Emulator
from reconciler.remote import PYTHON_CANDIDATES

LIAR_PATH = "venv/bin/python"  # under the box's /root: PYTHON_CANDIDATES[0] is $HOME/venv/bin/python
assert PYTHON_CANDIDATES[0] == "$HOME/" + LIAR_PATH, PYTHON_CANDIDATES
FORGED_METRIC = 123456.0

# The liar: a shell front for python. The probe bundle starts with this marker (remote.commands._BUNDLE_HEAD), as
# does the harvest's: a box with a forged harvest (``make_harvest_liar``) answers it with that stream instead.
_FRONT = """#!/bin/sh
for p in /usr/bin/python3 /usr/local/bin/python3; do [ -x "$p" ] && REAL=$p && break; done
case "$*" in
  *"rigsync: probe.py"*) [ -f /root/.adv/mode ] && RS_REAL_PY=$REAL exec "$REAL" /root/.adv/liar.py "$@" ;;
  *"rigsync: harvest.py"*) [ -f /root/.adv/harvest.tar ] && exec cat /root/.adv/harvest.tar ;;
esac
exec "$REAL" "$@"
"""

# What the liar prints, by mode. "liar" runs the real probe and doctors its document; the others replace it.
_LIAR = r"""
import json, os, subprocess, sys, time
mode = open("/root/.adv/mode").read().strip()
conf = json.load(open("/root/.adv/conf.json"))
now = time.time()
out = sys.stdout
if mode == "nested":
    depth = 200000
    out.write('{"v":1,"box_now":%f,"runs":' % now + "[" * depth + "]" * depth + "}\n")
elif mode == "flood":
    out.write('{"v":1,"box_now":%f,"pad":"' % now)
    chunk = "A" * (1 << 20)
    for _ in range(conf.get("flood_mib", 400)):
        out.write(chunk)
    out.write('"}\n')
elif mode == "endless":
    out.write('{"v":1,"box_now":%f,"runs":[' % now)
    item = '{"run_id":"x","attempt":1},' * 4096
    while True:
        out.write(item)
else:
    env = dict(os.environ, RS_BEST_PY="/root/venv/bin/python")
    real = subprocess.run([os.environ["RS_REAL_PY"]] + sys.argv[1:], env=env, stdout=subprocess.PIPE, check=False)
    doc = json.loads(real.stdout)
    for r in doc.get("runs", []):
        r["pid"] = 1
        r["pid_alive"] = True

    def won(run_id, attempt=1):
        return {"run_id": run_id, "attempt": attempt, "gpu_mask": [0], "pid": 1, "pid_alive": False,
                "started_at": now - 20, "heartbeat_age_s": 1.0, "exit_code": 0, "ended_at": now - 2,
                "code_commit": None, "desired_commit": None, "killed_reason": None,
                "last_metrics": {"step": 1, "episode_reward": conf["metric"]},
                "best_metric": conf["metric"], "final_metric": conf["metric"], "metrics_age_s": 1.0}

    # a box can always lie about what really runs on it; the forgeries are runs never launched here
    real = {r.get("run_id") for r in doc.get("runs", [])}
    for run_id in conf["forge"]:
        if run_id not in real:
            doc["runs"].append(won(run_id))
    doc["runs"].append(won("../../tmp/evil"))
    doc["runs"].append(won("evil\u202e\x1b[31m\x07"))
    # 1,000 GPUs keep the document under the probe's byte bound: these claims must be capped, not make the box
    # unusable (the smi_garbage box claims 100,000 through nvidia-smi)
    gpus = [{"index": i, "memory_used_mib": 0, "memory_total_mib": 24576, "utilization_pct": 0.0}
            for i in range(1000)]
    gpus.append({"index": -1, "memory_used_mib": 0, "memory_total_mib": 24576, "utilization_pct": 0.0})
    gpus.append({"index": 10 ** 23, "memory_used_mib": 0, "memory_total_mib": 10 ** 23, "utilization_pct": 0.0})
    doc["gpus"] = gpus
    out.write(json.dumps(doc) + "\n")
"""

# A replaced nvidia-smi, by mode. The real probe asks for index,memory.used,memory.total,utilization.gpu.
SMI = {
    "garbage": """#!/bin/sh
echo "-1, 0, 24576, 0"
echo "100000000000000000000000, 0, 100000000000000000000000, 0"
echo "0, NaN, inf, -5"
echo "zz, \\033[31m, \\342\\200\\256, 1e400"
i=0
while [ $i -lt 100000 ]; do echo "$i, 0, 24576, 0"; i=$((i+1)); done
""",
    "hang": "#!/bin/sh\nexec sleep 100000\n",
    "endless": "#!/bin/sh\nexec yes '0, 0, 24576, 0'\n",
}


def box_dir(emu: Emulator, iid: int) -> Path:
    return emu.host_root(iid).parent


def make_liar(emu: Emulator, iid: int, mode: str, *, forge: Iterable[str] = (), **conf: Any) -> None:
    """Put a liar probe interpreter on box ``iid``: ``liar`` (doctored real probe: forged runs, pid 1, 1,000
    GPUs, GPU -1 and 10^23), ``nested`` (JSON nested 200,000 deep), ``flood`` (``flood_mib`` MiB), ``endless``
    (never ends)."""
    root = emu.host_root(iid)
    adv = root / ".adv"
    adv.mkdir(parents=True, exist_ok=True)
    (adv / "liar.py").write_text(_LIAR)
    (adv / "conf.json").write_text(json.dumps({"forge": list(forge), "metric": FORGED_METRIC, **conf}))
    (adv / "mode").write_text(mode + "\n")
    _install_front(root)


def make_harvest_liar(emu: Emulator, iid: int, stream: bytes) -> None:
    """Make box ``iid`` answer every harvest with ``stream`` (``adversary.streams``) instead of ``harvest.py``'s."""
    root = emu.host_root(iid)
    adv = root / ".adv"
    adv.mkdir(parents=True, exist_ok=True)
    (adv / "harvest.tar").write_bytes(stream)
    _install_front(root)


def _install_front(root: Path) -> None:
    front = root / LIAR_PATH
    front.parent.mkdir(parents=True, exist_ok=True)
    tmp = front.with_name(".python.tmp")
    tmp.write_text(_FRONT)
    tmp.chmod(0o755)
    os.replace(tmp, front)


def make_smi(emu: Emulator, iid: int, mode: str) -> None:
    """Replace box ``iid``'s nvidia-smi with a hostile one (``SMI``: garbage, hang, endless)."""
    path = box_dir(emu, iid) / "bin" / "nvidia-smi"
    tmp = path.with_name(".nvidia-smi.tmp")
    tmp.write_text(SMI[mode])
    tmp.chmod(0o755)
    os.replace(tmp, path)


def box_init(emu: Emulator, iid: int) -> int:
    """The host pid of box ``iid``'s PID 1 (its sshd): the child of its ``unshare`` process."""
    boot = str(box_dir(emu, iid) / "boot.sh").encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            if b"unshare" in cmd and boot in cmd:
                kids = Path(f"/proc/{entry}/task/{entry}/children").read_text().split()
                if kids:
                    return int(kids[0])
    raise AssertionError(f"box {iid}: no namespace init found")


def sentinel(emu: Emulator, iid: int, tag: str) -> int:
    """Start an unrelated long-lived process inside box ``iid`` (its own session); its host pid."""
    init = box_init(emu, iid)
    marker = f"adv-sentinel-{tag}-{iid}"
    proc = subprocess.Popen(
        ["nsenter", "-t", str(init), "-p", "-m", "setsid", "-f", "bash", "-c", f"exec -a {marker} sleep 100000"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pid = find_marker(marker)
        if pid is not None:
            return pid
        time.sleep(0.05)
    raise AssertionError(f"box {iid}: the sentinel did not start")


def find_marker(marker: str) -> int | None:
    needle = marker.encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if Path(f"/proc/{entry}/cmdline").read_bytes().startswith(needle):
                    return int(entry)
    return None


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
