"""The emulator's state machine: market, instances (real SSH boxes), account keys, ledger and faults.

``Emulator`` is what tests, benchmarks and ``rigsync emulator`` use; the HTTP layer (``api.py``) only
translates requests into calls on it. Everything that mutates state holds one lock, so the HTTP threads, the
boot monitor and the Python fault API see one consistent world.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from reconciler.emulator.billing import Charge, Ledger
from reconciler.emulator.exceptions import ApiError
from reconciler.emulator.faults import ListFaults, RateLimits
from reconciler.emulator.market import Market, price, speed_factor
from reconciler.emulator.sshd_boxes import AddressPool, Box, BoxSpec, Forwarder, GpuSpec, ProxyHost, Spawner, preflight

# What a create without a ``runtype`` gets (the SDK leaves it out unless asked; the backend picks): SSH with a direct
# port when the offer has one, and the proxy.
DEFAULT_RUNTYPE = "ssh_direc ssh_proxy"
# An emulator's market and account unless told otherwise (`rigsync emulator` shows them in its help)
DEFAULT_SEED = 0
DEFAULT_OFFERS = 200
DEFAULT_BOOT_DELAY_S = 0.5  # seconds a box spends loading
DEFAULT_HOST_PREFIX = "127.0.1"  # the loopback /24 its boxes get addresses in
DEFAULT_CREDIT_USD = 1000.0


@dataclass
class EmulatedInstance:
    id: int
    offer: dict[str, Any]
    box: Box
    image: str
    label: str
    disk: float
    env: dict[str, str]
    onstart: str
    is_bid: bool
    dph_total: float
    storage_per_hour: float
    api_key: str
    start_date: float
    actual_status: str = "created"
    intended_status: str = "running"
    cur_state: str = "running"
    status_msg: str = "created"
    running_since: float | None = None
    ssh_keys: list[str] = field(default_factory=list)
    end_date: float | None = None  # the contract's end (the offer's at rent; an accepted increase moves it)
    contract_ended: bool = False  # it has: processes dead, listed exited, the GPU part no longer billed
    runtype: str = DEFAULT_RUNTYPE  # the record's ``image_runtype``, as the create asked (or ``set_runtype`` forced)
    proxy_port: int = 0  # the forwarder's port on the shared proxy address (the sshd behind it)
    forwarder: Forwarder | None = None  # None while the box is down


@dataclass
class PendingIncrease:
    """A host's price increase on a live contract: pending until answered; accepted, it cuts over at the
    contract's end (``contract_end_date``) to the new rate and runs on to ``ask_end_date``."""

    id: int
    instance_id: int
    host_id: int
    old_gpu_costpersec: float  # per GPU, as the vastai CLI shows it ("$/GPU/hr")
    new_gpu_costpersec: float
    disk_ram_costpersec: float  # per GB of disk; unchanged by an increase here
    contract_end_date: float
    ask_end_date: float
    created_at: float
    new_dph: float
    status: str = "pending"  # pending | accepted | rejected | cut_over | gone

    def row(self) -> dict[str, Any]:
        """The row as ``GET /api/v0/instances/pending-price-increases/`` lists it."""
        return {
            "pending_price_increase_id": self.id, "contract_id": self.instance_id, "host_id": self.host_id,
            "new_gpu_costpersec": self.new_gpu_costpersec, "old_gpu_costpersec": self.old_gpu_costpersec,
            "new_disk_ram_costpersec": self.disk_ram_costpersec, "old_disk_ram_costpersec": self.disk_ram_costpersec,
            "new_bwu_cost": None, "old_bwu_cost": None, "new_bwd_cost": None, "old_bwd_cost": None,
            "new_platform_fee": None, "old_platform_fee": None,
            "contract_end_date": self.contract_end_date, "ask_end_date": self.ask_end_date,
            "created_at": self.created_at,
        }


