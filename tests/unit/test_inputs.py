"""The edge's checks of hostile values (core/inputs.py, core/redact.py, build_job): each bad
value is a ValidationError naming its field, never an OverflowError, RecursionError or a
value a database or a log line cannot hold."""

from __future__ import annotations

import contextlib
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duetime.core.errors import DuetimeError, InvalidSchedule, PayloadTooLarge, ValidationError
from duetime.core.inputs import check_number, is_uuid_text, json_depth
from duetime.core.jobspec import build_job
from duetime.core.records import JobDefinition, PythonTarget
from duetime.core.redact import escape_control, redact_headers, redact_text, redact_url
from duetime.core.schedule import Cron, next_fire
from duetime.schedulers.logic import _check_uuid

NOW_MS = 1_780_000_000_000
HTTP_TARGET = {"type": "http", "url": "https://example.com/hook"}
BASE: dict[str, Any] = {"name": "n", "target": HTTP_TARGET}


def build(**fields: Any) -> JobDefinition:
    return build_job({**BASE, **fields}, now_ms=NOW_MS, topic_prefix="acme.")


def refused(field: str, **fields: Any) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        build(**fields)
    assert info.value.field == field, info.value.message
    return info.value


def test_reserved_labels_are_refused_unless_internal() -> None:
    refused("labels", labels={"duetime.dag": "00000000-0000-0000-0000-000000000001"})
    refused("labels", labels={"DUETIME.anything": "x"})
    refused("labels", labels={"acme.x": "x"})  # the deployment's topic prefix too
    ok = build_job({**BASE, "labels": {"duetime.dag": "d"}}, now_ms=NOW_MS, internal=True)
    assert ok.labels == {"duetime.dag": "d"}
    assert build(labels={"team": "billing"}).labels == {"team": "billing"}


@pytest.mark.parametrize(
    "header",
    [
        "Host",
        "content-length",
        "Transfer-Encoding",
        "Connection",
        "Proxy-Authorization",
        "X-Duetime-Job-Id",
        "Idempotency-Key",
        "bad header",
        "",
    ],
)
def test_framing_reserved_and_invalid_headers_are_refused(header: str) -> None:
    target = {**HTTP_TARGET, "headers": {header: "v"}}
    refused("target.headers", target=target)


def test_header_values_with_newlines_are_refused() -> None:
    target = {**HTTP_TARGET, "headers": {"X-Ok": "a\r\nHost: evil"}}
    refused("target.headers", target=target)


@pytest.mark.parametrize(
    "topic",
    ["duetime.jobs", "acme.exec.normal", "acme.resolver-runs-changelog", "__consumer_offsets"],
)
def test_reserved_topics_are_refused(topic: str) -> None:
    refused("target.topic", target={"type": "kafka", "topic": topic})


@pytest.mark.parametrize(
    "ref",
    [
        "sys:exit",
        "this:s",
        "builtins:print",
        "os:path.__class__.__subclasses__",
        "x:_private",
        "x.__init__:f",
        "os.path:join",
        "a b",
        "subprocess:run",
    ],
)
def test_python_refs_into_the_stdlib_or_private_names_are_refused(ref: str) -> None:
    refused("target.ref", target={"type": "python", "ref": ref})


@pytest.mark.parametrize("ref", ["send-invoice", "myapp.tasks:send_invoice", "etl:extract"])
def test_task_names_and_module_refs_pass(ref: str) -> None:
    assert build(target={"type": "python", "ref": ref}).target == PythonTarget(ref=ref)


@pytest.mark.parametrize(
    ("field", "body"),
    [
        ("timeout_s", {"timeout_s": 10**400}),
        ("timeout_s", {"timeout_s": 10**5000}),
        ("timeout_s", {"timeout_s": -(10**400)}),
        ("timeout_s", {"timeout_s": float("nan")}),
        ("retry.base_delay_s", {"retry": {"base_delay_s": 10**400}}),
        ("retry.max_delay_s", {"retry": {"max_delay_s": 10**400}}),
        ("retry.max_retries", {"retry": {"max_retries": 10**400}}),
        ("schedule.at", {"schedule": {"at": "0001-01-01T00:00:00+14:00"}}),
        ("schedule.at", {"schedule": {"at": "9999-12-31T23:59:59-14:00"}}),
        ("schedule.end_at", {"schedule": {"cron": "* * * * *", "end_at": "9999-12-31T23:00:00Z"}}),
        ("name", {"name": "a\x00b"}),
        ("name", {"name": "line\nbreak"}),
        ("dag_key", {"dag_key": "k\x00"}),
        ("payload", {"payload": {"k": "nul\x00"}}),
        ("payload", {"payload": json.loads("[" * 100 + "]" * 100)}),
    ],
)
def test_hostile_values_are_validation_errors_naming_the_field(
    field: str, body: dict[str, Any]
) -> None:
    refused(field, **body)


def test_a_deep_payload_is_refused_without_recursion() -> None:
    deep: Any = "x"
    for _ in range(50_000):
        deep = [deep]
    assert json_depth(deep, 64) == 65  # stops counting past the limit
    refused("payload", payload=deep)


