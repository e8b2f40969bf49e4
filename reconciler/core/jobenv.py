"""A sweep's job environment (``env:``): the one home of its rules, from the loader to the box.

A sweep may give its jobs environment variables. Each value is written in ``desired/`` either as a *literal*
(text, or an integer, which becomes its decimal text) or as a *reference* to the controller's environment,
``${NAME}``: the whole value, nothing around it (``prefix-${NAME}`` is refused, not half-expanded). Literals are
in git, so they are not secret; references are how secrets reach a job without ever being written down.

Where each form goes:

- The spec (``Sweep.env``, which a ``RunSpec`` carries) holds the values *as written*: literals, and references as
  the text ``${NAME}``. That is all the run id hashes, all a plan, the observed files, the archive, status and diff can
  ever show. A secret's value is never in any of them.
- The operator allows, on the controller, the names sweeps may reference: ``RIGSYNC_JOB_SECRETS``, comma-separated
  (``allowed_secrets``; unset: none). A name that can never be a job's (``refused_reference``: rigsync's API key,
  the store's credentials, any ``RIGSYNC_`` setting) on that list stops the controller at start (``UserError``).
  A name off the list is never read at all: ``ControllerEnv.available`` and ``resolve`` refuse it.
- ``plan()`` is pure: it learns which names are allowed (``Controller.allowed_secrets``) and *which* allowed
  referenced names the controller has (``Controller.env_names``, names set and non-empty), and withholds a
  sweep's launches while one is off the list (``ReasonCode.SECRET_NOT_ALLOWED``, decided first) or missing
  (``ReasonCode.SECRET_MISSING``).
- Values are resolved at launch only (``ControllerEnv.resolve`` in ``apply``) into a ``JobEnv``, whose ``repr``
  names the variables and never shows a value, and which ``redact``s its values out of any text that might
  carry one back (an error message). The box receives them on the SSH channel's stdin (``JobEnv.stdin``), never
  on a command line (``reconciler/box/launch.sh``, ``wrapper.sh``).

Pure: no I/O and no ``os.environ`` here; the caller hands ``ControllerEnv`` the mapping to read.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from reconciler.core.actions import ReasonCode
from reconciler.errors import SecretMissing, SecretNotAllowed, UserError

NAME_RE = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
REFERENCE_RE = re.compile(r"^\$\{([A-Z_][A-Z0-9_]{0,127})\}$")
# A value that looks like an attempt at a reference but is not the whole-value ``${NAME}`` form.
_REFERENCE_LIKE_RE = re.compile(r"\$\{|^\$[A-Za-z_][A-Za-z0-9_]*$")

EnvSpec = tuple[tuple[str, str], ...]
"""A job environment as written: (name, literal text or ``${NAME}``), in file order."""

# Names rigsync's wrapper sets for every run (``reconciler/box/wrapper.sh``): a sweep may not override them.
RIGSYNC_PREFIX = "RIGSYNC_"
SET_BY_RIGSYNC = frozenset({"CUDA_VISIBLE_DEVICES"})
# Names that change how the shell running the command starts or how programs are found and loaded: set as a
# whole value (no expansion) they break the run in ways its command does not show. The command can still set
# them (``PATH=/x:$PATH python ...``), where a reviewer sees it.
# Bash's read-only variables (UID, EUID, PPID, ...) could not be exported at all.
REFUSED_NAMES = frozenset(
    {"PATH", "HOME", "SHELL", "USER", "LOGNAME", "PWD", "OLDPWD", "IFS", "ENV", "SHELLOPTS", "BASHOPTS", "PS4",
     "CDPATH", "GLOBIGNORE", "TMOUT", "UID", "EUID", "PPID"}
)
REFUSED_PREFIXES = ("LD_", "BASH_")
# References the controller never hands to a job: rigsync's own credentials and settings. A pull request could
# otherwise send the account's key to a box (and from there anywhere).
# The result store's credentials (``storeconfig``: the standard AWS names, which boto3 reads too): never a job's.
STORE_CREDENTIAL_NAMES = frozenset({"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"})
REFUSED_REFERENCES = frozenset({"VAST_API_KEY", *STORE_CREDENTIAL_NAMES})
# The operator's allowlist: the only controller variables sweeps may reference (comma-separated names).
JOB_SECRETS_ENV = "RIGSYNC_JOB_SECRETS"

# The words that say "this holds a secret" (also the loader's hint on unknown keys anywhere in desired/).
SECRET_WORDS = r"api[_-]?key|secret|token|password|passwd|private[_-]?key|access[_-]?key|credentials?"
# An env *name* that says it holds a secret: one of the words as a whole ``_``-separated part (HF_TOKEN,
# WANDB_API_KEY, AWS_SECRET_ACCESS_KEY), not a prefix of another word (TOKENIZERS_PARALLELISM is not one).
SECRETISH_NAME_RE = re.compile(rf"(?:^|_)(?:{SECRET_WORDS})(?:_|$)", re.IGNORECASE)

# Literal values that are well-known credential formats, whatever their variable is called.
_SECRET_VALUE_RE = re.compile(
    r"gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}|sk-[A-Za-z0-9_-]{20,}|hf_[A-Za-z0-9]{30,}"
    r"|AKIA[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9-]{10,}|-----BEGIN [A-Z ]*PRIVATE KEY-----"
)
# how a plan warning about a held-back sweep begins (status, diff and the commit message pick them), by its reason
SECRET_WARNING = "secret missing: "
NOT_ALLOWED_WARNING = "secret not allowed: "
HELD_BACK_WARNINGS = {SECRET_WARNING: ReasonCode.SECRET_MISSING, NOT_ALLOWED_WARNING: ReasonCode.SECRET_NOT_ALLOWED}
SECRET_ADVICE = "secrets never belong in desired/; write `${NAME}` and set it in the controller's environment"


def reference(text: str) -> str | None:
    """The controller variable a value refers to (``"${WANDB_API_KEY}"`` -> ``"WANDB_API_KEY"``), else None."""
    m = REFERENCE_RE.match(text)
    return m.group(1) if m else None


def refused_reference(name: str) -> bool:
    """Whether ``name`` can never be a job's secret: rigsync's own credentials (``REFUSED_REFERENCES``) and settings."""
    return name in REFUSED_REFERENCES or name.startswith(RIGSYNC_PREFIX)


def allowed_secrets(text: str) -> frozenset[str]:
    """The names ``RIGSYNC_JOB_SECRETS`` lists (``text``: its value; empty entries and spaces around names are
    ignored). ``UserError`` for an entry that is no variable name (not quoted: it may be a value pasted by mistake)
    or a name that can never be a job's secret (``refused_reference``), naming the variable and the name."""
    names: set[str] = set()
    for n, part in enumerate(text.split(","), 1):
        name = part.strip()
        if not name:
            continue
        if not NAME_RE.match(name):
            raise UserError(
                f"{JOB_SECRETS_ENV}: entry {n} is not a variable name (uppercase letters, digits and '_'); it lists "
                "the names sweeps may reference, comma-separated, never their values"
            )
        if refused_reference(name):
            raise UserError(
                f"{JOB_SECRETS_ENV} lists {name}, which is rigsync's own setting or credential: the controller never "
                "hands it to a job; remove it from the list"
            )
        names.add(name)
    return frozenset(names)


