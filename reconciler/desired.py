"""The desired/ tree → validated, frozen ``reconciler.model.Desired``.

People and agents edit these YAML files by hand, so the loader's job is to refuse bad input precisely and
all at once: every problem becomes a ``LoadError`` with file, line, column, JSON pointer and message, and
nothing is acted on unless the whole tree is valid. It works from a mapping of repo-relative paths to bytes
so the git layer can feed it the tree of any commit; ``read_desired_files`` builds that mapping from disk.

Hostile input is expected, not exceptional:
- YAML is composed (not constructed) with PyYAML's SafeLoader so every node keeps its line and column;
  Python values are then built from the nodes by hand.
- Anchors and aliases are refused entirely (``&name`` / ``*name``): desired files are reviewed in diffs,
  where aliases hide what a value is, and refusing them makes "billion laughs" impossible rather than bounded.
- Files over ``MAX_FILE_BYTES``, non-UTF-8 bytes, tabs in indentation, nesting deeper than ``MAX_DEPTH``,
  multiple documents, a document that is not a mapping, duplicate keys (PyYAML keeps the last one silently),
  non-finite numbers and explicit tags each get their own clear error.
- Mapping keys are always the text as written, so ``on:`` or ``no:`` stay strings.
- A sweep whose grid expands past ``MAX_RUNS_PER_SWEEP`` is refused before expansion.
- Control, noncharacter and bidi-control characters are found before PyYAML's reader (which would raise on most
  of them) and named with line and column; bidi controls are printable to YAML but let a reviewer read a diff in
  another order than rigsync does.
- People write YAML 1.2 but PyYAML reads 1.1: the plain scalars the two read differently (``1:30``, ``010``,
  ``0x10``, ``1_000``, ``yes``) are refused, not silently taken the 1.1 way; integers are bounded in digits.
- Values that can never work (zero durations, a heartbeat deadline inside the wrapper's period, a sweep no named
  GPU can hold, a ``code`` path missing from the commit, a budget without a total cap) are refused here, where the
  author is, rather than discovered by the planner on rented boxes.
- The reader of the tree (disk or git) bounds what it reads — size before content, depth and entry count, no
  symlinks — and hands the loader what it refused (``TreeFiles``). Finally, ``_guard`` turns any exception nobody
  planned for into an error of the file being read, so a user's file never becomes a traceback.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
import re
import unicodedata
from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache, partial
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

import jsonschema
import yaml

from reconciler import jobenv
from reconciler.errors import DesiredStateInvalid, TemplateProblem, YamlRefused
from reconciler.expand import RUN_VARIABLES, count_runs, expand, parameter_name_problem, template_variables
from reconciler.model import (
    DEFAULT_POOL,
    OWN_PROVIDER,
    Budget,
    Checkpoint,
    Desired,
    Fleet,
    MetricGoal,
    OfferFilters,
    OnExceed,
    OwnHost,
    Pool,
    PromotionRule,
    Ranking,
    Scalar,
    Sweep,
)
from reconciler.offers import country_code, gpu_name_problem, most_gpu_ram_gib
from reconciler.remote import HEARTBEAT_INTERVAL_S

DESIRED_DIR = "desired"
FLEET_FILE = "desired/fleet.yaml"
BUDGET_FILE = "desired/budget.yaml"
SWEEPS_DIR = "desired/sweeps/"
README_FILE = "desired/README.md"
MAX_FILE_BYTES = 256 * 1024
MAX_DEPTH = 20
MAX_RUNS_PER_SWEEP = 10_000
MAX_RUNS_TOTAL = 50_000
MAX_SWEEP_FILES = 500
MAX_MESSAGE = 300

MAX_INT_DIGITS = 18
MAX_DESIRED_DEPTH = 8
MAX_DESIRED_ENTRIES = 2000
MAX_CHARACTER_ERRORS = 10
MAX_ERRORS_PER_FILE = 50
# A heartbeat must be able to miss a beat or two (a busy box, a slow disk) before its run is declared lost.
HEARTBEAT_MARGIN = 3

_DURATION_RE = re.compile(r"^(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?$")
# Characters no desired/ file may hold, anywhere (comments too): C0 controls but tab, LF and CR; DEL; C1 controls;
# the noncharacters U+FFFE/U+FFFF; and the bidirectional embeddings, overrides and isolates, which make a reviewer
# see text in another order than rigsync reads it ("Trojan Source", CVE-2021-42574). PyYAML's reader refuses the
# first kinds with an exception; finding them first turns them into errors with a line, a column and a name.
_REFUSED_CHAR_RE = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ufffe\uffff\ud800-\udfff]"
)
# A value (after YAML's escapes, e.g. "\e" or "\u202e") may not carry them either, nor a carriage return.
_VALUE_CONTROL_RE = re.compile(f"{_REFUSED_CHAR_RE.pattern}|\r")
_C0_NAMES = (
    *("NUL", "SOH", "STX", "ETX", "EOT", "ENQ", "ACK", "BEL", "BS", "HT", "LF", "VT", "FF", "CR", "SO", "SI"),
    *("DLE", "DC1", "DC2", "DC3", "DC4", "NAK", "SYN", "ETB", "CAN", "EM", "SUB", "ESC", "FS", "GS", "RS", "US"),
)
_SECRETISH_RE = re.compile(f"({jobenv.SECRET_WORDS})", re.IGNORECASE)  # the words: one home, in jobenv

Path_ = tuple[str | int, ...]
_T = TypeVar("_T")


@dataclass(frozen=True)
class LoadError:
    """One problem in the desired tree. ``file`` is repo-relative; ``line``/``column`` are 1-based or None."""

    file: str
    line: int | None
    column: int | None
    pointer: str
    message: str

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        return f"{where}: {self.pointer or '/'}: {self.message}"

    def to_json(self) -> dict[str, object]:
        return {
            "file": self.file,
            "line": self.line,
            "column": self.column,
            "pointer": self.pointer,
            "message": self.message,
        }

    def sort_key(self) -> tuple[str, int, int, str, str]:
        return (self.file, self.line or 0, self.column or 0, self.pointer, self.message)


def pointer_of(path: Sequence[str | int]) -> str:
    """RFC 6901 JSON pointer of a path inside a document ("" is the whole document)."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


def _short(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


# ---------------------------------------------------------------------------------------------- schemas


def schema_path(name: str) -> Path:
    """Path of ``schemas/<name>.schema.json`` (``name`` like "fleet"), from the repo or the installed package."""
    filename = name if name.endswith(".json") else f"{name}.schema.json"
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "schemas" / filename, here / "schemas" / filename):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"schema {filename} not found next to the reconciler package")


