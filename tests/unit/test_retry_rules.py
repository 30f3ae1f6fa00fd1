"""Per-error-class retry (issue 18, item 6): the policy's fields, the classification of a
failure, Retry-After parsing and the scheduler's retry decision (non-retryable, Retry-After
capped, snooze without an attempt and its cap)."""

from __future__ import annotations

import email.utils
import json
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duetime.consumers.projector import rows
from duetime.consumers.worker.http_target import MAX_RETRY_AFTER_S, retry_after_s
from duetime.consumers.worker.results import from_exception
from duetime.core.errors import RetryLater, ValidationError
from duetime.core.jobspec import build_job
from duetime.core.models import ErrorReason, ResultStatus, Status
from duetime.core.records import ErrorInfo, ExecutionRequest, ExecutionResult, SchedulerState
from duetime.core.retry import RetryPolicy
from duetime.core.retry_rules import (
    MAX_SNOOZES,
    apply_policy,
    exception_types,
    matching_error_name,
    retry_after_delay_s,
)
from duetime.producers.api import convert
from duetime.schedulers import logic
from duetime.schemas.codec import Codec

NOW = 1_800_000_000_000


# --- the policy's fields --------------------------------------------------------------------


def test_the_new_fields_default_to_todays_behaviour_and_round_trip() -> None:
    assert RetryPolicy.from_dict({}) == RetryPolicy()
    p = RetryPolicy.from_dict(
        {
            "non_retryable_http_statuses": [404, 400, 404],
            "non_retryable_errors": ["ValueError", "mypkg.errors:Fatal", "ValueError"],
            "respect_retry_after": False,
        }
    )
    assert p.non_retryable_http_statuses == (400, 404)
    assert p.non_retryable_errors == ("ValueError", "mypkg.errors:Fatal")
    assert RetryPolicy.from_dict(p.to_dict()) == p


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"non_retryable_http_statuses": [200]}, "retry.non_retryable_http_statuses"),
        ({"non_retryable_http_statuses": [99]}, "retry.non_retryable_http_statuses"),
        ({"non_retryable_http_statuses": ["404"]}, "retry.non_retryable_http_statuses"),
        ({"non_retryable_http_statuses": [True]}, "retry.non_retryable_http_statuses"),
        ({"non_retryable_http_statuses": 404}, "retry.non_retryable_http_statuses"),
        (
            {"non_retryable_http_statuses": list(range(300, 400))},
            "retry.non_retryable_http_statuses",
        ),
        ({"non_retryable_errors": "ValueError"}, "retry.non_retryable_errors"),
        ({"non_retryable_errors": ["os.system('x')"]}, "retry.non_retryable_errors"),
        ({"non_retryable_errors": ["a:b:c"]}, "retry.non_retryable_errors"),
        ({"non_retryable_errors": ["x" * 201]}, "retry.non_retryable_errors"),
        ({"non_retryable_errors": [""]}, "retry.non_retryable_errors"),
        ({"respect_retry_after": "yes"}, "retry.respect_retry_after"),
    ],
)
def test_bad_fields_are_refused_naming_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        RetryPolicy.from_dict(body)
    assert caught.value.field == field


# --- classification -------------------------------------------------------------------------


class Fatal(Exception):
    pass


class MoreFatal(Fatal):
    class Inner(Exception):
        pass


def test_exception_types_are_the_class_and_its_bases() -> None:
    types = exception_types(MoreFatal)
    assert types[:2] == [f"{__name__}:MoreFatal", f"{__name__}:Fatal"]
    assert types[-2:] == ["builtins:Exception", "builtins:BaseException"]
    assert exception_types(json.JSONDecodeError)[:2] == [
        "json.decoder:JSONDecodeError",
        "builtins:ValueError",
    ]


def test_a_hostile_metaclass_does_not_break_the_recording() -> None:
    class Meta(type):
        def __getattribute__(cls, name: str) -> Any:
            if name in ("__module__", "__qualname__", "__mro__"):
                raise RuntimeError("no")
            return super().__getattribute__(name)

    class Odd(ValueError, metaclass=Meta):
        pass

    types = exception_types(Odd)
    assert types[0].endswith(".<locals>.Odd") and types[1] == "builtins:ValueError"
    outcome = from_exception(Odd("x"))
    assert outcome.error is not None and outcome.error.exception_types == types


