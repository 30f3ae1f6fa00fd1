"""Kafka for an asyncio worker: a consumer polled in its own thread, producers with awaitable
deliveries.

librdkafka's calls block (``consume`` waits for records, ``poll`` serves delivery reports),
so each client gets one thread that does nothing but that, and hands what it got to the
event loop in batches with ``call_soon_threadsafe``: one wake-up of the loop per batch, no
busy polling, and a record is handed over the moment it arrives. ``produce`` is called from
the loop (it does not block); every other consumer call is queued to the consumer's thread
(see :class:`ConsumerThread`).

Rebalance callbacks run inside ``consume`` on the poll thread. A revocation must finish the
handover before it returns (commit what is done, forget the rest), so the poll thread asks the
loop to do its part and waits for the answer; the loop never waits for the poll thread
synchronously, so this cannot deadlock.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import queue
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from duetime.core.kafka import read_batch

log = logging.getLogger("duetime.worker.kafka")

TP = tuple[str, int]
T = TypeVar("T")


class AsyncProducer:
    """A Producer whose deliveries are asyncio futures, served by a poll thread."""

    def __init__(self, producer: Producer, loop: asyncio.AbstractEventLoop, name: str) -> None:
        self.producer = producer
        self._loop = loop
        self._reports: list[tuple[asyncio.Future[Message], KafkaError | None, Message]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            self.producer.poll(0.05)
            self._hand_over()

    def _report(
        self, future: asyncio.Future[Message], err: KafkaError | None, msg: Message
    ) -> None:
        with self._lock:  # called from whichever thread polls: this one, or a flush
            self._reports.append((future, err, msg))

    def _hand_over(self) -> None:
        with self._lock:
            if not self._reports:
                return
            reports, self._reports = self._reports, []
        self._loop.call_soon_threadsafe(_settle, reports)

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: str | bytes | None = None,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> asyncio.Future[Message]:
        """Produce; the future resolves when the broker acknowledged (or failed) the record.

        Raises BufferError when the local queue is full (see :meth:`send_wait`).
        """
        future: asyncio.Future[Message] = self._loop.create_future()
        kwargs: dict[str, Any] = {"on_delivery": functools.partial(self._report, future)}
        if partition is not None:
            kwargs["partition"] = partition
        if headers:
            kwargs["headers"] = headers
        self.producer.produce(topic, value, key, **kwargs)
        return future

    async def send_wait(
        self,
        topic: str,
        value: bytes | None,
        key: str | bytes | None = None,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> asyncio.Future[Message]:
        """:meth:`send`, waiting while the local queue is full instead of raising."""
        while True:
            try:
                return self.send(topic, value, key, partition, headers)
            except BufferError:
                await asyncio.sleep(0.01)

    async def flush(self, timeout_s: float) -> int:
        """Wait for every outstanding delivery; returns how many are still outstanding."""
        remaining = await asyncio.to_thread(self.producer.flush, timeout_s)
        self._hand_over()
        await asyncio.sleep(0)  # let the settled futures' callbacks run
        return int(remaining)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._hand_over()


def _settle(reports: list[tuple[asyncio.Future[Message], KafkaError | None, Message]]) -> None:
    for future, err, msg in reports:
        if future.done():
            continue
        if err is None:
            future.set_result(msg)
        else:
            future.set_exception(KafkaException(err))


class ConsumerThread:
    """Owns a subscribed consumer: polls it in a thread, hands batches of records to the loop.

    ``on_records(records)`` runs on the loop for every non-empty batch; ``on_assigned`` runs
    on the loop before any record of the new partitions; ``on_revoked(tps, lost)`` runs on the
    loop and returns the offsets to commit before the partitions go (ignored when ``lost``).

    Every other consumer call (commit, pause, resume, positions) is queued with :meth:`call`
    and runs on the poll thread between two ``consume`` calls: confluent-kafka serialises
    calls on one consumer, and a ``commit`` from another thread starves behind back-to-back
    ``consume`` calls (measured: it never returned).
    """

    def __init__(
        self,
        consumer: Consumer,
        topics: list[str],
        loop: asyncio.AbstractEventLoop,
        *,
        on_records: Callable[[list[Message]], None],
        on_assigned: Callable[[list[TP]], None],
        on_revoked: Callable[[list[TP], bool], Coroutine[Any, Any, dict[TP, int]]],
        on_failed: Callable[[], None] | None = None,
        batch_size: int = 500,
        poll_timeout_s: float = 0.05,
    ) -> None:
        self.consumer = consumer
        self._on_failed = on_failed
        self._topics = topics
        self._loop = loop
        self._on_records = on_records
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        self._batch_size = batch_size
        self._poll_timeout_s = poll_timeout_s
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], asyncio.Future[Any] | None]] = (
            queue.SimpleQueue()
        )
        self._stop = threading.Event()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="worker-consumer", daemon=True)

    def start(self) -> None:
        self.consumer.subscribe(
            self._topics,
            on_assign=self._assign_cb,
            on_revoke=functools.partial(self._revoke_cb, lost=False),
            on_lost=functools.partial(self._revoke_cb, lost=True),
        )
        self._thread.start()

    def call(self, func: Callable[[], object]) -> None:
        """Run ``func`` on the poll thread (a failure is logged)."""
        self._calls.put((func, None))

    def ask(self, func: Callable[[], T]) -> asyncio.Future[T]:
        """Run ``func`` on the poll thread; the future resolves to what it returns."""
        future: asyncio.Future[T] = self._loop.create_future()
        self._calls.put((func, future))
        return future

    async def stop(self) -> None:
        """Stop polling and close the consumer (commits on the way out, leaves the group)."""
        self._stop.set()
        await asyncio.to_thread(self._closed.wait, 60)

    def _serve(self) -> None:
        try:
            while not self._stop.is_set():
                self._run_calls()
                try:
                    records = read_batch(self.consumer, self._batch_size, self._poll_timeout_s)
                except KafkaException as exc:
                    log.warning("consume failed: %s", exc)
                    continue
                good = [m for m in records if not _error(m)]
                if good:
                    self._loop.call_soon_threadsafe(self._on_records, good)
            self._run_calls()
        except Exception:
            log.exception("the consumer thread failed")
            if self._on_failed is not None:  # a worker that cannot fetch must not linger
                self._loop.call_soon_threadsafe(self._on_failed)
        finally:
            try:
                self.consumer.close()  # runs the revoke callback: the last commit
            except Exception as exc:
                log.warning("closing the consumer: %s", exc)
            self._closed.set()

    def _run_calls(self) -> None:
        while True:
            try:
                func, future = self._calls.get_nowait()
            except queue.Empty:
                return
            try:
                value = func()
            except Exception as exc:
                if future is None:
                    log.warning("consumer call failed: %s", exc)
                else:
                    self._loop.call_soon_threadsafe(_resolve, future, None, exc)
                continue
            if future is not None:
                self._loop.call_soon_threadsafe(_resolve, future, value, None)

    def _assign_cb(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        tps = [(tp.topic, tp.partition) for tp in partitions]
        self._loop.call_soon_threadsafe(self._on_assigned, tps)

    def _revoke_cb(self, consumer: Consumer, partitions: list[TopicPartition], lost: bool) -> None:
        tps = [(tp.topic, tp.partition) for tp in partitions]
        try:
            future = asyncio.run_coroutine_threadsafe(self._on_revoked(tps, lost), self._loop)
            offsets: dict[TP, int] = future.result(timeout=10)
        except Exception as exc:  # the loop is gone or stuck: let the partitions go anyway
            log.warning("revocation bookkeeping failed: %s", exc)
            return
        if lost or not offsets:
            return
        try:
            consumer.commit(
                offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                asynchronous=False,
            )
        except KafkaException as exc:
            log.warning("commit on revocation failed: %s", exc)


def _resolve(future: asyncio.Future[Any], value: Any, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is None:
        future.set_result(value)
    else:
        future.set_exception(exc)


def _error(msg: Message) -> bool:
    err = msg.error()
    if err is None:
        return False
    if err.code() != KafkaError._PARTITION_EOF:
        log.warning("consume error: %s", err)
    return True
