"""Bootstrap cache: a box's bootstrap seconds cold (it runs the script, then packs and uploads what it built) vs warm
(a new box with the same key downloads and unpacks that instead of running the script).

Real parts throughout: the emulator's sshd boxes rented through the real ``vastai`` SDK, paramiko, and a real S3
server on loopback (SeaweedFS, ``reconciler.emulator.s3server``) behind ``S3Store``, which mints the presigned URLs
the boxes use themselves; each bootstrap goes through ``apply``'s ``Bootstrap`` branch, applied every
``--poll`` seconds as the controller's cycles would (the seconds are from the first apply to the answer ``ok``, so
they include up to one poll of latency each).

The bootstrap really installs something: it makes a venv (``python3 -m venv``, pip included), pip-installs a
generated wheel (``--modules`` modules of generated Python, compiled to bytecode by pip) from a local wheelhouse
with ``--no-index``, and writes ``--data-mb`` MB of generated data files beside it (model weights, a dataset),
all under the cached path ``/root/venv``. The warm box's venv is then used: its Python imports the package.

Printed JSON: ``cold_s``, ``warm_s``, ``speedup`` (cold / warm), ``cache_bytes`` (the uploaded tar), ``venv_mb``,
the cold and warm boxes' last outcomes, ``warm_ran_script`` (false: the marker the script appends to outside the
cached paths is absent on the warm box), ``warm_import`` (what the warm venv's package answered), ``host`` (cores,
load averages: other work on the host slows both) and ``wall_s``.
Kept under two minutes at the defaults.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from reconciler.adapters.archive import ShardedRunArchive
from reconciler.adapters.box_control import ShellBoxes
from reconciler.adapters.s3store import S3Store
from reconciler.adapters.ssh import SshShell
from reconciler.adapters.vast import VastProvider
from reconciler.apply import ApplyContext, apply
from reconciler.core.actions import Bootstrap, Plan, ReasonCode
from reconciler.core.identity import box_cache_key
from reconciler.core.model import Budget, Desired, Fleet, Instance, Observed, OfferFilters, Pool
from reconciler.desired.fields import script_hash
from reconciler.emulator import Emulator
from reconciler.emulator.s3server import S3Server, start_s3_server
from reconciler.emulator.testing import make_keypair
from reconciler.plan.executable import executable
from reconciler.ports import ResultStore
from reconciler.settings.object_store import StoreConfig

FLEET = "bcache"
WHEEL_NAME = "rsbench"


def s3_store(server: S3Server, prefix: str) -> S3Store:
    """``S3Store`` on the server's bucket under ``prefix``, with its credentials (the controller's environment)."""
    return S3Store(StoreConfig(bucket=server.bucket, prefix=prefix, endpoint=server.endpoint), FLEET, env=server.env())


def rent_boxes(emulator: Emulator, n: int) -> list[Instance]:
    """``n`` running boxes of the fleet, rented through the real SDK, as the provider lists them."""
    provider = VastProvider(api_key=emulator.api_key, server_url=emulator.url)
    offers = provider.search_offers(OfferFilters(verified=False), disk_gb=10)
    ids = [
        provider.create_instance(o.id, image="img", disk_gb=10, label=f"rigsync:{FLEET}:s-{o.id}", onstart="", env={})
        for o in offers[:n]
    ]
    emulator.wait_running(ids)
    listed = {i.id: i for i in provider.list_instances()}
    return [listed[i] for i in ids]


def bootstrap_until_done(
    emulator: Emulator, shell: SshShell, store: ResultStore, box: Instance, pool: Pool, archive: Path, *,
    poll_s: float = 0.3, timeout_s: float = 120.0,
) -> list[str]:
    """Apply ``Bootstrap`` to ``box`` every ``poll_s`` (as cycles would) until it answers done; the outcomes'
    details. ``AssertionError`` when one fails or it is not done within ``timeout_s``."""
    desired = Desired(fleet=Fleet(name=FLEET, pools=(pool,)), budget=Budget(), sweeps=(), runs=())
    ctx = ApplyContext(
        provider=VastProvider(api_key=emulator.api_key, server_url=emulator.url), boxes=ShellBoxes(shell),
        desired=desired, observed=Observed(instances=(box,)), archive=ShardedRunArchive(archive),
        code_tar=lambda commit, paths: b"", now=time.time, store=store,
    )
    planned = Bootstrap(reason="bootstrap", code=ReasonCode.BOOTSTRAP_MISSING, instance_id=box.id,
                        script_hash=pool.bootstrap_hash)
    (action,) = executable(desired, ctx.observed, [planned])  # as the planner finishes it: its script and cache
    details: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        outcome = apply(Plan(actions=(action,)), ctx).outcomes[0]
        assert outcome.ok, outcome.detail
        details.append(outcome.detail)
        if outcome.detail.startswith("bootstrap ok"):
            return details
        time.sleep(poll_s)
    raise AssertionError(f"bootstrap not done in {timeout_s} s: {details[-3:]}")


def on_box(emulator: Emulator, box: Instance, path: str) -> Path:
    """The host path of ``path`` under a box's /root (bind-mounted from its directory)."""
    assert path.startswith("/root/"), path
    return emulator.host_root(box.id) / path.removeprefix("/root/")


