"""agents/lib/jsonsafe.py on its own: every plain JSON document parses to what json.loads
gives, and each refusal names its problem."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.lib import jsonsafe

TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=20)
PLAIN = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=30,
)


@given(value=PLAIN, ascii_only=st.booleans())
@settings(max_examples=300, deadline=None, database=None, derandomize=True)
def test_plain_json_parses_as_json_loads_parses_it(value, ascii_only) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)
    assert jsonsafe.parse(text) == json.loads(text)
    assert jsonsafe.parse(text.encode()) == json.loads(text)
    assert jsonsafe.validate(value) is value


def test_brackets_inside_strings_do_not_count_as_depth() -> None:
    text = json.dumps({"a": "[" * 500, "b": ["\\\"[[[[" * 100]})
    assert jsonsafe.parse(text) == json.loads(text)
    assert jsonsafe.parse("[" * 64 + "]" * 64) is not None


@pytest.mark.parametrize(
    "text, problem, message",
    [
        ('{"a": [1e400]}', "non_finite", "1e400 at $.a[0] is not a finite number"),
        ("[NaN]", "non_finite", "NaN at $[0] is not a finite number"),
        ('{"x y": -Infinity}', "non_finite", '-Infinity at $["x y"] is not a finite number'),
        ("[" * 65 + "]" * 65, "too_deep", "the JSON is nested deeper than 64 levels"),
        ('{"\\ud800": 1}', "invalid_unicode", "a key with a lone surrogate (invalid Unicode) at $"),
        ('["\\udfff"]', "invalid_unicode", "text with a lone surrogate (invalid Unicode) at $[0]"),
        (b'"\xff"', "invalid_unicode", "the body is not UTF-8 (byte 1)"),
        ("1" * 5000, "too_large", "an integer with more than 4,300 digits"),
        ('{"a": ', "invalid", "not valid JSON: Expecting value (line 1, column 7)"),
    ],
)
def test_each_refusal_names_its_problem(text, problem, message) -> None:
    with pytest.raises(jsonsafe.JsonError) as raised:
        jsonsafe.parse(text)
    assert (raised.value.problem, raised.value.message) == (problem, message)


def test_size_is_capped_before_anything_is_decoded() -> None:
    with pytest.raises(jsonsafe.JsonError, match="over 1,000,000 characters"):
        jsonsafe.parse('"' + "x" * 1_000_000 + '"')
    with pytest.raises(jsonsafe.JsonError, match="over 10 characters"):
        jsonsafe.parse('"abcdefghijk"', max_chars=10)


def test_validate_walks_data_deeper_than_pythons_recursion_limit() -> None:
    value: list = []
    for _ in range(100_000):
        value = [value]
    with pytest.raises(jsonsafe.JsonError, match="nested deeper than 64 levels"):
        jsonsafe.validate(value)
    with pytest.raises(jsonsafe.JsonError, match="a set at \\$.s is not JSON"):
        jsonsafe.validate({"s": {1}})
    with pytest.raises(jsonsafe.JsonError, match="a key that is not text"):
        jsonsafe.validate({1: "x"})


def test_a_string_that_never_ends_costs_one_pass_not_one_per_escaped_quote() -> None:
    # '"' + '\\"' * 30_000 took 28 s when every escaped quote restarted the string search;
    # the size here would take hours that way. An outcome, not a timing: it returns.
    with pytest.raises(jsonsafe.JsonError, match="Unterminated string"):
        jsonsafe.parse('"' + '\\"' * 450_000)
