"""Running an execution's target: an HTTP webhook, a Python callable or a Kafka topic.

:meth:`Targets.run` never raises for anything the target does: every way it can end is an
:class:`~.results.Outcome`. The caller (the executor) owns the timeout and the cancellation;
a cancelled coroutine target is cancelled (and abandoned if it ignores that:
``duetime_worker_abandoned_tasks``), a sync one is abandoned in its thread (Python cannot stop
a thread; ``duetime_worker_abandoned_threads`` counts them).

Containment: user code can raise anything. ``SystemExit``, ``KeyboardInterrupt``,
``GeneratorExit`` or a ``CancelledError`` a task raises by itself never reach the event loop
(where they would end the process): the attempt fails permanently, naming the type. A
``CancelledError`` that the *worker* caused (timeout, lost lease, shutdown) keeps its meaning.

- ``http`` (``http_target.py``): API.md's request: the job's method (POST by default) with the
  JSON body ``{job_id, execution_id, attempt, scheduled_at, payload}`` (no body for GET and
  HEAD) and the headers ``Idempotency-Key: <execution_id>``, ``X-Duetime-Job-Id``,
  ``X-Duetime-Attempt`` (over the job's own headers). 2xx is success; any other status
  (3xx included: redirects are not followed), a timeout or a connection failure is a
  retryable failure (a numeric ``Retry-After`` on the answer becomes the result's
  ``retry_after_s``). Egress policy, header rules and secrets: see ``http_target.py``.
- ``python``: the callable receives an :class:`~duetime.consumers.tasks.ExecutionContext`;
  only registered tasks and refs in modules the operator allowed resolve
  (``DUETIME_WORKER_PYTHON_MODULES``; see ``duetime.consumers.tasks``).
- ``kafka``: the payload JSON, keyed by job_id, with headers ``execution_id``,
  ``duetime-job-id`` and ``duetime-attempt``, acknowledged by all in-sync replicas. Never to
  duetime's own topics nor Kafka's internal ones; only to ``DUETIME_WORKER_KAFKA_TOPICS`` when
  that is set (``policy.topic_refusal``).

An unknown or forbidden target (no registered task, a module not allowed, a topic that does
not exist or may not be written) is a permanent failure with reason ``unknown_target``:
retrying cannot help.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import KafkaException

from duetime.consumers.tasks import ExecutionContext, TaskRegistry, UnknownTarget, is_async
from duetime.core import tracing
from duetime.core.records import ExecutionRequest, HttpTarget, PythonTarget
from duetime.core.redact import escape_control

from . import metrics
from .http_target import HttpCaller, request_body
from .kafka_io import AsyncProducer
from .policy import topic_refusal
from .results import (
    Outcome,
    contained,
    failure,
    from_exception,
    redacted_traceback,
    success,
)

log = logging.getLogger("duetime.worker.targets")

_NO_BODY = frozenset({"GET", "HEAD"})
_TOPIC_CACHE_S = 60.0


def iso_ms(ms: int) -> str:
    return (
        datetime.fromtimestamp(ms / 1000, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def payload_of(request: ExecutionRequest) -> Any:
    text = request.payload_json or "null"
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        return text


def context_of(
    request: ExecutionRequest, worker_id: str, cancelled: threading.Event | None = None
) -> ExecutionContext:
    return ExecutionContext(
        cancelled=cancelled if cancelled is not None else threading.Event(),
        job_id=request.job_id,
        execution_id=request.execution_id,
        attempt=request.attempt,
        scheduled_at=datetime.fromtimestamp(request.scheduled_at_ms / 1000, UTC),
        payload=payload_of(request),
        name=request.name,
        # plain strings: what a task compares or serialises is the value, not our enum
        priority=request.priority.value,
        trigger=request.trigger.value,
        timeout_s=request.timeout_s,
        worker_id=worker_id,
        dag_id=request.dag_id,
        dag_run_id=request.dag_run_id,
        dag_key=request.dag_key,
    )


def log_fields(request: ExecutionRequest) -> dict[str, Any]:
    """The request's identity, for a log line's ``extra``."""
    return {
        "job_id": request.job_id,
        "execution_id": request.execution_id,
        "attempt": request.attempt,
    }


class Targets:
    def __init__(
        self,
        *,
        registry: TaskRegistry,
        http: HttpCaller,
        kafka_producer: Callable[[], AsyncProducer],
        worker_id: str,
        topic_prefix: str,
        kafka_topics: tuple[str, ...] = (),
    ) -> None:
        self.registry = registry
        self.http = http
        self._kafka_producer = kafka_producer
        self.worker_id = worker_id
        self.topic_prefix = topic_prefix
        self.kafka_topics = kafka_topics
        self._topics_seen: dict[str, float] = {}

    async def run(
        self, request: ExecutionRequest, cancelled: threading.Event | None = None
    ) -> Outcome:
        """Run the target. ``cancelled`` becomes a Python task's ``ctx.cancelled``: the caller
        sets it when it stops waiting (a cancelled HTTP call is aborted by the cancellation of
        this coroutine itself)."""
        target = request.target
        try:
            if isinstance(target, HttpTarget):
                return await self._http(request, target)
            if isinstance(target, PythonTarget):
                return await self._python(request, target.ref, cancelled)
            return await self._kafka(request, target.topic)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug here must not kill the worker: fail the attempt
            metrics.TARGET_ERRORS.inc()
            log.error(
                "target failed unexpectedly: %s",
                redacted_traceback(exc),
                extra=log_fields(request),
            )
            return from_exception(exc)

    # --- http -----------------------------------------------------------------------------

    async def _http(self, request: ExecutionRequest, target: HttpTarget) -> Outcome:
        method = (target.method or "POST").upper()
        headers = {
            # ours win, whatever the case the job wrote them in
            name: value
            for name, value in target.headers.items()
            if name.lower() not in _OWN_HEADERS
        }
        headers.update(
            {
                "Idempotency-Key": request.execution_id,
                "X-Duetime-Job-Id": request.job_id,
                "X-Duetime-Attempt": str(request.attempt),
                "User-Agent": "duetime-worker",
            }
        )
        traceparent = tracing.current()
        if traceparent is not None:  # the job's trace (core/tracing.py), over the job's own
            headers = {n: v for n, v in headers.items() if n.lower() != tracing.HEADER}
            headers[tracing.HEADER] = traceparent
        body: bytes | None = None
        if method not in _NO_BODY:
            headers["Content-Type"] = "application/json"
            body = request_body(request, payload_of(request), iso_ms(request.scheduled_at_ms))
        return await self.http.call(
            url=target.url,
            method=method,
            headers=headers,
            body=body,
            timeout_s=request.timeout_s,
        )

    # --- python ---------------------------------------------------------------------------

    async def _python(
        self, request: ExecutionRequest, ref: str, cancelled: threading.Event | None = None
    ) -> Outcome:
        try:
            func = self.registry.resolve(ref)
        except UnknownTarget as exc:
            return failure("UnknownTarget", exc.message, retryable=False, reason="unknown_target")
        ctx = context_of(request, self.worker_id, cancelled)
        if is_async(func):
            outcome = await _in_task(func, ctx, request.execution_id)
        else:
            try:
                outcome = success(await _in_thread(func, ctx, request.execution_id))
            except _Contained as exc:
                outcome = contained(exc.original)
            except Exception as exc:
                outcome = from_exception(exc)
        if outcome.error is not None:
            log.info(
                "task failed: %s: %s",
                outcome.error.type,
                escape_control(outcome.error.message),
                extra=log_fields(request),
            )
        return outcome

    # --- kafka ----------------------------------------------------------------------------

    async def _kafka(self, request: ExecutionRequest, topic: str) -> Outcome:
        refusal = topic_refusal(topic, self.topic_prefix, self.kafka_topics)
        if refusal is not None:
            return failure("UnknownTarget", refusal, retryable=False, reason="unknown_target")
        producer = self._kafka_producer()
        if not await self._topic_exists(producer, topic):
            return failure(
                "UnknownTarget",
                f"Kafka topic {topic!r} does not exist",
                retryable=False,
                reason="unknown_target",
            )
        try:
            future = await producer.send_wait(
                topic,
                (request.payload_json or "null").encode(),
                key=request.job_id,
                headers=[
                    ("execution_id", request.execution_id.encode()),
                    ("duetime-job-id", request.job_id.encode()),
                    ("duetime-attempt", str(request.attempt).encode()),
                    *(tracing.kafka_headers(tracing.current()) or ()),
                ],
            )
            msg = await future
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            retryable = bool(getattr(err, "retriable", lambda: True)())
            return failure(
                "KafkaError", f"publishing to {topic!r} failed: {exc}", retryable=retryable
            )
        return success({"topic": topic, "partition": msg.partition(), "offset": msg.offset()})

    async def _topic_exists(self, producer: AsyncProducer, topic: str) -> bool:
        seen = self._topics_seen.get(topic)
        if seen is not None and time.monotonic() - seen < _TOPIC_CACHE_S:
            return True
        try:
            metadata = await asyncio.to_thread(producer.producer.list_topics, topic, 10)
        except KafkaException:
            return True  # the broker did not answer: let the send decide (retryable)
        info = metadata.topics.get(topic)
        if info is None or info.error is not None:
            return False
        self._topics_seen[topic] = time.monotonic()
        return True


_OWN_HEADERS = frozenset(
    {"idempotency-key", "x-duetime-job-id", "x-duetime-attempt", "user-agent", "content-type"}
)


class _Contained(Exception):
    """Carries what a sync task raised that is not an ``Exception`` (SystemExit...) out of its
    thread: a SystemExit set on an asyncio future would end the event loop when awaited."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(type(original).__name__)
        self.original = original


