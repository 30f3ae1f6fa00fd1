"""Trace context end to end, in process (the API, a scheduler, a worker and the projector as
threads of this process, against the test broker and database), recorded with OpenTelemetry's
in-memory span exporter: a job created over REST with a ``traceparent`` yields the scheduler's
``fire`` span and the worker's ``claim``, ``run`` and ``report`` spans in that trace, the HTTP
target receives a ``traceparent`` of it, and the result record carries it; a malformed header
is ignored (the job is created and runs). The SDK (argument or ambient span) and the batch
route put the trace on the definition record, and so does a change (PATCH)."""

from __future__ import annotations

import secrets
import uuid
from datetime import UTC, datetime

from confluent_kafka import Consumer, TopicPartition
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from duetime.core import tracing
from duetime.core.config import CommonSettings
from duetime.core.topics import Topics
from duetime.producers.sdk import JobClient
from tests.helpers import wait_for
from tests.integration.test_api_support import RunningApi, running_stack
from tests.integration.test_worker_support import Delivery, Sink

STEPS = {"duetime.fire", "duetime.claim", "duetime.run", "duetime.report"}


def _job(sink: Sink) -> dict[str, object]:
    return {
        "name": "traced",
        "schedule": {"at": datetime.now(UTC).isoformat()},
        "target": {"type": "http", "url": sink.url},
        "retry": {"max_retries": 0},
    }


def _spans_of(exporter: InMemorySpanExporter, job_id: str) -> dict[str, ReadableSpan]:
    return {
        s.name: s
        for s in exporter.get_finished_spans()
        if (s.attributes or {}).get("job_id") == job_id
    }