def allowlist_given(environ: Mapping[str, str]) -> frozenset[str] | None:
    """The allowlist ``environ`` gives when it sets ``RIGSYNC_JOB_SECRETS`` at all (``rigsync review`` marks the
    references off it); None: not set, so not known there (for a controller, unset means none allowed)."""
    listed = environ.get(JOB_SECRETS_ENV)
    return None if listed is None else allowed_secrets(listed)


def name_problem(name: str) -> str | None:
    """Why a sweep may not set the variable ``name``, or None."""
    if not NAME_RE.match(name):
        return "is not a valid variable name: uppercase letters, digits and '_', not starting with a digit"
    if name.startswith(RIGSYNC_PREFIX) or name in SET_BY_RIGSYNC:
        return "is set by rigsync's run wrapper for every run; choose another name"
    if name in REFUSED_NAMES or name.startswith(REFUSED_PREFIXES):
        return (
            "changes how the run's shell starts or how programs are found and loaded; set it in the command "
            "instead (e.g. `PATH=/x:$PATH python ...`), where it is reviewed with what it affects"
        )
    return None


def value_problem(name: str, text: str) -> str | None:
    """Why a value written for ``name`` is refused, or None. Never quotes the value (it may be a leaked secret)."""
    ref = reference(text)
    if ref is not None:
        if refused_reference(ref):
            return f"${{{ref}}} is rigsync's own setting or credential; the controller never hands it to a job"
        return None
    if _REFERENCE_LIKE_RE.search(text):
        return (
            "a reference to the controller's environment must be the whole value, exactly `${NAME}` "
            "(uppercase name); nothing is expanded inside a longer value"
        )
    if SECRETISH_NAME_RE.search(name):
        return f"{name} looks like a secret but its value is written here: {SECRET_ADVICE}"
    if _SECRET_VALUE_RE.search(text):
        return f"the value of {name} looks like a credential (an API token or private key): {SECRET_ADVICE}"
    return None


def references(env: EnvSpec) -> tuple[str, ...]:
    """The controller variables ``env`` refers to, in order, once each."""
    seen: dict[str, None] = {}
    for _, text in env:
        ref = reference(text)
        if ref is not None:
            seen.setdefault(ref, None)
    return tuple(seen)


def missing(env: EnvSpec, available: frozenset[str]) -> tuple[str, ...]:
    """The references of ``env`` the controller does not have (``available``: names set, non-empty)."""
    return tuple(r for r in references(env) if r not in available)


