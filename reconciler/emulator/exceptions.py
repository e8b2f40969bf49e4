"""The emulator's own errors. It stands for Vast.ai, so it shares none of rigsync's types (``reconciler.errors``).

    EmulatorError                     base of everything the emulator raises on purpose
    ├── EmulatorUnavailable           the machine lacks what real SSH boxes need (root, sshd, unshare)
    ├── ApiError                      answered with the real service's JSON error shape (status, error, msg)
    └── QueryError (also ValueError)  an offer query is malformed (unknown operator, value of the wrong kind)
"""

from __future__ import annotations


class EmulatorError(Exception):
    """Base of every error the emulator raises on purpose; its message is meant for a person."""


class EmulatorUnavailable(EmulatorError):
    """The machine lacks what real SSH boxes need (root, sshd, unshare)."""


class ApiError(EmulatorError):
    """An error the API answers with the real service's JSON error shape."""

    def __init__(self, status: int, error: str, msg: str) -> None:
        super().__init__(msg)
        self.status = status
        self.error = error
        self.msg = msg


class QueryError(EmulatorError, ValueError):
    """The offer query is malformed (unknown operator, value of the wrong kind)."""
