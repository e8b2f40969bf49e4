"""rigsync's own error tree.

Library exceptions (requests, paramiko, git, yaml) are wrapped at the adapter boundary so the loop and the
CLI only ever reason about these classes. The split that matters to a reconciler is transient (retry later,
with backoff) versus permanent (a human must change something); kopf's ``clients/errors.py`` is the model.
"""

from __future__ import annotations


class RigsyncError(Exception):
    """Base of every error rigsync raises on purpose."""


class UserError(RigsyncError):
    """Bad input from a person or an agent: printed as one clear message, exit 1, never a traceback."""


class DesiredStateInvalid(UserError):
    """The desired/ tree did not validate; ``errors`` holds every problem found, not just the first."""

    def __init__(self, errors: list[object]) -> None:
        self.errors = errors
        super().__init__(f"desired state is invalid ({len(errors)} error(s))")


class TransientError(RigsyncError):
    """May succeed if tried again: rate limits, 5xx, timeouts, connection resets, git push races."""


class PermanentError(RigsyncError):
    """Will not succeed by retrying: bad credentials, unknown object, rejected request."""


class ProviderError(RigsyncError):
    """Raised by a Provider adapter."""


class ProviderTransient(ProviderError, TransientError):
    """429, 5xx, timeouts talking to the provider API."""


class ProviderPermanent(ProviderError, PermanentError):
    """401/403 (bad key), 400 (bad request), 404 (no such offer/instance)."""


class ProviderAuthError(ProviderPermanent, UserError):
    """The API key is missing or rejected."""


class ShellError(RigsyncError):
    """Raised by a Shell (SSH) adapter."""


class HostUnreachable(ShellError, TransientError):
    """Connect, auth handshake or command timed out, or the connection dropped."""


class HostKeyMismatch(ShellError, PermanentError):
    """The box presented a different host key than the one pinned on first contact."""


class RemoteCommandFailed(ShellError, PermanentError):
    """A command on the box exited non-zero where success was required."""


class LaunchLockHeld(RemoteCommandFailed):
    """The run directory already exists on the box: this attempt was launched before."""


class RepoError(RigsyncError):
    """Raised by the git adapter."""


class PushRejected(RepoError, TransientError):
    """Non-fast-forward or `cannot lock ref`: fetch, rebase, retry."""


class LeaseHeld(UserError):
    """Another reconciler holds the fleet's lease."""


class StalePlan(UserError):
    """A saved plan no longer matches the world (an offer or a box it relies on is gone)."""
