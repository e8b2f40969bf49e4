"""``observed/hosts.yaml``: the host reliability ledger (``model.HostLedger``) to and from its file.

The ledger is what rigsync learned about the market's machines (``reconciler.core.ledger``); keeping it in git makes it
reviewable ("why is machine 10023 never rented?") and lets it survive a restart. Each host entry also carries what
the rules make of its counts (``faults``, ``penalty``, ``blacklisted``) so a reader needs no code to see why; those
are derived and ignored when the file is read back. Format described by ``schemas/observed-hosts.schema.json``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from reconciler.core.ledger import throughput_vs_dlperf
from reconciler.core.model import AttemptRecord, Fleet, GhostOffer, HostLedger, HostRecord
from reconciler.core.offers import host_penalty
from reconciler.errors import ObservedInvalid
from reconciler.observed.codec import FORMAT_VERSION, HOSTS, expect_mapping, iso, load_yaml, parse_iso

HEADER = (
    "rigsync host reliability ledger: per machine rented, its rents and faults (ranking penalty, blacklist), "
    "offers skipped after a failed rent, the fleet's recent rents"
)

_COUNTS = (
    "rents",
    "rent_failures",
    "boot_timeouts",
    "bootstrap_failures",
    "vanishes",
    "hangs",
    "unusable",
    "outbids",
    "attempts_succeeded",
    "attempts_failed",
    "attempts_lost",
)


def hosts_document(
    ledger: HostLedger, fleet: Fleet | None, history: Iterable[AttemptRecord] = ()
) -> dict[str, Any]:
    """The file's content as a mapping (``dump_yaml`` writes it); ``history`` (the run archive) gives each machine's
    measured throughput against its DLPerf (``ledger.throughput_vs_dlperf``)."""
    hosts = []
    speed = throughput_vs_dlperf(ledger.hosts, history)
    for h in ledger.hosts:
        entry: dict[str, Any] = {"machine_id": h.machine_id, "gpu_name": h.gpu_name}
        entry.update({k: getattr(h, k) for k in _COUNTS})
        entry.update(
            {
                "dlperf": h.dlperf,
                "throughput_vs_dlperf": speed[h.machine_id][0] if h.machine_id in speed else None,
                "throughput_attempts": speed[h.machine_id][1] if h.machine_id in speed else 0,
                "first_seen": iso(h.first_seen),
                "last_seen": iso(h.last_seen),
                "offers": list(h.offers),
                "faults": h.faults,
                "penalty": host_penalty(h),
                "blacklisted": fleet is not None
                and (
                    h.machine_id in fleet.avoid_machines
                    or (fleet.blacklist_after > 0 and h.faults >= fleet.blacklist_after)
                ),
            }
        )
        hosts.append(entry)
    return {
        "format_version": FORMAT_VERSION,
        "hosts": hosts,
        "ghost_offers": [
            {"offer_id": g.offer_id, "machine_id": g.machine_id, "failed_at": iso(g.failed_at), "detail": g.detail}
            for g in ledger.ghosts
        ],
        "renting": {
            "rents_at": [iso(t) for t in ledger.rents_at],
            "failures_in_a_row": ledger.failures_in_a_row,
            "last_failure_at": iso(ledger.last_failure_at),
        },
        "boxes": [{"instance_id": i, "machine_id": m} for i, m in ledger.boxes],
    }


def read_hosts(files: Mapping[str, str]) -> HostLedger:
    """The ledger from the observed files (no hosts.yaml: an empty ledger). A malformed entry is ObservedInvalid."""
    if HOSTS not in files:
        return HostLedger()
    doc = expect_mapping(load_yaml(files[HOSTS], HOSTS), HOSTS)
    try:
        hosts = []
        for n, e in enumerate(doc.get("hosts") or []):
            where = f"{HOSTS}: hosts[{n}]"
            hosts.append(
                HostRecord(
                    machine_id=int(e["machine_id"]),
                    gpu_name=str(e.get("gpu_name") or ""),
                    dlperf=None if e.get("dlperf") is None else float(e["dlperf"]),
                    first_seen=parse_iso(e.get("first_seen"), where + ".first_seen"),
                    last_seen=parse_iso(e.get("last_seen"), where + ".last_seen"),
                    offers=tuple(int(o) for o in e.get("offers") or ()),
                    **{k: int(e.get(k) or 0) for k in _COUNTS},
                )
            )
        ghosts = []
        for n, g in enumerate(doc.get("ghost_offers") or []):
            at = parse_iso(g["failed_at"], f"{HOSTS}: ghost_offers[{n}].failed_at")
            detail = str(g.get("detail") or "")
            ghosts.append(GhostOffer(int(g["offer_id"]), int(g.get("machine_id") or 0), at or 0.0, detail))
        renting = expect_mapping(doc.get("renting"), f"{HOSTS}: renting")
        rents_at = [parse_iso(t, f"{HOSTS}: renting.rents_at") for t in renting.get("rents_at") or []]
        boxes = [(int(b["instance_id"]), int(b["machine_id"])) for b in doc.get("boxes") or []]
        return HostLedger(
            hosts=tuple(sorted(hosts, key=lambda h: h.machine_id)),
            ghosts=tuple(sorted(ghosts, key=lambda g: g.offer_id)),
            rents_at=tuple(sorted(t for t in rents_at if t is not None)),
            failures_in_a_row=int(renting.get("failures_in_a_row") or 0),
            last_failure_at=parse_iso(renting.get("last_failure_at"), f"{HOSTS}: renting.last_failure_at"),
            boxes=tuple(sorted(boxes)),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ObservedInvalid(f"{HOSTS}: malformed host ledger ({exc})") from exc
