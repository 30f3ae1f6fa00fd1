"""duetime/core/tracing.py: traceparent parsing of hostile headers (property tests), the
pass-through without a tracer, spans with OpenTelemetry's in-memory exporter, setup from the
standard OTEL_* variables."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from duetime.core import tracing
from duetime.core.config import Env
from duetime.core.errors import ConfigError
from duetime.core.jobspec import build_job
from duetime.core.records import ExecutionRequest, SchedulerState
from duetime.schedulers import logic

NOW = 1_800_000_000_000

HEX = "0123456789abcdef"
trace_ids = st.text(HEX, min_size=32, max_size=32).filter(lambda t: t != "0" * 32)
span_ids = st.text(HEX, min_size=16, max_size=16).filter(lambda t: t != "0" * 16)
flags = st.text(HEX, min_size=2, max_size=2)


@given(trace_ids, span_ids, flags)
def test_a_valid_traceparent_round_trips(trace: str, parent: str, flag: str) -> None:
    value = f"00-{trace}-{parent}-{flag}"
    assert tracing.parse(value) == value
    assert tracing.parse(value.encode()) == value
    assert tracing.from_headers([("other", b"x"), ("traceparent", value.encode())]) == value
    assert tracing.trace_id(value) == trace


@given(st.one_of(st.text(max_size=700), st.binary(max_size=700)))
def test_anything_parses_to_none_or_a_well_formed_version_00(value: str | bytes) -> None:
    parsed = tracing.parse(value)  # never raises
    if parsed is not None:
        version, trace, parent, flag = parsed.split("-")
        assert version == "00" and len(trace) == 32 and len(parent) == 16 and len(flag) == 2
        assert set(trace + parent + flag) <= set(HEX)
        assert trace != "0" * 32 and parent != "0" * 16


@given(trace_ids, span_ids, flags, st.text("-abc123", max_size=40))
def test_a_later_version_keeps_its_first_four_fields(
    trace: str, parent: str, flag: str, rest: str
) -> None:
    value = f"01-{trace}-{parent}-{flag}-{rest}"
    assert tracing.parse(value) == f"00-{trace}-{parent}-{flag}"


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "00-" + "0" * 32 + "-" + "1" * 16 + "-01",  # zero trace id
        "00-" + "1" * 32 + "-" + "0" * 16 + "-01",  # zero parent id
        "ff-" + "1" * 32 + "-" + "1" * 16 + "-01",  # forbidden version
        "00-" + "A" * 32 + "-" + "1" * 16 + "-01",  # uppercase
        "00-" + "1" * 32 + "-" + "1" * 16 + "-01-extra",  # version 00 has four fields
        "00-" + "1" * 31 + "-" + "1" * 16 + "-01",
        "00-" + "1" * 32 + "-" + "1" * 16 + "-01\r\nX-Injected: 1",
        "01-" + "1" * 32 + "-" + "1" * 16 + "-01-" + "a" * 600,  # over the length bound
        b"\xff\xfe" * 30,
    ],
)
def test_malformed_headers_are_ignored(value: str | bytes | None) -> None:
    assert tracing.parse(value) is None
    assert tracing.from_headers([("traceparent", value)]) is None


def test_without_a_tracer_the_parent_is_handed_on_unchanged() -> None:
    parent = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    assert not tracing.enabled()
    with tracing.span("run", parent) as carried:
        assert carried == parent
        assert tracing.current() == parent
    assert tracing.current() is None
    assert tracing.emit("fire", parent) == parent
    assert tracing.emit("fire", None) is None
    assert tracing.kafka_headers(None) is None
    assert tracing.kafka_headers(parent) == [("traceparent", parent.encode())]


def test_spans_continue_the_parents_trace(exporter: InMemorySpanExporter) -> None:
    parent = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    fired = tracing.emit("fire", parent, job_id="j", attempt=1, ignored=object())
    assert fired is not None and fired != parent and tracing.trace_id(fired) == "a" * 32
    with tracing.span("run", fired, execution_id="e") as carried:
        assert carried is not None and tracing.current() == carried
    with pytest.raises(RuntimeError), tracing.span("report", fired):
        raise RuntimeError("the work's own error propagates")
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"duetime.fire", "duetime.run", "duetime.report"}
    assert {f"{s.context.trace_id:032x}" for s in spans.values()} == {"a" * 32}
    fire = spans["duetime.fire"]
    assert fire.parent is not None and f"{fire.parent.span_id:016x}" == "b" * 16
    assert spans["duetime.run"].parent.span_id == fire.context.span_id  # type: ignore[union-attr]
    assert dict(fire.attributes or {}) == {"job_id": "j", "attempt": 1}
    assert not spans["duetime.report"].status.is_ok


def test_a_span_without_a_parent_starts_a_trace(exporter: InMemorySpanExporter) -> None:
    with tracing.span("claim", None) as carried:
        assert tracing.parse(carried) == carried
    (only,) = exporter.get_finished_spans()
    assert only.parent is None


def test_a_failing_tracer_never_stops_the_work(exporter: InMemorySpanExporter) -> None:
    class BrokenTracer:
        def start_span(self, *args: object, **kwargs: object) -> object:
            raise ValueError("exporter down")

    tracing.install(TracerProvider())
    tracing._tracer = BrokenTracer()  # type: ignore[assignment]
    parent = "00-" + "c" * 32 + "-" + "d" * 16 + "-00"
    with tracing.span("run", parent) as carried:
        assert carried == parent
    assert tracing.emit("fire", parent) == parent


def test_configure_reads_the_standard_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not tracing.configure("worker", Env({}))
    assert not tracing.configure("worker", Env({"OTEL_TRACES_EXPORTER": "none"}))
    assert not tracing.configure(
        "worker", Env({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"})
    )
    with pytest.raises(ConfigError, match="OTEL_TRACES_EXPORTER"):
        tracing.configure("worker", Env({"OTEL_TRACES_EXPORTER": "jaeger"}))
    try:
        assert tracing.configure(
            "worker", Env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"})
        )
        assert tracing.enabled()
    finally:
        tracing.install(None)  # not shutdown(): it would try to export to the dead endpoint
    assert not tracing.enabled()


def test_ambient_context_is_the_callers_current_span(exporter: InMemorySpanExporter) -> None:
    from opentelemetry import trace

    assert tracing.ambient() is None  # no current span
    tracer = TracerProvider().get_tracer("caller")
    with trace.use_span(tracer.start_span("caller"), end_on_exit=True) as caller:
        ambient = tracing.ambient()
        assert ambient is not None
        assert tracing.trace_id(ambient) == f"{caller.get_span_context().trace_id:032x}"


def _fired(traceparent: str | None) -> tuple[SchedulerState, ExecutionRequest]:
    definition = build_job(
        {
            "name": "traced",
            "schedule": {"at": "2020-01-01T00:00:00Z"},
            "target": {"type": "http", "url": "http://127.0.0.1:9/x"},
        },
        now_ms=NOW,
    )
    definition = tracing.keep_trace(
        definition, None if traceparent is None else [("traceparent", traceparent.encode())]
    )
    state, _ = logic.on_definition(None, definition, NOW)
    out = logic.fire_due(state, NOW, logic.Policy())
    return state, out.executions[0]


def test_the_scheduler_keeps_only_a_valid_header_as_the_jobs_trace() -> None:
    parent = "00-" + "e" * 32 + "-" + "f" * 16 + "-01"
    state, _ = _fired(parent)
    assert state.definition.traceparent == parent
    # the header decides, whatever the value claims: a hostile value's field is dropped
    forged = replace(state.definition, traceparent="00-evil\r\nX-Injected: 1")
    assert tracing.keep_trace(forged, [("traceparent", b"not-a-traceparent")]).traceparent is None
    assert tracing.keep_trace(forged, None).traceparent is None
    assert tracing.keep_trace(state.definition, {"traceparent": parent}) is state.definition


def test_an_execution_request_carries_its_jobs_trace() -> None:
    parent = "00-" + "e" * 32 + "-" + "f" * 16 + "-01"
    state, request = _fired(parent)
    assert tracing.request_headers(state, request) == [("traceparent", parent.encode())]
    assert tracing.request_headers(None, request) is None
    assert tracing.request_headers(state, state) is None  # only execution requests carry it
    untraced_state, untraced = _fired(None)
    assert tracing.request_headers(untraced_state, untraced) is None


def test_a_fire_span_continues_the_jobs_trace(exporter: InMemorySpanExporter) -> None:
    parent = "00-" + "e" * 32 + "-" + "f" * 16 + "-01"
    state, request = _fired(parent)
    headers = tracing.request_headers(state, request)
    assert headers is not None
    carried = tracing.from_headers(headers)
    (fire,) = exporter.get_finished_spans()
    assert fire.name == "duetime.fire"
    assert carried == f"00-{'e' * 32}-{fire.context.span_id:016x}-01"
    assert (fire.attributes or {})["execution_id"] == request.execution_id
    # a job without a trace still gets a fire span (a trace of its own) when spans are on
    untraced_state, untraced = _fired(None)
    assert tracing.from_headers(tracing.request_headers(untraced_state, untraced)) is not None


def test_a_role_configured_by_otel_variables_exports_its_spans() -> None:
    """As a role's main does it, in a process of its own (the provider is process-wide):
    OTEL_TRACES_EXPORTER=console prints every span when the role flushes at exit."""
    parent = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
    code = (
        "from duetime.core import tracing\n"
        "assert tracing.configure('worker')\n"
        f"with tracing.span('run', {parent!r}, job_id='j'):\n"
        "    pass\n"
        "tracing.shutdown()\n"
    )
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "w-test"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert '"name": "duetime.run"' in done.stdout
    assert "0x" + "1" * 32 in done.stdout  # the parent's trace
    assert '"service.name": "w-test"' in done.stdout