def _result_traces(settings: CommonSettings, job_id: str) -> list[str]:
    """The traceparents of the job's result records (read_committed, from the start)."""
    consumer = Consumer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": f"trace-{uuid.uuid4()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    topic = Topics(settings.topic_prefix).results
    consumer.assign([TopicPartition(topic, p) for p in range(settings.partitions)])
    found: list[str] = []

    def read() -> list[str]:
        for msg in consumer.consume(100, timeout=0.5):
            if msg.error() is None and (msg.key() or b"").decode() == job_id:
                trace = tracing.from_headers(msg.headers())
                found.extend([] if trace is None else [trace])
        return found

    try:
        return wait_for(read, 30, "a result record of the job with a traceparent")
    finally:
        consumer.close()


def test_a_job_created_over_rest_is_one_trace_from_create_to_target(
    settings: CommonSettings, exporter: InMemorySpanExporter
) -> None:
    trace_id = secrets.token_hex(16)
    caller = f"00-{trace_id}-{secrets.token_hex(8)}-01"
    with running_stack(settings) as sink:
        api = RunningApi(settings)
        try:
            with api.client() as http:
                # the job's own traceparent header gives way to the job's trace
                own = {"TraceParent": f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"}
                job = {**_job(sink), "target": {"type": "http", "url": sink.url, "headers": own}}
                traced = http.post("/v1/jobs", json=job, headers={"traceparent": caller})
                assert traced.status_code == 201, traced.text
                # hostile: malformed, and oversized; ignored, the job is created and runs
                bad = http.post("/v1/jobs", json=_job(sink), headers={"traceparent": "00-zz"})
                huge = http.post(
                    "/v1/jobs", json=_job(sink), headers={"traceparent": caller + "-" * 600}
                )
                assert (bad.status_code, huge.status_code) == (201, 201)
        finally:
            api.stop()
        job_id = traced.json()["job_id"]
        others = {bad.json()["job_id"], huge.json()["job_id"]}

        def delivered(job: str) -> Delivery | None:
            return next((d for d in sink.deliveries if d.job_id == job), None)

        delivery = wait_for(lambda: delivered(job_id), 60, "the traced job's HTTP call")
        assert delivery is not None  # wait_for returns only a truthy value
        wait_for(
            lambda: all(delivered(other) for other in others), 60, "the other jobs' HTTP calls"
        )

        def all_steps() -> dict[str, ReadableSpan]:
            found = _spans_of(exporter, job_id)
            return found if set(found) >= STEPS else {}

        spans = wait_for(all_steps, 30, "fire, claim, run and report spans of the traced job")
        result_traces = _result_traces(settings, job_id)

    # every step is in the caller's trace; fire is the caller's child, the worker's are fire's
    assert {f"{s.context.trace_id:032x}" for s in spans.values()} == {trace_id}
    fire = spans["duetime.fire"]
    assert fire.parent is not None and f"{fire.parent.span_id:016x}" == caller.split("-")[2]
    for step in ("duetime.claim", "duetime.run", "duetime.report"):
        parent = spans[step].parent
        assert parent is not None and parent.span_id == fire.context.span_id, step
    # the target was called inside the run span, and says so
    assert [n for n in delivery.headers if n.lower() == "traceparent"] == ["traceparent"]
    received = tracing.parse(delivery.headers.get("traceparent"))
    assert received is not None
    assert received.split("-")[1:3] == [trace_id, f"{spans['duetime.run'].context.span_id:016x}"]
    # the result record carries the report span's context
    report = spans["duetime.report"].context
    assert f"00-{trace_id}-{report.span_id:016x}-01" in result_traces
    # the jobs whose header was refused started traces of their own, never the caller's
    for other in others:
        theirs = _spans_of(exporter, other)
        assert theirs and all(f"{s.context.trace_id:032x}" != trace_id for s in theirs.values())


def _definition_traces(settings: CommonSettings, job_ids: set[str]) -> dict[str, str | None]:
    """job_id → the traceparent header of its latest definition record: the jobs topic read
    from the start up to the end offsets it had when called."""
    consumer = Consumer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": f"trace-{uuid.uuid4()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    topic = Topics(settings.topic_prefix).jobs
    parts = [TopicPartition(topic, p) for p in range(settings.partitions)]
    ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in parts}
    consumer.assign(parts)
    found: dict[str, str | None] = {}
    done: set[int] = {p for p, end in ends.items() if end == 0}

    def read() -> bool:
        for msg in consumer.consume(100, timeout=0.5):
            partition, offset = msg.partition() or 0, msg.offset() or 0
            if msg.error() is not None:
                continue  # the end-of-partition events
            if offset + 1 >= ends[partition]:
                done.add(partition)
            key = (msg.key() or b"").decode()
            if key in job_ids:
                headers = msg.headers()
                assert len([h for h in headers or [] if h[0] == tracing.HEADER]) <= 1
                found[key] = tracing.from_headers(headers)
        return len(done) == len(ends)

    try:
        wait_for(read, 30, "the jobs topic up to its end offsets")
    finally:
        consumer.close()
    assert set(found) == job_ids
    return found


def test_the_sdk_and_the_batch_route_put_the_trace_on_definitions(
    settings: CommonSettings, exporter: InMemorySpanExporter
) -> None:
    from opentelemetry import trace

    given = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
    batch_trace = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-00"
    spec = {
        "name": "t",
        "schedule": {"cron": "0 0 1 1 *"},
        "target": {"type": "http", "url": "http://127.0.0.1:9/x"},
    }
    with JobClient(settings=settings) as client:
        explicit = client.create_job(spec, traceparent=given).job_id
        forged = client.create_job(spec, traceparent="00-" + "g" * 32 + "-" + "1" * 16 + "-01")
        caller = TracerProvider().get_tracer("caller").start_span("caller")
        with trace.use_span(caller, end_on_exit=True):
            ambient = client.create_job(spec).job_id
        untraced = client.create_job(spec).job_id  # no argument, no current span
    api = RunningApi(settings)
    try:
        with api.client() as http:
            batch = http.post(
                "/v1/jobs:batch", json={"jobs": [spec, spec]}, headers={"traceparent": batch_trace}
            )
            assert batch.status_code == 201, batch.text
            changed, kept = (item["job_id"] for item in batch.json()["items"])
            patch = http.patch(
                f"/v1/jobs/{changed}", json={"payload": {"v": 2}}, headers={"traceparent": given}
            )
            assert patch.status_code == 200, patch.text
    finally:
        api.stop()
    batched = {changed, kept}
    traces = _definition_traces(settings, {explicit, forged.job_id, ambient, untraced, *batched})
    assert traces[explicit] == given
    assert traces[forged.job_id] is None
    assert traces[untraced] is None
    caller_trace = f"{caller.get_span_context().trace_id:032x}"
    assert tracing.trace_id(traces[ambient] or "-") == caller_trace
    assert traces[kept] == batch_trace
    assert traces[changed] == given  # its latest definition: the change's trace
