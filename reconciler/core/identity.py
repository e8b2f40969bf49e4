"""What a box is built from and which fleet slot it fills: the spec hash and the ownership label, stated once.

A rented box carries ``rigsync:<fleet>:<spec>-<offer>`` (and ``-<pool>`` when the fleet names pools); ``spec``
hashes the image, disk and bootstrap script of its pool, so a change to any of them makes existing boxes "drifted"
(replaced once their work is done). Ownership itself (``model.owns``) only reads the fleet part; the planner, apply
and the saved-plan check all build labels here.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

from reconciler.core.model import Endpoint, Fleet, Instance, InstanceStatus, Ownership, Pool


def spec_hash(image: str, disk_gb: float, bootstrap_hash: str) -> str:
    """First 8 hex of sha256 over what a box is built from."""
    payload = "\n".join((image, repr(float(disk_gb)), bootstrap_hash))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:8]


def fleet_spec_hash(fleet: Fleet) -> str:
    """The spec hash of the fleet's first pool (its only one without ``pools:``)."""
    return pool_spec_hash(fleet.pools[0])


def pool_spec_hash(pool: Pool) -> str:
    return spec_hash(pool.image, pool.disk_gb, pool.bootstrap_hash)


def rent_label(fleet: Fleet, offer_id: int, pool: Pool | None = None) -> str:
    """The ownership label a box rented from ``offer_id`` carries: ``rigsync:<fleet>:<spec_hash>-<offer>``, and
    ``-<pool>`` after it when the fleet names its pools (so a fleet without ``pools:`` labels boxes as it always did).
    """
    pool = pool or fleet.pools[0]
    suffix = f"-{pool.name}" if fleet.named_pools else ""
    return Ownership(fleet.name, f"{pool_spec_hash(pool)}-{offer_id}{suffix}").label()


def own_box_id(pool: Pool, address: str, port: int) -> int:
    """A stable instance id for one of the lab's own machines: negative, so it never meets a provider's id."""
    digest = hashlib.sha256(f"{pool.name}\n{address}\n{port}".encode()).hexdigest()
    return -(int(digest[:12], 16) + 1)


def own_boxes(fleet: Fleet) -> list[Instance]:
    """The machines of the fleet's ``provider: ssh`` pools as instances: always running, $0/h, labelled as this
    fleet's box of that pool (with its current spec: an own box never drifts, it is bootstrapped again)."""
    out: list[Instance] = []
    for pool in fleet.pools:
        if not pool.own:
            continue
        for host in pool.hosts:
            iid = own_box_id(pool, host.address, host.port)
            out.append(
                Instance(
                    id=iid,
                    label=Ownership(fleet.name, f"{pool_spec_hash(pool)}-{-iid}-{pool.name}").label(),
                    status=InstanceStatus.RUNNING,
                    gpu_name=host.gpu_name,
                    num_gpus=host.gpus,
                    gpu_ram_mib=0,
                    dph_total=0.0,
                    start_date=0.0,
                    direct=Endpoint(host.address, host.port, host.user),
                )
            )
    return sorted(out, key=lambda i: i.id)


def slot_pool(fleet: Fleet, slot: str) -> str:
    """The pool a box with this label slot belongs to: its ``-<pool>`` suffix, else the fleet's first pool."""
    named = label_pool(slot)
    return named if named is not None and fleet.named_pools else fleet.pools[0].name


def label_pool(slot: str) -> str | None:
    """The pool a label slot names in its ``-<pool>`` suffix, without the fleet at hand (None: it names none)."""
    parts = slot.split("-", 2)
    return parts[2] if len(parts) == 3 else None


def slot_spec_hash(slot: str) -> str:
    """The spec hash a box was built for, from the slot part of its label."""
    return slot.split("-", 1)[0]


def bootstrap_cache_key(script_hash: str, image: str, cuda_major: int | None, paths: Sequence[str] = ()) -> str:
    """The bootstrap cache's key (the one home of its rule): 16 hex of sha256 over what a box's bootstrap built
    depends on, the script (its hash), the image, the CUDA major version of the box's driver (None: unknown, a key
    of its own), and the cached paths (another list is another cache). A change to any of them is a new key, so
    a new box never restores what an older script, another image or another CUDA built."""
    payload = "\n".join(("bootstrap-cache/1", script_hash, image, "" if cuda_major is None else str(cuda_major),
                         *paths))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


def box_cache_key(pool: Pool, box: Instance) -> str | None:
    """The bootstrap cache key of ``pool`` on ``box`` (its image as the provider lists it, else the pool's; the
    major of the CUDA version its driver supports); None when the pool caches nothing."""
    if not pool.bootstrap_cache or not pool.bootstrap_hash:
        return None
    cuda_major = int(box.cuda) if box.cuda is not None and math.isfinite(box.cuda) and box.cuda > 0 else None
    return bootstrap_cache_key(pool.bootstrap_hash, box.image or pool.image, cuda_major, pool.bootstrap_cache)