@given(st.integers() | st.floats(allow_nan=True) | st.booleans() | st.text())
def test_check_number_never_raises_anything_but_validation_error(value: Any) -> None:
    try:
        result = check_number(value, "f", lo=0, hi=100)
    except ValidationError as exc:
        assert exc.field == "f"
    else:
        assert 0 <= result <= 100


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=30,
)


@given(
    st.dictionaries(
        st.sampled_from(
            [
                "name",
                "schedule",
                "target",
                "payload",
                "retry",
                "timeout_s",
                "labels",
                "priority",
                "misfire",
                "overlap",
                "depends_on",
                "dag_key",
                "junk",
            ]
        ),
        JSON,
    )
)
def test_any_body_is_a_job_or_a_duetime_error(body: dict[str, Any]) -> None:
    with contextlib.suppress(ValidationError, PayloadTooLarge, InvalidSchedule, DuetimeError):
        build_job(body, now_ms=NOW_MS)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "https://user:pw@h.example/p?api_key=s3cret&x=1",
            "https://***@h.example/p?api_key=***&x=***",
        ),
        ("http://h/p", "http://h/p"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@given(st.text(alphabet=st.characters(blacklist_categories=["Cs"]), min_size=8, max_size=40))
def test_secrets_in_urls_and_credentials_never_survive_redaction(secret: str) -> None:
    token = "".join(c for c in secret if c.isalnum()) or "abcdEFGH1234"
    token = (token * 8)[:32]
    text = f"GET https://u:{token}@h/x?k={token} failed; Authorization: Bearer {token}"
    assert token not in redact_text(text)


def test_secret_headers_are_masked_and_references_kept() -> None:
    shown = redact_headers(
        {
            "Authorization": "Bearer abc",
            "X-Api-Key": "k",
            "Cookie": "c",
            "X-Token": "Bearer ${secret:BILLING}",
            "Accept": "json",
        }
    )
    assert shown == {
        "Authorization": "***",
        "X-Api-Key": "***",
        "Cookie": "***",
        "X-Token": "Bearer ${secret:BILLING}",
        "Accept": "json",
    }


def test_escape_control_keeps_one_line() -> None:
    assert "\n" not in escape_control("a\nb\r\nc")


@given(st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1)))
def test_every_second_cron_is_the_next_second_at_any_time_of_day(naive: datetime) -> None:
    after = naive.replace(tzinfo=UTC)
    expected = after.replace(microsecond=0) + timedelta(seconds=1)
    assert next_fire(Cron("* * * * * *"), after) == expected


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/computeMetadata/v1/",
        "http://[::ffff:169.254.169.254]/",
        "http://[fe80::1]/",
        "http://metadata.google.internal/",
        "http://0.0.0.0:8080/",
        "http://host:99999/",
        "http://:80/",
    ],
)
def test_metadata_and_unusable_urls_are_refused_at_creation(url: str) -> None:
    refused("target.url", target={"type": "http", "url": url})


@pytest.mark.parametrize(
    "payload",
    [{1, 2}, b"bytes", {"d": __import__("decimal").Decimal("1.5")}, object(), 10**5000],
    ids=["set", "bytes", "decimal", "object", "huge-int"],
)
def test_payloads_json_cannot_hold_are_validation_errors(payload: Any) -> None:
    refused("payload", payload=payload)


def _uuid_accepts(value: str) -> bool:
    try:
        uuid.UUID(value)
    except (ValueError, TypeError, AttributeError):
        return False
    return True


def _uuid_like() -> st.SearchStrategy[str]:
    """Canonical UUIDs in mixed case, and each with one character replaced, dropped or a
    hyphen moved: the near misses a quick check could let through."""
    canonical = st.uuids().map(str)
    mixed = st.tuples(canonical, st.randoms()).map(
        lambda t: "".join(c.upper() if t[1].random() < 0.5 else c for c in t[0])
    )

    def mutate(t: tuple[str, int, str]) -> str:
        text, at, char = t
        at %= len(text)
        return text[:at] + char + text[at + 1 :]

    replaced = st.tuples(mixed, st.integers(0, 35), st.characters()).map(mutate)
    dropped = st.tuples(mixed, st.integers(0, 35)).map(lambda t: t[0][: t[1]] + t[0][t[1] + 1 :])
    hyphens_anywhere = st.permutations(list("0123456789abcdef" * 2 + "----")).map("".join)
    forms = st.uuids().flatmap(
        lambda u: st.sampled_from([u.hex, f"{{{u}}}", f"urn:uuid:{u}", str(u) + "\n"])
    )
    return st.one_of(mixed, replaced, dropped, hyphens_anywhere, forms, st.text(max_size=40))


@given(_uuid_like())
def test_uuid_text_is_exactly_the_hyphenated_form_uuid_writes(value: str) -> None:
    canonical = _uuid_accepts(value) and str(uuid.UUID(value)) == value.lower()
    assert is_uuid_text(value) == canonical


@given(_uuid_like())
def test_the_schedulers_uuid_check_takes_what_uuid_takes(value: str) -> None:
    """The compiled match is a fast path only: the scheduler's check of a record's ids still
    takes every form ``uuid.UUID`` does (braces, ``urn:uuid:``, 32 digits)."""
    if _uuid_accepts(value):
        _check_uuid(value, "job_id")
    else:
        with pytest.raises(ValueError, match=r"job_id .* is not a UUID"):
            _check_uuid(value, "job_id")
