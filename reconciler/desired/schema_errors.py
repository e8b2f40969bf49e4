"""The JSON schemas of desired/ files, and their errors as messages a person can act on.

jsonschema's own words name validators; these name the key, suggest the spelling meant, say why a key is
required or where it moved, and never quote a value that may be a secret (a sweep's ``env``).
"""

from __future__ import annotations

import difflib
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

from reconciler.core import jobenv
from reconciler.desired.load_error import LoadError, Path_, pointer_of, short
from reconciler.desired.strict_yaml import Doc, yaml12_number_hint

_SECRETISH_RE = re.compile(f"({jobenv.SECRET_WORDS})", re.IGNORECASE)  # the words: one home, in jobenv


def schema_path(name: str) -> Path:
    """Path of ``schemas/<name>.schema.json`` (``name`` like "fleet"), from the repo or the installed package."""
    filename = name if name.endswith(".json") else f"{name}.schema.json"
    here = Path(__file__).resolve().parent.parent  # the reconciler package
    for candidate in (here.parent / "schemas" / filename, here / "schemas" / filename):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"schema {filename} not found next to the reconciler package")


@cache
def _validator(name: str) -> jsonschema.Draft202012Validator:
    # The schemas are checked against the metaschema by the tests (test_schema_conventions), not on every command:
    # that check costs each `rigsync validate` more than validating desired/ does.
    schema = json.loads(schema_path(name).read_text(encoding="utf-8"))
    return jsonschema.Draft202012Validator(schema)


_FRIENDLY_PATTERNS = {
    "^([0-9]{1,6}d)?([0-9]{1,6}h)?([0-9]{1,6}m)?([0-9]{1,6}s)?$": "is not a duration like 90s, 10m, 12h or 1h30m",
    "^[a-z0-9][a-z0-9_-]{0,62}$": (
        "is not a safe name: use lowercase letters, digits, '-' and '_', start with a letter or digit, "
        "at most 63 characters"
    ),
    "^[a-z_][a-z0-9_]{0,62}$": "is not a valid parameter name: lowercase letters, digits and '_', not starting "
    "with a digit",
    "^(/[A-Za-z0-9_.+@=-]+)+$": "is not an absolute path below / on the box, like /opt/venv (letters, digits and "
    "'_', '.', '+', '@', '=', '-' between slashes, no trailing slash)",
    jobenv.NAME_RE.pattern: "is not a valid environment variable name: uppercase letters, digits and '_', not "
    "starting with a digit, at most 128 characters",
}


# Keys that moved out of desired/, by JSON pointer: where they went and why.
_MOVED_OUT = {
    "/provider/api_url": "'api_url' moved out of desired/ to the controller (RIGSYNC_API_URL or --api-url): the "
    "account's API key is sent to that URL, and a pull request could point it anywhere; remove the key",
}

# Keys that name a result store (``store``, ``bucket``, ``endpoint``, ``s3``, ``s3_bucket``, ...), wherever they are
# written: refused with STORE_WHY. Where results go is the controller's (``settings.object_store``: its flag and
# variables are named here as that module spells them, a unit test holds the two together).
_STORE_KEY_RE = re.compile(r"(?:^|[_-])(?:s3|bucket|store|endpoint)(?:$|[_-])", re.IGNORECASE)
STORE_WHY = (
    "where results go and their credentials are the controller's settings: --store / RIGSYNC_STORE "
    "(s3://bucket/prefix), RIGSYNC_STORE_ENDPOINT and the AWS credential variables; a pull request could send "
    "the fleet's results anywhere; remove the key"
)

NOTIFY_URL_WHY = (
    "notification URLs are the controller's secrets (RIGSYNC_NOTIFY_URLS): desired/ is committed to git and "
    "names only the events; remove the URL"
)

_WHY_REQUIRED = {
    ("budget", "max_total_usd"): "a budget must cap total spend; without it rigsync could spend without bound",
    ("sweep", "metric"): "a search needs its objective, {key, goal}; the sweep's metrics.key is not taken for it",
}