@pytest.mark.parametrize(
    ("name", "matches"),
    [
        ("ValueError", True),  # a base, by its bare name
        ("builtins.ValueError", True),
        ("builtins:ValueError", True),
        ("JSONDecodeError", True),
        ("json.decoder:JSONDecodeError", True),
        ("json.decoder.JSONDecodeError", True),
        ("json:JSONDecodeError", False),  # the class's module is json.decoder
        ("KeyError", False),
        ("Error", False),  # no substring matching
    ],
)
def test_names_match_the_class_or_a_base(name: str, matches: bool) -> None:
    recorded = exception_types(json.JSONDecodeError)
    assert (matching_error_name([name], recorded) == name) is matches


def test_nested_classes_match_by_qualified_name() -> None:
    recorded = exception_types(MoreFatal.Inner)
    assert matching_error_name(["MoreFatal.Inner"], recorded) == "MoreFatal.Inner"
    assert matching_error_name([f"{__name__}.MoreFatal.Inner"], recorded) is not None
    assert matching_error_name(["Inner"], recorded) is None


_IDENT = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)


@given(
    modules=st.lists(_IDENT, min_size=1, max_size=3),
    classes=st.lists(_IDENT, min_size=1, max_size=3),
    other=_IDENT,
)
def test_matching_is_by_whole_names_only(
    modules: list[str], classes: list[str], other: str
) -> None:
    module, qualname = ".".join(modules), ".".join(classes)
    recorded = [f"{module}:{qualname}"]
    for form in (f"{module}:{qualname}", f"{module}.{qualname}", qualname):
        assert matching_error_name([form], recorded) == form
    # a name that is none of the three forms never matches
    if other not in (qualname, f"{module}.{qualname}"):
        assert matching_error_name([other], recorded) is None


def error(**fields: Any) -> ErrorInfo:
    base: dict[str, Any] = dict(type="X", message="m", retryable=True, reason=ErrorReason.ERROR)
    return ErrorInfo(**{**base, **fields})


@given(
    status=st.integers(100, 599),
    listed=st.lists(st.integers(300, 599), max_size=10),
    retryable=st.booleans(),
)
def test_a_listed_status_is_non_retryable_and_nothing_else_changes(
    status: int, listed: list[int], retryable: bool
) -> None:
    policy = RetryPolicy(non_retryable_http_statuses=tuple(listed))
    before = error(http_status=status, reason=ErrorReason.HTTP_STATUS, retryable=retryable)
    after = apply_policy(before, policy)
    if retryable and status in listed:
        assert not after.retryable and after.reason is ErrorReason.NON_RETRYABLE
        assert f"HTTP {status}" in after.message and after.message.endswith("; m")
    else:
        assert after == before


def test_a_listed_exception_type_is_non_retryable() -> None:
    policy = RetryPolicy(non_retryable_errors=("ValueError",))
    outcome = from_exception(json.JSONDecodeError("bad", "doc", 0))
    assert outcome.error is not None
    after = apply_policy(outcome.error, policy)
    assert not after.retryable and after.reason is ErrorReason.NON_RETRYABLE
    assert "'ValueError' in the job's retry.non_retryable_errors" in after.message
    other = from_exception(KeyError("k")).error
    assert other is not None and apply_policy(other, policy) == other


# --- Retry-After ----------------------------------------------------------------------------


@given(seconds=st.integers(0, 10**9))
def test_delay_seconds_parse_and_are_capped(seconds: int) -> None:
    assert retry_after_s(str(seconds), NOW) == min(float(seconds), MAX_RETRY_AFTER_S)


@given(offset_s=st.integers(-(10**6), 10**7))
def test_http_dates_count_from_now(offset_s: int) -> None:
    header = email.utils.formatdate(NOW / 1000 + offset_s, usegmt=True)
    assert retry_after_s(header, NOW) == min(max(float(offset_s), 0.0), MAX_RETRY_AFTER_S)


@given(value=st.text(max_size=80))
def test_any_header_is_a_bounded_delay_or_none(value: str) -> None:
    got = retry_after_s(value, NOW)
    assert got is None or 0 <= got <= MAX_RETRY_AFTER_S


@pytest.mark.parametrize("value", [None, "", "-1", "nan", "inf", "1e3", "soon", "Wed, 99 Foo"])
def test_odd_headers_are_none(value: str | None) -> None:
    assert retry_after_s(value, NOW) is None


