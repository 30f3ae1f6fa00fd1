"""Limit keys: the template language, the limits' validation (the 422s) and the token bucket
arithmetic, with property tests (issue 18, items 1 and 2)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from duetime.core.errors import ValidationError
from duetime.core.jobspec import build_job
from duetime.core.keys import (
    MAX_KEY_CHARS,
    MAX_TEMPLATE_CHARS,
    KeyTemplateError,
    check_concurrency,
    check_rate_limit,
    parse_template,
    resolve_key,
    take_token,
)

_SEGMENTS = st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True)
_LITERALS = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="{}\x00"),
    max_size=12,
)
_SCALARS = st.one_of(
    st.text(
        alphabet=st.characters(codec="utf-8", exclude_characters="\x00"),
        max_size=12,
    ),
    st.integers(-(10**12), 10**12),
    st.booleans(),
)


# --- the template language -------------------------------------------------------------


@given(
    st.lists(
        st.tuples(_LITERALS, st.lists(_SEGMENTS, min_size=1, max_size=3), _SCALARS),
        min_size=1,
        max_size=4,
    ),
    _LITERALS,
)
def test_a_template_resolves_to_its_literals_and_payload_values(
    pieces: list[tuple[str, list[str], Any]], tail: str
) -> None:
    """Literals come out as written, each placeholder as its payload value (a string as it
    is, a number or a boolean as JSON writes it)."""
    template, expected = "", ""
    payload: dict[str, Any] = {}
    for index, (literal, path, value) in enumerate(pieces):
        path = [f"f{index}", *path]  # distinct top-level fields
        node: dict[str, Any] = payload
        for segment in path[:-1]:
            node = node.setdefault(segment, {})
        node[path[-1]] = value
        template += literal + "{payload." + ".".join(path) + "}"
        shown = (
            value
            if isinstance(value, str)
            else ("true" if value is True else "false" if value is False else str(value))
        )
        expected += literal + shown
    template += tail
    expected += tail
    assume(len(template) <= MAX_TEMPLATE_CHARS)  # longer ones are refused (tested apart)
    parsed = parse_template(template)
    assert len(parsed.paths) == len(pieces)
    if len(expected) <= MAX_KEY_CHARS:
        assert resolve_key(parsed, payload) == expected
    else:
        with pytest.raises(KeyTemplateError, match="longer than"):
            resolve_key(parsed, payload)


@given(st.text(max_size=60))
def test_any_text_either_parses_or_says_why(template: str) -> None:
    """Hostile templates never raise anything but KeyTemplateError (a ValueError)."""
    try:
        parsed = parse_template(template)
    except KeyTemplateError as exc:
        assert str(exc)
        return
    try:
        resolve_key(parsed, {"a": 1})
    except KeyTemplateError as exc:
        assert "placeholder" in str(exc) or "key" in str(exc)


@given(_LITERALS)
def test_braces_are_escaped_by_doubling(text: str) -> None:
    template = "{{" + text + "}}"
    assert resolve_key(parse_template(template), None) == "{" + text + "}"


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("", "empty"),
        ("x" * 201, "longer than 200"),
        ("{payload.a", "unmatched '{'"),
        ("a}b", "unmatched '}'"),
        ("{0.__class__}", "must name a payload field"),
        ("{payload.__class__.__init__}", None),  # a plain (missing) field name, never an attribute
        ("{payload.a b}", "invalid field name"),
        ("{payload.a:>10}", "invalid field name"),
        ("{payload.a!r}", "invalid field name"),
        ("{job_id}", "must name a payload field"),
        ("{payload." + ".".join("a" * 9) + "}", "deeper than 8"),
        ("{payload.a}" * 9, "more than 8 placeholders"),
        ("a\x00b", "NUL"),
    ],
)
def test_bad_templates_are_refused_naming_the_problem(template: str, message: str | None) -> None:
    if message is None:
        with pytest.raises(KeyTemplateError, match="has no field"):
            resolve_key(parse_template(template), {"a": 1})
        return
    with pytest.raises(KeyTemplateError, match=message):
        parse_template(template)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({}, "payload has no field 'tenant'"),
        ({"tenant": None}, "is null"),
        ({"tenant": {"id": 1}}, "is dict"),
        ({"tenant": [1]}, "is list"),
        ([], "payload has no field 'tenant'"),
        ({"tenant": "a\x00b"}, "NUL"),
        ({"tenant": "x" * 300}, "longer than 200"),
    ],
)
def test_payloads_that_do_not_fit_are_refused(payload: Any, message: str) -> None:
    with pytest.raises(KeyTemplateError, match=message):
        resolve_key(parse_template("t-{payload.tenant}"), payload)


def test_list_indexes_and_the_whole_payload() -> None:
    assert resolve_key(parse_template("{payload.0}-{payload.1.x}"), ["a", {"x": 2}]) == "a-2"
    assert resolve_key(parse_template("{payload}"), "whole") == "whole"
    with pytest.raises(KeyTemplateError, match="has no field '5'"):
        resolve_key(parse_template("{payload.5}"), ["a"])


# --- the limits at the edge: 422 naming the field ----------------------------------------


def _job(**extra: Any) -> dict[str, Any]:
    return {
        "name": "j",
        "target": {"type": "http", "url": "https://example.com/hook"},
        "payload": {"tenant": "acme"},
        **extra,
    }


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"concurrency": {"key": "k", "limit": 0}}, "concurrency.limit"),
        ({"concurrency": {"key": "k", "limit": 100001}}, "concurrency.limit"),
        ({"concurrency": {"key": "k", "limit": 1.5}}, "concurrency.limit"),
        ({"concurrency": {"key": "k", "limit": True}}, "concurrency.limit"),
        ({"concurrency": {"key": "{payload.nope}", "limit": 1}}, "concurrency.key"),
        ({"concurrency": {"key": "{bad", "limit": 1}}, "concurrency.key"),
        ({"concurrency": {"key": 5, "limit": 1}}, "concurrency.key"),
        ({"concurrency": {"limit": 1}}, "concurrency"),
        ({"concurrency": {"key": "k", "limit": 1, "x": 1}}, "concurrency"),
        ({"concurrency": "k"}, "concurrency"),
        ({"rate_limit": {"key": "k", "per_s": 0, "burst": 1}}, "rate_limit.per_s"),
        ({"rate_limit": {"key": "k", "per_s": -1, "burst": 1}}, "rate_limit.per_s"),
        ({"rate_limit": {"key": "k", "per_s": math.inf, "burst": 1}}, "rate_limit.per_s"),
        ({"rate_limit": {"key": "k", "per_s": math.nan, "burst": 1}}, "rate_limit.per_s"),
        ({"rate_limit": {"key": "k", "per_s": "1", "burst": 1}}, "rate_limit.per_s"),
        ({"rate_limit": {"key": "k", "per_s": 1, "burst": 0}}, "rate_limit.burst"),
        ({"rate_limit": {"key": "{payload.x}", "per_s": 1, "burst": 1}}, "rate_limit.key"),
    ],
)
def test_bad_limits_are_422_naming_the_field(extra: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        build_job(_job(**extra), now_ms=1_700_000_000_000)
    assert info.value.details["field"] == field
    assert str(info.value).startswith(field.split(".")[0])


def test_good_limits_travel_in_the_definition() -> None:
    definition = build_job(
        _job(
            concurrency={"key": "tenant-{payload.tenant}", "limit": 2},
            rate_limit={"key": "api", "per_s": 2, "burst": 5},
        ),
        now_ms=1_700_000_000_000,
    )
    assert definition.concurrency is not None and definition.rate_limit is not None
    assert (definition.concurrency.key, definition.concurrency.limit) == (
        "tenant-{payload.tenant}",
        2,
    )
    assert (definition.rate_limit.per_s, definition.rate_limit.burst) == (2.0, 5)
    assert check_concurrency({"key": "a", "limit": 3}, None) == ("a", 3)
    assert check_rate_limit({"key": "a", "per_s": 0.5, "burst": 1}, None) == ("a", 0.5, 1)


# --- the token bucket --------------------------------------------------------------------

_RATES = st.floats(0.001, 1000)
_BURSTS = st.integers(1, 1000)


@given(_RATES, _BURSTS, st.lists(st.floats(0, 10), min_size=1, max_size=200))
def test_starts_never_exceed_burst_plus_rate_times_time(
    per_s: float, burst: int, gaps_s: list[float]
) -> None:
    """Over any run of attempts from a full bucket, the starts allowed are at most
    burst + per_s * elapsed (the rate-limit guarantee), and tokens stay in [0, burst]."""
    tokens, elapsed, allowed = float(burst), 0.0, 0
    for gap in gaps_s:
        elapsed += gap
        ok, tokens, wait_s = take_token(tokens, gap, per_s, burst)
        allowed += ok
        assert 0.0 <= tokens <= burst
        assert (wait_s == 0) if ok else (wait_s > 0)
        assert allowed <= burst + per_s * elapsed + 1e-6


@given(_RATES, _BURSTS, st.floats(0, 0.999))
def test_a_refusal_says_exactly_when_the_next_token_comes(
    per_s: float, burst: int, tokens: float
) -> None:
    ok, left, wait_s = take_token(tokens, 0.0, per_s, burst)
    assert not ok and left == tokens
    ok, _, _ = take_token(left, wait_s * (1 + 1e-9) + 1e-12, per_s, burst)
    assert ok


@given(_RATES, _BURSTS, st.floats(0, 1000), st.floats(-100, 0))
def test_a_clock_stepping_back_adds_no_tokens(
    per_s: float, burst: int, tokens: float, elapsed_s: float
) -> None:
    tokens = min(tokens, burst)
    _, left, _ = take_token(tokens, elapsed_s, per_s, burst)
    assert left <= tokens


@given(_RATES, _BURSTS, st.floats(0, 10_000))
def test_a_quiet_bucket_fills_to_burst_and_no_further(
    per_s: float, burst: int, quiet_s: float
) -> None:
    ok, left, _ = take_token(0.0, quiet_s, per_s, burst)
    expected = min(float(burst), quiet_s * per_s)
    assert ok == (expected >= 1)
    assert left == pytest.approx(expected - 1 if ok else expected)


# --- the CLI's flags ---------------------------------------------------------------------


def test_cli_limit_flags_make_the_limits_and_leave_them_out_when_not_given() -> None:
    import argparse

    from duetime.producers.cli.commands import _create_body, add_jobs_arguments

    parser = argparse.ArgumentParser()
    add_jobs_arguments(parser)
    base = ["create", "--name", "x", "--url-target", "https://example.com/hook"]
    args = parser.parse_args(
        [
            *base,
            *("--concurrency-key", "t-{payload.t}", "--concurrency-limit", "2"),
            *("--rate-key", "api", "--rate-per-s", "1.5", "--rate-burst", "3"),
        ]
    )
    body = _create_body(args)
    assert body["concurrency"] == {"key": "t-{payload.t}", "limit": 2}
    assert body["rate_limit"] == {"key": "api", "per_s": 1.5, "burst": 3}
    plain = _create_body(parser.parse_args(base))
    assert "concurrency" not in plain and "rate_limit" not in plain
    # half a limit goes to the API as given: its 422 names what is missing
    half = _create_body(parser.parse_args([*base, "--concurrency-limit", "2"]))
    with pytest.raises(ValidationError, match="misses key"):
        build_job(half, now_ms=1_700_000_000_000)
