"""Pure parts of the worker: in-order offsets, outcomes, the task registry, its settings."""

from __future__ import annotations

import json
import sys
import types
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duetime.consumers.tasks import ExecutionContext, TaskRegistry, UnknownTarget, is_async, task
from duetime.consumers.worker.offsets import OffsetTracker
from duetime.consumers.worker.results import (
    check_request,
    encode_output,
    failure,
    from_exception,
    result_record,
    timed_out,
)
from duetime.consumers.worker.settings import WorkerSettings
from duetime.core.config import Env
from duetime.core.errors import ConfigError, FailPermanently, RetryLater
from duetime.core.models import ResultStatus
from duetime.core.records import ExecutionRequest, ExecutionResult
from duetime.schemas.codec import Codec

TP = ("t.exec.low", 0)

# --- offsets ------------------------------------------------------------------------------


@given(st.permutations(list(range(30))), st.integers(0, 30))
def test_the_committable_position_never_passes_an_unfinished_offset(
    order: list[int], finished: int
) -> None:
    tracker = OffsetTracker()
    offsets = [100 + 2 * i for i in range(30)]  # gaps, as transaction markers leave them
    for offset in offsets:
        assert tracker.add(TP, offset)
    done = {offsets[i] for i in order[:finished]}
    for offset in (offsets[i] for i in order[:finished]):
        tracker.done(TP, offset)
    position = tracker.positions().get(TP)
    pending = [o for o in offsets if o not in done]
    if not pending:
        assert position == offsets[-1] + 1
    elif pending[0] == offsets[0]:
        assert position is None
    else:
        assert position == max(o for o in offsets if o < pending[0]) + 1
    assert all(o in done for o in offsets if position is not None and o < position)
    assert tracker.outstanding() == len(pending)
    assert tracker.first_pending(TP) == (pending[0] if pending else None)


def test_commit_hands_out_each_position_once_and_again_after_a_failure() -> None:
    tracker = OffsetTracker()
    for offset in (5, 6, 7):
        tracker.add(TP, offset)
    tracker.done(TP, 6)
    assert tracker.to_commit() == {}
    tracker.done(TP, 5)
    assert tracker.to_commit() == {TP: 7}
    assert tracker.to_commit() == {}
    tracker.uncommitted([TP])
    assert tracker.to_commit() == {TP: 7}
    assert not tracker.add(TP, 6), "an offset seen before is refused"
    tracker.forget(TP)
    tracker.done(TP, 7)  # revoked meanwhile: ignored
    assert tracker.positions() == {}


# --- outcomes and result records ----------------------------------------------------------


def test_exceptions_map_to_retryable_or_permanent_failures() -> None:
    later = from_exception(RetryLater("busy", delay_s=12.5))
    assert later.error is not None and later.error.retryable and later.retry_after_s == 12.5
    void = from_exception(FailPermanently("void"))
    assert void.error is not None and not void.error.retryable
    assert void.error.reason == "error" and void.error.type == "FailPermanently"
    unknown = from_exception(UnknownTarget("nope"))
    assert unknown.error is not None and unknown.error.reason == "unknown_target"
    boom = from_exception(ZeroDivisionError("division by zero"))
    assert boom.error is not None and boom.error.retryable and boom.error.reason == "error"
    slow = timed_out(2.5)
    assert slow.error is not None and slow.error.reason == "timeout" and slow.error.retryable


def test_outputs_are_json_or_nothing() -> None:
    assert encode_output({"a": 1}) == '{"a": 1}'
    assert encode_output(None) is None
    # over the size limit: a marker saying so instead of the output
    assert json.loads(encode_output("x" * 100_000) or "") == {
        "duetime_truncated": True,
        "size_bytes": 100_002,
        "limit_bytes": 64 * 1024,
    }


def test_long_error_texts_are_truncated_with_a_marker() -> None:
    error = failure("E" * 300, "m" * 5000, retryable=True).error
    assert error is not None
    assert error.message.startswith("m" * 2000)
    assert error.message.endswith("[truncated: 5000 characters, limit 2000]")
    assert error.type.endswith("[truncated: 300 characters, limit 200]")


def request(**overrides: Any) -> ExecutionRequest:
    base = {
        "execution_id": "6f1c2a5e-8a4b-4c1d-9e8f-0a1b2c3d4e5f",
        "job_id": "0b1c2a5e-8a4b-4c1d-9e8f-0a1b2c3d4e5f",
        "name": "n",
        "attempt": 1,
        "scheduled_at_ms": 1,
        "due_at_ms": 1,
        "emitted_at_ms": 1,
        "priority": "low",
        "target": {"ref": "m:f"},
        "payload_json": "{}",
        "timeout_s": 1.0,
        "trigger": "schedule",
        "dag_id": None,
        "dag_run_id": None,
        "dag_key": None,
    }
    base.update(overrides)
    return ExecutionRequest.from_avro(base)


