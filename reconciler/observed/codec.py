"""The one YAML style of observed/, its UTC time format, and the paths of its files.

Every file rigsync writes under observed/ goes through ``dump_yaml``: a comment header, sorted keys, block
style, unicode, no wrapping. So the same facts always give the same bytes, and an unchanged world makes no
commit. Times are whole UTC seconds like ``2026-11-03T12:00:00Z``.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import yaml

from reconciler.core.textsafe import has_hazard
from reconciler.errors import ObservedInvalid

OBSERVED_DIR = "observed"
FLEET = f"{OBSERVED_DIR}/fleet.yaml"
RUNS = f"{OBSERVED_DIR}/runs.yaml"
DRIFT = f"{OBSERVED_DIR}/drift.yaml"
BUDGET = f"{OBSERVED_DIR}/budget.yaml"
STATUS = f"{OBSERVED_DIR}/status.yaml"
LEASE = f"{OBSERVED_DIR}/lease.yaml"  # the lease's old home on the branch: deleted by the next commit
HOSTS = f"{OBSERVED_DIR}/hosts.yaml"  # the host reliability ledger (observed/hosts_file.py)
THROUGHPUT = f"{OBSERVED_DIR}/throughput.yaml"  # the sweeps' learned progress rates (observed/throughput_file.py)
SUGGESTIONS = f"{OBSERVED_DIR}/suggestions.yaml"  # a bayes search's configurations made (observed/suggestions.py)
RUNS_DIR = f"{OBSERVED_DIR}/runs"  # the run archive's month shards
RENDERED = (BUDGET, DRIFT, FLEET, HOSTS, RUNS, STATUS, THROUGHPUT)  # what a cycle renders

FORMAT_VERSION = 1


def iso(ts: float | None) -> str | None:
    """POSIX seconds → ``YYYY-MM-DDTHH:MM:SSZ`` (UTC, whole seconds), None stays None."""
    if ts is None or not math.isfinite(ts):
        return None
    try:
        return dt.datetime.fromtimestamp(round(ts), tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (ValueError, OverflowError, OSError):  # a year past 9999 (or before 1): no such time to write
        return None


def parse_iso(value: Any, where: str) -> float | None:
    """The reverse of ``iso`` (also accepting numbers and YAML timestamps); ``where`` names the field on error."""
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, dt.datetime):
        return (value if value.tzinfo else value.replace(tzinfo=dt.UTC)).timestamp()
    try:
        parsed = dt.datetime.strptime(str(value), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError as exc:
        raise ObservedInvalid(f"{where}: {value!r} is not a UTC time like 2026-11-03T12:00:00Z") from exc
    return parsed.timestamp()


def money(x: float) -> float:
    """Dollars as written to observed/: rounded to 6 decimals, so float noise never makes a commit."""
    return round(float(x), 6)


def utc_day(ts: float) -> str:
    """``YYYY-MM-DD`` of ``ts`` in UTC (the day spend's "today" belongs to)."""
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%d")


# Parsing with libyaml when present is only faster; dumping stays pure Python so every machine writes the same bytes.
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def dump_yaml(data: Any, header: str) -> str:
    """The one YAML style of observed/: a comment header, sorted keys, block style, unicode, no wrapping.

    Non-finite floats are written as null (``strict_values``). A document holding a control or bidi character (a
    host name, an API error, a label from the world) is written with every non-ASCII character escaped instead
    (``"\\u202E"``): the same values, and a reviewer reading the file in a diff sees the escape, not a reordered or
    recoloured line.
    """
    data = strict_values(data)
    body = yaml.safe_dump(data, sort_keys=True, default_flow_style=False, allow_unicode=True, width=10_000)
    if has_hazard(body):
        body = yaml.safe_dump(data, sort_keys=True, default_flow_style=False, allow_unicode=False, width=10_000)
    return f"# {header}\n# Written by rigsync; do not edit (rigsync never reads desired/ from here).\n{body}"


def strict_values(data: Any) -> Any:
    """``data`` with every non-finite float (``.nan``, ``.inf`` in YAML, not a number to any strict reader) as None:
    observed/ never carries one, whatever a box or an old archive line held."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: strict_values(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [strict_values(v) for v in data]
    return data


def load_yaml(text: str, path: str) -> Any:
    """Parse one observed file; a syntax error becomes ``ObservedInvalid`` naming ``path:line:col``."""
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else path
        problem = getattr(exc, "problem", None) or str(exc)
        raise ObservedInvalid(f"{where}: not valid YAML: {problem}") from exc


def load_mapping_quietly(text: str | None) -> dict[str, Any]:
    """A file as a mapping, or ``{}`` when it is missing, empty or unreadable (for comparisons, never for state)."""
    if not text:
        return {}
    try:
        doc = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError:
        return {}
    return doc if isinstance(doc, dict) else {}


def expect_mapping(value: Any, where: str) -> dict[str, Any]:
    """``value`` when it is a mapping (None counts as empty); otherwise ``ObservedInvalid`` naming ``where``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ObservedInvalid(f"{where}: expected a mapping, got {type(value).__name__}")
    return value