async def _guarded(func: Callable[[ExecutionContext], Any], ctx: ExecutionContext) -> Outcome:
    """Run a coroutine task; whatever it raises becomes an outcome (only the worker's own
    cancellation goes through)."""
    try:
        value = await func(ctx)
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # the worker cancelled it: timeout, lost lease or shutdown
        return contained(exc)  # the task raised CancelledError by itself
    except Exception as exc:
        return from_exception(exc)
    except BaseException as exc:  # SystemExit, KeyboardInterrupt, GeneratorExit...
        return contained(exc)
    return success(value)


async def _in_task(
    func: Callable[[ExecutionContext], Any], ctx: ExecutionContext, name: str
) -> Outcome:
    """Run a coroutine task in a task of its own, so that one that ignores its cancellation is
    abandoned (and counted) instead of holding the worker's slot forever."""
    child = asyncio.get_running_loop().create_task(_guarded(func, ctx), name=f"task-{name[:8]}")
    try:
        return await asyncio.shield(child)
    except asyncio.CancelledError:
        if not child.done():
            metrics.ABANDONED_TASKS.inc()
            child.add_done_callback(_abandoned_done)
            child.cancel()
        raise


def _abandoned_done(task: asyncio.Task[Outcome]) -> None:
    metrics.ABANDONED_TASKS.dec()
    if not task.cancelled():
        task.exception()  # retrieved: an abandoned task's late error is expected


def _in_thread(
    func: Callable[[ExecutionContext], Any], ctx: ExecutionContext, name: str
) -> asyncio.Future[Any]:
    """Run a sync task in a daemon thread of its own; the future is abandoned on cancel.

    A thread per call, not a pool: an abandoned (timed-out) call keeps its thread, and a
    pool's threads would starve and block the process's exit.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if future.cancelled():
            metrics.ABANDONED_THREADS.dec()
        elif ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    def body() -> None:
        try:
            value, ok = func(ctx), True
        except Exception as exc:
            value, ok = exc, False
        except BaseException as exc:  # never let SystemExit & co. reach the loop
            value, ok = _Contained(exc), False
        with contextlib.suppress(RuntimeError):  # the loop is closed: the worker stopped
            loop.call_soon_threadsafe(settle, ok, value)

    def on_done(f: asyncio.Future[Any]) -> None:
        if f.cancelled():
            metrics.ABANDONED_THREADS.inc()

    future.add_done_callback(on_done)
    threading.Thread(target=body, name=f"task-{name[:8]}", daemon=True).start()
    return future
