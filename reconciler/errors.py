"""rigsync's own error tree: every exception class rigsync defines lives here.

Library exceptions (requests, paramiko, git, yaml) are wrapped at the adapter boundary so the loop and the
CLI only ever reason about these classes. The split that matters to a reconciler is transient (retry later,
with backoff) versus permanent (a human must change something); kopf's ``clients/errors.py`` is the model.
Every concrete error that an adapter raises says which of the two it is; the adapter families
(``ProviderError``, ``ShellError``, ``RepoError``) say *where* it came from::

    Exception
    ├── RigsyncError                      raised on purpose; the CLI prints it as one line, never a traceback
    │   ├── UserError                     bad input from a person or an agent: exit 1
    │   │   ├── DesiredStateInvalid       desired/ did not validate (``errors`` lists every problem)
    │   │   ├── ObservedInvalid           a file under observed/ does not parse
    │   │   ├── LeaseHeld                 another reconciler holds the fleet
    │   │   │   └── LeaseLost             (also PermanentError) our lease's deadline passed mid-apply: stop acting
    │   │   ├── StalePlan                 a saved plan no longer matches the world
    │   │   ├── SecretMissing             (also PermanentError) a sweep's ``${NAME}`` is not set on the controller
    │   │   │   └── SecretNotAllowed      ``RIGSYNC_JOB_SECRETS`` does not list it: not read at all
    │   │   ├── StoreCredentialsRefused   (also StoreError) the object store refused the controller's credentials
    │   │   ├── StoreBucketMissing
    │   │   └── ProviderAuthError         (also ProviderPermanent) the API key is missing or rejected
    │   ├── TransientError                may succeed if tried again: back off and retry
    │   │   ├── ProviderTransient         (ProviderError) 429, 5xx, timeouts
    │   │   │   └── ObservationFailed     the instance list answered is not a whole list: nothing may be decided
    │   │   ├── HostUnreachable           (ShellError) connect/auth timeout, dropped connection
    │   │   ├── PushRejected              (RepoError) non-fast-forward: fetch, rebase, retry
    │   │   └── StoreUnavailable          the object store is down: refused connection, timeout, 5xx, SlowDown
    │   ├── PermanentError                will not succeed by retrying
    │   │   ├── ProviderPermanent         (ProviderError) 400/401/403/404
    │   │   │   ├── RejectedByProvider    a 4xx or ``success: false`` reply, with ``status`` and ``code``
    │   │   │   │   └── PriceIncreaseGone a price increase answered is no longer pending (404 or legacy 409)
    │   │   │   ├── RentMismatch          a new box is not the rental asked for (type, GPU, price): destroyed
    │   │   │   └── ProviderAuthError
    │   │   ├── HostKeyMismatch           (ShellError) the box's host key changed since it was pinned
    │   │   ├── RemoteCommandFailed       (ShellError) a command on the box exited non-zero
    │   │   │   ├── LaunchLockHeld        this attempt's run directory exists: launched before
    │   │   │   ├── LaunchRefused         the box's fence is newer than the launch's epoch, or it is draining
    │   │   │   └── OutputOverBound       it printed more than its byte bound: reading stopped there
    │   │   ├── ArchiveCorrupt            (RepoError) a run archive line is not a record
    │   │   ├── StoreError                the result store cannot take or give a harvest (disk, a bad stream)
    │   │   │   ├── StoreCredentialsRefused
    │   │   │   └── StoreBucketMissing    (also UserError) the bucket does not exist
    │   │   └── LaunchJournalError        the launch journal in the state dir cannot be written: no launch then
    │   ├── LeaseRace                     a compare-and-swap of the lease lost to another writer: decide again
    │   ├── PlanInconsistent              a plan that breaks the table of needs between actions: a planner bug
    │   ├── ProviderError                 raised by a Provider adapter
    │   ├── ShellError                    raised by a Shell adapter (also: rigsync's own SSH key is unusable)
    │   └── RepoError                     raised by the git adapter
    └── ValueError
        ├── TemplateProblem               a sweep's command template is unusable (becomes a desired/ error)
        └── YamlRefused                   a YAML construct rigsync refuses (becomes a desired/ error)

The last two never leave the loading of desired/: they are turned into ``file:line:col`` errors there.

**Causes are kept.** An adapter raises ours ``from`` the library's exception (``raise HostUnreachable(...) from
exc``), so the original travels as ``__cause__``. People see one line, ours (``rigsync: error: ...``); the chain
below it (``cause_chain``) is logged at DEBUG where the error is caught (the CLI, the daemon's cycle), with
``--log-level DEBUG`` on `rigsync run` or ``RIGSYNC_LOG_LEVEL=DEBUG`` for any command.

Anything else (a ``KeyError`` from an SDK, an ``OSError`` a library forgot to wrap) is a bug somewhere below
us, not a decision: ``apply()`` records it as that one action's failed outcome (the rest of the plan still
runs) and the daemon logs it with its traceback and retries the cycle with backoff.

The Vast.ai emulator (``reconciler.emulator``) stands for the real service and shares none of this: its own
errors live in ``reconciler.emulator.exceptions``.
"""

