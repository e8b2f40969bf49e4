"""The loader cannot crash: whatever bytes or mutations land in desired/, the only outcome is a valid ``Desired`` or
``DesiredStateInvalid`` whose every error names a file under desired/.

Two families of input: arbitrary bytes (and arbitrary text) as each of fleet.yaml, budget.yaml, a sweep file and
(bytes only) the bootstrap script;
and structured mutations of the valid example tree, which stay close enough to YAML to reach the schema, the
cross-field rules and sweep expansion: characters (controls and bidi included) inserted anywhere, scalar values
replaced by YAML 1.1 oddities (huge integers, sexagesimal, octal, dates, nulls, tags, anchors), keys renamed
(``self``, ``true``, ``<<`` ...), values nested deeply, lines duplicated. Bounded so the fast tier stays fast.
"""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from profiles import examples

from reconciler.desired import DESIRED_DIR, errors_of, load_desired, read_desired_files
from reconciler.errors import DesiredStateInvalid

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = dict(read_desired_files(REPO))
TARGETS = ("desired/fleet.yaml", "desired/budget.yaml", "desired/sweeps/tdmpc.yaml")
FUZZ = settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def outcome(files: dict[str, bytes]) -> str:
    """Load; fail the test on anything but success or DesiredStateInvalid with every error located in a file."""
    try:
        load_desired(files, repo_paths={"experiments", "experiments/train.py"})
    except DesiredStateInvalid as exc:
        errors = errors_of(exc)
        assert errors and len(errors) == len(exc.errors), exc.errors
        for error in errors:
            assert error.file == DESIRED_DIR or error.file.startswith(DESIRED_DIR + "/"), error
            assert error.message and "\n" not in error.message, error
            # The loader's safety net turns a surprise into this; every surprise found must get its own check.
            assert "internal error" not in error.message, error
        return f"invalid: {errors[0].message.split(':')[0][:40]}"
    return "valid"


def with_file(path: str, data: bytes) -> dict[str, bytes]:
    files = dict(EXAMPLE)
    files[path] = data
    return files


def test_the_unmutated_example_is_valid() -> None:
    assert outcome(dict(EXAMPLE)) == "valid"


@FUZZ
@given(target=st.sampled_from((*TARGETS, "desired/bootstrap.sh")), data=st.binary(max_size=1500))
def test_arbitrary_bytes(target: str, data: bytes) -> None:
    event(outcome(with_file(target, data)))


@FUZZ
@given(target=st.sampled_from(TARGETS), text=st.text(st.characters(codec="utf-8"), max_size=800))
def test_arbitrary_text(target: str, text: str) -> None:
    event(outcome(with_file(target, text.encode("utf-8", "surrogatepass"))))


# Characters a hostile edit inserts: C0/C1 controls, DEL, bidi controls, noncharacters, YAML indicators, anything.
HOSTILE_CHARS = st.one_of(
    st.sampled_from(
        [
            "\x00", "\x1b", "\x7f", "\x85", "\x9b", "\u202e", "\u2066", "\u2069", "\ufeff", "\ufffe", "\uffff",
            "\t", "\r", "\n", ":", "-", "&", "*", "!", "|", ">", "{", "}", "[", "]", "#", "'", '"', "%", "@", "`",
        ]
    ),
    st.characters(codec="utf-8"),
)

SCALARS = st.one_of(
    st.sampled_from(
        [
            "9" * 25, "-" + "9" * 5000, "1:30", "1:00", "190:20:30", "010", "0o10", "0x1F", "0b101", "1_000",
            "+.inf", "-.inf", ".nan", ".NaN", "1e309", "-1e309", "1e3", "2026-12-01", "2026-12-01 10:00:00",
            "~", "null", "", "yes", "No", "on", "OFF", "y", "true", "[]", "{}", "[1, [2, [3]]]", "&a 1", "*a",
            "!!python/object/apply:os.system ['true']", "!!binary aGk=", "!custom x", '"unclosed', "'q''s'",
            "<<", "? x", "0s", "0m", "5s", "0d0h0m0s", "999999d", "12h", "-1", "0", "1.5", "1.", ".5", "-0",
            "{{ self }}", "{% for x in y %}{% endfor %}", "   ", "|\n  block", ">-\n  folded",
        ]
    ),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(HOSTILE_CHARS, max_size=20),
)

