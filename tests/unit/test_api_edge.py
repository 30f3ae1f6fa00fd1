"""The API edge's pure parts: the JSON depth scan (against the parser's own depth), the
Host/Origin/Content-Type rules, the exposure check, and redaction of what reads return."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duetime.core.config import CommonSettings, Env
from duetime.core.errors import ConfigError, ValidationError
from duetime.core.models import Status
from duetime.producers.api.convert import (
    MAX_SHOWN_DEPTH,
    dead_letter_out,
    execution_out,
    job_out,
)
from duetime.producers.api.dlq import _filter as replay_filter
from duetime.producers.api.guard import HostRules, json_media_type
from duetime.producers.api.jsondepth import deep_field, exceeds_depth, nesting_depth, string_path
from duetime.producers.api.rows import DeadLetterRow, ExecutionRow, JobRow
from duetime.producers.api.settings import ApiSettings, is_loopback

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(alphabet=st.sampled_from('ab[]{}"\\,:\n\u00e9'), max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(alphabet='[]{}"\\k', max_size=4), inner, max_size=3)
    ),
    max_leaves=30,
)


@given(json_values, st.integers(0, 12))
def test_the_byte_scan_agrees_with_the_parsed_depth(value: Any, limit: int) -> None:
    raw = json.dumps(value).encode()
    assert nesting_depth(value) == nesting_depth(json.loads(raw))
    assert exceeds_depth(raw, limit) == (nesting_depth(value) > limit)


@given(st.integers(1, 3000), st.integers(1, 100))
def test_deep_arrays_and_objects_are_caught_however_deep(depth: int, limit: int) -> None:
    arrays = b"[" * depth + b"]" * depth
    objects = b'{"a":' * depth + b"1" + b"}" * depth
    assert exceeds_depth(arrays, limit) == (depth > limit)
    assert exceeds_depth(objects, limit) == (depth > limit)


def test_brackets_inside_strings_do_not_nest_and_malformed_input_is_left_to_the_parser() -> None:
    assert not exceeds_depth(json.dumps({"a": "[" * 1000 + '\\"{'}).encode(), 2)
    assert not exceeds_depth(b"]" * 500, 3)  # no nesting at all: json.loads reports it
    assert exceeds_depth(b"[" * 500, 3)  # unclosed but deep: refused as deep (a 400 either way)


def test_nesting_depth_measures_any_depth_without_recursion() -> None:
    value: Any = 1
    for _ in range(100_000):
        value = [value]
    assert nesting_depth(value) == 100_000
    assert nesting_depth({"a": [1, {"b": []}]}) == 4 and nesting_depth("x") == 0


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("application/json", True),
        ("Application/JSON; charset=UTF-8", True),
        ('application/json;charset="utf-8"', True),
        ("application/json; charset=latin-1", False),
        ("application/json; boundary=x", False),
        ("text/plain", False),
        ("application/x-www-form-urlencoded", False),
        ("multipart/form-data; boundary=x", False),
        ("application/jsonp", False),
        ("", False),
        (None, False),
    ],
)
def test_only_json_bodies_are_read(value: str | None, ok: bool) -> None:
    assert json_media_type(value) is ok


def _settings(**over: Any) -> ApiSettings:
    return ApiSettings(common=CommonSettings(), **over)


def test_the_default_hosts_are_loopback_and_the_bind_host_with_the_port() -> None:
    rules = HostRules(_settings(host="10.1.2.3", port=8080))
    for host in (
        "127.0.0.1:8080",
        "localhost:8080",
        "[::1]:8080",
        "10.1.2.3:8080",
        "LOCALHOST:8080",
    ):
        assert rules.host_ok(host), host
    for host in ("127.0.0.1:8081", "evil.example:8080", "evil.example", "", "127.0.0.1.nip.io"):
        assert not rules.host_ok(host), host
    # a Host without a port (port 80, or a tool that leaves it out): the name decides
    assert rules.host_ok("127.0.0.1") and rules.host_ok("[::1]") and rules.host_ok("localhost")
    # a wildcard bind address is no name a client uses
    assert _settings(host="0.0.0.0").hosts() == ("127.0.0.1:8080", "localhost:8080", "[::1]:8080")
    assert HostRules(_settings(port=80)).host_ok("localhost")  # default port left out


def test_configured_hosts_with_and_without_port_and_the_wildcard() -> None:
    rules = HostRules(_settings(allowed_hosts=("api.example.com", "Ops.Example.com:9000")))
    assert rules.host_ok("api.example.com:443") and rules.host_ok("api.example.com")
    assert rules.host_ok("ops.example.com:9000") and not rules.host_ok("ops.example.com:9001")
    assert not rules.host_ok("127.0.0.1:8080")
    assert HostRules(_settings(allowed_hosts=("*",))).host_ok("anything:1")


def test_origins_same_origin_or_listed_only() -> None:
    rules = HostRules(_settings(port=8080, allowed_origins=("https://ops.example.com",)))
    assert rules.origin_ok("http://127.0.0.1:8080") and rules.origin_ok("http://localhost:8080")
    assert rules.origin_ok("https://ops.example.com") and rules.origin_ok("HTTPS://OPS.example.com")
    for origin in (
        "http://evil.example",
        "http://127.0.0.1:8081",
        "null",
        "file://",
        "http://127.0.0.1:8080/path",
        "http://user@evil.example",
        "ftp://127.0.0.1:8080",
        "https://ops.example.com:8443",
        "http://[::1",
    ):
        assert not rules.origin_ok(origin), origin


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.3.4.5", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.1", False),
        ("my-host", False),
    ],
)
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_no_tokens_means_loopback_only_unless_a_gateway_is_declared() -> None:
    _settings(host="127.0.0.1").check_exposure()
    _settings(host="0.0.0.0", tokens=("x" * 16,)).check_exposure()
    _settings(host="0.0.0.0", allow_no_auth=True).check_exposure()
    with pytest.raises(ConfigError) as refused:
        _settings(host="0.0.0.0").check_exposure()
    for variable in ("DUETIME_API_TOKENS", "DUETIME_API_HOST", "DUETIME_API_ALLOW_NO_AUTH"):
        assert variable in refused.value.message


def test_edge_variables_are_validated_naming_themselves() -> None:
    s = ApiSettings.from_env(
        Env(
            {
                "DUETIME_API_ALLOWED_HOSTS": "api.example.com, 10.0.0.1:8080",
                "DUETIME_API_ALLOWED_ORIGINS": "https://Ops.Example.com/",
                "DUETIME_API_MAX_JSON_DEPTH": "16",
                "DUETIME_API_ALLOW_NO_AUTH": "true",
            }
        )
    )
    assert s.hosts() == ("api.example.com", "10.0.0.1:8080")
    assert s.allowed_origins == ("https://ops.example.com",)
    assert s.max_json_depth == 16 and s.allow_no_auth
    assert ApiSettings.from_env(Env({})).max_json_depth == 64
    for name, value in (
        ("DUETIME_API_ALLOWED_HOSTS", "http://x"),
        ("DUETIME_API_ALLOWED_ORIGINS", "ops.example.com"),
        ("DUETIME_API_ALLOWED_ORIGINS", "https://x/path"),
        ("DUETIME_API_MAX_JSON_DEPTH", "1"),
        ("DUETIME_API_ALLOW_NO_AUTH", "maybe"),
    ):
        with pytest.raises(ConfigError) as bad:
            ApiSettings.from_env(Env({name: value}))
        assert bad.value.details["variable"] == name


def _job_row(**over: Any) -> JobRow:
    row: dict[str, Any] = {
        "job_id": "6f9f3c1e-5d1b-4c1e-9a63-6a0d7e1f2b10",
        "name": "n",
        "status": "pending",
        "next_run_at": None,
        "schedule": None,
        "priority": "normal",
        "target": {
            "type": "http",
            "url": "https://user:pw@hooks.example.com/p?api_key=k1&team=a",
            "method": "POST",
            "headers": {
                "Authorization": "Bearer abcdef123456",
                "X-Api-Key": "k2",
                "Accept": "application/json",
                "X-Signature": "${secret:HOOK}",
            },
        },
        "payload": {"p": 1},
        "retry": {},
        "timeout_s": 1.0,
        "misfire": "skip",
        "overlap": "skip",
        "labels": {},
        "dag_id": None,
        "dag_key": None,
        "depends_on": [],
        "created_at": None,
        "updated_at": None,
        "last_execution": None,
    }
    return JobRow.from_row({**row, **over})


def _execution(error: Any) -> dict[str, Any]:
    return {
        "execution_id": "e",
        "job_id": "j",
        "name": "n",
        "status": "dead",
        "attempt": 1,
        "trigger": "schedule",
        "priority": "normal",
        "scheduled_at": None,
        "queued_at": None,
        "started_at": None,
        "finished_at": None,
        "worker_id": None,
        "error": error,
        "lateness_ms": None,
        "dag_id": None,
        "dag_run_id": None,
        "attempts": [{"attempt": 1, "status": "dead", "error": error}],
    }


SECRETS = ("pw", "k1", "k2", "abcdef123456", "s3cr3t")


def test_reads_redact_target_urls_secret_headers_and_error_texts() -> None:
    error = {
        "type": "ConnectError",
        "message": "POST https://u:s3cr3t@hooks.example.com/p?api_key=k1 failed: "
        "Bearer abcdef123456",
    }
    job = job_out(_job_row(last_execution=_execution(error)))
    text = json.dumps(job)
    for secret in SECRETS:
        assert secret not in text, secret
    assert job["target"]["url"] == "https://***@hooks.example.com/p?api_key=***&team=***"
    assert job["target"]["headers"]["Accept"] == "application/json"
    assert job["target"]["headers"]["X-Signature"] == "${secret:HOOK}"  # a reference, not a secret
    assert "hooks.example.com" in job["last_execution"]["error"]["message"]
    dead = dead_letter_out(
        DeadLetterRow.from_row(
            {
                "execution_id": "e",
                "job_id": "j",
                "name": "n",
                "dead_at": None,
                "attempts": 1,
                "errors": [{"attempt": 1, "error": error}],
                "dag_run_id": None,
                "replayed_at": None,
            }
        )
    )
    one = execution_out(ExecutionRow.from_row(_execution(error)))
    for shown in (dead, one):
        for secret in SECRETS:
            assert secret not in json.dumps(shown), secret


def test_a_payload_too_deep_to_render_is_left_out_with_a_note() -> None:
    deep: Any = 1
    for _ in range(MAX_SHOWN_DEPTH + 1):
        deep = [deep]
    out = job_out(_job_row(payload=deep))
    assert out["payload"] is None and str(MAX_SHOWN_DEPTH) in out["payload_omitted"]
    assert "payload_omitted" not in job_out(_job_row())


def _nest(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ('{"name": "x", "target": {"a": 1}, "payload": ' + _nest(100) + "}", "payload"),
        ('{"jobs": [{"payload": [1, ","]}, {"key": "b", "payload": ' + _nest(99) + "}]}",
         "jobs[1].payload"),
        ('{"execution_ids": ' + _nest(100) + "}", "execution_ids"),
        ('{"a\\"b": ' + _nest(100) + "}", 'a"b'),
        ('{"payload": [1, "x,]", ' + _nest(100) + "]}", "payload"),
        (_nest(100), ""),
        ('{"payload": ' + _nest(10) + "}", ""),
    ],
)  # fmt: skip
def test_the_deep_field_is_named(raw: str, field: str) -> None:
    assert deep_field(raw.encode(), 64) == field


def test_the_first_bad_string_is_named_by_its_path() -> None:
    def nul(text: str) -> bool:
        return "\x00" in text

    assert string_path({"name": "a", "labels": {"k": "v\x00"}}, nul) == "labels.k"
    assert string_path({"jobs": [{"name": "a"}, {"name": "\x00"}]}, nul) == "jobs[1].name"
    assert string_path({"x\x00": 1}, nul) == "x\x00"
    assert string_path({"a": ["ok", 1, None]}, nul) is None


def test_a_row_is_typed_at_the_edge_and_a_missing_column_is_named() -> None:
    row = _job_row(extra_column="ignored")
    assert row.status is Status.PENDING and row.last_execution is None
    columns = {**_execution(None)}
    del columns["lateness_ms"]
    with pytest.raises(TypeError, match="lateness_ms"):
        ExecutionRow.from_row(columns)
    with pytest.raises(ValueError):
        _job_row(status="sleeping")  # not a job status: never shown as if it were one


@given(
    st.dictionaries(
        st.sampled_from(["job_id", "name", "since", "until", "include_replayed", "limit", "x"]),
        st.none() | st.booleans() | st.integers(-2, 20_000) | st.text(max_size=30),
        max_size=7,
    )
)
def test_the_replay_filter_is_checked_field_by_field(body: dict[str, Any]) -> None:
    try:
        flt = replay_filter(body)
    except ValidationError as exc:
        assert exc.field in body  # the error names a field the body has
        return
    assert set(body) <= {"job_id", "name", "since", "until", "include_replayed", "limit"}
    assert 1 <= flt.limit <= 10_000 and isinstance(flt.include_replayed, bool)
    for when in (flt.since, flt.until):
        assert when is None or when.tzinfo is not None