def not_allowed(env: EnvSpec, allowed: frozenset[str]) -> tuple[str, ...]:
    """The references of ``env`` off the operator's list (``allowed``: ``allowed_secrets``)."""
    return missing(env, allowed)


def not_allowed_text(sweep: str, names: Sequence[str]) -> str:
    """The one sentence for a sweep held back by references off the allowlist (plan no-op, warning, status)."""
    listed = ", ".join(names)
    pronoun = "it" if len(names) == 1 else "them"
    return (
        f"sweep {sweep} references {listed} from the controller's environment; {JOB_SECRETS_ENV} does not list "
        f"{pronoun}, so the controller never reads or hands {pronoun} to a job"
    )


def missing_text(sweep: str, names: Sequence[str]) -> str:
    """The one sentence for a sweep held back by missing references (plan no-op, warning, status)."""
    listed = ", ".join(names)
    verb = "it is" if len(names) == 1 else "they are"
    return f"sweep {sweep} needs {listed} from the controller's environment; {verb} not set"


def held_back(warnings: Iterable[object]) -> list[str]:
    """The plan warnings about sweeps held back for a variable (off the allowlist, or missing), without their
    prefix and with their reason code after them (status, diff, the commit message)."""
    out = []
    for w in warnings:
        for prefix, code in HELD_BACK_WARNINGS.items():
            if str(w).startswith(prefix):
                out.append(f"{str(w).removeprefix(prefix)} ({code.value})")
    return out


def expands_reference(command: str, names: Iterable[str]) -> str | None:
    """The first referenced name the command template expands itself (``$NAME``/``${NAME}``), else None: the
    shell would put the secret into the job's argv, where every user of the box sees it in ``ps``."""
    for name in names:
        if re.search(rf"\$\{{?{re.escape(name)}(?![A-Za-z0-9_])", command):
            return name
    return None


class JobEnv:
    """One job's resolved environment. Its values are secret: never shown by ``repr``/``str``."""

    __slots__ = ("_items",)

    def __init__(self, items: Iterable[tuple[str, str]] = ()) -> None:
        pairs = tuple(items)
        for name, value in pairs:
            if not NAME_RE.match(name) or "\0" in value:
                raise ValueError(f"job environment variable {name!r} cannot be passed (bad name or a NUL in its value)")
        self._items = pairs

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self._items)

    def items(self) -> tuple[tuple[str, str], ...]:
        return self._items

    def stdin(self) -> bytes:
        """What the launch reads from its stdin: ``NAME=VALUE`` records, each ended by a NUL byte."""
        return b"".join(f"{n}={v}".encode() + b"\0" for n, v in self._items)

    def redact(self, text: str) -> str:
        """``text`` with every secret value replaced by ``${NAME}`` (longest values first)."""
        for name, value in sorted(self._items, key=lambda nv: -len(nv[1])):
            if value:
                text = text.replace(value, f"${{{name}}}")
        return text

    def __repr__(self) -> str:
        return f"JobEnv({', '.join(self.names)})"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JobEnv) and other._items == self._items

    def __hash__(self) -> int:
        return hash(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)


class ControllerEnv:
    """The controller's environment as jobs may see it: references resolve here, at launch, and nowhere else.

    Holds the mapping it was given (``os.environ`` in ``reconciler.loop``) and reads it lazily, except the
    allowlist (``RIGSYNC_JOB_SECRETS``), parsed when it is made: a bad list is a ``UserError`` when the controller
    starts. A name off the list is never read. ``repr`` shows nothing of it. A variable that is set but empty
    counts as not set: an empty API key is a mistake, not a key.
    """

    __slots__ = ("_environ", "allowed")

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ: Mapping[str, str] = environ if environ is not None else {}
        self.allowed: frozenset[str] = allowed_secrets(self._environ.get(JOB_SECRETS_ENV, ""))

    def available(self, wanted: Iterable[str]) -> frozenset[str]:
        """Which of the ``wanted`` names are allowed and set (non-empty): what ``plan()`` may know."""
        return frozenset(n for n in wanted if n in self.allowed and self._environ.get(n))

    def resolve(self, sweep: str, env: EnvSpec) -> JobEnv:
        """The job's environment with references filled in; ``SecretNotAllowed`` naming the references off the
        allowlist (their values are not read), then ``SecretMissing`` naming what is not set."""
        refused = not_allowed(env, self.allowed)
        if refused:
            raise SecretNotAllowed(not_allowed_text(sweep, refused))
        absent = missing(env, self.available(references(env)))
        if absent:
            raise SecretMissing(missing_text(sweep, absent))
        out: list[tuple[str, str]] = []
        for name, text in env:
            ref = reference(text)
            out.append((name, self._environ[ref] if ref is not None else text))
        return JobEnv(out)

    def __repr__(self) -> str:
        return "ControllerEnv(...)"