class Emulator:
    """A Vast.ai API server plus real SSH boxes, for tests, benchmarks and demos.

    Use as a context manager; leaving it tears down every box and the server.
    """

    def __init__(
        self,
        *,
        port: int = 0,
        api_key: str | None = None,
        state_dir: Path | None = None,
        seed: int = DEFAULT_SEED,
        offers: int = DEFAULT_OFFERS,
        boot_delay: float = DEFAULT_BOOT_DELAY_S,
        host_prefix: str = DEFAULT_HOST_PREFIX,
        credit: float = DEFAULT_CREDIT_USD,
        clock: Callable[[], float] | None = None,
        contract_s: tuple[float, float] | None = None,
        ssh_shapes: str = "direct",
        reuse_proxy_ports: bool = False,
    ) -> None:
        # The wall clock of the emulated world (start dates, billing, charges); tests move it to cross a UTC
        # midnight without waiting for one. Boot delays and timeouts still run on the monotonic clock.
        self.clock: Callable[[], float] = clock or time.time
        self.api_key = api_key or secrets.token_hex(32)
        self.boot_delay = boot_delay
        self._port = port
        self._own_state_dir = state_dir is None
        self._state_dir_arg = state_dir
        self.state_dir = Path(state_dir) if state_dir is not None else Path("/nonexistent")
        # contract_s=(lo, hi): every offer's contract ends lo..hi seconds from now (tests need short ones)
        self.market = Market(seed=seed, n=offers, clock=self.clock, contract_s=contract_s, ssh_shapes=ssh_shapes)
        self.ledger = Ledger(clock=self.clock, credit=credit)
        self._pool = AddressPool(host_prefix)
        # The shared SSH proxy host: the prefix's .1, which the address pool never hands to a box.
        self.proxy = ProxyHost(f"{host_prefix}.1", reuse_ports=reuse_proxy_ports)
        self._runtype_override: str | None = None
        self._lock = threading.RLock()
        self._instances: dict[int, EmulatedInstance] = {}
        self._boxes: list[Box] = []
        self._next_id = 31_000_000 + seed % 1000 * 1000 + 1
        self._account_keys: dict[int, dict[str, Any]] = {}
        self._labels: dict[int, str] = {}  # every instance ever created (its charges outlive it)
        self._next_key_id = 1
        self._increases: dict[int, PendingIncrease] = {}  # every increase ever raised, by id (answered ones kept)
        self._next_increase_id = 7001
        self._fail_rules: list[list[Any]] = []  # [prefix, remaining, status]
        self.list_faults = ListFaults()  # the instance list lies (faults.py)
        self.rate_limits = RateLimits()  # 429s per identity and endpoint (faults.py)
        self.latency = 0.0
        self._never_boot_next = False
        self._churn_rate = 0.0
        self._churn_rng = random.Random(0)
        self._stop = threading.Event()
        self._spawner: Spawner | None = None
        self._monitor: threading.Thread | None = None
        self._server: Any = None
        self._server_thread: threading.Thread | None = None
        self.url = ""

    # ---- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> Emulator:
        from reconciler.emulator.api import make_server

        preflight()
        if self._own_state_dir:
            self.state_dir = Path(tempfile.mkdtemp(prefix="rigsync-emu-"))
        else:
            self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "boxes").mkdir(exist_ok=True)
        self._spawner = Spawner()
        self._server = make_server(self, self._port)
        host, port = self._server.server_address[:2]
        self.url = f"http://{host}:{port}"
        self._server_thread = threading.Thread(target=self._server.serve_forever, name="emulator-http", daemon=True)
        self._server_thread.start()
        self._monitor = threading.Thread(target=self._monitor_loop, name="emulator-monitor", daemon=True)
        self._monitor.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._monitor is not None:
            self._monitor.join(timeout=5)
        with self._lock:
            for box in self._boxes:
                box.kill()
            for inst in self._instances.values():
                self._close_forwarder(inst)
            self._instances.clear()
        if self._spawner is not None:
            self._spawner.close()
        if self._own_state_dir and self.state_dir.exists():
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> Emulator:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ---- read side -------------------------------------------------------------------------------------
    def instance_ids(self) -> list[int]:
        with self._lock:
            return sorted(self._instances)

    def host_root(self, instance_id: int) -> Path:
        return self._get(instance_id).box.root

    def instance(self, instance_id: int) -> dict[str, Any]:
        """The instance's API record (what ``show instance`` returns)."""
        with self._lock:
            return self.record(self._get(instance_id))

    def status(self, instance_id: int) -> str:
        with self._lock:
            return self._get(instance_id).actual_status

    def wait_running(self, instance_ids: list[int] | None = None, timeout: float = 30.0) -> None:
        """Block until the given (default: all) instances are ``running``; raise TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                ids = instance_ids if instance_ids is not None else list(self._instances)
                pending = [i for i in ids if i in self._instances and self._instances[i].actual_status != "running"]
            if not pending:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"instances not running after {timeout}s: {pending}")
            time.sleep(0.02)

    def alive_processes(self) -> int:
        """Processes still running for any box (namespaced jobs, sshd, unshare); 0 after teardown."""
        found: set[int] = set()
        with self._lock:
            boxes = list(self._boxes)
        for box in boxes:
            if box.running_process() and box.proc is not None:
                found.add(box.proc.pid)
            if not box.dead:
                found.update(box.pids())
        marker = str(self.state_dir).encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if marker in fh.read():
                        found.add(int(entry))
            except OSError:
                continue
        found.discard(os.getpid())
        return len(found)

    def _get(self, instance_id: int) -> EmulatedInstance:
        with self._lock:
            inst = self._instances.get(instance_id)
        if inst is None:
            raise ApiError(404, "no_such_instance", f"Instance {instance_id} not found.")
        return inst

    # ---- account ----------------------------------------------------------------------------------------
    def add_ssh_key(self, public_key: str) -> dict[str, Any]:
        key = public_key.strip()
        parts = key.split()
        if len(parts) < 2 or not parts[0].startswith(("ssh-", "ecdsa-", "sk-")):
            raise ApiError(400, "invalid_args", "Invalid SSH key: expected an OpenSSH public key line.")
        with self._lock:
            for existing in self._account_keys.values():
                if existing["public_key"].split()[:2] == parts[:2]:
                    return dict(existing)
            kid = self._next_key_id
            self._next_key_id += 1
            rec = {"id": kid, "user_id": 1, "public_key": key, "key": key, "created_at": self.clock(),
                   "deleted_at": None}
            self._account_keys[kid] = rec
            return dict(rec)

    def ssh_keys(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(k) for k in self._account_keys.values()]

    def update_ssh_key(self, key_id: int, public_key: str) -> None:
        with self._lock:
            if key_id not in self._account_keys:
                raise ApiError(404, "no_such_key", f"SSH key {key_id} not found.")
            self._account_keys[key_id]["public_key"] = public_key.strip()
            self._account_keys[key_id]["key"] = public_key.strip()

    def delete_ssh_key(self, key_id: int) -> None:
        with self._lock:
            if self._account_keys.pop(key_id, None) is None:
                raise ApiError(404, "no_such_key", f"SSH key {key_id} not found.")

    def attach_ssh_key(self, instance_id: int, public_key: str) -> None:
        key = public_key.strip()
        if len(key.split()) < 2:
            raise ApiError(400, "invalid_args", "Invalid SSH key: expected an OpenSSH public key line.")
        with self._lock:
            inst = self._get(instance_id)
            if key not in inst.ssh_keys:
                inst.ssh_keys.append(key)
            inst.box.write_keys(inst.ssh_keys)

    # ---- instance lifecycle -----------------------------------------------------------------------------
    def create_instance(self, offer_id: int, body: dict[str, Any]) -> int:
        image = body.get("image")
        if not image and not body.get("template_hash_id"):
            raise ApiError(400, "invalid_args", "Invalid image: an image (or template) is required.")
        try:
            disk = float(str(body["disk"])) if body.get("disk") is not None else 10.0
        except (TypeError, ValueError):
            raise ApiError(400, "invalid_args", f"Invalid disk size {body.get('disk')!r}.") from None
        env_raw = body.get("env") or {}
        if not isinstance(env_raw, dict):
            raise ApiError(400, "invalid_args", "env must be an object of NAME: value.")
        env = {str(k): str(v) for k, v in env_raw.items()}
        bid = None if self.list_faults.bids_ignored() else body.get("price")
        with self._lock:
            self._require_credit()
            offer = self.market.get(offer_id)
            if offer is None or not self.market.is_available(offer_id):
                raise ApiError(
                    404, "invalid_args",
                    f"error 404/3603: no_such_ask  Instance type by id {offer_id} is not available.",
                )
            if disk <= 0 or disk > offer["disk_space"]:
                raise ApiError(
                    400, "invalid_args",
                    f"Invalid disk size {disk:g} GB: the offer has {offer['disk_space']:g} GB available.",
                )
            if bid is not None:
                try:
                    bid = float(str(bid))
                except (TypeError, ValueError):
                    raise ApiError(400, "invalid_args", f"Invalid bid price {bid!r}.") from None
                if bid < offer["min_bid"]:
                    raise ApiError(
                        400, "invalid_args",
                        f"Bid price ${bid:.4f}/hr is below the minimum bid ${offer['min_bid']:.4f}/hr.",
                    )
            self.market.rent(offer_id)
            priced = price(offer, disk, bid is not None)
            if bid is not None:
                disk_hour = priced["search"]["diskHour"]
                priced["dph_base"] = bid
                priced["dph_total"] = round(bid + disk_hour, 6)
            iid = self._next_id
            self._next_id += 1
            ip, inner, direct = self._pool.take()
            runtype = self._runtype_override or str(body.get("runtype") or DEFAULT_RUNTYPE)
            if "ssh_direc" not in runtype.split() or int(offer.get("direct_port_count") or 0) <= 0:
                direct_port: int | None = None
            else:
                direct_port = direct
            api_key = secrets.token_hex(32)
            gpus = [
                GpuSpec(offer["gpu_name"], int(offer["gpu_ram"]),
                        "GPU-" + hashlib.sha1(f"{iid}-{g}".encode()).hexdigest()[:8] + "-emu")
                for g in range(int(offer["num_gpus"]))
            ]
            box_env = {
                **env,
                "CONTAINER_ID": str(iid),
                "CONTAINER_API_KEY": api_key,
                "VAST_CONTAINERLABEL": f"C.{iid}",
                "VAST_URL": self.url,
                "EMULATOR_SPEED_FACTOR": f"{speed_factor(offer['gpu_name']):g}",
            }
            spec = BoxSpec(iid, ip, inner, direct_port, gpus, box_env, str(body.get("onstart") or ""), self.boot_delay,
                           speed_factor(offer["gpu_name"]))
            box = Box(spec, self.state_dir / "boxes" / str(iid))
            keys = [k["public_key"] for k in self._account_keys.values()]
            inst = EmulatedInstance(
                id=iid, offer=priced, box=box, image=str(image or ""), label=str(body.get("label") or ""),
                disk=disk, env=env, onstart=spec.onstart, is_bid=bid is not None,
                dph_total=float(priced["dph_total"]),
                storage_per_hour=float(offer["storage_cost"]) * disk / (30 * 24),
                api_key=api_key, start_date=self.clock(), ssh_keys=keys, runtype=runtype,
                end_date=float(offer["end_date"]) if offer.get("end_date") is not None else None,
            )
            if self._never_boot_next:
                self._never_boot_next = False
                box.dir.mkdir(parents=True, exist_ok=True)
                (box.dir / "never_boot").touch()
                self.ledger.log("never_boot", iid)
            self._instances[iid] = inst
            self._labels[iid] = inst.label
            if self.list_faults.created(iid):
                self.ledger.log("hide", iid, new=True)
            self._boxes.append(box)
            self.ledger.set_rate(iid, inst.dph_total, inst.storage_per_hour)
            self.ledger.log("create", iid, offer_id=offer_id, dph_total=inst.dph_total, is_bid=inst.is_bid,
                            label=inst.label)
            self._boot(inst)
            return iid

    def _boot(self, inst: EmulatedInstance) -> None:
        assert self._spawner is not None
        inst.box.prepare(inst.ssh_keys)
        inst.box.start(self._spawner)
        if inst.forwarder is None:
            inst.forwarder = self.proxy.open((inst.box.spec.ip, inst.box.spec.inner_port), inst.proxy_port or None,
                                             hold_below="jupyter" in inst.runtype)
            inst.proxy_port = inst.forwarder.port
        inst.actual_status = "loading"
        inst.cur_state = "running"
        inst.status_msg = f"Pulling image {inst.image}"
        inst.running_since = None

    def _close_forwarder(self, inst: EmulatedInstance) -> None:
        if inst.forwarder is not None:
            inst.forwarder.close()
            inst.forwarder = None

    def _set_down(self, inst: EmulatedInstance, actual: str, intended: str, msg: str) -> None:
        inst.box.kill()
        self._close_forwarder(inst)
        inst.actual_status = actual
        inst.intended_status = intended
        inst.cur_state = "stopped"
        inst.status_msg = msg
        inst.running_since = None
        self.ledger.set_rate(inst.id, inst.storage_per_hour, inst.storage_per_hour)

    def destroy_instance(self, instance_id: int) -> None:
        with self._lock:
            inst = self._get(instance_id)
            inst.box.remove()
            inst.box.dead = True
            self._close_forwarder(inst)
            if inst.proxy_port:
                self.proxy.release(inst.proxy_port)
            del self._instances[instance_id]
            self.market.release(int(inst.offer["id"]))
            self.ledger.set_rate(instance_id, 0.0)
            for inc in self._increases.values():
                if inc.instance_id == instance_id and inc.status in ("pending", "accepted"):
                    inc.status = "gone"
            self.ledger.log("destroy", instance_id)

    def stop_instance(self, instance_id: int) -> None:
        with self._lock:
            inst = self._get(instance_id)
            if inst.actual_status != "stopped":
                self._set_down(inst, "stopped", "stopped", "stopped by user")
            self.ledger.log("stop", instance_id)

    def start_instance(self, instance_id: int) -> None:
        with self._lock:
            inst = self._get(instance_id)
            if inst.contract_ended:
                raise ApiError(
                    400, "invalid_args",
                    f"Instance {instance_id} cannot be started: its contract ended and the host took the machine back.",
                )
            inst.intended_status = "running"
            if inst.actual_status in ("stopped", "offline", "exited"):
                self._require_credit()
                inst.box.kill()
                self._boot(inst)
                self.ledger.set_rate(instance_id, inst.dph_total, inst.storage_per_hour)
            self.ledger.log("start", instance_id)

    def label_instance(self, instance_id: int, label: str) -> None:
        with self._lock:
            self._get(instance_id).label = label
            self._labels[instance_id] = label
            self.ledger.log("label", instance_id, label=label)

    # ---- credit ------------------------------------------------------------------------------------------------
    def credit_usd(self) -> float:
        """What the account has left (what ``show user`` reports as ``credit``)."""
        return self.ledger.credit_usd()

    def deposit(self, usd: float) -> None:
        """Top the account up by ``usd`` (a credit purchase, listed by ``show invoices-v1 --invoices``)."""
        if not usd > 0:
            raise ApiError(400, "invalid_args", f"Invalid amount {usd!r}: a deposit must be positive.")
        self.ledger.deposit(usd)
        self.ledger.log("deposit", None, usd=usd)

    def charges(self, start: float, end: float) -> list[tuple[Charge, str]]:
        """Every instance's charge inside ``[start, end]`` (destroyed ones included), with its label, by id."""
        out = []
        for iid in self.ledger.instance_ids():
            charge = self.ledger.charge(iid, start, end)
            if charge is not None:
                with self._lock:
                    label = self._labels.get(iid, "")
                out.append((charge, label))
        return out

    def _require_credit(self) -> None:
        if self.ledger.credit_usd() <= 0:
            raise ApiError(
                400, "insufficient_credit",
                f"Insufficient credit: your balance is ${self.ledger.credit_usd():.2f}; add credit to rent.",
            )

    def _stop_for_credit(self) -> None:
        """At zero credit Vast stops every instance of the account (not destroyed: stopped ones bill storage)."""
        with self._lock:
            if self.ledger.credit_usd() > 0:
                return
            for inst in sorted(self._instances.values(), key=lambda i: i.id):
                if inst.actual_status in ("created", "loading", "running"):
                    self._set_down(inst, "stopped", "stopped", "stopped: insufficient credit")
                    self.ledger.log("out_of_credit", inst.id)

    # ---- faults ------------------------------------------------------------------------------------------
    def vanish(self, instance_id: int) -> None:
        """The box dies with everything on it; the API lists it as ``offline``."""
        with self._lock:
            inst = self._get(instance_id)
            self._set_down(inst, "offline", "running", "machine offline")
            inst.cur_state = "running"
            self.ledger.log("vanish", instance_id)

    def set_end_date(self, instance_id: int, at: float) -> None:
        """Move the instance's contract end to ``at`` (epoch seconds; in the past: taken back at the next tick)."""
        with self._lock:
            inst = self._get(instance_id)
            if inst.contract_ended:
                raise ApiError(400, "invalid_args", f"Instance {instance_id}: its contract has already ended.")
            inst.end_date = float(at)
            self.ledger.log("end_date", instance_id, at=inst.end_date)

    def _end_contract(self, inst: EmulatedInstance) -> None:
        """The host takes the box back at its contract's end: processes killed, listed ``exited``, GPU billing over
        (storage bills while it is listed, as for any stopped instance, until destroyed)."""
        with self._lock:
            if inst.id not in self._instances or inst.contract_ended:
                return
            inst.contract_ended = True
            self._set_down(inst, "exited", "stopped", "contract ended: the host took the machine back")
            self.ledger.log("contract_end", inst.id, end_date=inst.end_date)

    def hang(self, instance_id: int) -> None:
        """Freeze every process on the box (SIGSTOP): connects time out, the API still says running."""
        with self._lock:
            self._get(instance_id).box.hang()
            self.ledger.log("hang", instance_id)

    def rekey(self, instance_id: int) -> None:
        """The box's SSH host key changes (reinstalled, or impersonated): new connections see another key."""
        with self._lock:
            self._get(instance_id).box.rekey()
            self.ledger.log("rekey", instance_id)

    def resume(self, instance_id: int) -> None:
        with self._lock:
            self._get(instance_id).box.resume()
            self.ledger.log("resume", instance_id)

    def outbid(self, instance_id: int) -> None:
        """An interruptible instance loses its bid: processes killed, listed ``stopped``, storage still billed."""
        with self._lock:
            inst = self._get(instance_id)
            self._set_down(inst, "stopped", "running", "outbid: a higher bid took this machine")
            self.ledger.log("outbid", instance_id)

    def fail_next(self, path_prefix: str, n: int, status: int = 429) -> None:
        with self._lock:
            self._fail_rules.append([path_prefix, int(n), int(status)])
            self.ledger.log("fail_next", None, path_prefix=path_prefix, n=n, status=status)

    def clear_failures(self, path_prefix: str = "") -> None:
        """Drop the injected failures still pending for paths under ``path_prefix`` (all when empty)."""
        with self._lock:
            self._fail_rules = [r for r in self._fail_rules if not r[0].startswith(path_prefix)]
            self.ledger.log("clear_failures", None, path_prefix=path_prefix)

    # ---- the instance list lies; rate limits per identity (faults.py) ------------------------------------
    def listed_records(self) -> list[dict[str, Any]]:
        """The records the instance list shows: every instance but the hidden ones."""
        return self.list_faults.listed(self.records())

    def set_list_fault(self, fault: str | None, n: int | None = None, error: str = "deprecated_endpoint") -> None:
        """The next ``n`` instance-list requests (each page one; None: until set again) answer ``fault``:
        ``success_false``, ``no_list``, ``cut_short`` or ``endless_token`` (None: the truth again)."""
        self.list_faults.set(fault, n, error)
        self.ledger.log("list_fault", None, fault=fault, n=n, error=error)

    def hide(self, instance_id: int) -> None:
        """The instance list stops showing the instance (it lives on, billed; ``show instance`` still finds it)."""
        self._get(instance_id)
        self.list_faults.hide(instance_id)
        self.ledger.log("hide", instance_id)

    def unhide(self, instance_id: int) -> None:
        self.list_faults.hide(instance_id, hidden=False)
        self.ledger.log("unhide", instance_id)

    def ignore_bids(self, on: bool = True) -> None:
        """Every create from now on rents on-demand whatever bid it carries (False: bids count again): what a rent
        whose bid is lost on the way gets, silently (vast-cli PR #403)."""
        self.list_faults.ignore_bids(on)
        self.ledger.log("ignore_bids", None, on=on)

    def hide_new(self, on: bool = True) -> None:
        """Every instance created from now on is hidden from the list (until ``unhide``), or no longer (False)."""
        self.list_faults.hide_new(on)
        self.ledger.log("hide_new", None, on=on)

    def rate_limit(self, per_s: float | None, burst: int = 1, path_prefix: str = "/api/") -> None:
        """Per identity (the key presented) and endpoint under ``path_prefix``: ``burst`` requests, refilled at
        ``per_s`` a second; more answer 429 ``API requests too frequent`` (per_s None or 0: no limit there)."""
        self.rate_limits.set(path_prefix, per_s, burst)
        self.ledger.log("rate_limit", None, path_prefix=path_prefix, per_s=per_s, burst=burst)

    def take_failure(self, path: str) -> int | None:
        """Called per API request: the injected status to answer with, if a rule matches."""
        with self._lock:
            for rule in self._fail_rules:
                if rule[1] > 0 and path.startswith(rule[0]):
                    rule[1] -= 1
                    self.ledger.log("injected_failure", None, path=path, status=rule[2])
                    return int(rule[2])
            self._fail_rules = [r for r in self._fail_rules if r[1] > 0]
        return None

    def set_runtype(self, runtype: str | None) -> None:
        """Every following create gets ``runtype`` instead of the one it asked for (None: as asked), as a template
        that sets it would: e.g. ``"jupyter ssh_proxy"`` makes rigsync's next boxes proxy-only jupyter boxes."""
        with self._lock:
            self._runtype_override = runtype or None
            self.ledger.log("set_runtype", None, runtype=runtype)

    def set_latency(self, seconds: float) -> None:
        self.latency = max(0.0, float(seconds))
        self.ledger.log("latency", None, seconds=self.latency)

    def never_boot(self, instance_id_or_next: int | None = None) -> None:
        """Make the given still-booting instance, or the next one created, stay ``loading`` forever."""
        with self._lock:
            if instance_id_or_next is None:
                self._never_boot_next = True
                self.ledger.log("never_boot", None, next=True)
                return
            inst = self._get(instance_id_or_next)
            (inst.box.dir / "never_boot").touch()
            self.ledger.log("never_boot", instance_id_or_next)

    def churn(self, rate_per_hour: float, seed: int) -> None:
        """Random vanishes: each running instance dies with hazard ``rate_per_hour`` (per instance-hour)."""
        with self._lock:
            self._churn_rate = max(0.0, float(rate_per_hour))
            self._churn_rng = random.Random(seed)
            self.ledger.log("churn", None, rate_per_hour=self._churn_rate, seed=seed)

    def drift_prices(self, max_fraction: float = 0.1, seed: int | None = None) -> None:
        self.market.drift(max_fraction, seed)
        self.ledger.log("price_drift", None, max_fraction=max_fraction)

    # ---- price increases on live contracts ------------------------------------------------------------------
    def raise_price(self, instance_id: int, dph: float, ask_end_date: float) -> int:
        """The host asks ``dph`` (the instance's new total $/h) from its contract's current end on, running on to
        ``ask_end_date``: a pending row the account may accept or reject. Returns the row's id."""
        with self._lock:
            inst = self._get(instance_id)
            if not (isinstance(dph, int | float) and dph > 0 and dph < 1e6):
                raise ApiError(400, "invalid_args", f"Invalid dph {dph!r}: a positive $/h is required.")
            if inst.end_date is None:
                raise ApiError(400, "invalid_args", f"Instance {instance_id} has no contract end to extend.")
            if not float(ask_end_date) > inst.end_date:
                raise ApiError(400, "invalid_args", "ask_end_date must be after the contract's current end.")
            storage_h = inst.storage_per_hour
            disk_gb = inst.disk if inst.disk > 0 else 1.0
            gpus = max(1, int(inst.offer["num_gpus"]))  # the row's GPU price is per GPU, as the CLI shows it
            inc = PendingIncrease(
                id=self._next_increase_id, instance_id=instance_id, host_id=int(inst.offer["host_id"]),
                old_gpu_costpersec=(inst.dph_total - storage_h) / gpus / 3600.0,
                new_gpu_costpersec=(float(dph) - storage_h) / gpus / 3600.0,
                disk_ram_costpersec=storage_h / disk_gb / 3600.0,
                contract_end_date=inst.end_date, ask_end_date=float(ask_end_date), created_at=self.clock(),
                new_dph=float(dph),
            )
            self._next_increase_id += 1
            for old in self._increases.values():  # one pending row per contract: a new ask replaces the last
                if old.instance_id == instance_id and old.status == "pending":
                    old.status = "gone"
            self._increases[inc.id] = inc
            self.ledger.log("price_increase", instance_id, pending_id=inc.id, old_dph=inst.dph_total,
                            new_dph=inc.new_dph, applies_at=inc.contract_end_date, ask_end_date=inc.ask_end_date)
            return inc.id

    def pending_increases(self, caller_instance: int | None = None) -> list[dict[str, Any]]:
        """The pending rows (only the caller's own contract's for a per-instance key), by id."""
        with self._lock:
            return [
                inc.row() for inc in sorted(self._increases.values(), key=lambda i: i.id)
                if inc.status == "pending" and (caller_instance is None or inc.instance_id == caller_instance)
            ]

    def answer_increase(self, pending_id: int, *, accept: bool, caller_instance: int | None = None) -> int:
        """Accept or reject a pending row; returns its contract id. A row that is not pending (answered, gone,
        never raised, or another instance's for a per-instance key) is 404 ``no_pending_price_increase``."""
        with self._lock:
            inc = self._increases.get(pending_id)
            if (
                inc is None or inc.status != "pending"
                or (caller_instance is not None and inc.instance_id != caller_instance)
            ):
                raise ApiError(404, "no_pending_price_increase", f"No pending price increase {pending_id}.")
            inc.status = "accepted" if accept else "rejected"
            self.ledger.log("price_increase_accepted" if accept else "price_increase_rejected", inc.instance_id,
                            pending_id=inc.id, new_dph=inc.new_dph, applies_at=inc.contract_end_date)
            if accept:
                self.price_cutovers()  # an answer after the contract's end cuts over at once
            return inc.instance_id

    def increase_status(self, pending_id: int) -> str:
        """pending, accepted (its cutover still ahead), rejected (tombstoned), cut_over, or gone."""
        with self._lock:
            inc = self._increases.get(pending_id)
            if inc is None:
                raise ApiError(404, "no_pending_price_increase", f"No price increase {pending_id}.")
            return inc.status

    def price_cutovers(self) -> None:
        """Accepted increases whose contract end has come: from that moment the ledger bills the new rate and the
        contract ends at ``ask_end_date``. (Called each monitor tick, and before anything that reads end dates.)"""
        with self._lock:
            now = self.clock()
            for inc in sorted(self._increases.values(), key=lambda i: i.id):
                if inc.status != "accepted" or now < inc.contract_end_date:
                    continue
                inst = self._instances.get(inc.instance_id)
                inc.status = "cut_over"
                if inst is None:
                    continue
                inst.dph_total = inc.new_dph
                inst.end_date = inc.ask_end_date
                if inst.actual_status in ("created", "loading", "running"):
                    self.ledger.set_rate(inst.id, inst.dph_total, inst.storage_per_hour, at=inc.contract_end_date)
                self.ledger.log("price_cutover", inst.id, pending_id=inc.id, dph_total=inst.dph_total,
                                end_date=inst.end_date, at=inc.contract_end_date)

    # ---- background --------------------------------------------------------------------------------------
    def _monitor_loop(self) -> None:
        tick = 0.05
        last = time.monotonic()
        while not self._stop.wait(tick):
            now = time.monotonic()
            dt, last = now - last, now
            with contextlib.suppress(Exception):
                self._stop_for_credit()
            with contextlib.suppress(Exception):
                self.price_cutovers()
            with self._lock:
                insts = list(self._instances.values())
            for inst in insts:
                with contextlib.suppress(Exception):
                    self._watch(inst, dt)

    def _watch(self, inst: EmulatedInstance, dt: float) -> None:
        if not inst.contract_ended and inst.end_date is not None and self.clock() >= inst.end_date:
            self.price_cutovers()  # an accepted increase extends the contract at this very end: not taken back then
            if inst.end_date is not None and self.clock() >= inst.end_date:
                self._end_contract(inst)
                return
        if inst.actual_status == "loading" and inst.box.booted():
            with self._lock:
                if inst.id in self._instances and inst.actual_status == "loading":
                    inst.actual_status = "running"
                    inst.status_msg = f"success, running {inst.image}/ssh"
                    inst.running_since = self.clock()
                    self.ledger.log("running", inst.id)
            return
        if inst.actual_status in ("loading", "running") and not inst.box.running_process():
            with self._lock:
                if inst.id in self._instances and inst.actual_status in ("loading", "running"):
                    self._set_down(inst, "offline", "running", "machine offline")
                    inst.cur_state = "running"
                    self.ledger.log("offline", inst.id, reason="box process exited")
            return
        if self._churn_rate > 0 and inst.actual_status == "running":
            with self._lock:
                hit = self._churn_rng.random() < self._churn_rate * dt / 3600
            if hit and inst.id in self._instances:
                self.vanish(inst.id)
                self.ledger.log("churn_vanish", inst.id)

    # ---- records -----------------------------------------------------------------------------------------
    def record(self, inst: EmulatedInstance) -> dict[str, Any]:
        o = inst.offer
        s = inst.box.spec
        now = self.clock()
        uptime = (now - inst.running_since) / 60 if inst.running_since else 0.0
        env_pairs = [[k, v] for k, v in inst.env.items()]
        direct = s.direct_port
        # The jupyter quirk: the API reports the proxy port one below the sshd behind it (the CLI adds one back).
        ssh_port = inst.proxy_port - 1 if "jupyter" in inst.runtype else inst.proxy_port
        return {
            "id": inst.id, "machine_id": o["machine_id"], "host_id": o["host_id"], "bundle_id": o["bundle_id"],
            "actual_status": inst.actual_status, "intended_status": inst.intended_status,
            "cur_state": inst.cur_state, "next_state": inst.intended_status, "status_msg": inst.status_msg,
            "label": inst.label or None, "template_id": None, "template_hash_id": None, "template_name": None,
            "image_uuid": inst.image, "image_args": [], "image_runtype": inst.runtype,
            "extra_env": env_pairs, "onstart": inst.onstart, "jupyter_token": hashlib.sha256(
                inst.api_key.encode()).hexdigest(),
            "public_ipaddr": s.ip, "local_ipaddrs": f"{s.ip}\n", "ssh_host": self.proxy.ip, "ssh_idx": "0",
            "ssh_port": ssh_port, "machine_dir_ssh_port": direct,
            "direct_port_count": 1 if direct else 0, "direct_port_start": direct or -1, "direct_port_end": direct or -1,
            "ports": {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": str(direct)}]} if direct else {},
            "static_ip": o["static_ip"], "geolocation": o["geolocation"], "verification": o["verification"],
            "rentable": True, "hosting_type": o["hosting_type"], "external": o["external"],
            "start_date": inst.start_date, "end_date": inst.end_date,
            "duration": max(0.0, inst.end_date - now) if inst.end_date is not None else None,  # seconds left
            "uptime_mins": round(uptime, 3), "client_run_time": 1.0, "host_run_time": 1.0,
            "num_gpus": o["num_gpus"], "gpu_name": o["gpu_name"], "gpu_arch": "nvidia",
            "gpu_ram": o["gpu_ram"], "gpu_totalram": o["gpu_ram"], "gpu_frac": 1.0, "gpu_lanes": o["gpu_lanes"],
            "gpu_mem_bw": o["gpu_mem_bw"], "gpu_util": 0.0, "gpu_temp": 40.0, "bw_nvlink": o["bw_nvlink"],
            "cuda_max_good": o["cuda_max_good"], "driver_version": o["driver_version"],
            "compute_cap": o["compute_cap"], "cpu_name": o["cpu_name"], "cpu_arch": o["cpu_arch"],
            "cpu_cores": o["cpu_cores"], "cpu_cores_effective": o["cpu_cores_effective"], "cpu_ram": o["cpu_ram"],
            "cpu_util": 0.0, "mem_limit": o["cpu_ram"] / 1000, "mem_usage": 0.0, "vmem_usage": 0.0,
            "disk_name": o["disk_name"], "disk_space": inst.disk, "disk_bw": o["disk_bw"], "disk_usage": 0.0,
            "disk_util": 0.0, "inet_up": o["inet_up"], "inet_down": o["inet_down"], "inet_up_billed": None,
            "inet_down_billed": None, "pci_gen": o["pci_gen"], "pcie_bw": o["pcie_bw"], "mobo_name": o["mobo_name"],
            "os_version": o["os_version"], "is_bid": inst.is_bid, "min_bid": o["min_bid"],
            "dph_base": o["dph_base"], "dph_total": inst.dph_total, "storage_cost": o["storage_cost"],
            "storage_total_cost": round(inst.storage_per_hour, 7), "vram_costperhour": o["vram_costperhour"],
            "credit_balance": None, "credit_discount": None, "credit_discount_max": 0.4,
            "dlperf": o["dlperf"], "dlperf_per_dphtotal": o["dlperf_per_dphtotal"],
            "flops_per_dphtotal": o["flops_per_dphtotal"], "total_flops": o["total_flops"], "score": o["score"],
            "reliability2": o["reliability2"], "search": o["search"], "instance": o["instance"],
            "time_remaining": "", "time_remaining_isbid": "", "country_code": None, "webpage": None,
            "volume_info": [],
            # Not on the real service: the emulated work speed of this box (also EMULATOR_SPEED_FACTOR on it).
            "emulator_speed_factor": s.speed_factor,
        }

    def records(self) -> list[dict[str, Any]]:
        with self._lock:
            return [self.record(i) for i in sorted(self._instances.values(), key=lambda i: i.id)]

    def instance_key_owner(self, key: str) -> int | None:
        """The instance a ``CONTAINER_API_KEY`` belongs to, if any."""
        with self._lock:
            for inst in self._instances.values():
                if secrets.compare_digest(inst.api_key, key):
                    return inst.id
        return None

    def admin_state(self) -> dict[str, Any]:
        with self._lock:
            boxes = {
                str(i.id): {"status": i.actual_status, "hung": i.box.hung, "ip": i.box.spec.ip,
                            "proxy_host": self.proxy.ip, "proxy_port": i.proxy_port,
                            "direct_port": i.box.spec.direct_port, "runtype": i.runtype, "root": str(i.box.root),
                            "end_date": i.end_date}
                for i in self._instances.values()
            }
        return {"url": self.url, "instances": boxes, "latency": self.latency, "churn_rate_per_hour": self._churn_rate,
                "ledger": self.ledger.snapshot()}
