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
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

import jsonschema
import yaml

from reconciler.errors import DesiredStateInvalid, TemplateProblem, YamlRefused
from reconciler.expand import RUN_VARIABLES, count_runs, expand, template_variables
from reconciler.model import (
    Budget,
    Desired,
    Fleet,
    MetricGoal,
    OfferFilters,
    OnExceed,
    PromotionRule,
    Ranking,
    Scalar,
    Sweep,
)
from reconciler.offers import country_code, gpu_name_problem

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

_DURATION_RE = re.compile(r"^(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?$")
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_SECRETISH_RE = re.compile(r"(api[_-]?key|secret|token|password|passwd|private[_-]?key)", re.IGNORECASE)

Path_ = tuple[str | int, ...]


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


class _Builder:
    """Builds Python data from a composed node tree, recording marks and collecting problems."""

    def __init__(self, doc: _Doc, loader: _StrictLoader) -> None:
        self.doc = doc
        self.loader = loader
        self.errors: list[LoadError] = []

    def problem(self, mark: yaml.Mark, path: Path_, message: str) -> None:
        line, col = _mark(mark)
        self.errors.append(LoadError(self.doc.file, line, col, pointer_of(path), message))

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
        try:
            value = self.loader.construct_object(node, deep=False)
        except yaml.YAMLError as exc:
            self.problem(node.start_mark, path, f"cannot read value: {exc}")
            return str(node.value)
        if isinstance(value, float) and not math.isfinite(value):
            self.problem(node.start_mark, path, f"{node.value!r} is not a finite number")
            return str(node.value)
        return value


def _position(text: str, index: int) -> tuple[int, int]:
    line = text.count("\n", 0, index) + 1
    return line, index - (text.rfind("\n", 0, index) + 1) + 1


def parse_yaml(file: str, raw: bytes) -> tuple[_Doc | None, list[LoadError]]:
    """Parse one YAML file into a ``_Doc``; on any problem return (None or partial doc, errors)."""

    def fail(message: str, line: int | None = None, col: int | None = None) -> tuple[None, list[LoadError]]:
        return None, [LoadError(file, line, col, "", _short(message))]

    if len(raw) > MAX_FILE_BYTES:
        return fail(f"file is {len(raw)} bytes; the limit is {MAX_FILE_BYTES} bytes ({MAX_FILE_BYTES // 1024} KiB)")
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
    if not text.strip():
        return fail("file is empty; expected a mapping of keys to values", 1, 1)
    loader = _StrictLoader(text)
    line: int | None
    col: int | None
    try:
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
        return fail(f"YAML error: {exc}")
    except RecursionError:
        return fail("nesting too deep")
    finally:
        loader.dispose()


# ---------------------------------------------------------------------------------------- schema errors

_FRIENDLY_PATTERNS = {
    "^([0-9]{1,6}d)?([0-9]{1,6}h)?([0-9]{1,6}m)?([0-9]{1,6}s)?$": "is not a duration like 90s, 10m, 12h or 1h30m",
    "^[a-z0-9][a-z0-9_-]{0,62}$": (
        "is not a safe name: use lowercase letters, digits, '-' and '_', start with a letter or digit, "
        "at most 63 characters"
    ),
    "^https?://[^\\s@?#]+$": "is not a plain http(s) URL (no spaces, credentials, query or fragment)",
    "^[a-z_][a-z0-9_]{0,62}$": "is not a valid parameter name: lowercase letters, digits and '_', not starting "
    "with a digit",
}