from __future__ import annotations

from typing import Any


def cause_chain(exc: BaseException) -> str:
    """``exc`` and each ``__cause__`` below it, one ``Type: message`` per step joined by `` <- ``: for DEBUG logs."""
    steps: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        steps.append(f"{type(current).__module__}.{type(current).__qualname__}: {current}")
        current = current.__cause__
    return " <- ".join(steps)


class RigsyncError(Exception):
    """Base of every error rigsync raises on purpose."""


class UserError(RigsyncError):
    """Bad input from a person or an agent: printed as one clear message, exit 1, never a traceback."""


class DesiredStateInvalid(UserError):
    """The desired/ tree did not validate; ``errors`` holds every problem found, not just the first."""

    def __init__(self, errors: list[object]) -> None:
        self.errors = errors
        super().__init__(f"desired state is invalid ({len(errors)} error(s))")


class ObservedInvalid(UserError):
    """A file under observed/ is missing a required part or does not parse."""


class LeaseHeld(UserError):
    """Another reconciler holds the fleet's lease."""


class LeaseRace(RigsyncError):
    """A compare-and-swap on the fleet's lease lost: the lease is not the version we last read or wrote (someone
    else wrote or deleted it since). ``Lease`` turns it into ``LeaseHeld``/``LeaseLost`` naming the holder."""


class StalePlan(UserError):
    """A saved plan no longer matches the world (an offer or a box it relies on is gone)."""


class PlanInconsistent(RigsyncError):
    """The planner made a plan that breaks the table of needs between actions (``actions.NEEDS``): a bug, so the
    plan is never applied."""


class TransientError(RigsyncError):
    """May succeed if tried again: rate limits, 5xx, timeouts, connection resets, git push races."""


class PermanentError(RigsyncError):
    """Will not succeed by retrying: bad credentials, unknown object, rejected request."""


class SecretMissing(UserError, PermanentError):
    """A sweep references ``${NAME}`` and the controller's environment does not set it (or sets it empty).

    The message names the variables, never a value. The planner withholds such launches; this is raised only
    when a launch is applied anyway (a saved plan applied from a shell without the variable)."""


class SecretNotAllowed(SecretMissing):
    """A sweep references ``${NAME}`` and the controller's allowlist (``RIGSYNC_JOB_SECRETS``) does not list it: to
    the job it is as good as missing, and its value is never read. Raised, like ``SecretMissing``, only when a
    launch the planner withholds is applied anyway."""


class LeaseLost(LeaseHeld, PermanentError):
    """The lease this reconciler held can no longer be trusted: its fencing deadline passed, or another holder took it.

    Permanent for the cycle (and the process): nothing more is done to the world, nothing is committed as if the
    lease were still held, and ``rigsync run`` exits non-zero like it does when the lease is refused at start.
    """


# ------------------------------------------------------------------------------------------------ provider


class ProviderError(RigsyncError):
    """Raised by a Provider adapter."""


class ProviderTransient(ProviderError, TransientError):
    """429, 5xx, timeouts talking to the provider API."""


class ProviderPermanent(ProviderError, PermanentError):
    """401/403 (bad key), 400 (bad request), 404 (no such offer/instance)."""


