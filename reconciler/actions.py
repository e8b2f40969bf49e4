"""The closed set of things rigsync can do, each carrying the reason it was decided.

A plan is a value (Terraform's lesson): a tuple of these, serialisable to JSON (``schemas/plan.schema.json``)
and back, so a saved plan can be reviewed in a pull request and applied exactly. There is deliberately no
``Stop``: a stopped box keeps billing storage, so rigsync only ever destroys.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from reconciler.model import Drift, DriftClass

PLAN_FORMAT_VERSION = 1


class Kind(enum.StrEnum):
    RENT = "rent"
    DESTROY = "destroy"
    BOOTSTRAP = "bootstrap"
    SHIP_CODE = "ship_code"
    LAUNCH = "launch"
    KILL = "kill"
    REQUEUE = "requeue"
    RECORD = "record"
    NOOP = "noop"


SIGNS: dict[Kind, str] = {
    Kind.RENT: "+",
    Kind.DESTROY: "-",
    Kind.BOOTSTRAP: "*",
    Kind.SHIP_CODE: "^",
    Kind.LAUNCH: ">",
    Kind.KILL: "!",
    Kind.REQUEUE: "~",
    Kind.RECORD: "=",
    Kind.NOOP: " ",
}

# The order apply() runs them in: free money and record outcomes first, then prepare boxes, then launch.
APPLY_ORDER: dict[Kind, int] = {
    Kind.RECORD: 0,
    Kind.KILL: 1,
    Kind.REQUEUE: 2,
    Kind.DESTROY: 3,
    Kind.RENT: 4,
    Kind.BOOTSTRAP: 5,
    Kind.SHIP_CODE: 6,
    Kind.LAUNCH: 7,
    Kind.NOOP: 8,
}


@dataclass(frozen=True)
class Action:
    reason: str
    kind: ClassVar[Kind]

    @property
    def target(self) -> str:
        raise NotImplementedError

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d = {"kind": self.kind.value, "target": self.target, **d}
        return d


@dataclass(frozen=True)
class Rent(Action):
    offer_id: int
    label: str
    image: str
    disk_gb: float
    dph: float
    gpu_name: str
    num_gpus: int
    kind: ClassVar[Kind] = Kind.RENT

    @property
    def target(self) -> str:
        return f"offer/{self.offer_id}"


@dataclass(frozen=True)
class Destroy(Action):
    instance_id: int
    dph: float = 0.0
    kind: ClassVar[Kind] = Kind.DESTROY

    @property
    def target(self) -> str:
        return f"instance/{self.instance_id}"


@dataclass(frozen=True)
class Bootstrap(Action):
    instance_id: int
    script_hash: str
    kind: ClassVar[Kind] = Kind.BOOTSTRAP

    @property
    def target(self) -> str:
        return f"instance/{self.instance_id}"


@dataclass(frozen=True)
class ShipCode(Action):
    instance_id: int
    commit: str
    kind: ClassVar[Kind] = Kind.SHIP_CODE

    @property
    def target(self) -> str:
        return f"instance/{self.instance_id}"


@dataclass(frozen=True)
class Launch(Action):
    instance_id: int
    run_id: str
    attempt: int
    gpu_mask: tuple[int, ...]
    command: str
    code_commit: str | None
    sweep: str = ""
    kind: ClassVar[Kind] = Kind.LAUNCH

    @property
    def target(self) -> str:
        return f"run/{self.run_id}.{self.attempt}@{self.instance_id}"


@dataclass(frozen=True)
class Kill(Action):
    """Kill a running attempt (past max runtime, or its run is no longer desired); then record it."""

    instance_id: int
    run_id: str
    attempt: int
    kind: ClassVar[Kind] = Kind.KILL

    @property
    def target(self) -> str:
        return f"run/{self.run_id}.{self.attempt}@{self.instance_id}"


@dataclass(frozen=True)
class Requeue(Action):
    """An attempt was lost (box gone, heartbeat stale): archive it as lost; the run becomes pending."""

    run_id: str
    attempt: int
    instance_id: int
    kind: ClassVar[Kind] = Kind.REQUEUE

    @property
    def target(self) -> str:
        return f"run/{self.run_id}.{self.attempt}"


@dataclass(frozen=True)
class Record(Action):
    """An attempt finished on a box (exit code present): write its archive record."""

    run_id: str
    attempt: int
    instance_id: int
    phase: str
    exit_code: int | None = None
    kind: ClassVar[Kind] = Kind.RECORD

    @property
    def target(self) -> str:
        return f"run/{self.run_id}.{self.attempt}"


@dataclass(frozen=True)
class Noop(Action):
    """Something considered and left alone; kept so every decision has a visible reason."""

    subject: str = ""
    kind: ClassVar[Kind] = Kind.NOOP

    @property
    def target(self) -> str:
        return self.subject


ACTION_TYPES: dict[Kind, type[Action]] = {
    cls.kind: cls for cls in (Rent, Destroy, Bootstrap, ShipCode, Launch, Kill, Requeue, Record, Noop)
}


def action_from_json(d: dict[str, Any]) -> Action:
    kind = Kind(d["kind"])
    cls = ACTION_TYPES[kind]
    fields = {k: v for k, v in d.items() if k not in ("kind", "target")}
    if "gpu_mask" in fields:
        fields["gpu_mask"] = tuple(fields["gpu_mask"])
    return cls(**fields)


@dataclass(frozen=True)
class Plan:
    """The planner's answer: what to do, what was considered and left, and where the money goes."""

    actions: tuple[Action, ...]
    noops: tuple[Noop, ...] = ()
    fleet_dph_before: float = 0.0
    fleet_dph_after: float = 0.0
    desired_commit: str | None = None
    suspended: bool = False
    warnings: tuple[str, ...] = field(default=())
    drift: tuple[Drift, ...] = ()

    @property
    def changes(self) -> bool:
        return bool(self.actions)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for a in self.actions:
            out[a.kind.value] = out.get(a.kind.value, 0) + 1
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": PLAN_FORMAT_VERSION,
            "desired_commit": self.desired_commit,
            "suspended": self.suspended,
            "fleet_dph_before": round(self.fleet_dph_before, 6),
            "fleet_dph_after": round(self.fleet_dph_after, 6),
            "counts": self.counts(),
            "actions": [a.to_json() for a in self.actions],
            "noops": [n.to_json() for n in self.noops],
            "warnings": list(self.warnings),
            "drift": [
                {"class": d.cls.value, "subject": d.subject, "detail": d.detail, "action": d.action}
                for d in self.drift
            ],
        }

    @staticmethod
    def from_json(d: dict[str, Any]) -> Plan:
        return Plan(
            actions=tuple(action_from_json(a) for a in d["actions"]),
            noops=tuple(Noop(reason=n["reason"], subject=n.get("subject", "")) for n in d.get("noops", [])),
            fleet_dph_before=float(d.get("fleet_dph_before", 0.0)),
            fleet_dph_after=float(d.get("fleet_dph_after", 0.0)),
            desired_commit=d.get("desired_commit"),
            suspended=bool(d.get("suspended", False)),
            warnings=tuple(d.get("warnings", ())),
            drift=tuple(
                Drift(cls=DriftClass(x["class"]), subject=x["subject"], detail=x["detail"], action=x["action"])
                for x in d.get("drift", [])
            ),
        )