# Keys that moved out of desired/, by JSON pointer: where they went and why.
_MOVED_OUT = {
    "/provider/api_url": "'api_url' moved out of desired/ to the controller (RIGSYNC_API_URL or --api-url): the "
    "account's API key is sent to that URL, and a pull request could point it anywhere; remove the key",
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
            out.append(LoadError(doc.file, line, col, pointer_of(target), _short(err.message)))
            continue
        if "propertyNames" in err.absolute_schema_path:
            key = str(err.instance)
            friendly = _FRIENDLY_PATTERNS.get(str(err.validator_value))
            message = f"key '{key}' {friendly}" if friendly else err.message
            out.append(doc.error((*path, key), message, at_key=True))
            continue
        if err.validator == "pattern" and str(err.validator_value) in _FRIENDLY_PATTERNS:
            message = f"{err.instance!r} {_FRIENDLY_PATTERNS[str(err.validator_value)]}"
        else:
            message = err.message
        if err.validator == "type" and isinstance(err.instance, bool) and "string" in str(err.validator_value):
            message += " (YAML reads unquoted yes/no/on/off/true/false as booleans: quote the text)"
        if err.validator == "type" and err.instance is None:
            message += " (an empty value is null: write the value or remove the key)"

        out.append(doc.error(path, message))
    return out


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
    """The repo-relative path the fleet's ``bootstrap`` names, if it names a safe one."""
    value = data.get("bootstrap")
    if not isinstance(value, str) or not _safe_relative(value):
        return None
    return str(PurePosixPath(DESIRED_DIR) / PurePosixPath(value))


def _fleet_checks(doc: _Doc, files: Mapping[str, bytes]) -> tuple[list[LoadError], tuple[str, str] | None]:
    """Checks beyond the schema. Returns (errors, (bootstrap path, script text) or None)."""
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
    # The box's watchdog destroys a box this long after the controller's last probe: zero would end every box.
    if "orphan_timeout" in data and parse_duration(data["orphan_timeout"]) <= 0:
        errors.append(doc.error(("orphan_timeout",), "orphan_timeout must be longer than 0s"))
    bootstrap: tuple[str, str] | None = None
    if "bootstrap" in data:
        value = data["bootstrap"]
        target = _bootstrap_file(data)
        if target is None:
            errors.append(doc.error(("bootstrap",), f"bootstrap path {value!r} must stay inside desired/ (no '..')"))
        elif target not in files:
            errors.append(doc.error(("bootstrap",), f"bootstrap script {target} does not exist"))
        else:
            raw = files[target]
            if len(raw) > MAX_FILE_BYTES:
                errors.append(doc.error(("bootstrap",), f"bootstrap script {target} is over {MAX_FILE_BYTES} bytes"))
            else:
                try:
                    bootstrap = (target, raw.decode("utf-8"))
                except UnicodeDecodeError:
                    errors.append(doc.error(("bootstrap",), f"bootstrap script {target} is not valid UTF-8"))
    return errors, bootstrap


def _build_fleet(data: Mapping[str, Any], bootstrap: tuple[str, str] | None) -> Fleet:
    offers = data.get("offers", {})
    provider = data.get("provider", {})
    filters = OfferFilters(
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
    defaults = Fleet(name="_")
    script = bootstrap[1] if bootstrap else ""
    return Fleet(
        name=data["name"],
        provider=provider.get("name", "vast"),
        min_instances=int(data["instances"].get("min", 0)),
        max_instances=int(data["instances"]["max"]),
        filters=filters,
        ranking=Ranking(offers.get("rank_by", Ranking.DLPERF_PER_DPH.value)),
        image=data.get("image", defaults.image),
        disk_gb=float(data.get("disk_gb", defaults.disk_gb)),
        bootstrap_path=bootstrap[0] if bootstrap else None,
        bootstrap_script=script,
        bootstrap_hash=hashlib.sha256(script.encode()).hexdigest()[:16] if bootstrap else "",
        idle_timeout_s=_duration(data, "idle_timeout", defaults.idle_timeout_s),
        ttl_s=parse_duration(data["ttl"]) if "ttl" in data else None,
        boot_timeout_s=_duration(data, "boot_timeout", defaults.boot_timeout_s),
        unreachable_grace_s=_duration(data, "unreachable_grace", defaults.unreachable_grace_s),
        heartbeat_stale_s=_duration(data, "heartbeat_stale", defaults.heartbeat_stale_s),
        suspend=bool(data.get("suspend", False)),
        orphan_timeout_s=_duration(data, "orphan_timeout", defaults.orphan_timeout_s),
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
    )


def _sweep_checks(doc: _Doc, fleet_data: Mapping[str, Any] | None) -> list[LoadError]:
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
    for key, values in grid.items():
        for i, value in enumerate(values):
            if isinstance(value, str) and _CONTROL_RE.search(value):
                errors.append(
                    doc.error(("grid", key, i), "control characters (NUL, escape, ...) are not allowed in values")
                )
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
    if "expected_runtime" in data:
        expected = parse_duration(data["expected_runtime"])
        longest = _duration(data, "max_runtime", 3600.0)
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
        if not _safe_relative(path):
            errors.append(
                doc.error(("code", i), f"code path {path!r} must be relative to the repository root, without '..'")
            )
    metrics = data.get("metrics", {})
    if ".." in PurePosixPath(metrics.get("file", "x")).parts:
        errors.append(doc.error(("metrics", "file"), "metrics file must stay inside the run directory (no '..')"))
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
    if fleet_data is not None:
        gpus_max = fleet_data.get("offers", {}).get("gpus_max")
        if gpus_max is not None and gpus > gpus_max:
            errors.append(
                doc.error(
                    ("resources", "gpus"),
                    f"a run needs {gpus} GPUs but the fleet rents boxes with at most {gpus_max} (offers.gpus_max "
                    f"in {FLEET_FILE}); it could never be scheduled",
                )
            )
    return errors


# ----------------------------------------------------------------------------------------------- public


def read_desired_files(repo: Path) -> dict[str, bytes]:
    """Every regular file under ``repo/desired/``, keyed by repo-relative POSIX path ("desired/...").

    Raises ``DesiredStateInvalid`` when desired/ is missing or holds symlinks or special files. Oversized files
    are read only up to one byte past the limit, which is enough for the loader to refuse them.
    """
    root = repo / DESIRED_DIR
    if not root.is_dir():
        missing: list[object] = [LoadError(DESIRED_DIR, None, None, "", f"no {DESIRED_DIR}/ directory in {repo}")]
        raise DesiredStateInvalid(missing)
    out: dict[str, bytes] = {}
    errors: list[LoadError] = []
    for path in sorted(_walk(root)):
        rel = path.relative_to(repo).as_posix()
        if path.is_symlink():
            errors.append(LoadError(rel, None, None, "", "symlinks are not allowed in desired/"))
        elif path.is_dir():
            continue
        elif not path.is_file():
            errors.append(LoadError(rel, None, None, "", "not a regular file"))
        else:
            with path.open("rb") as fh:
                out[rel] = fh.read(MAX_FILE_BYTES + 1)
    if errors:
        raise DesiredStateInvalid([*errors])
    return out


def _walk(root: Path) -> Iterator[Path]:
    for entry in root.iterdir():
        yield entry
        if entry.is_dir() and not entry.is_symlink():
            yield from _walk(entry)


def load_desired_from_dir(repo: Path) -> Desired:
    """``load_desired(read_desired_files(repo))``."""
    return load_desired(read_desired_files(repo))


def load_desired(files: Mapping[str, bytes], *, commit: str | None = None) -> Desired:
    """Validate the desired tree and build the model; raise ``DesiredStateInvalid`` with every problem found.

    ``files`` maps repo-relative paths to contents; paths outside desired/ are ignored, so a whole commit tree
    may be passed.
    """
    files = {k: v for k, v in files.items() if k.startswith(DESIRED_DIR + "/")}
    errors: list[LoadError] = []

    docs: dict[str, _Doc] = {}
    sweep_files = sorted(k for k in files if k.startswith(SWEEPS_DIR) and _is_sweep_file(k))
    if len(sweep_files) > MAX_SWEEP_FILES:
        errors.append(LoadError(SWEEPS_DIR.rstrip("/"), None, None, "", f"more than {MAX_SWEEP_FILES} sweep files"))
        sweep_files = sweep_files[:MAX_SWEEP_FILES]
    for name, schema in ((FLEET_FILE, "fleet"), (BUDGET_FILE, "budget"), *((f, "sweep") for f in sweep_files)):
        if name not in files:
            if name != FLEET_FILE and name != BUDGET_FILE:
                continue
            errors.append(LoadError(name, None, None, "", f"missing: {name} is required"))
            continue
        doc, problems = parse_yaml(name, files[name])
        errors += problems
        if doc is None:
            continue
        schema_problems = _schema_errors(doc, schema)
        errors += schema_problems
        if not schema_problems:
            docs[name] = doc

    fleet_doc = docs.get(FLEET_FILE)
    bootstrap: tuple[str, str] | None = None
    if fleet_doc is not None:
        problems, bootstrap = _fleet_checks(fleet_doc, files)
        errors += problems
        if problems:
            fleet_doc = None

    known = {FLEET_FILE, BUDGET_FILE, README_FILE, *sweep_files}
    fleet_readable, bootstrap_named = _bootstrap_named(files.get(FLEET_FILE))
    if bootstrap_named:
        known.add(bootstrap_named)
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
        problems = _sweep_checks(doc, fleet_data)
        sweep_name = doc.data["name"]
        if sweep_name in names:
            problems.append(doc.error(("name",), f"sweep name '{sweep_name}' is already used by {names[sweep_name]}"))
        else:
            names[sweep_name] = name
        errors += problems
        if not problems:
            sweeps.append(_build_sweep(doc.data, order))

    if not errors and sum(count_runs(s) for s in sweeps) > MAX_RUNS_TOTAL:
        errors.append(
            LoadError(SWEEPS_DIR.rstrip("/"), None, None, "", f"all sweeps together exceed {MAX_RUNS_TOTAL} runs")
        )

    if errors or fleet_doc is None or BUDGET_FILE not in docs:
        ordered: list[object] = [*sorted(errors, key=LoadError.sort_key)]
        raise DesiredStateInvalid(ordered)
    fleet = _build_fleet(fleet_doc.data, bootstrap)
    budget = _build_budget(docs[BUDGET_FILE].data)
    return Desired(fleet=fleet, budget=budget, sweeps=tuple(sweeps), runs=expand(sweeps), commit=commit)


def _is_sweep_file(path: str) -> bool:
    rest = path[len(SWEEPS_DIR) :]
    return "/" not in rest and rest.endswith(".yaml") and not rest.startswith(".")


def _bootstrap_named(raw: bytes | None) -> tuple[bool, str | None]:
    """(fleet file readable, the bootstrap path it names), read leniently: known even when the fleet is invalid."""
    if raw is None:
        return False, None
    doc, _ = parse_yaml(FLEET_FILE, raw)
    if doc is None or not isinstance(doc.data, dict):
        return False, None
    return True, _bootstrap_file(doc.data)


def errors_of(exc: DesiredStateInvalid) -> list[LoadError]:
    """The LoadErrors a DesiredStateInvalid carries (its ``errors`` is typed loosely in errors.py)."""
    return [e for e in exc.errors if isinstance(e, LoadError)]