@cache
def _validator(name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads(schema_path(name).read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


# ------------------------------------------------------------------------------------------------ YAML


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader's composer with anchors, aliases and deep nesting refused at the first event."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event: Any = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent):
            raise YamlRefused(
                f"aliases (*{event.anchor}) are not allowed in desired/ files; write the value out", event.start_mark
            )
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            raise YamlRefused(
                f"anchors (&{anchor}) are not allowed in desired/ files; write the value out", event.start_mark
            )
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise YamlRefused(f"nesting deeper than {MAX_DEPTH} levels", event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


@dataclass
class _Doc:
    """A parsed file: plain Python data plus where each value (and each mapping key) was written."""

    file: str
    data: Any
    value_marks: dict[Path_, tuple[int, int]] = field(default_factory=dict)
    key_marks: dict[Path_, tuple[int, int]] = field(default_factory=dict)

    def where(self, path: Path_) -> tuple[int | None, int | None]:
        mark = self.value_marks.get(path)
        if mark is None:
            return None, None
        return mark

    def where_key(self, path: Path_) -> tuple[int | None, int | None]:
        mark = self.key_marks.get(path) or self.value_marks.get(path)
        if mark is None:
            return None, None
        return mark

    def error(self, path: Path_, message: str, *, at_key: bool = False) -> LoadError:
        line, col = self.where_key(path) if at_key else self.where(path)
        return LoadError(self.file, line, col, pointer_of(path), _short(message))


def _mark(mark: Any) -> tuple[int, int]:
    return (int(mark.line) + 1, int(mark.column) + 1)


def _mark_or_none(mark: Any) -> tuple[int | None, int | None]:
    return _mark(mark) if mark is not None else (None, None)


_STR = "tag:yaml.org,2002:str"
_PLAIN_SCALAR_TAGS = {
    _STR,
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:null",
}


def _tag(tag: str) -> str:
    return tag.replace("tag:yaml.org,2002:", "!!")


_YAML12_INT_RE = re.compile(r"^[-+]?(0|[1-9][0-9]*)$")
_YAML12_FLOAT_RE = re.compile(
    r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$|^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$"
)
_YAML12_BOOLS = frozenset({"true", "True", "TRUE", "false", "False", "FALSE"})


def _yaml11_problem(text: str, tag: str) -> str | None:
    """Why a plain scalar PyYAML resolved as a YAML 1.1 number or boolean must be refused, or None.

    The files are read by PyYAML (YAML 1.1) but written by people and tools who expect YAML 1.2, where
    ``1:30``, ``010``, ``0x10``, ``1_000`` and ``yes`` are not the numbers or booleans 1.1 makes of them.
    Only the forms both versions read the same are accepted; the others would change meaning silently.
    """
    if tag == "tag:yaml.org,2002:bool":
        if text in _YAML12_BOOLS:
            return None
        value = "true" if text.lower() in ("yes", "on", "y") else "false"
        return (
            f"{text!r} is a YAML 1.1 boolean ({value}) but text in YAML 1.2: write {value}, "
            f'or quote it ("{text}") if you mean the text'
        )
    if tag == "tag:yaml.org,2002:int":
        digits = text.lstrip("+-")
        if _YAML12_INT_RE.match(text):
            if len(digits) > MAX_INT_DIGITS:
                return f"integer with {len(digits)} digits is out of range (at most {MAX_INT_DIGITS} digits)"
            return None
        if ":" in text:
            return _yaml11_number(text, "base-60 (sexagesimal) number", _sexagesimal(text))
        if "_" in text:
            return _yaml11_number(text, "number with '_' separators", text.replace("_", ""))
        if digits[:2] in ("0x", "0X"):
            return _yaml11_number(text, "hexadecimal number", None)
        if digits[:2] in ("0b", "0B"):
            return _yaml11_number(text, "binary number", None)
        return _yaml11_number(text, "octal number (leading zero)", None)
    if tag == "tag:yaml.org,2002:float" and not _YAML12_FLOAT_RE.match(text):
        if ":" in text:
            return _yaml11_number(text, "base-60 (sexagesimal) number", _sexagesimal(text))
        return _yaml11_number(text, "number with '_' separators", text.replace("_", ""))
    return None


def _yaml12_number_hint(text: str) -> str:
    """A hint for text YAML 1.2 reads as a number but PyYAML (1.1) as a string: ``1e3``, ``0o17``, ``.5E2``."""
    if re.match(r"^[-+]?0o[0-7]+$", text):
        return f" (YAML 1.1, which rigsync reads, takes {text} as text: write the number in decimal, {int(text, 8)})"
    if _YAML12_FLOAT_RE.match(text) and re.search(r"[eE]", text):
        return (
            f" (YAML 1.1, which rigsync reads, takes {text} as text: write the number with a decimal point and a "
            f"signed exponent, e.g. {float(text):.1e}, or in full)"
        )
    return ""


def _sexagesimal(text: str) -> str | None:
    sign = -1 if text.startswith("-") else 1
    try:
        total = 0.0
        for part in text.lstrip("+-").split(":"):
            total = total * 60 + float(part.replace("_", "") or 0)
    except ValueError:
        return None
    value = sign * total
    if not math.isfinite(value) or abs(value) >= 10**MAX_INT_DIGITS:
        return None
    return str(int(value)) if value == int(value) else repr(value)


def _yaml11_number(text: str, kind: str, plain: str | None) -> str:
    if plain is None:
        try:
            plain = str(int(text.replace("_", ""), 0 if text.lstrip("+-")[:2].lower() in ("0x", "0b") else 8))
        except ValueError:
            plain = None
    if plain is not None and len(plain) > MAX_INT_DIGITS:
        plain = None
    text = text if len(text) <= 40 else text[:37] + "..."
    reads = f" (YAML 1.1 reads it as {plain})" if plain is not None else ""
    instead = f"write {plain} if you mean that number, or " if plain is not None else ""
    return f"{text!r} is a YAML 1.1 {kind}{reads}, which YAML 1.2 reads differently: {instead}quote it (\"{text}\")"


class _Builder:
    """Builds Python data from a composed node tree, recording marks and collecting problems."""

    def __init__(self, doc: _Doc, loader: _StrictLoader) -> None:
        self.doc = doc
        self.loader = loader
        self.errors: list[LoadError] = []

    def problem(self, mark: yaml.Mark, path: Path_, message: str) -> None:
        line, col = _mark(mark)
        self.errors.append(LoadError(self.doc.file, line, col, pointer_of(path), _short(message)))

    def build(self, node: yaml.Node, path: Path_) -> Any:
        self.doc.value_marks[path] = _mark(node.start_mark)
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path)
        if isinstance(node, yaml.SequenceNode):
            if node.tag != "tag:yaml.org,2002:seq":
                self.problem(node.start_mark, path, f"explicit tag {_tag(node.tag)} is not allowed")
            return [self.build(child, (*path, i)) for i, child in enumerate(node.value)]
        assert isinstance(node, yaml.ScalarNode)
        return self._scalar(node, path)

    def _mapping(self, node: yaml.MappingNode, path: Path_) -> dict[str, Any]:
        if node.tag != "tag:yaml.org,2002:map":
            self.problem(node.start_mark, path, f"explicit tag {_tag(node.tag)} is not allowed")
        out: dict[str, Any] = {}
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag not in _PLAIN_SCALAR_TAGS | {
                "tag:yaml.org,2002:merge",
                "tag:yaml.org,2002:timestamp",
            }:
                self.problem(key_node.start_mark, path, "mapping keys must be plain text")
                continue
            key = str(key_node.value)
            key_path = (*path, key)
            if key in out:
                self.problem(
                    key_node.start_mark,
                    key_path,
                    f"duplicate key '{key}' (first set on line {first_line[key]}); YAML would silently keep the last",
                )
                continue
            first_line[key] = key_node.start_mark.line + 1
            self.doc.key_marks[key_path] = _mark(key_node.start_mark)
            out[key] = self.build(value_node, key_path)
        return out

    def _scalar(self, node: yaml.ScalarNode, path: Path_) -> Any:
        if node.tag in ("tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:merge") and node.style is None:
            return str(node.value)  # an unquoted date or "<<" stays the text as written
        if node.tag not in _PLAIN_SCALAR_TAGS:
            self.problem(node.start_mark, path, f"explicit tag {_tag(node.tag)} is not allowed")
            return str(node.value)
        if node.style is None:
            problem = _yaml11_problem(str(node.value), node.tag)
            if problem is not None:
                self.problem(node.start_mark, path, problem)
                return str(node.value)
        try:
            value = self.loader.construct_object(node, deep=False)
        except yaml.YAMLError as exc:
            self.problem(node.start_mark, path, f"cannot read value: {exc}")
            return str(node.value)
        if isinstance(value, float) and not math.isfinite(value):
            self.problem(node.start_mark, path, f"{node.value!r} is not a finite number")
            return str(node.value)
        return value


def _character_name(char: str) -> str:
    code = ord(char)
    if code < 0x20:
        return _C0_NAMES[code]
    if code == 0x7F:
        return "DEL"
    if 0x80 <= code <= 0x9F:
        return "C1 control"
    if 0xD800 <= code <= 0xDFFF:
        return "surrogate"
    return unicodedata.name(char, "noncharacter")


def _character_problems(file: str, text: str) -> list[LoadError]:
    """One error per refused character (the first ``MAX_CHARACTER_ERRORS``), naming it and where it is."""
    errors: list[LoadError] = []
    for found in _REFUSED_CHAR_RE.finditer(text):
        if len(errors) == MAX_CHARACTER_ERRORS:
            errors.append(LoadError(file, None, None, "", "more refused characters follow; only the first are listed"))
            break
        char = found.group()
        line, col = _position(text, found.start())
        what = f"U+{ord(char):04X} {_character_name(char)}"
        if "\u202a" <= char <= "\u202e" or "\u2066" <= char <= "\u2069":
            message = (
                f"bidirectional control character {what} is not allowed in desired/ files: it makes a reviewer "
                "see the text in a different order than rigsync reads it (Trojan Source)"
            )
        else:
            kind = "control character" if ord(char) <= 0x9F else "character"
            message = (
                f"{kind} {what} is not allowed in desired/ files, comments included (terminals and diffs hide "
                "or act on it)"
            )
        errors.append(LoadError(file, line, col, "", message))
    return errors


def _position(text: str, index: int) -> tuple[int, int]:
    line = text.count("\n", 0, index) + 1
    return line, index - (text.rfind("\n", 0, index) + 1) + 1


def parse_yaml(file: str, raw: bytes) -> tuple[_Doc | None, list[LoadError]]:
    """Parse one YAML file into a ``_Doc``; on any problem return (None or partial doc, errors)."""

    def fail(message: str, line: int | None = None, col: int | None = None) -> tuple[None, list[LoadError]]:
        return None, [LoadError(file, line, col, "", _short(message))]

    if len(raw) > MAX_FILE_BYTES:
        return fail(too_big(len(raw)))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        good = raw[: exc.start].decode("utf-8", errors="replace")
        bad_line, bad_col = _position(good, len(good))
        return fail(f"not valid UTF-8: byte 0x{raw[exc.start]:02x} at offset {exc.start}", bad_line, bad_col)
    text = text.removeprefix("\ufeff")
    for number, line_text in enumerate(text.split("\n"), start=1):
        indent = line_text[: len(line_text) - len(line_text.lstrip(" \t"))]
        if "\t" in indent:
            return fail("tab character in indentation; YAML indents with spaces only", number, indent.index("\t") + 1)
    refused = _character_problems(file, text)
    if refused:
        return None, refused
    if not text.strip():
        return fail("file is empty; expected a mapping of keys to values", 1, 1)
    loader: _StrictLoader | None = None
    line: int | None
    col: int | None
    try:
        loader = _StrictLoader(text)
        try:
            node = loader.get_single_node()
        except yaml.composer.ComposerError as exc:
            if exc.context and "single document" in exc.context:
                mark = exc.problem_mark
                line, col = _mark_or_none(mark)
                return fail("multiple YAML documents ('---') in one file; put each in its own file", line, col)
            raise
        if node is None:
            return fail("file has no content (only comments?); expected a mapping of keys to values", 1, 1)
        if not isinstance(node, yaml.MappingNode):
            kind = "a list" if isinstance(node, yaml.SequenceNode) else "a single value"
            line, col = _mark(node.start_mark)
            return fail(f"the document is {kind}; expected a mapping of keys to values", line, col)
        doc = _Doc(file=file, data=None)
        builder = _Builder(doc, loader)
        doc.data = builder.build(node, ())
        return (doc if not builder.errors else None), builder.errors
    except YamlRefused as exc:
        line, col = _mark_or_none(exc.mark)
        return fail(exc.message, line, col)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = _mark_or_none(mark)
        message = " ".join(p for p in (exc.context, exc.problem) if p)
        cm, pm = exc.context_mark, exc.problem_mark
        if cm is not None and pm is not None and cm.line != pm.line:
            message += f" (the construct began at line {cm.line + 1})"
        return fail(f"YAML syntax error: {message}", line, col)
    except yaml.YAMLError as exc:
        return fail(f"YAML error: {' '.join(str(exc).split())}")
    except RecursionError:
        return fail("nesting too deep")
    finally:
        if loader is not None:
            loader.dispose()


# ---------------------------------------------------------------------------------------- schema errors

_FRIENDLY_PATTERNS = {
    "^([0-9]{1,6}d)?([0-9]{1,6}h)?([0-9]{1,6}m)?([0-9]{1,6}s)?$": "is not a duration like 90s, 10m, 12h or 1h30m",
    "^[a-z0-9][a-z0-9_-]{0,62}$": (
        "is not a safe name: use lowercase letters, digits, '-' and '_', start with a letter or digit, "
        "at most 63 characters"
    ),
    "^[a-z_][a-z0-9_]{0,62}$": "is not a valid parameter name: lowercase letters, digits and '_', not starting "
    "with a digit",
    jobenv.NAME_RE.pattern: "is not a valid environment variable name: uppercase letters, digits and '_', not "
    "starting with a digit, at most 128 characters",
}


# Keys that moved out of desired/, by JSON pointer: where they went and why.
_MOVED_OUT = {
    "/provider/api_url": "'api_url' moved out of desired/ to the controller (RIGSYNC_API_URL or --api-url): the "
    "account's API key is sent to that URL, and a pull request could point it anywhere; remove the key",
}

_WHY_REQUIRED = {
    ("budget", "max_total_usd"): "a budget must cap total spend; without it rigsync could spend without bound",
}


def _schema_errors(doc: _Doc, schema: str) -> list[LoadError]:
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
            out.append(LoadError(doc.file, line, col, pointer_of(target), _short(message)))
            continue
        if "propertyNames" in err.absolute_schema_path:
            key = str(err.instance)
            friendly = _FRIENDLY_PATTERNS.get(str(err.validator_value))
            message = f"key '{key}' {friendly}" if friendly else err.message
            out.append(doc.error((*path, key), message, at_key=True))
            continue
        if path[:1] == ("env",):
            out.append(doc.error(path, _env_schema_message(path, err)))  # never quotes a value: it may be a secret
            continue
        if err.validator == "pattern" and str(err.validator_value) in _FRIENDLY_PATTERNS:
            message = f"{err.instance!r} {_FRIENDLY_PATTERNS[str(err.validator_value)]}"
        else:
            message = err.message
        if err.validator == "type" and isinstance(err.instance, bool) and "string" in str(err.validator_value):
            message += " (YAML reads unquoted yes/no/on/off/true/false as booleans: quote the text)"
        if err.validator == "type" and isinstance(err.instance, str):
            message += _yaml12_number_hint(err.instance)
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


# ------------------------------------------------------------------------------------------- conversion


def parse_duration(text: str) -> float:
    """``"1h30m"`` → 5400.0 seconds. The schema has already checked the shape."""
    m = _DURATION_RE.match(text)
    if not m or not text:
        raise ValueError(f"not a duration: {text!r}")
    d, h, mi, s = (int(g) if g else 0 for g in m.groups())
    return float(((d * 24 + h) * 60 + mi) * 60 + s)


def _gib_to_mib(value: float | int | None) -> int | None:
    return None if value is None else round(float(value) * 1024)


def _safe_relative(path: str) -> bool:
    parts = PurePosixPath(path).parts
    return bool(parts) and not path.startswith("/") and ".." not in parts


def _bootstrap_file(data: Mapping[str, Any]) -> str | None:
    """The repo-relative path the fleet's (or a pool's) ``bootstrap`` names, if it names a safe one."""
    value = data.get("bootstrap")
    if not isinstance(value, str) or not _safe_relative(value):
        return None
    return str(PurePosixPath(DESIRED_DIR) / PurePosixPath(value))


def _bootstrap_owners(data: Mapping[str, Any]) -> list[tuple[tuple[str | int, ...], Mapping[str, Any]]]:
    """(pointer, mapping) of the fleet and each pool that may name a ``bootstrap``."""
    owners: list[tuple[tuple[str | int, ...], Mapping[str, Any]]] = [((), data)]
    pools = data.get("pools")
    if isinstance(pools, list):
        owners += [(("pools", i), p) for i, p in enumerate(pools) if isinstance(p, dict)]
    return owners


def _fleet_checks(doc: _Doc, files: Mapping[str, bytes]) -> tuple[list[LoadError], dict[str, str]]:
    """Checks beyond the schema. Returns (errors, bootstrap path -> script text for the fleet's and its pools')."""
    data = doc.data
    errors: list[LoadError] = []
    instances = data.get("instances", {})
    if instances.get("min", 0) > instances.get("max", 0):
        errors.append(
            doc.error(("instances", "min"), f"min ({instances['min']}) is greater than max ({instances['max']})")
        )
    offers = data.get("offers", {})
    if "gpus_max" in offers and offers.get("gpus_min", 1) > offers["gpus_max"]:
        errors.append(
            doc.error(
                ("offers", "gpus_min"),
                f"gpus_min ({offers['gpus_min']}) is greater than gpus_max ({offers['gpus_max']})",
            )
        )
    # What a GPU name or a geolocation means is decided in reconciler.offers; the loader refuses what it cannot use.
    for i, name in enumerate(offers.get("gpu_names", ())):
        problem = gpu_name_problem(name)
        if problem is not None:
            errors.append(doc.error(("offers", "gpu_names", i), f"GPU name {name!r} {problem}"))
    for i, entry in enumerate(offers.get("geolocations", ())):
        if country_code(entry) is None:
            errors.append(
                doc.error(
                    ("offers", "geolocations", i),
                    f"{entry!r} is not a country: write an ISO 3166-1 alpha-2 code such as \"DE\" or an English "
                    "country name such as \"Germany\"",
                )
            )
    errors += _fleet_duration_checks(doc)
    errors += _pool_checks(doc)
    scripts: dict[str, str] = {}
    for at, owner in _bootstrap_owners(data):
        if "bootstrap" not in owner:
            continue
        value = owner["bootstrap"]
        where = (*at, "bootstrap")
        target = _bootstrap_file(owner)
        if target is None:
            errors.append(doc.error(where, f"bootstrap path {value!r} must stay inside desired/ (no '..')"))
        elif target in scripts:
            continue
        elif target not in files:
            errors.append(doc.error(where, f"bootstrap script {target} does not exist"))
        else:
            raw = files[target]
            if len(raw) > MAX_FILE_BYTES:
                errors.append(doc.error(where, f"bootstrap script {target} is over {MAX_FILE_BYTES} bytes"))
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                errors.append(doc.error(where, f"bootstrap script {target} is not valid UTF-8"))
                continue
            # A script is reviewed in the same diffs: the same characters would hide what it runs.
            hidden = _character_problems(target, text)
            errors += hidden
            if not hidden:
                scripts[target] = text
    return errors, scripts


def _pool_checks(doc: _Doc) -> list[LoadError]:
    """``pools:`` beyond the schema: unique names, min <= max, and no fleet-wide floor beside the pools' own."""
    data = doc.data
    pools = data.get("pools")
    if not pools:
        return []
    errors: list[LoadError] = []
    seen: set[str] = set()
    for i, pool in enumerate(pools):
        if pool["name"] in seen:
            errors.append(doc.error(("pools", i, "name"), f"pool {pool['name']!r} is defined twice"))
        seen.add(pool["name"])
        own = pool.get("provider") == OWN_PROVIDER
        if own and "hosts" not in pool:
            errors.append(doc.error(("pools", i, "provider"), "a provider: ssh pool lists its machines in hosts:"))
        if not own and "hosts" in pool:
            errors.append(
                doc.error(("pools", i, "hosts"), "hosts: are the machines of a provider: ssh pool; add provider: ssh")
            )
        for key in ("offers", "instances"):
            if own and key in pool:
                errors.append(
                    doc.error(
                        ("pools", i, key),
                        f"a provider: ssh pool is its hosts: rigsync never rents for it, so it has no {key}",
                    )
                )
        addresses = [(h.get("address"), h.get("port", 22)) for h in pool.get("hosts", ())]
        for n, where in enumerate(addresses):
            if where in addresses[:n]:
                errors.append(doc.error(("pools", i, "hosts", n), f"host {where[0]}:{where[1]} is listed twice"))
        instances = pool.get("instances", {})
        if instances.get("min", 0) > instances.get("max", 1):
            errors.append(
                doc.error(
                    ("pools", i, "instances", "min"),
                    f"min ({instances['min']}) is greater than max ({instances.get('max', 1)})",
                )
            )
    if data.get("instances", {}).get("min", 0) > 0:
        errors.append(
            doc.error(
                ("instances", "min"),
                "with pools, each pool keeps its own instances.min; the fleet's instances.min must be 0 "
                "(instances.max still bounds the whole fleet)",
            )
        )
    return errors


# Why zero cannot work for each fleet duration; none of them documents 0 as "off" (ttl is off when omitted).
_ZERO_FLEET_DURATION = {
    "ttl": "every box would be destroyed as soon as it is rented; omit ttl for no limit",
    "boot_timeout": "every box would be destroyed before it could boot",
    "unreachable_grace": "one missed probe would destroy a box and requeue its runs",
    "heartbeat_stale": "every run would be declared lost at once",
    "orphan_timeout": "each box's watchdog would destroy it at once (it runs after this long without a probe)",
    "idle_timeout": "every box would be destroyed before it could take work",
    "bootstrap_timeout": "every box would be destroyed before its bootstrap could run",
}


def _fleet_duration_checks(doc: _Doc) -> list[LoadError]:
    """Fleet durations that can never work: zero, too short for the run protocol, or contradicting each other."""
    data = doc.data
    errors: list[LoadError] = []
    zero = {key for key in _ZERO_FLEET_DURATION if key in data and parse_duration(data[key]) <= 0}
    for key in sorted(zero):
        errors.append(doc.error((key,), f"{key} must be longer than 0s: {_ZERO_FLEET_DURATION[key]}"))
    least_stale = HEARTBEAT_MARGIN * HEARTBEAT_INTERVAL_S
    if "heartbeat_stale" not in zero and _duration(data, "heartbeat_stale", least_stale) < least_stale:
        errors.append(
            doc.error(
                ("heartbeat_stale",),
                f"heartbeat_stale {data['heartbeat_stale']} is shorter than {least_stale}s: a run's heartbeat is "
                f"touched every {HEARTBEAT_INTERVAL_S}s, so a healthy run would be declared lost (use at least "
                f"{HEARTBEAT_MARGIN}x the period)",
            )
        )
    # Only when both are written: with the default boot_timeout a short ttl (a test fleet's 20s) simply ends first.
    if (
        "ttl" in data
        and "boot_timeout" in data
        and not zero & {"ttl", "boot_timeout"}
        and parse_duration(data["boot_timeout"]) >= parse_duration(data["ttl"])
    ):
        errors.append(
            doc.error(
                ("boot_timeout",),
                f"boot_timeout {data['boot_timeout']} is not shorter than ttl {data['ttl']}: a box would reach its "
                "ttl before it is given up as not booting",
            )
        )
    return errors


def _filters(offers: Mapping[str, Any]) -> OfferFilters:
    return OfferFilters(
        gpu_names=tuple(offers.get("gpu_names", ())),
        num_gpus_min=int(offers.get("gpus_min", 1)),
        num_gpus_max=offers.get("gpus_max"),
        gpu_ram_mib_min=_gib_to_mib(offers.get("min_gpu_ram_gib")),
        reliability_min=_opt_float(offers.get("min_reliability")),
        inet_down_mbps_min=_opt_float(offers.get("min_inet_down_mbps")),
        dph_max=_opt_float(offers.get("max_dph")),
        dlperf_per_dph_min=_opt_float(offers.get("min_dlperf_per_dph")),
        cuda_min=_opt_float(offers.get("min_cuda")),
        verified=bool(offers.get("verified", True)),
        geolocations=tuple(offers.get("geolocations", ())),
    )


def _build_pool(data: Mapping[str, Any], fleet: Fleet, scripts: Mapping[str, str]) -> Pool:
    """One entry of ``pools:``: what it does not say, it takes from the fleet's own fields."""
    instances = data.get("instances", {})
    offers = data.get("offers")
    bootstrap = _bootstrap_file(data) if "bootstrap" in data else fleet.bootstrap_path
    script = scripts.get(bootstrap, "") if bootstrap else ""
    return Pool(
        name=data["name"],
        min_instances=int(instances.get("min", 0)),
        max_instances=int(instances.get("max", 1)),
        filters=_filters(offers) if offers is not None else fleet.filters,
        ranking=Ranking(offers.get("rank_by", Ranking.DLPERF_PER_DPH.value)) if offers is not None else fleet.ranking,
        image=data.get("image", fleet.image),
        disk_gb=float(data.get("disk_gb", fleet.disk_gb)),
        bootstrap_path=bootstrap,
        bootstrap_script=script,
        bootstrap_hash=_script_hash(script) if bootstrap else "",
        provider=str(data.get("provider", "vast")),
        max_bid_dph=_max_bid(data) if "interruptible" in data else fleet.max_bid_dph,
        hosts=tuple(
            OwnHost(
                address=str(h["address"]),
                port=int(h.get("port", 22)),
                user=str(h.get("user", "root")),
                gpus=int(h["gpus"]),
                gpu_name=str(h.get("gpu_name", "own")),
            )
            for h in data.get("hosts", ())
        ),
    )


def _max_bid(data: Mapping[str, Any]) -> float | None:
    """``interruptible: {max_bid_dph: X}`` as X; ``interruptible: null`` (a pool turning the fleet's off) or none:
    None."""
    block = data.get("interruptible")
    return None if not isinstance(block, dict) else float(block["max_bid_dph"])


def _script_hash(script: str) -> str:
    return hashlib.sha256(script.encode()).hexdigest()[:16]


def _build_fleet(data: Mapping[str, Any], scripts: Mapping[str, str]) -> Fleet:
    offers = data.get("offers", {})
    provider = data.get("provider", {})
    filters = _filters(offers)
    defaults = Fleet(name="_")
    bootstrap_path = _bootstrap_file(data) if "bootstrap" in data else None
    script = scripts.get(bootstrap_path, "") if bootstrap_path else ""
    fleet = Fleet(
        name=data["name"],
        provider=provider.get("name", "vast"),
        min_instances=int(data["instances"].get("min", 0)),
        max_instances=int(data["instances"]["max"]),
        filters=filters,
        ranking=Ranking(offers.get("rank_by", Ranking.DLPERF_PER_DPH.value)),
        image=data.get("image", defaults.image),
        disk_gb=float(data.get("disk_gb", defaults.disk_gb)),
        bootstrap_path=bootstrap_path,
        bootstrap_script=script,
        bootstrap_hash=_script_hash(script) if bootstrap_path else "",
        idle_timeout_s=_duration(data, "idle_timeout", defaults.idle_timeout_s),
        ttl_s=parse_duration(data["ttl"]) if "ttl" in data else None,
        boot_timeout_s=_duration(data, "boot_timeout", defaults.boot_timeout_s),
        unreachable_grace_s=_duration(data, "unreachable_grace", defaults.unreachable_grace_s),
        heartbeat_stale_s=_duration(data, "heartbeat_stale", defaults.heartbeat_stale_s),
        suspend=bool(data.get("suspend", False)),
        orphan_timeout_s=_duration(data, "orphan_timeout", defaults.orphan_timeout_s),
        avoid_machines=tuple(sorted(int(m) for m in data.get("avoid_machines", ()))),
        blacklist_after=int(data.get("blacklist_after", defaults.blacklist_after)),
        ghost_cooldown_s=_duration(data, "ghost_cooldown", defaults.ghost_cooldown_s),
        bootstrap_timeout_s=_duration(data, "bootstrap_timeout", defaults.bootstrap_timeout_s),
        max_rents_per_hour=data.get("max_rents_per_hour", defaults.max_rents_per_hour),
        rent_backoff_s=_duration(data, "rent_backoff", defaults.rent_backoff_s),
        max_bid_dph=_max_bid(data),
    )
    pools = tuple(_build_pool(p, fleet, scripts) for p in data.get("pools", ()))
    if not pools:
        return fleet
    # the fleet's own filter set, image and bootstrap are those of its first pool (what single-pool readers see)
    first = pools[0]
    return replace(
        fleet,
        pools=pools,
        filters=first.filters,
        ranking=first.ranking,
        image=first.image,
        disk_gb=first.disk_gb,
        bootstrap_path=first.bootstrap_path,
        bootstrap_script=first.bootstrap_script,
        bootstrap_hash=first.bootstrap_hash,
    )


def _opt_float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def _duration(data: Mapping[str, Any], key: str, default: float) -> float:
    return parse_duration(data[key]) if key in data else default


def _build_budget(data: Mapping[str, Any]) -> Budget:
    return Budget(
        max_instance_dph=_opt_float(data.get("max_instance_dph")),
        max_fleet_dph=_opt_float(data.get("max_fleet_dph")),
        daily_usd=_opt_float(data.get("max_daily_usd")),
        total_usd=_opt_float(data.get("max_total_usd")),
        on_exceed=OnExceed(data.get("on_exceed", OnExceed.DRAIN.value)),
    )


def _build_sweep(data: Mapping[str, Any], order: int) -> Sweep:
    goal = MetricGoal(data.get("metrics", {}).get("goal", MetricGoal.MAX.value))
    rules = [
        PromotionRule(threshold=float(r["threshold"]), add_seeds=int(r["add_seeds"])) for r in data.get("promotion", ())
    ]
    # Strongest bar first: highest threshold for goal max, lowest for goal min.
    rules.sort(key=lambda r: -r.threshold if goal is MetricGoal.MAX else r.threshold)
    resources = data.get("resources", {})
    metrics = data.get("metrics", {})
    grid: tuple[tuple[str, tuple[Scalar, ...]], ...] = tuple((k, tuple(v)) for k, v in data.get("grid", {}).items())
    return Sweep(
        name=data["name"],
        command=data["command"],
        grid=grid,
        seeds=tuple(int(s) for s in data["seeds"]),
        priority=int(data.get("priority", 0)),
        code_paths=tuple(data.get("code", (".",))),
        gpus_per_run=int(resources.get("gpus", 1)),
        min_gpu_ram_mib=_gib_to_mib(resources.get("min_gpu_ram_gib")) or 0,
        max_runtime_s=_duration(data, "max_runtime", 3600.0),
        expected_runtime_s=_duration(data, "expected_runtime", 0.0) if "expected_runtime" in data else None,
        retries=int(data.get("retries", 2)),
        metrics_file=metrics.get("file", "metrics.jsonl"),
        metric_key=metrics.get("key"),
        metric_goal=goal,
        promotion=tuple(rules),
        order=order,
        env=tuple((str(k), str(v)) for k, v in data.get("env", {}).items()),
        artifacts=tuple(data.get("artifacts", ())),
        checkpoint=_checkpoint(data.get("checkpoint")),
        stall_timeout_s=_duration(data, "stall_timeout", 0.0) if "stall_timeout" in data else None,
        stall_gpu_util_pct=float(data.get("stall_gpu_util", 5.0)),
        pool=str(data.get("pool", "")),
    )


def _checkpoint(data: Mapping[str, Any] | None) -> Checkpoint | None:
    """A sweep's ``checkpoint: {path, every}`` (validated by the schema and ``_sweep_checks``)."""
    if not data:
        return None
    return Checkpoint(path=str(data["path"]).rstrip("/"), every_s=parse_duration(data["every"]))


def _sweep_checks(
    doc: _Doc, fleet_data: Mapping[str, Any] | None, repo_paths: Container[str] | None
) -> list[LoadError]:
    data = doc.data
    errors: list[LoadError] = []
    grid: Mapping[str, Any] = data.get("grid", {})
    for key in grid:
        if key in RUN_VARIABLES:
            errors.append(
                doc.error(
                    ("grid", key), f"grid parameter '{key}' clashes with the run variable of that name", at_key=True
                )
            )
        elif (reserved := parameter_name_problem(key)) is not None:
            errors.append(
                doc.error(("grid", key), f"grid parameter '{key}' cannot be used in a command: {reserved}", at_key=True)
            )
    if not data["command"].strip():
        errors.append(doc.error(("command",), "command is blank: it would run nothing"))
    for key, values in grid.items():
        for i, value in enumerate(values):
            found = _VALUE_CONTROL_RE.search(value) if isinstance(value, str) else None
            if found is not None:
                char = found.group()
                errors.append(
                    doc.error(
                        ("grid", key, i),
                        f"control characters (NUL, escape, ...) are not allowed in values: this one has "
                        f"U+{ord(char):04X} {_character_name(char)}",
                    )
                )
    errors += _env_checks(doc)
    try:
        used = template_variables(data["command"])
    except TemplateProblem as exc:
        errors.append(doc.error(("command",), str(exc)))
        used = []
    known = set(grid) | RUN_VARIABLES
    for name in used:
        if name not in known:
            hint = difflib.get_close_matches(name, sorted(known), n=1)
            message = f"template variable '{name}' is neither a grid parameter nor a run variable"
            message += (
                f"; did you mean '{hint[0]}'?" if hint else f" (run variables: {', '.join(sorted(RUN_VARIABLES))})"
            )
            errors.append(doc.error(("command",), message))
    for key in grid:
        if key not in used:
            errors.append(
                doc.error(
                    ("grid", key),
                    f"grid parameter '{key}' is not used in the command, so its cells would run the same command",
                    at_key=True,
                )
            )
    longest = _duration(data, "max_runtime", 3600.0)
    if longest <= 0:
        errors.append(doc.error(("max_runtime",), "max_runtime must be longer than 0s: every run would be killed"))
    if "stall_timeout" in data and parse_duration(data["stall_timeout"]) <= 0:
        errors.append(
            doc.error(("stall_timeout",), "stall_timeout must be longer than 0s: every run would be killed as stalled")
        )
    # max_runtime is only a cap (runs may end long before it), so it may exceed ttl; a run *expected* to outlast
    # ttl, though, can never finish: its box is destroyed ttl after it is rented, every attempt.
    ttl = parse_duration(fleet_data["ttl"]) if fleet_data is not None and "ttl" in fleet_data else 0.0
    if "expected_runtime" in data and fleet_data is not None and 0 < ttl <= parse_duration(data["expected_runtime"]):
        errors.append(
            doc.error(
                ("expected_runtime",),
                f"expected_runtime {data['expected_runtime']} is not shorter than the fleet's ttl {fleet_data['ttl']} "
                f"({FLEET_FILE}): every box is destroyed ttl after it is rented, so such a run could never finish; "
                "raise ttl",
            )
        )
    if "expected_runtime" in data:
        expected = parse_duration(data["expected_runtime"])
        if expected <= 0:
            errors.append(doc.error(("expected_runtime",), "expected_runtime must be longer than 0s"))
        elif expected > longest:
            errors.append(
                doc.error(
                    ("expected_runtime",),
                    f"expected_runtime {data['expected_runtime']} is longer than max_runtime "
                    f"{data.get('max_runtime', '1h')}: a run that long is killed",
                )
            )
    for i, path in enumerate(data.get("code", ())):
        if path == ".":
            continue  # the whole repository, as the schema documents
        if not _safe_relative(path):
            errors.append(
                doc.error(("code", i), f"code path {path!r} must be relative to the repository root, without '..'")
            )
        elif repo_paths is not None and path not in repo_paths:
            errors.append(
                doc.error(("code", i), f"code path {path!r} is not in the repository: there is no such file or folder")
            )
    metrics = data.get("metrics", {})
    if ".." in PurePosixPath(metrics.get("file", "x")).parts:
        errors.append(doc.error(("metrics", "file"), "metrics file must stay inside the run directory (no '..')"))
    for i, pattern in enumerate(data.get("artifacts", ())):
        if pattern.startswith("/") or ".." in PurePosixPath(pattern).parts:
            errors.append(doc.error(("artifacts", i), "artifacts must stay inside the run directory (no '/', no '..')"))
    checkpoint = data.get("checkpoint")
    if checkpoint:
        if ".." in PurePosixPath(checkpoint["path"]).parts:
            errors.append(doc.error(("checkpoint", "path"), "checkpoint path must stay inside the run directory"))
        if parse_duration(checkpoint["every"]) <= 0:
            errors.append(doc.error(("checkpoint", "every"), "checkpoint every must be longer than 0s"))
    promotion = data.get("promotion", [])
    if promotion and "key" not in metrics:
        errors.append(doc.error(("promotion",), "promotion rules need metrics.key (which metric to compare)"))
    seen: dict[float, int] = {}
    for i, rule in enumerate(promotion):
        t = float(rule["threshold"])
        if t in seen:
            errors.append(
                doc.error(("promotion", i, "threshold"), f"threshold {rule['threshold']} repeats rule {seen[t]}")
            )
        seen.setdefault(t, i)
    cells = math.prod(len(v) for v in grid.values())
    total = cells * (len(data["seeds"]) + max((int(r["add_seeds"]) for r in promotion), default=0))
    if total > MAX_RUNS_PER_SWEEP:
        errors.append(
            doc.error(
                ("grid",) if grid else ("seeds",),
                f"sweep expands to {total} runs (with promotion seeds); the limit is {MAX_RUNS_PER_SWEEP}",
            )
        )
    gpus = int(data.get("resources", {}).get("gpus", 1))
    pool_data: Mapping[str, Any] | None = fleet_data
    if fleet_data is not None and fleet_data.get("pools"):
        pools = fleet_data["pools"]
        wanted = data.get("pool", pools[0]["name"])
        pool_data = next((p for p in pools if p["name"] == wanted), None)
        if pool_data is None:
            names = ", ".join(p["name"] for p in pools)
            errors.append(doc.error(("pool",), f"no pool {wanted!r} in {FLEET_FILE} (its pools: {names})"))
        elif "offers" not in pool_data:
            pool_data = fleet_data
    elif fleet_data is not None and data.get("pool", DEFAULT_POOL) != DEFAULT_POOL:
        errors.append(
            doc.error(
                ("pool",),
                f"no pool {data['pool']!r} in {FLEET_FILE}: it defines no pools:, so its one pool is {DEFAULT_POOL!r}",
            )
        )
    if pool_data is not None:
        need_ram = data.get("resources", {}).get("min_gpu_ram_gib")
        named = pool_data.get("offers", {}).get("gpu_names", ())
        most_ram = most_gpu_ram_gib(named)
        if need_ram is not None and most_ram is not None and need_ram > most_ram:
            errors.append(
                doc.error(
                    ("resources", "min_gpu_ram_gib"),
                    f"a run needs {need_ram} GiB of GPU memory but no GPU model the fleet accepts has that much "
                    f"(offers.gpu_names in {FLEET_FILE}: {', '.join(named)}; the most is {most_ram:g} GiB); it "
                    "could never be scheduled",
                )
            )
        gpus_max = pool_data.get("offers", {}).get("gpus_max")
        if gpus_max is not None and gpus > gpus_max:
            errors.append(
                doc.error(
                    ("resources", "gpus"),
                    f"a run needs {gpus} GPUs but the fleet rents boxes with at most {gpus_max} (offers.gpus_max "
                    f"in {FLEET_FILE}); it could never be scheduled",
                )
            )
    return errors


def _env_checks(doc: _Doc) -> list[LoadError]:
    """A sweep's ``env`` beyond the schema (``reconciler.jobenv`` holds the rules). No message quotes a value."""
    env: Mapping[str, Any] = doc.data.get("env", {})
    errors: list[LoadError] = []
    for name, value in env.items():
        if (why := jobenv.name_problem(name)) is not None:
            errors.append(doc.error(("env", name), f"env variable {name} {why}", at_key=True))
            continue
        text = str(value)
        found = _VALUE_CONTROL_RE.search(text)
        if found is not None:
            char = found.group()
            errors.append(
                doc.error(
                    ("env", name),
                    f"control characters (NUL, escape, ...) are not allowed in env values: this one has "
                    f"U+{ord(char):04X} {_character_name(char)}",
                )
            )
        elif (why := jobenv.value_problem(name, text)) is not None:
            errors.append(doc.error(("env", name), why))
    refs = jobenv.references(tuple((str(k), str(v)) for k, v in env.items()))
    expanded = jobenv.expands_reference(doc.data["command"], refs)
    if expanded is not None:
        errors.append(
            doc.error(
                ("command",),
                f"the command expands ${expanded} itself, which puts the value into the job's command line (seen "
                f"by every user of the box in `ps`); read {expanded} from the environment in the program instead",
            )
        )
    return errors


# ----------------------------------------------------------------------------------------------- public


class TreeFiles(dict[str, bytes]):
    """The files under desired/ in one tree (a commit, or the working tree), as a reader found them.

    A plain mapping of repo-relative path to bytes, plus what only the reader knows: ``refused`` maps a path it
    left unread to why (too big to read, a symlink, not a regular file), and ``repo_paths`` answers whether a
    repo-relative path is a file or folder in that tree (None when the reader cannot say cheaply), which is how
    a sweep's ``code`` paths are checked. The git adapter and ``read_desired_files`` build one; ``load_desired``
    reads both.
    """

    def __init__(
        self,
        files: Mapping[str, bytes] | None = None,
        *,
        refused: Mapping[str, str] | None = None,
        repo_paths: Container[str] | None = None,
    ) -> None:
        super().__init__(files or {})
        self.refused: dict[str, str] = dict(refused or {})
        self.repo_paths = repo_paths


def symlink_refused(folder: str) -> str:
    """The one message for a symlink inside ``folder`` (desired/), from the working tree or a git tree."""
    return f"symlinks are not allowed in {folder.rstrip('/')}/"


def folder_is_symlink(folder: str) -> str:
    """The one message for ``folder`` (desired/) itself being a symlink."""
    return f"{folder.rstrip('/')}/ is a symlink; it must be a folder in the repository"


def too_many_entries(folder: str) -> str:
    """The one message for a tree under ``folder`` (desired/) with more than ``MAX_DESIRED_ENTRIES`` entries."""
    return f"{folder.rstrip('/')}/ holds more than {MAX_DESIRED_ENTRIES} entries"


def too_deep(folder: str) -> str:
    """The one message for folders nested past ``MAX_DESIRED_DEPTH`` levels under ``folder`` (desired/)."""
    return f"folders nested deeper than {MAX_DESIRED_DEPTH} levels in {folder.rstrip('/')}/"


def too_big(size: int, limit: int = MAX_FILE_BYTES) -> str:
    """The one message for a file over the size limit (also for blobs the git adapter leaves unread)."""
    return f"file is {size} bytes; the limit is {limit} bytes ({limit // 1024} KiB)"


class _WorkTreePaths(Container[str]):
    """Whether a repo-relative path exists in a working tree (file, folder or symlink)."""

    def __init__(self, repo: Path) -> None:
        self.repo = repo

    def __contains__(self, path: object) -> bool:
        return isinstance(path, str) and _safe_relative(path) and os.path.lexists(self.repo / path)


def read_desired_files(repo: Path) -> TreeFiles:
    """Every regular file under ``repo/desired/``, keyed by repo-relative POSIX path ("desired/...").

    Raises ``DesiredStateInvalid`` when desired/ is missing or a symlink, holds symlinks or special files, or is
    deeper or larger than the limits. Oversized files are not read: they are listed in ``refused`` with their size.
    """
    root = repo / DESIRED_DIR
    if root.is_symlink():
        symlinked: list[object] = [LoadError(DESIRED_DIR, None, None, "", folder_is_symlink(DESIRED_DIR))]
        raise DesiredStateInvalid(symlinked)
    if not root.is_dir():
        missing: list[object] = [LoadError(DESIRED_DIR, None, None, "", f"no {DESIRED_DIR}/ directory in {repo}")]
        raise DesiredStateInvalid(missing)
    out = TreeFiles(repo_paths=_WorkTreePaths(repo))
    errors: list[LoadError] = []
    for path in sorted(_walk(root, errors, repo)):
        rel = path.relative_to(repo).as_posix()
        if path.is_symlink():
            errors.append(LoadError(rel, None, None, "", symlink_refused(DESIRED_DIR)))
        elif path.is_dir():
            continue
        elif not path.is_file():
            errors.append(LoadError(rel, None, None, "", "not a regular file"))
        else:
            with path.open("rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size > MAX_FILE_BYTES:
                    out.refused[rel] = too_big(size)
                else:
                    out[rel] = fh.read(MAX_FILE_BYTES + 1)
    if errors:
        raise DesiredStateInvalid([*errors])
    return out


def _walk(root: Path, errors: list[LoadError], repo: Path) -> Iterator[Path]:
    """Entries under ``root``, iteratively, stopping (with an error) past ``MAX_DESIRED_DEPTH`` folders deep or
    ``MAX_DESIRED_ENTRIES`` entries: desired/ holds a handful of files, and a hostile tree must not exhaust us."""
    stack: list[tuple[Path, int]] = [(root, 1)]
    seen = 0
    while stack:
        folder, depth = stack.pop()
        for entry in sorted(folder.iterdir()):
            seen += 1
            if seen > MAX_DESIRED_ENTRIES:
                errors.append(LoadError(DESIRED_DIR, None, None, "", too_many_entries(DESIRED_DIR)))
                return
            yield entry
            if entry.is_dir() and not entry.is_symlink():
                if depth >= MAX_DESIRED_DEPTH:
                    rel = entry.relative_to(repo).as_posix()
                    errors.append(LoadError(rel, None, None, "", too_deep(DESIRED_DIR)))
                    continue
                stack.append((entry, depth + 1))


def load_desired_from_dir(repo: Path) -> Desired:
    """``load_desired(read_desired_files(repo))``."""
    return load_desired(read_desired_files(repo))


def _guard(file: str, errors: list[LoadError], step: Callable[[], _T]) -> _T | None:
    """Run one step of loading ``file``; an exception nobody planned for becomes that file's error, not a crash.

    Every known way a file can fail has its own check and message; this is the belt to those braces, so a user's
    file can never take the CLI or the daemon down with a traceback.
    """
    try:
        return step()
    except Exception as exc:  # anything at all: a bad file must not crash the loader
        message = f"internal error reading this file: {type(exc).__name__}: {exc}"
        errors.append(LoadError(file, None, None, "", _short(message[: MAX_MESSAGE - 20] + "; please report it")))
        return None


def load_desired(
    files: Mapping[str, bytes], *, commit: str | None = None, repo_paths: Container[str] | None = None
) -> Desired:
    """Validate the desired tree and build the model; raise ``DesiredStateInvalid`` with every problem found.

    ``files`` maps repo-relative paths to contents; paths outside desired/ are ignored, so a whole commit tree
    may be passed. ``repo_paths`` says which paths exist in the repository (files and folders), to check each
    sweep's ``code``; it defaults to what a ``TreeFiles`` knows, and when unknown that check is skipped.
    """
    refused: dict[str, str] = {}
    if isinstance(files, TreeFiles):
        refused = files.refused
        repo_paths = files.repo_paths if repo_paths is None else repo_paths
    files = {k: v for k, v in files.items() if k.startswith(DESIRED_DIR + "/")}
    errors: list[LoadError] = [LoadError(path, None, None, "", why) for path, why in refused.items()]

    docs: dict[str, _Doc] = {}
    parsed: dict[str, _Doc] = {}
    sweep_files = sorted(k for k in files if k.startswith(SWEEPS_DIR) and _is_sweep_file(k))
    if len(sweep_files) > MAX_SWEEP_FILES:
        errors.append(LoadError(SWEEPS_DIR.rstrip("/"), None, None, "", f"more than {MAX_SWEEP_FILES} sweep files"))
        sweep_files = sweep_files[:MAX_SWEEP_FILES]
    for name, schema in ((FLEET_FILE, "fleet"), (BUDGET_FILE, "budget"), *((f, "sweep") for f in sweep_files)):
        if name in refused:
            continue
        if name not in files:
            if name != FLEET_FILE and name != BUDGET_FILE:
                continue
            errors.append(LoadError(name, None, None, "", f"missing: {name} is required"))
            continue
        doc = _guard(name, errors, partial(_parse_and_check, name, files[name], schema, errors, parsed))
        if doc is not None:
            docs[name] = doc

    fleet_doc = docs.get(FLEET_FILE)
    bootstrap: dict[str, str] = {}
    if fleet_doc is not None:
        checked = _guard(FLEET_FILE, errors, partial(_fleet_checks, fleet_doc, files))
        problems, bootstrap = checked if checked is not None else ([], {})
        errors += problems
        if problems or checked is None:
            fleet_doc = None

    known = {FLEET_FILE, BUDGET_FILE, README_FILE, *sweep_files, *refused}
    named = _guard(FLEET_FILE, [], partial(_bootstrap_named, parsed.get(FLEET_FILE)))
    fleet_readable, bootstrap_named = named if named is not None else (False, [])
    known.update(bootstrap_named)
    for name in sorted(files):
        if name in known:
            continue
        if not fleet_readable and not name.startswith(SWEEPS_DIR):
            continue  # it may be the bootstrap script of a fleet file we could not read; don't pile on
        if name.startswith(SWEEPS_DIR) and name.endswith(".yml"):
            message = "sweep files must end in .yaml"
        elif name.startswith(SWEEPS_DIR) and "/" in name[len(SWEEPS_DIR) :]:
            message = "sweeps/ holds files only, no sub-folders"
        else:
            message = (
                "unknown file in desired/ (expected fleet.yaml, budget.yaml, sweeps/*.yaml, README.md "
                "and the fleet's bootstrap script)"
            )
        errors.append(LoadError(name, None, None, "", message))

    sweeps: list[Sweep] = []
    names: dict[str, str] = {}
    fleet_data = fleet_doc.data if fleet_doc is not None else None
    for order, name in enumerate(sweep_files):
        doc = docs.get(name)
        if doc is None:
            continue
        sweep = _guard(name, errors, partial(_checked_sweep, doc, order, fleet_data, repo_paths, names, errors))
        if sweep is not None:
            sweeps.append(sweep)

    if not errors and sum(count_runs(s) for s in sweeps) > MAX_RUNS_TOTAL:
        errors.append(
            LoadError(SWEEPS_DIR.rstrip("/"), None, None, "", f"all sweeps together exceed {MAX_RUNS_TOTAL} runs")
        )

    desired: Desired | None = None
    if not errors and fleet_doc is not None and BUDGET_FILE in docs:
        fleet = _guard(FLEET_FILE, errors, partial(_build_fleet, fleet_doc.data, bootstrap))
        budget = _guard(BUDGET_FILE, errors, partial(_build_budget, docs[BUDGET_FILE].data))
        runs = _guard(SWEEPS_DIR.rstrip("/"), errors, partial(expand, sweeps))
        if fleet is not None and budget is not None and runs is not None:
            desired = Desired(fleet=fleet, budget=budget, sweeps=tuple(sweeps), runs=runs, commit=commit)
    if desired is None:
        if not errors:
            errors.append(LoadError(DESIRED_DIR, None, None, "", "desired/ did not load; please report it"))
        raise DesiredStateInvalid([*_capped(sorted(errors, key=LoadError.sort_key))])
    return desired


def _capped(errors: list[LoadError]) -> list[LoadError]:
    """At most ``MAX_ERRORS_PER_FILE`` errors per file, then one saying how many more: a generated file with
    thousands of duplicate keys must not become thousands of lines in status.yaml and every commit message."""
    out: list[LoadError] = []
    per_file: dict[str, int] = {}
    for error in errors:
        n = per_file[error.file] = per_file.get(error.file, 0) + 1
        if n <= MAX_ERRORS_PER_FILE:
            out.append(error)
    for file, n in sorted(per_file.items()):
        if n > MAX_ERRORS_PER_FILE:
            more = n - MAX_ERRORS_PER_FILE
            out.append(LoadError(file, None, None, "", f"{more} more error(s) in this file not listed"))
    return sorted(out, key=LoadError.sort_key)


def _parse_and_check(
    name: str, raw: bytes, schema: str, errors: list[LoadError], parsed: dict[str, _Doc]
) -> _Doc | None:
    """Parse one file and check it against its schema; its problems go to ``errors``, the doc back if clean.
    A file that parses is kept in ``parsed`` whatever its schema says (what the fleet names is known even then)."""
    doc, problems = parse_yaml(name, raw)
    errors += problems
    if doc is None:
        return None
    parsed[name] = doc
    schema_problems = _schema_errors(doc, schema)
    errors += schema_problems
    return None if schema_problems else doc


def _checked_sweep(
    doc: _Doc,
    order: int,
    fleet_data: Mapping[str, Any] | None,
    repo_paths: Container[str] | None,
    names: dict[str, str],
    errors: list[LoadError],
) -> Sweep | None:
    problems = _sweep_checks(doc, fleet_data, repo_paths)
    sweep_name = doc.data["name"]
    if sweep_name in names:
        problems.append(doc.error(("name",), f"sweep name '{sweep_name}' is already used by {names[sweep_name]}"))
    else:
        names[sweep_name] = doc.file
    errors += problems
    return None if problems else _build_sweep(doc.data, order)


def _is_sweep_file(path: str) -> bool:
    rest = path[len(SWEEPS_DIR) :]
    return "/" not in rest and rest.endswith(".yaml") and not rest.startswith(".")


def _bootstrap_named(doc: _Doc | None) -> tuple[bool, list[str]]:
    """(fleet file readable, the bootstrap paths it and its pools name), read leniently: known even when the fleet is
    invalid."""
    if doc is None or not isinstance(doc.data, dict):
        return False, []
    return True, [t for _, owner in _bootstrap_owners(doc.data) if (t := _bootstrap_file(owner)) is not None]


def errors_of(exc: DesiredStateInvalid) -> list[LoadError]:
    """The LoadErrors a DesiredStateInvalid carries (its ``errors`` is typed loosely in errors.py)."""
    return [e for e in exc.errors if isinstance(e, LoadError)]
