"""What a box is built from and which fleet slot it fills: the spec hash and the ownership label, stated once.

A rented box carries ``rigsync:<fleet>:<spec>-<offer>``; ``spec`` hashes the image, disk and bootstrap script,
so a change to any of them makes existing boxes "drifted" (replaced once their work is done). Ownership itself
(``model.owns``) only reads the fleet part; the planner, apply and the saved-plan check all build labels here.
"""

from __future__ import annotations

import hashlib

from reconciler.model import Fleet, Ownership


def spec_hash(image: str, disk_gb: float, bootstrap_hash: str) -> str:
    """First 8 hex of sha256 over what a box is built from."""
    payload = "\n".join((image, repr(float(disk_gb)), bootstrap_hash))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:8]


def fleet_spec_hash(fleet: Fleet) -> str:
    return spec_hash(fleet.image, fleet.disk_gb, fleet.bootstrap_hash)


def rent_label(fleet: Fleet, offer_id: int) -> str:
    """The ownership label a box rented from ``offer_id`` carries: ``rigsync:<fleet>:<spec_hash>-<offer>``."""
    return Ownership(fleet.name, f"{fleet_spec_hash(fleet)}-{offer_id}").label()


def slot_spec_hash(slot: str) -> str:
    """The spec hash a box was built for, from the slot part of its label."""
    return slot.split("-", 1)[0]
