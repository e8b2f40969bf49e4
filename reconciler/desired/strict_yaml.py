"""Strict YAML: one desired/ file's bytes → plain data that remembers where each value was written.

Hostile input is expected, not exceptional:
- YAML is composed (not constructed) with PyYAML's SafeLoader so every node keeps its line and column;
  Python values are then built from the nodes by hand.
- Anchors and aliases are refused entirely (``&name`` / ``*name``): desired files are reviewed in diffs,
  where aliases hide what a value is, and refusing them makes "billion laughs" impossible rather than bounded.
- Files over ``MAX_FILE_BYTES``, non-UTF-8 bytes, tabs in indentation, nesting deeper than ``MAX_DEPTH``,
  multiple documents, a document that is not a mapping, duplicate keys (PyYAML keeps the last one silently),
  non-finite numbers and explicit tags each get their own clear error.
- Mapping keys are always the text as written, so ``on:`` or ``no:`` stay strings.
- Control, noncharacter and bidi-control characters are found before PyYAML's reader (which would raise on most
  of them) and named with line and column; bidi controls are printable to YAML but let a reviewer read a diff in
  another order than rigsync does.
- People write YAML 1.2 but PyYAML reads 1.1: the plain scalars the two read differently (``1:30``, ``010``,
  ``0x10``, ``1_000``, ``yes``) are refused, not silently taken the 1.1 way; integers are bounded in digits.
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any

import yaml

from reconciler.desired.desired_tree import MAX_FILE_BYTES, too_big
from reconciler.desired.load_error import LoadError, Path_, pointer_of, short
from reconciler.errors import YamlRefused

MAX_DEPTH = 20
MAX_INT_DIGITS = 18
MAX_CHARACTER_ERRORS = 10

# Characters no desired/ file may hold, anywhere (comments too): C0 controls but tab, LF and CR; DEL; C1 controls;
# the noncharacters U+FFFE/U+FFFF; and the bidirectional embeddings, overrides and isolates, which make a reviewer
# see text in another order than rigsync reads it ("Trojan Source", CVE-2021-42574). PyYAML's reader refuses the
# first kinds with an exception; finding them first turns them into errors with a line, a column and a name.
_REFUSED_CHAR_RE = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ufffe\uffff\ud800-\udfff]"
)
# A value (after YAML's escapes, e.g. "\e" or "\u202e") may not carry them either, nor a carriage return.
VALUE_CONTROL_RE = re.compile(f"{_REFUSED_CHAR_RE.pattern}|\r")
_C0_NAMES = (
    *("NUL", "SOH", "STX", "ETX", "EOT", "ENQ", "ACK", "BEL", "BS", "HT", "LF", "VT", "FF", "CR", "SO", "SI"),
    *("DLE", "DC1", "DC2", "DC3", "DC4", "NAK", "SYN", "ETB", "CAN", "EM", "SUB", "ESC", "FS", "GS", "RS", "US"),
)


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
class Doc:
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
        return LoadError(self.file, line, col, pointer_of(path), short(message))


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


def yaml12_number_hint(text: str) -> str:
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
    return f'{text!r} is a YAML 1.1 {kind}{reads}, which YAML 1.2 reads differently: {instead}quote it ("{text}")'


class _Builder:
    """Builds Python data from a composed node tree, recording marks and collecting problems."""

    def __init__(self, doc: Doc, loader: _StrictLoader) -> None:
        self.doc = doc
        self.loader = loader
        self.errors: list[LoadError] = []

    def problem(self, mark: yaml.Mark, path: Path_, message: str) -> None:
        line, col = _mark(mark)
        self.errors.append(LoadError(self.doc.file, line, col, pointer_of(path), short(message)))

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


def character_name(char: str) -> str:
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


def character_problems(file: str, text: str) -> list[LoadError]:
    """One error per refused character (the first ``MAX_CHARACTER_ERRORS``), naming it and where it is."""
    errors: list[LoadError] = []
    for found in _REFUSED_CHAR_RE.finditer(text):
        if len(errors) == MAX_CHARACTER_ERRORS:
            errors.append(LoadError(file, None, None, "", "more refused characters follow; only the first are listed"))
            break
        char = found.group()
        line, col = _position(text, found.start())
        what = f"U+{ord(char):04X} {character_name(char)}"
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


def parse_yaml(file: str, raw: bytes) -> tuple[Doc | None, list[LoadError]]:
    """Parse one YAML file into a ``Doc``; on any problem return (None or partial doc, errors)."""

    def fail(message: str, line: int | None = None, col: int | None = None) -> tuple[None, list[LoadError]]:
        return None, [LoadError(file, line, col, "", short(message))]

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
    refused = character_problems(file, text)
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
        doc = Doc(file=file, data=None)
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