def schema_errors(doc: Doc, schema: str) -> list[LoadError]:
    out: list[LoadError] = []
    for err in _validator(schema).iter_errors(doc.data):
        path: Path_ = tuple(err.absolute_path)
        if err.validator == "additionalProperties" and err.validator_value is False and isinstance(err.instance, dict):
            allowed = sorted(err.schema.get("properties", {}))
            for key in err.instance:
                if key in err.schema.get("properties", {}):
                    continue
                hint = difflib.get_close_matches(key, allowed, n=1)
                message = f"unknown key '{key}'"
                if hint:
                    message += f"; did you mean '{hint[0]}'?"
                elif allowed:
                    message += f" (allowed: {', '.join(allowed)})"
                if _SECRETISH_RE.search(key):
                    message += "; secrets never belong in desired/ (they are committed to git)"
                message = _MOVED_OUT.get(pointer_of((*path, key)), message)
                if path[:1] == ("notify",) and key != "events":
                    message = f"'{key}' is not set in desired/: {NOTIFY_URL_WHY}"
                if _STORE_KEY_RE.search(key):
                    message = f"'{key}' is not set in desired/: {STORE_WHY}"
                out.append(doc.error((*path, key), message, at_key=True))
            continue
        if err.validator == "required" and isinstance(err.validator_value, list):
            missing = next(
                (k for k in err.validator_value if isinstance(err.instance, dict) and k not in err.instance), None
            )
            line, col = doc.where_key(path)
            target = (*path, missing) if missing is not None else path
            why = _WHY_REQUIRED.get((schema, str(missing)))
            message = f"{err.message}: {why}" if why else err.message
            out.append(LoadError(doc.file, line, col, pointer_of(target), short(message)))
            continue
        if "propertyNames" in err.absolute_schema_path:
            key = str(err.instance)
            friendly = _FRIENDLY_PATTERNS.get(str(err.validator_value))
            message = f"key '{key}' {friendly}" if friendly else err.message
            out.append(doc.error((*path, key), message, at_key=True))
            continue
        if path[:1] == ("notify",) and isinstance(err.instance, str) and "://" in err.instance:
            out.append(doc.error(path, NOTIFY_URL_WHY))  # never quotes it: a notification URL carries its token
            continue
        if path[:1] == ("env",):
            out.append(doc.error(path, _env_schema_message(path, err)))  # never quotes a value: it may be a secret
            continue
        if path[-1:] == ("cache",) and err.validator in ("minItems", "maxItems") and isinstance(err.instance, list):
            low, high = err.schema.get("minItems"), err.schema.get("maxItems")
            out.append(doc.error(path, f"a bootstrap cache lists {low} to {high} paths, not {len(err.instance)} "
                                 "(omit cache: for none)"))
            continue
        if err.validator == "pattern" and str(err.validator_value) in _FRIENDLY_PATTERNS:
            message = f"{err.instance!r} {_FRIENDLY_PATTERNS[str(err.validator_value)]}"
        else:
            message = err.message
        if err.validator == "type" and isinstance(err.instance, bool) and "string" in str(err.validator_value):
            message += " (YAML reads unquoted yes/no/on/off/true/false as booleans: quote the text)"
        if err.validator == "type" and isinstance(err.instance, str):
            message += yaml12_number_hint(err.instance)
        if err.validator == "type" and err.instance is None:
            message += " (an empty value is null: write the value or remove the key)"

        out.append(doc.error(path, message))
    return out


def _env_schema_message(path: Path_, err: Any) -> str:
    """A schema error under a sweep's ``env`` in words that never quote the value (jsonschema's would)."""
    if len(path) == 1:
        if err.validator == "maxProperties":
            return f"env sets more than {err.validator_value} variables"
        return "env must be a mapping of variable names to values"
    if err.validator == "type":
        return (
            "an env value is text or an integer: quote other numbers and booleans (YAML reads unquoted "
            "yes/no/on/off/true/false as booleans, and 1e-3 as a number whose spelling would change)"
        )
    if err.validator == "maxLength":
        return f"an env value is at most {err.validator_value} characters"
    return f"invalid env value ({err.validator})"