@given(
    given_s=st.none() | st.floats(0, MAX_RETRY_AFTER_S),
    from_http=st.booleans(),
    respect=st.booleans(),
    cap_s=st.floats(0.001, MAX_RETRY_AFTER_S),
)
def test_the_delay_a_failure_sets(
    given_s: float | None, from_http: bool, respect: bool, cap_s: float
) -> None:
    got = retry_after_delay_s(
        given_s, from_http=from_http, respect_retry_after=respect, max_delay_s=cap_s
    )
    if given_s is None or (from_http and not respect):
        assert got is None
    elif from_http:
        assert got == min(given_s, cap_s)
    else:
        assert got == given_s


# --- the scheduler's decision ---------------------------------------------------------------


def fired(retry: dict[str, Any]) -> tuple[SchedulerState, ExecutionRequest]:
    definition = build_job(
        {
            "name": "x",
            "schedule": {"at": "2020-01-01T00:00:00Z"},
            "target": {"type": "http", "url": "http://127.0.0.1:9/x"},
            "retry": {"base_delay_s": 1, "jitter": False, **retry},
        },
        now_ms=NOW,
    )
    state, _ = logic.on_definition(None, definition, NOW)
    out = logic.fire_due(state, NOW, logic.Policy())
    return state, out.executions[0]


def failed(
    request: ExecutionRequest, attempt: int, err: ErrorInfo, retry_after: float | None = None
) -> ExecutionResult:
    return ExecutionResult(
        execution_id=request.execution_id,
        job_id=request.job_id,
        attempt=attempt,
        status=ResultStatus.FAILURE,
        worker_id="w",
        lease_token=attempt,
        scheduled_at_ms=request.scheduled_at_ms,
        finished_at_ms=NOW,
        error=err,
        retry_after_s=retry_after,
        priority=request.priority,
    )


def status_of(state: SchedulerState) -> Status:
    """The status, read afresh (mypy narrows ``state.status`` across calls that change it)."""
    return state.status


def apply(state: SchedulerState, res: ExecutionResult, now_ms: int) -> logic.Outputs:
    new, out = logic.on_result(state, res, now_ms, random.Random(0))
    assert new is state
    return out


def test_a_non_retryable_status_goes_to_the_dead_letter_queue_after_one_attempt() -> None:
    state, request = fired({"max_retries": 5, "non_retryable_http_statuses": [404]})
    err = error(type="HttpStatus", reason=ErrorReason.HTTP_STATUS, http_status=404)
    out = apply(state, failed(request, 1, err), NOW + 10)
    assert state.status is Status.DEAD
    [dead] = out.dead_letters
    assert dead.attempts == 1 and dead.errors[0].error.reason is ErrorReason.NON_RETRYABLE
    assert (
        "HTTP 404 is in the job's retry.non_retryable_http_statuses" in dead.errors[0].error.message
    )


def test_a_retryable_status_waits_for_retry_after_capped_at_max_delay() -> None:
    state, request = fired(
        {"max_retries": 5, "max_delay_s": 30, "non_retryable_http_statuses": [404]}
    )
    err = error(type="HttpStatus", reason=ErrorReason.HTTP_STATUS, http_status=503)
    apply(state, failed(request, 1, err, retry_after=1.0), NOW)
    assert state.status is Status.FAILED and state.inflight[0].due_at_ms == NOW + 1000
    out = logic.fire_due(state, NOW + 1000, logic.Policy())
    [retry] = out.executions
    apply(state, failed(request, 2, err, retry_after=3600.0), NOW + 2000)
    assert state.inflight[0].due_at_ms == NOW + 2000 + 30_000  # capped at max_delay_s
    assert retry.attempt == 2


def test_retry_after_is_ignored_when_the_policy_says_so() -> None:
    state, request = fired({"respect_retry_after": False})
    err = error(type="HttpStatus", reason=ErrorReason.HTTP_STATUS, http_status=503)
    apply(state, failed(request, 1, err, retry_after=500.0), NOW)
    assert state.inflight[0].due_at_ms == NOW + 1000  # the backoff: base_delay_s


