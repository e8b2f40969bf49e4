"""A fleet that floods every channel, and the controller's peak RSS while it runs (issue 20, point 5).

Shared by ``tests/integration/test_adversary_memory.py`` (the bound, asserted) and ``bench/flood_rss.py`` (the
figures: an honest fleet against a flooded one). ``run_fleet`` makes a fleet repository, starts ``rigsync run``
(the console script) against the emulator, makes its first boxes hostile as they boot, and samples the
process's VmHWM for ``seconds``:

* box 1: a probe that never stops printing (``endless``);
* box 2: a probe that prints ``flood_mib`` MiB in one line (``flood``);
* box 3: an nvidia-smi that never stops printing;
* and on whichever box it lands, a job with a 200 MB line in metrics.jsonl and 200 MB of stdout and of stderr.

An honest fleet (``flooded=False``) runs the same sweep with honest jobs and boxes. A controller past
``ceiling_mib`` is SIGKILLed by the sampler (the figure then says ``killed``): an unbounded read would
otherwise take the shared machine's memory with it.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from waiting import wait_for
from world import RIGSYNC, emulator_env, fleet_repo, remote_archive

from adversary import boxes as hostile
from adversary import checks
from adversary.jobs import JOB
from reconciler.core.model import Ownership
from reconciler.emulator import Emulator

BOX_FLOODS = ("endless", "flood", "smi_endless")
SWEEP = """\
name: {name}
code: [experiments]
command: "{{{{ python }}}} experiments/adv_job.py --mode {mode} --out {{{{ run_dir }}}}/metrics.jsonl"
seeds: [{seeds}]
max_runtime: 2m
retries: 0
metrics: {{file: metrics.jsonl, key: episode_reward, goal: max}}
"""


def _poison(emu: Emulator, fleet: str, stop: threading.Event, done: dict[int, str], flood_mib: int) -> None:
    while not stop.wait(0.25):
        for iid in emu.instance_ids():
            if iid in done or len(done) >= len(BOX_FLOODS):
                continue
            with contextlib.suppress(Exception):
                own = Ownership.parse(emu.instance(iid).get("label"))
                if own is None or own.fleet != fleet or emu.status(iid) != "running":
                    continue
                mode = BOX_FLOODS[len(done)]
                if mode == "smi_endless":
                    hostile.make_smi(emu, iid, "endless")
                else:
                    hostile.make_liar(emu, iid, mode, flood_mib=flood_mib)
                done[iid] = mode


def run_fleet(
    emu: Emulator,
    tmp: Path,
    name: str,
    *,
    flooded: bool,
    boxes: int = 3,
    seconds: float = 75.0,
    flood_mib: int = 400,
    ceiling_mib: float = 1536.0,
    until_settled: bool = False,
) -> dict[str, Any]:
    """Run a fleet of ``boxes`` boxes for ``seconds`` under ``rigsync run``; its figures (``peak_rss_mib``...).

    With ``until_settled`` it stops sooner, once the fleet went through everything it sends: every box flood placed
    (when ``flooded``), every run archived at the remote, then three more cycles (``seconds`` only bounds it)."""
    repo = fleet_repo(tmp / "fleet")
    repo.edit_fleet(name=name, max=boxes, idle_timeout="10m")
    repo.set_sweeps(
        {
            "flood": SWEEP.format(name="flood", mode="flood" if flooded else "honest", seeds="1"),
            "calm": SWEEP.format(name="calm", mode="honest", seeds=", ".join(str(s) for s in range(1, boxes))),
        }
    )
    repo.edit("desired/budget.yaml", lambda d: d.update(max_fleet_dph=2.0))
    repo.write("experiments/adv_job.py", JOB)
    repo.commit(f"flood fleet {name}")
    state, data = tmp / "state", tmp / "data"
    state.mkdir()
    data.mkdir()
    env = {**emulator_env(emu, state_dir=state), "RIGSYNC_DATA_DIR": str(data)}
    log = tmp / "daemon.log"
    stop = threading.Event()
    poisoned: dict[int, str] = {}
    poisoner = threading.Thread(target=_poison, args=(emu, name, stop, poisoned, flood_mib), daemon=True)
    t0 = time.monotonic()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [str(RIGSYNC), "run", "--repo", str(repo.work), "--interval", "1"],
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=tmp,
        )
    watch = checks.RssWatch(proc.pid, ceiling_mib=ceiling_mib).start()
    if flooded:
        poisoner.start()
    try:
        runs = 1 + (boxes - 1)  # the flood sweep's one seed and the calm sweep's
        settled: list[int] = []  # the cycle count when every flood was placed and every run archived

        def done() -> bool:
            if proc.poll() is not None or time.monotonic() - t0 >= seconds:
                return True
            if not until_settled:
                return False
            cycles = len(checks.cycles(log.read_text(errors="replace")))
            if not settled and len(poisoned) >= (len(BOX_FLOODS) if flooded else 0) and len(
                    {r["run_id"] for r in remote_archive(repo.remote) if "run_id" in r}) >= runs:
                settled.append(cycles)
            return bool(settled) and cycles >= settled[0] + 3

        wait_for("the fleet's time", done, seconds + 60, every=0.5)
        alive = proc.poll() is None
        peak = watch.stop()
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait(timeout=10)
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
        for iid in emu.instance_ids():
            with contextlib.suppress(Exception):
                own = Ownership.parse(emu.instance(iid).get("label"))
                if own is not None and own.fleet == name:
                    emu.destroy_instance(iid)
    text = log.read_text(errors="replace")
    return {
        "fleet": name,
        "flooded": flooded,
        "boxes": boxes,
        "seconds": round(time.monotonic() - t0, 1),
        "peak_rss_mib": round(peak, 1),
        "killed_at_ceiling": watch.killed,
        "ceiling_mib": ceiling_mib,
        "alive_at_end": alive,
        "exit_code": code,
        "cycles": len(checks.cycles(text)),
        "poisoned": {str(k): v for k, v in poisoned.items()},
        "log": str(log),
    }
