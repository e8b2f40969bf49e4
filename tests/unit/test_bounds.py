"""``reconciler.core.bounds``: its checks are total, and what they let through is within the bound they name."""

from __future__ import annotations

import json
import math

from hypothesis import given
from hypothesis import strategies as st

from reconciler.core.bounds import (
    MAX_JSON_DEPTH,
    MAX_METRIC_ABS,
    TIME_WINDOW_S,
    bounded_int,
    bounded_text,
    clamp_time,
    finite,
    json_depth,
    strict_json,
)
from reconciler.core.textsafe import has_hazard

_anything = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(), st.sampled_from([10**400, -(10**400), 2**1023])
)


@given(_anything)
def test_finite_is_a_finite_float_within_its_limit_or_none(value: object) -> None:
    got = finite(value)
    assert got is None or (isinstance(got, float) and math.isfinite(got) and abs(got) <= MAX_METRIC_ABS)
    if isinstance(value, bool) or not isinstance(value, int | float):
        assert got is None


def test_finite_refuses_the_forged_numbers() -> None:
    assert [finite(v) for v in (math.nan, math.inf, 1e308, 10**400, True, "1")] == [None] * 6
    assert finite(3) == 3.0 and finite(-0.5) == -0.5 and finite(1e300, limit=math.inf) == 1e300


@given(st.floats(), st.floats(min_value=-1e12, max_value=1e12))
def test_clamp_time_lands_within_the_window(t: float, now: float) -> None:
    got = clamp_time(t, now)
    assert abs(got - now) <= TIME_WINDOW_S
    if math.isfinite(t) and abs(t - now) <= TIME_WINDOW_S:
        assert got == t


@given(st.text(), st.integers(min_value=2, max_value=1000))
def test_bounded_text_is_short_and_safe(text: str, limit: int) -> None:
    got = bounded_text(text, limit)
    assert len(got) <= limit and not has_hazard(got.replace("\n", "").replace("\t", ""))


@given(_anything, st.integers(-5, 5), st.integers(-5, 5))
def test_bounded_int_is_an_int_in_range_or_none(value: object, low: int, high: int) -> None:
    got = bounded_int(value, low, high)
    assert got is None or (type(got) is int and low <= got < high and got == value)


_nested = st.recursive(
    st.one_of(st.integers(), st.text(alphabet='[]{}"\\ab', max_size=6)),
    lambda kids: (
        st.lists(kids, max_size=3) | st.dictionaries(st.text(alphabet='[]{}"\\k', max_size=4), kids, max_size=3)
    ),
    max_leaves=40,
)


def _depth(v: object) -> int:
    if isinstance(v, list):
        return 1 + max((_depth(x) for x in v), default=0)
    if isinstance(v, dict):
        return 1 + max((_depth(x) for x in v.values()), default=0)
    return 0


@given(_nested)
def test_json_depth_counts_what_the_parser_would_nest(doc: object) -> None:
    text = json.dumps(doc)
    assert json_depth(text, stop_past=1000) == _depth(doc)
    got, problem = strict_json(text)
    assert (got, problem) == ((doc, None) if _depth(doc) <= MAX_JSON_DEPTH else (None, problem))


@given(st.text(alphabet=st.sampled_from('[]{}"\\,:0123456789.eE-+ ntrufalsNIiy'), max_size=3000))
def test_strict_json_never_raises(text: str) -> None:
    got, problem = strict_json(text)
    assert problem is None or (got is None and len(problem) <= 200)


def test_strict_json_refuses_what_a_box_may_forge() -> None:
    assert strict_json("[" * 100_000)[1] == f"nested deeper than {MAX_JSON_DEPTH}"
    assert strict_json('{"a": NaN}')[1] == "invalid JSON: NaN is not a number"
    assert (strict_json("9" * 5000)[1] or "").startswith("invalid JSON: Exceeds the limit")
    assert strict_json('["[[[[[[[[[[[[[[[[[[[[[[[["]') == (["[" * 24], None), "brackets in strings do not count"
