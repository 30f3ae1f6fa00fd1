"""Unique jobs and debounce, the pure part (issue 18, item 3): what ``POST /v1/jobs`` takes out
of a body before it builds the job, the refusal of the Kafka-direct SDK, and the CLI flags."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duetime.core.errors import ValidationError
from duetime.core.jobspec import build_job
from duetime.producers.api.uniqueness import MAX_WINDOW_S, take_directive
from duetime.producers.cli.commands import _create_body, add_jobs_arguments

NOW = datetime(2026, 12, 2, 1, 0, tzinfo=UTC)
BODY: dict[str, Any] = {"name": "n", "target": {"type": "http", "url": "http://h/x"}}


def test_a_body_without_them_is_left_as_it_is() -> None:
    assert take_directive(dict(BODY), NOW) == (BODY, None)


@given(
    tenant=st.text(
        alphabet=st.characters(min_codepoint=33, max_codepoint=0x2FFF, exclude_characters="{}"),
        min_size=1,
        max_size=20,
    ),
    window_s=st.floats(0.001, MAX_WINDOW_S),
)
def test_unique_resolves_its_key_from_the_payload(tenant: str, window_s: float) -> None:
    body = {
        **BODY,
        "payload": {"t": tenant},
        "unique": {"key": "r-{payload.t}", "window_s": window_s},
    }
    rest, directive = take_directive(body, NOW)
    assert directive is not None and "unique" not in rest
    assert (directive.kind, directive.key, directive.window_s) == (
        "unique",
        f"r-{tenant}",
        window_s,
    )
    assert rest == {k: v for k, v in body.items() if k != "unique"}  # nothing else changes


@given(window_s=st.floats(0.001, MAX_WINDOW_S), own_at_s=st.none() | st.integers(-3600, 10**6))
def test_a_debounced_job_is_due_at_the_windows_end_or_its_own_later_time(
    window_s: float, own_at_s: int | None
) -> None:
    body = {**BODY, "debounce": {"key": "k", "window_s": window_s}}
    if own_at_s is not None:
        body["schedule"] = {"at": (NOW + timedelta(seconds=own_at_s)).isoformat()}
    rest, directive = take_directive(body, NOW)
    assert directive is not None and directive.kind == "debounce"
    due = datetime.fromisoformat(rest["schedule"]["at"].replace("Z", "+00:00"))
    end = NOW + timedelta(seconds=window_s)
    expected = end if own_at_s is None else max(end, NOW + timedelta(seconds=own_at_s))
    assert abs((due - expected).total_seconds()) < 1e-3
    build_job(rest, now_ms=int(NOW.timestamp() * 1000))  # what the route then builds is valid


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"unique": {"key": "k", "window_s": 0}}, "unique.window_s"),
        ({"unique": {"key": "k", "window_s": float("nan")}}, "unique.window_s"),
        ({"unique": {"key": "k", "window_s": True}}, "unique.window_s"),
        ({"unique": {"key": "k", "window_s": MAX_WINDOW_S * 2}}, "unique.window_s"),
        ({"unique": {"window_s": 1}}, "unique.key"),
        ({"unique": {"key": "", "window_s": 1}}, "unique.key"),
        ({"unique": {"key": "{payload.nope}", "window_s": 1}}, "unique.key"),
        ({"unique": {"key": "{oops", "window_s": 1}}, "unique.key"),
        ({"unique": {"key": "k", "window_s": 1, "extra": 1}}, "unique.extra"),
        ({"unique": ["k", 1]}, "unique"),
        ({"debounce": {"key": "k", "window_s": 1}, "schedule": {"cron": "* * * * *"}}, "debounce"),
        ({"debounce": {"key": "k", "window_s": 1}, "schedule": {"at": "soon"}}, "schedule.at"),
        ({"debounce": {"key": "k", "window_s": 1}, "depends_on": ["a"]}, "debounce"),
        (
            {"debounce": {"key": "k", "window_s": 1}, "unique": {"key": "k", "window_s": 1}},
            "debounce",
        ),
    ],
)
def test_invalid_directives_are_refused_naming_the_field(extra: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        take_directive({**BODY, "payload": {"a": 1}, **extra}, NOW)
    assert caught.value.field == field


@pytest.mark.parametrize("directive", ["unique", "debounce"])
def test_the_kafka_direct_sdk_refuses_them_pointing_at_the_rest_api(directive: str) -> None:
    with pytest.raises(ValidationError) as caught:
        build_job({**BODY, directive: {"key": "k", "window_s": 1}}, now_ms=0)
    assert caught.value.field == directive and "POST /v1/jobs" in str(caught.value)


def cli(*argv: str) -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    add_jobs_arguments(parser)
    return _create_body(
        parser.parse_args(["create", "--name", "n", "--url-target", "http://h/x", *argv])
    )


def test_the_cli_flags_make_the_same_fields() -> None:
    body = cli("--unique-key", "r-{payload.t}", "--window-s", "60", "--max-retries", "2")
    assert body["unique"] == {"key": "r-{payload.t}", "window_s": 60.0}
    assert body["retry"] == {"max_retries": 2}
    body = cli(
        "--debounce-key", "k", "--window-s", "5",
        "--non-retryable-status", "404", "--non-retryable-status", "410",
        "--non-retryable-error", "ValueError", "--ignore-retry-after",
    )  # fmt: skip
    assert body["debounce"] == {"key": "k", "window_s": 5.0}
    assert body["retry"] == {
        "non_retryable_http_statuses": [404, 410],
        "non_retryable_errors": ["ValueError"],
        "respect_retry_after": False,
    }
    assert "unique" not in cli() and "retry" not in cli()
    with pytest.raises(SystemExit):
        cli("--unique-key", "a", "--debounce-key", "b")