def build_wheel(wheelhouse: Path, modules: int) -> Path:
    """A pure-Python wheel of ``modules`` generated modules (~40 KB of code each) and an ``__init__`` that imports
    them all: something for pip to unpack, record and byte-compile."""
    wheelhouse.mkdir(parents=True, exist_ok=True)
    version = "1.0"
    dist = f"{WHEEL_NAME}-{version}.dist-info"
    files: dict[str, bytes] = {}
    for m in range(modules):
        body = "".join(f"def f{m}_{i}(x):\n    return x * {i} + {m} - len(str(x))\n\n" for i in range(700))
        files[f"{WHEEL_NAME}/m{m}.py"] = body.encode()
    init = "".join(f"from {WHEEL_NAME} import m{m}\n" for m in range(modules))
    files[f"{WHEEL_NAME}/__init__.py"] = (init + f"VALUE = m0.f0_3(2) + {modules}\n").encode()
    files[f"{dist}/METADATA"] = f"Metadata-Version: 2.1\nName: {WHEEL_NAME}\nVersion: {version}\n".encode()
    files[f"{dist}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: rigsync-bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = wheelhouse / f"{WHEEL_NAME}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    return wheel


def bench_pool(wheelhouse: Path, data_mb: int, marker: str) -> Pool:
    script = (
        "set -e\n"
        f"echo ran >> {marker}\n"
        "rm -rf /root/venv\n"
        "python3 -m venv /root/venv\n"
        f"/root/venv/bin/pip install -q --no-index --find-links {wheelhouse} {WHEEL_NAME}\n"
        "mkdir -p /root/venv/share/data\n"
        f"/root/venv/bin/python - <<'EOF'\n"
        "import hashlib, os\n"
        "seed = b'rigsync'\n"
        f"for i in range({data_mb}):\n"
        "    block = hashlib.shake_256(seed + str(i).encode()).digest(1 << 20)\n"
        "    with open(f'/root/venv/share/data/part{i:04d}.bin', 'wb') as f:\n"
        "        f.write(block)\n"
        "EOF\n"
    )
    return Pool(name="default", image="img", bootstrap_path="desired/bootstrap.sh", bootstrap_script=script,
                bootstrap_hash=script_hash(script), bootstrap_cache=("/root/venv",))


def _tree_mb(path: Path) -> float:
    return round(sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink()) / 1e6, 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--modules", type=int, default=1200, help="modules in the generated wheel (default 1200)")
    ap.add_argument("--data-mb", type=int, default=200, help="MB of generated data the script writes (default 200)")
    ap.add_argument("--poll", type=float, default=0.5, help="seconds between applies of Bootstrap (default 0.5)")
    args = ap.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rigsync-bench-bcache-") as tmp_name:
        tmp = Path(tmp_name)
        keys = make_keypair(tmp / "keys")
        wheel = build_wheel(tmp / "wheelhouse", args.modules)
        (tmp / "wheelhouse").chmod(0o755)
        tmp.chmod(0o755)  # the boxes read the wheelhouse from the host's /tmp
        with Emulator(seed=7, offers=50, boot_delay=0.2) as emu, start_s3_server() as server:
            emu.add_ssh_key(keys.public)
            cold, warm = rent_boxes(emu, 2)
            store = s3_store(server, "bench")
            marker = "/root/bench-script-ran.log"
            pool = bench_pool(tmp / "wheelhouse", args.data_mb, marker)
            with SshShell(private_key=keys.private_path, known_hosts=tmp / "known_hosts", connect_timeout=5) as shell:
                t0 = time.monotonic()
                cold_out = bootstrap_until_done(emu, shell, store, cold, pool, tmp / "archive", poll_s=args.poll)
                cold_s = time.monotonic() - t0
                t0 = time.monotonic()
                warm_out = bootstrap_until_done(emu, shell, store, warm, pool, tmp / "archive", poll_s=args.poll)
                warm_s = time.monotonic() - t0
                key = box_cache_key(pool, warm)
                recorded = store.cache_download(key, ttl_s=60) if key else None
                use = f"/root/venv/bin/python -c 'import {WHEEL_NAME}; print({WHEEL_NAME}.VALUE)'"
                answer = shell.run(warm.ssh, use, timeout=60) if warm.ssh else None
            out = {
                "cold_s": round(cold_s, 2),
                "warm_s": round(warm_s, 2),
                "speedup": round(cold_s / warm_s, 2) if warm_s > 0 else None,
                "cache_key": key,
                "cache_bytes": recorded.size if recorded else None,
                "venv_mb": _tree_mb(on_box(emu, warm, "/root/venv")),
                "wheel_mb": round(wheel.stat().st_size / 1e6, 1),
                "cold_outcome": cold_out[-1],
                "warm_outcome": warm_out[-1],
                "warm_ran_script": on_box(emu, warm, marker).exists(),
                "warm_import": answer.stdout.decode().strip() if answer and answer.exit_code == 0 else None,
                "modules": args.modules,
                "data_mb": args.data_mb,
                "poll_s": args.poll,
                "host": {"cores": os.cpu_count(), "load": [round(x, 2) for x in os.getloadavg()]},
                "wall_s": round(time.monotonic() - started, 1),
            }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