def test_result_records_fit_the_schema() -> None:
    codec = Codec()
    for outcome in (None, from_exception(RetryLater("x", delay_s=1)), timed_out(1)):
        record = result_record(
            request(),
            status=ResultStatus.RUNNING if outcome is None else outcome.status,
            worker_id="w",
            token=7,
            started_at_ms=2,
            finished_at_ms=None if outcome is None else 3,
            outcome=outcome,
        )
        assert codec.load(ExecutionResult, codec.dump(record)).lease_token == 7


@pytest.mark.parametrize(
    "bad",
    [
        {"execution_id": "not-a-uuid"},
        # uuid.UUID takes these; PostgreSQL does not (and would fail a whole lease batch)
        {"execution_id": "urn:uuid:12345678-1234-5678-1234-567812345678"},
        {"job_id": "{12345678-1234-5678-1234-567812345678}"},
        {"attempt": 0},
        {"timeout_s": 0.0},
        {"timeout_s": float("inf")},
        {"timeout_s": float("nan")},
        {"scheduled_at_ms": 2**62},
        {"due_at_ms": -1},
    ],
)
def test_requests_no_scheduler_can_write_are_refused(bad: dict[str, Any]) -> None:
    check_request(request())
    with pytest.raises(ValueError):
        check_request(request(**bad))


# --- tasks --------------------------------------------------------------------------------


def test_marking_registers_nothing_until_discovered() -> None:
    module = types.ModuleType("duetime_test_tasks")

    @task("invoice.send")
    def send(ctx: ExecutionContext) -> None:
        return None

    other = TaskRegistry()

    @other.task("invoice.void")
    async def void(ctx: ExecutionContext) -> None:
        return None

    module.send = send  # type: ignore[attr-defined]
    module.registry = other  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        registry = TaskRegistry(allowed_modules=("json",))
        assert "invoice.send" not in registry
        assert registry.discover([module.__name__]) == 2
        assert registry.resolve("invoice.send") is send
        assert registry.resolve("invoice.void") is void and is_async(void)
        assert registry.resolve("json:dumps").__name__ == "dumps"
        with pytest.raises(UnknownTarget, match="registered"):
            registry.resolve("invoice.unknown")
        with pytest.raises(UnknownTarget, match="not allowed"):
            registry.resolve("no_such_pkg.mod:f")
        with pytest.raises(UnknownTarget, match="cannot import"):
            TaskRegistry(allowed_modules=("no_such_pkg",)).resolve("no_such_pkg.mod:f")
        with pytest.raises(UnknownTarget, match="no attribute"):
            registry.resolve("json:no_such_function")
        with pytest.raises(ValueError, match="already registered"):
            registry.register("invoice.send", print)
    finally:
        del sys.modules[module.__name__]


# --- settings -----------------------------------------------------------------------------


def test_settings_are_validated_naming_the_variable() -> None:
    s = WorkerSettings.from_env(
        Env(
            {
                "DUETIME_WORKER_CONCURRENCY": "50",
                "DUETIME_WORKER_CRITICAL_SHARE": "0.2",
                "DUETIME_WORKER_IMPORTS": "a.b, c",
            }
        )
    )
    assert (s.concurrency, s.reserved_critical, s.imports) == (50, 10, ("a.b", "c"))
    assert s.group == "duetime.workers"
    for env, variable in (
        ({"DUETIME_WORKER_CONCURRENCY": "0"}, "DUETIME_WORKER_CONCURRENCY"),
        ({"DUETIME_WORKER_BUFFER": "10"}, "DUETIME_WORKER_BUFFER"),
        ({"DUETIME_LEASE_TTL_S": "x"}, "DUETIME_LEASE_TTL_S"),
        ({"DUETIME_WORKER_CRITICAL_SHARE": "1.5"}, "DUETIME_WORKER_CRITICAL_SHARE"),
    ):
        with pytest.raises(ConfigError, match=variable):
            WorkerSettings.from_env(Env(env))


# --- found by the worker benchmark --------------------------------------------------------


def test_a_past_one_time_job_ingested_late_still_runs_once() -> None:
    """20,000 jobs "due now" took the scheduler more than the misfire threshold to ingest;
    the late ones were skipped because their `at` lay before their due time (created_at)."""
    from duetime.core.jobspec import build_job
    from duetime.schedulers import logic

    created_ms = 1_800_000_000_000
    body = {
        "name": "late",
        "schedule": {"at": "2020-01-01T00:00:00Z"},
        "target": {"type": "http", "url": "http://127.0.0.1:9/x"},
    }
    job = build_job(body, now_ms=created_ms, max_payload_bytes=256 * 1024)
    state, _ = logic.on_definition(None, job, created_ms + 6_000)
    out = logic.fire_due(state, created_ms + 6_000, logic.Policy(misfire_threshold_ms=5_000))
    assert len(out.executions) == 1, state.status