class ObservationFailed(ProviderTransient):
    """The provider answered the instance list, but not with a whole list in the market's own shape: no list,
    ``success: false`` (Vast's ``deprecated_endpoint`` comes with HTTP 200), a refusal of the list endpoint itself
    (a 4xx other than the key's), a page token that never ends, pages cut short. ``reason`` says which, one word:
    ``success_false``; ``no_list`` (no list, no count of it, an unreadable token); ``refused``; ``endless_pages`` (a
    token given twice, an empty page naming a next one, an instance listed twice, more rows than the list's own
    count, too many pages); ``cut_short`` (fewer rows than its count); ``bad_row`` (a row without an id).

    Never read as "no instances": boxes this fleet holds would look gone, their attempts lost and their needs rented
    again, while they go on billing (skypilot-org/skypilot#10517). A cycle that gets this decides nothing. A list
    that cannot be fetched at all is a plain ``ProviderTransient`` (429, 5xx, unreachable) or ``ProviderAuthError``.
    """

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class RejectedByProvider(ProviderPermanent):
    """A 4xx or ``{"success": false}`` reply; ``status`` and ``code`` say which (e.g. 404, "no_such_instance")."""

    def __init__(self, message: str, *, status: int = 0, code: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class PriceIncreaseGone(RejectedByProvider):
    """The price increase answered is no longer pending: answered before, or its contract ended (404
    ``no_pending_price_increase``; older backends 409). Nothing to do; the next cycle reads the list again."""


class RentMismatch(ProviderPermanent):
    """A box just rented is not the rental that was asked for: its rental type (Vast rents on-demand, silently,
    when a bid is lost on the way: vast-cli PR #403), its GPU or its price differ from the offer and bid asked.
    The adapter destroyed it (``destroyed`` False: the destroy failed too, and the box is still there);
    ``instance_id`` is the box, ``reasons`` what differed, one phrase each."""

    def __init__(self, message: str, *, instance_id: int, reasons: tuple[str, ...], destroyed: bool) -> None:
        super().__init__(message)
        self.instance_id = instance_id
        self.reasons = reasons
        self.destroyed = destroyed


class ProviderAuthError(ProviderPermanent, UserError):
    """The API key is missing or rejected."""


# --------------------------------------------------------------------------------------------------- shell


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


class LaunchRefused(RemoteCommandFailed):
    """The box refused a launch or a queue entry and did nothing: its epoch is older than the box's fence (another
    controller holds the fleet now; the message names both epochs), or the box is draining. Never retried."""


class OutputOverBound(RemoteCommandFailed):
    """A command printed more than its byte bound (``reconciler.core.bounds``): the controller stopped reading it."""


# ---------------------------------------------------------------------------------------------------- repo


class RepoError(RigsyncError):
    """Raised by the git adapter."""


class PushRejected(RepoError, TransientError):
    """Non-fast-forward or `cannot lock ref`: fetch, rebase, retry."""


class ArchiveCorrupt(RepoError, PermanentError):
    """A shard holds a line that is not a valid archive record (and is not a crash-truncated last line)."""


# --------------------------------------------------------------------------------------------------- store


class StoreError(PermanentError):
    """The result store (``adapters.store``, ``adapters.s3store``) cannot take or give a harvest: a full disk, a bad
    stream, a missing object, a bucket that does not exist."""


class StoreCredentialsRefused(StoreError, UserError):
    """The object store refused the controller's credentials (InvalidAccessKeyId, SignatureDoesNotMatch,
    AccessDenied, 403). One line naming the endpoint and bucket, never a key."""


class StoreBucketMissing(StoreError, UserError):
    """The object store has no such bucket: the operator's ``--store`` / ``RIGSYNC_STORE`` names another one."""


class StoreUnavailable(TransientError):
    """The object store did not answer usefully (refused connection, timeout, 5xx, SlowDown): try again later; the
    last good checkpoint is never replaced by a transfer that did not complete."""


class LaunchJournalError(PermanentError):
    """The launch journal (``adapters.launch_journal``) cannot be written: a full disk, a read-only state dir.
    Raised by ``note`` before a launch, that launch does not happen (a launch nobody wrote down could run twice)."""


# ------------------------------------------------------------------------- internal to loading desired/


class TemplateProblem(ValueError):
    """The command template cannot be used; ``lineno`` is the template line (1-based) when known."""

    def __init__(self, message: str, lineno: int | None = None) -> None:
        super().__init__(message)
        self.lineno = lineno


class YamlRefused(ValueError):
    """A YAML construct rigsync refuses (anchors, aliases, deep nesting); ``mark`` is where it starts."""

    def __init__(self, message: str, mark: Any) -> None:
        super().__init__(message)
        self.message = message
        self.mark = mark