def test_snoozes_use_no_attempt_up_to_the_cap() -> None:
    state, request = fired({"max_retries": 1})
    snooze = error(type="RetryLater", reason=ErrorReason.SNOOZED)
    now = NOW
    for attempt in range(1, MAX_SNOOZES + 1):
        apply(state, failed(request, attempt, snooze, retry_after=5.0), now)
        assert state.status is Status.FAILED, attempt
        assert state.inflight[0].due_at_ms == now + 5000
        now += 5000
        assert len(logic.fire_due(state, now, logic.Policy()).executions) == 1
    assert state.inflight[0].snoozes == MAX_SNOOZES
    # past the cap a snooze counts as an attempt: the first uses max_retries' one retry...
    apply(state, failed(request, MAX_SNOOZES + 1, snooze, retry_after=5.0), now)
    assert state.status is Status.FAILED
    now += 5000
    logic.fire_due(state, now, logic.Policy())
    # ...and the next one is dead
    out = apply(state, failed(request, MAX_SNOOZES + 2, snooze, retry_after=5.0), now)
    assert status_of(state) is Status.DEAD and len(out.dead_letters) == 1


def test_a_snooze_then_real_failures_still_get_every_retry() -> None:
    state, request = fired({"max_retries": 1})
    apply(state, failed(request, 1, error(reason=ErrorReason.SNOOZED), retry_after=1.0), NOW)
    logic.fire_due(state, NOW + 1000, logic.Policy())
    apply(state, failed(request, 2, error()), NOW + 1000)
    assert state.status is Status.FAILED  # the one retry max_retries allows
    logic.fire_due(state, NOW + 5000, logic.Policy())
    out = apply(state, failed(request, 3, error()), NOW + 5000)
    assert status_of(state) is Status.DEAD and out.dead_letters[0].attempts == 3


def test_the_worker_reports_a_snooze_and_its_delay() -> None:
    outcome = from_exception(RetryLater("not yet", delay_s=2.5, snooze=True))
    assert outcome.error is not None and outcome.error.reason is ErrorReason.SNOOZED
    assert outcome.retry_after_s == 2.5 and outcome.error.exception_types == []
    plain = from_exception(RetryLater("again"))
    assert plain.error is not None and plain.error.reason is ErrorReason.ERROR


def test_state_with_snoozes_and_policies_round_trips_through_avro() -> None:
    state, request = fired(
        {"non_retryable_http_statuses": [410], "non_retryable_errors": ["a.b:C"]}
    )
    apply(state, failed(request, 1, error(reason=ErrorReason.SNOOZED), retry_after=1.0), NOW)
    codec = Codec()
    assert codec.load(SchedulerState, codec.dump(state)) == state


def test_the_history_shows_the_policys_verdict_whatever_arrives_first() -> None:
    """The worker reports a 404 as retryable; the scheduler's dead letter says non_retryable.
    The projector keeps the verdict whether the result or the dead letter comes first."""
    state, request = fired({"non_retryable_http_statuses": [404]})
    err = error(type="HttpStatus", reason=ErrorReason.HTTP_STATUS, http_status=404)
    res = failed(request, 1, err)
    [dead] = apply(state, res, NOW + 10).dead_letters
    for events in ((res, dead), (dead, res)):
        ex = rows.Execution(request.execution_id, request.scheduled_at_ms, request.job_id)
        for event in events:
            rows.apply(ex, event)
        shown = ex.attempts[1].error
        assert shown["reason"] == "non_retryable" and shown["http_status"] == 404, events
        assert ex.attempts[1].status() == "dead"


def test_a_row_written_before_the_error_classes_reads_as_a_new_job_would() -> None:
    """A job projected before issue 18 has a retry without the new fields: shown and compared
    (idempotent re-create) with their defaults, so the same body created again is not a 409."""
    body = {
        "name": "x",
        "target": {"type": "http", "url": "http://h/x"},
        "retry": {"max_retries": 2},
    }
    definition = build_job(body, now_ms=NOW)
    old_row_retry = {"max_retries": 2, "base_delay_s": 10.0, "max_delay_s": 3600.0, "jitter": True}
    assert convert.retry_of(old_row_retry) == convert.definition_spec(definition)["retry"]
    custom = {**old_row_retry, "non_retryable_http_statuses": [404]}
    assert convert.retry_of(custom)["non_retryable_http_statuses"] == [404]
    assert convert.retry_of(None) is None
