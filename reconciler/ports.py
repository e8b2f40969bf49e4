"""The small Protocols the loop talks through; adapters implement them, tests fake them.

Only these shapes cross the boundary between the pure core and the world. Each adapter wraps its library's
exceptions in ``reconciler.errors`` so callers never see requests, paramiko or git exceptions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from reconciler.model import Endpoint, Instance, Offer, OfferFilters


@dataclass(frozen=True)
class CommandResult:
    exit_code: int
    stdout: bytes
    stderr: bytes


class Provider(Protocol):
    """A GPU market: Vast.ai through its official SDK, or the emulator behind the same API."""

    def search_offers(self, filters: OfferFilters, disk_gb: float, limit: int = 200) -> list[Offer]: ...

    def list_instances(self) -> list[Instance]: ...

    def create_instance(
        self, offer_id: int, *, image: str, disk_gb: float, label: str, onstart: str, env: dict[str, str]
    ) -> int: ...

    def destroy_instance(self, instance_id: int) -> None: ...

    def ensure_ssh_key(self, public_key: str) -> None: ...


class Shell(Protocol):
    """Runs commands on boxes over SSH."""

    def run(
        self, endpoint: Endpoint, command: str, *, stdin: bytes | None = None, timeout: float = 30.0
    ) -> CommandResult: ...

    def run_many(
        self, targets: dict[int, tuple[Endpoint, str]], *, timeout: float = 10.0
    ) -> dict[int, CommandResult | Exception]: ...

    def forget(self, endpoint: Endpoint) -> None: ...

    def close(self) -> None: ...


class Clock(Protocol):
    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...
