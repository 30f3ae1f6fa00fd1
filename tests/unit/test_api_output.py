"""How the API shows a stored task output (``convert.output_of``, pure): strict JSON decoded
as it was returned, a list's large output left out with its size, NaN/Infinity and too deep
nesting left out with the reason; never an error (one odd output must not fail a page)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.consumers.worker.results import encode_output
from duetime.producers.api.convert import MAX_LISTED_OUTPUT_BYTES, output_of

_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=30,
)


@given(_JSON)
@settings(max_examples=200)
def test_what_a_task_returned_is_shown_as_it_was(value: Any) -> None:
    text = encode_output(value)
    shown, omitted = output_of(text, None)
    assert omitted is None
    assert shown == (None if text is None else json.loads(text))


@given(_JSON)
@settings(max_examples=200)
def test_a_list_shows_an_output_up_to_its_limit_and_says_why_not_beyond(value: Any) -> None:
    text = json.dumps(value)
    shown, omitted = output_of(text, MAX_LISTED_OUTPUT_BYTES)
    if len(text.encode()) <= MAX_LISTED_OUTPUT_BYTES:
        assert (shown, omitted) == (json.loads(text), None)
    else:
        assert shown is None and omitted is not None
        assert omitted.startswith(f"{len(text.encode())} bytes, over 1024 in a list")


def test_what_strict_json_cannot_hold_is_left_out_with_the_reason() -> None:
    for text in ('{"ratio": NaN}', "[Infinity]", "-Infinity"):
        shown, omitted = output_of(text, None)
        assert shown is None and omitted is not None and omitted.startswith("not strict JSON")
    shown, omitted = output_of("[" * 10_000 + "]" * 10_000, None)
    assert (shown, omitted) == (None, "nested too deep to show")
    assert output_of("{not json", None)[1] is not None
    assert output_of(None, None) == (None, None)