KEYS = st.one_of(
    st.sampled_from(
        [
            "self", "true", "none", "not", "loop", "<<", "on", "no", "name", "seeds", "grid", "ttl", "code",
            "command", "max_total_usd", "api_key", "offers", "instances", "max", "resources", "promotion", "x y",
            "9", "", "-", "?",
        ]
    ),
    st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True),
)

# Grid parameter names the schema allows that Jinja2 might read as something else.
GRID_NAMES = st.one_of(
    st.sampled_from(["self", "true", "false", "none", "not", "loop", "caller", "varargs", "kwargs", "super", "range"]),
    st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True),
)

_VALUE = re.compile(r"^(\s*(?:- )?[A-Za-z_]+:\s*)(\S.*)$", re.MULTILINE)
_KEY = re.compile(r"^(\s*(?:- )?)([A-Za-z_]+)(:)", re.MULTILINE)


@st.composite
def mutated_tree(draw: st.DrawFn) -> dict[str, bytes]:
    files = dict(EXAMPLE)
    for _ in range(draw(st.integers(1, 3))):
        target = draw(st.sampled_from(TARGETS))
        text = files[target].decode("utf-8", "surrogatepass")
        kind = draw(st.sampled_from(["grid", "value", "insert", "key", "nest", "duplicate"]))
        if kind == "insert":
            at = draw(st.integers(0, len(text)))
            text = text[:at] + draw(st.text(HOSTILE_CHARS, min_size=1, max_size=5)) + text[at:]
        elif kind == "value":
            spots = list(_VALUE.finditer(text))
            if spots:
                m = draw(st.sampled_from(spots))
                text = text[: m.start(2)] + draw(SCALARS) + text[m.end(2) :]
        elif kind == "key":
            spots = list(_KEY.finditer(text))
            if spots:
                m = draw(st.sampled_from(spots))
                text = text[: m.start(2)] + draw(KEYS) + text[m.end(2) :]
        elif kind == "nest":
            spots = list(_VALUE.finditer(text))
            if spots:
                m = draw(st.sampled_from(spots))
                depth = draw(st.integers(1, 40))
                opener, closer = draw(st.sampled_from([("[", "]"), ("{a: ", "}")]))
                text = text[: m.start(2)] + opener * depth + m.group(2) + closer * depth + text[m.end(2) :]
        elif kind == "duplicate":
            lines = text.split("\n")
            i = draw(st.integers(0, len(lines) - 1))
            lines.insert(draw(st.integers(0, len(lines))), lines[i])
            text = "\n".join(lines)
        else:
            target = "desired/sweeps/tdmpc.yaml"
            text = files[target].decode("utf-8", "surrogatepass")
            name = draw(GRID_NAMES)
            values = draw(st.lists(st.one_of(SCALARS, st.integers().map(str)), min_size=1, max_size=3))
            text = text.replace(
                "grid:\n", f"grid:\n  {name}: [{', '.join(values)}]\n", 1
            ).replace("--seed {{ seed }}", f"--seed {{{{ seed }}}} {{{{ {name} }}}}", 1)
        files[target] = text.encode("utf-8", "surrogatepass")
    return files


@FUZZ
@given(files=mutated_tree())
def test_mutations_of_the_example(files: dict[str, bytes]) -> None:
    event(outcome(files))


@FUZZ
@given(name=GRID_NAMES, values=st.lists(st.integers(-5, 5), min_size=1, max_size=3, unique=True))
def test_any_grid_parameter_name_the_schema_allows(name: str, values: list[int]) -> None:
    """Every name the schema's pattern admits either expands or is refused with its own error."""
    target = "desired/sweeps/tdmpc.yaml"
    text = EXAMPLE[target].decode()
    text = text.replace("grid:\n", f"grid:\n  {name}: {values}\n", 1)
    text = text.replace("--seed {{ seed }}", f"--seed {{{{ seed }}}} {{{{ {name} }}}}", 1)
    event(outcome(with_file(target, text.encode())))
