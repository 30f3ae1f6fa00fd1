"""Running an execution's target: an HTTP webhook, a Python callable or a Kafka topic.

:meth:`Targets.run` never raises for anything the target does: every way it can end is an
:class:`~.results.Outcome`. The caller (the executor) owns the timeout and the cancellation;
a cancelled coroutine target is cancelled, a sync one is abandoned in its thread (Python
cannot stop a thread; ``duetime_worker_abandoned_threads`` counts them).

- ``http``: API.md's request: the job's method (POST by default) with the JSON body
  ``{job_id, execution_id, attempt, scheduled_at, payload}`` (no body for GET and HEAD) and
  the headers ``Idempotency-Key: <execution_id>``, ``X-Duetime-Job-Id``,
  ``X-Duetime-Attempt`` (over the job's own headers). 2xx is success; any other status, a
  timeout or a connection failure is a retryable failure (a numeric ``Retry-After`` on the
  answer becomes the result's ``retry_after_s``).
- ``python``: the callable receives an :class:`~duetime.consumers.tasks.ExecutionContext`;
  see ``duetime.consumers.tasks``.
- ``kafka``: the payload JSON, keyed by job_id, with headers ``execution_id``,
  ``duetime-job-id`` and ``duetime-attempt``, acknowledged by all in-sync replicas.

An unknown target (no registered task, nothing importable, a topic that does not exist) is a
permanent failure with reason ``unknown_target``: retrying cannot help.
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

import httpx
from confluent_kafka import KafkaException

from duetime.consumers.tasks import ExecutionContext, TaskRegistry, UnknownTarget, is_async

from . import metrics
from .kafka_io import AsyncProducer
from .results import Outcome, failure, from_exception, success

log = logging.getLogger("duetime.worker.targets")

_NO_BODY = frozenset({"GET", "HEAD"})
_TOPIC_CACHE_S = 60.0


def iso_ms(ms: int) -> str:
    return (
        datetime.fromtimestamp(ms / 1000, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def payload_of(request: dict[str, Any]) -> Any:
    text = request.get("payload_json") or "null"
    try:
        return json.loads(text)
    except ValueError:
        return text


def context_of(request: dict[str, Any], worker_id: str) -> ExecutionContext:
    return ExecutionContext(
        job_id=request["job_id"],
        execution_id=request["execution_id"],
        attempt=request["attempt"],
        scheduled_at=datetime.fromtimestamp(request["scheduled_at_ms"] / 1000, UTC),
        payload=payload_of(request),
        name=request.get("name", ""),
        priority=request["priority"],
        trigger=request.get("trigger", "schedule"),
        timeout_s=request["timeout_s"],
        worker_id=worker_id,
        dag_id=request.get("dag_id"),
        dag_run_id=request.get("dag_run_id"),
        dag_key=request.get("dag_key"),
    )


class Targets:
    def __init__(
        self,
        *,
        registry: TaskRegistry,
        http: httpx.AsyncClient,
        kafka_producer: Callable[[], AsyncProducer],
        worker_id: str,
    ) -> None:
        self.registry = registry
        self.http = http
        self._kafka_producer = kafka_producer
        self.worker_id = worker_id
        self._topics_seen: dict[str, float] = {}

    async def run(self, request: dict[str, Any]) -> Outcome:
        target = request["target"]
        try:
            if "url" in target:
                return await self._http(request, target)
            if "ref" in target:
                return await self._python(request, target["ref"])
            if "topic" in target:
                return await self._kafka(request, target["topic"])
            return failure(
                "UnknownTarget",
                f"unknown target {target!r}",
                retryable=False,
                reason="unknown_target",
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug here must not kill the worker: fail the attempt
            log.exception(
                "target failed unexpectedly",
                extra={"execution_id": request["execution_id"], "job_id": request["job_id"]},
            )
            return from_exception(exc)

    # --- http -----------------------------------------------------------------------------

    async def _http(self, request: dict[str, Any], target: dict[str, Any]) -> Outcome:
        method = str(target.get("method") or "POST").upper()
        headers = dict(target.get("headers") or {})
        headers.update(
            {
                "Idempotency-Key": request["execution_id"],
                "X-Duetime-Job-Id": request["job_id"],
                "X-Duetime-Attempt": str(request["attempt"]),
                "User-Agent": "duetime-worker",
            }
        )
        content: bytes | None = None
        if method not in _NO_BODY:
            headers["Content-Type"] = "application/json"
            content = json.dumps(
                {
                    "job_id": request["job_id"],
                    "execution_id": request["execution_id"],
                    "attempt": request["attempt"],
                    "scheduled_at": iso_ms(request["scheduled_at_ms"]),
                    "payload": payload_of(request),
                }
            ).encode()
        try:
            response = await self.http.request(
                method,
                target["url"],
                content=content,
                headers=headers,
                timeout=request["timeout_s"],
            )
        except httpx.TimeoutException as exc:
            return failure(
                type(exc).__name__, f"HTTP timeout: {exc}", retryable=True, reason="timeout"
            )
        except httpx.HTTPError as exc:
            return failure(type(exc).__name__, f"HTTP request failed: {exc}", retryable=True)
        if 200 <= response.status_code < 300:
            return success({"http_status": response.status_code})
        return failure(
            "HttpStatus",
            f"{method} {target['url']} answered {response.status_code}: {response.text[:200]}",
            retryable=True,
            reason="http_status",
            http_status=response.status_code,
            retry_after_s=_retry_after_s(response),
        )

    # --- python ---------------------------------------------------------------------------

    async def _python(self, request: dict[str, Any], ref: str) -> Outcome:
        try:
            func = self.registry.resolve(ref)
        except UnknownTarget as exc:
            return failure("UnknownTarget", exc.message, retryable=False, reason="unknown_target")
        ctx = context_of(request, self.worker_id)
        try:
            if is_async(func):
                value = await func(ctx)
            else:
                value = await _in_thread(func, ctx, request["execution_id"])
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.info(
                "task raised %s: %s",
                type(exc).__name__,
                exc,
                extra={"execution_id": request["execution_id"], "job_id": request["job_id"]},
            )
            return from_exception(exc)
        return success(value)

    # --- kafka ----------------------------------------------------------------------------

    async def _kafka(self, request: dict[str, Any], topic: str) -> Outcome:
        producer = self._kafka_producer()
        if not await self._topic_exists(producer, topic):
            return failure(
                "UnknownTarget",
                f"Kafka topic {topic!r} does not exist",
                retryable=False,
                reason="unknown_target",
            )
        future = await producer.send_wait(
            topic,
            (request.get("payload_json") or "null").encode(),
            key=request["job_id"],
            headers=[
                ("execution_id", request["execution_id"].encode()),
                ("duetime-job-id", request["job_id"].encode()),
                ("duetime-attempt", str(request["attempt"]).encode()),
            ],
        )
        try:
            msg = await future
        except KafkaException as exc:
            return failure("KafkaError", f"publishing to {topic!r} failed: {exc}", retryable=True)
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


def _retry_after_s(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if 0 <= seconds <= 7 * 24 * 3600 else None


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
        except BaseException as exc:
            value, ok = exc, False
        with contextlib.suppress(RuntimeError):  # the loop is closed: the worker stopped
            loop.call_soon_threadsafe(settle, ok, value)

    def on_done(f: asyncio.Future[Any]) -> None:
        if f.cancelled():
            metrics.ABANDONED_THREADS.inc()

    future.add_done_callback(on_done)
    threading.Thread(target=body, name=f"task-{name[:8]}", daemon=True).start()
    return future
