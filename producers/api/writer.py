"""Kafka writes of the API: the SDK's ``JobClient``, awaited per event.

Each write registers a delivery callback for its own event and awaits it, so a request
answers only after Kafka acknowledged *its* event (``acks=all``) and never waits for other
requests' events. A thread serves the producer's callbacks.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError

from duetime.core.errors import RetryableError
from duetime.producers.sdk import JobClient

from .errors import Unavailable

Publish = Callable[[Callable[[KafkaError | None], None]], Any]


class Writer:
    def __init__(self, client: JobClient, timeout_s: float) -> None:
        self.client = client
        self.timeout_s = timeout_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="kafka-deliveries", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            self.client.poll(0.05)

    async def publish(self, publish: Publish) -> Any:
        """Run ``publish(on_delivery)`` and wait for that event's acknowledgement."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[KafkaError | None] = loop.create_future()

        def resolve(err: KafkaError | None) -> None:
            if not future.done():
                future.set_result(err)

        def on_delivery(err: KafkaError | None) -> None:
            loop.call_soon_threadsafe(resolve, err)

        result = publish(on_delivery)
        await self._acknowledged(future)
        return result

    async def _acknowledged(self, future: asyncio.Future[KafkaError | None]) -> None:
        try:
            # asyncio.timeout, not wait_for: wait_for (3.11) wraps the future in a new task
            async with asyncio.timeout(self.timeout_s):
                err = await future
        except TimeoutError:
            raise Unavailable(
                f"Kafka did not acknowledge the write within {self.timeout_s:.0f} s"
            ) from None
        if err is not None:
            raise Unavailable(f"Kafka refused the write: {err.str()}")

    async def publish_many(self, publishes: list[Publish]) -> list[Any]:
        return list(await asyncio.gather(*(self.publish(p) for p in publishes)))

    async def publish_all(self, publishes: Sequence[Publish]) -> None:
        """Run every ``publish(on_delivery)`` and wait until Kafka acknowledged them all:
        one wake-up of the event loop for the lot (the last acknowledgement, or the first
        error), not one per event."""
        if not publishes:
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[KafkaError | None] = loop.create_future()
        lock = threading.Lock()  # deliveries are served by this thread and by produce()'s poll
        remaining = [len(publishes)]

        def resolve(err: KafkaError | None) -> None:
            if not future.done():
                future.set_result(err)

        def on_delivery(err: KafkaError | None) -> None:
            with lock:
                remaining[0] -= 1
                last = remaining[0] == 0
            if err is not None or last:
                loop.call_soon_threadsafe(resolve, err)

        for publish in publishes:
            publish(on_delivery)
        await self._acknowledged(future)

    async def flush(self) -> None:
        try:
            await asyncio.to_thread(self.client.flush, self.timeout_s)
        except RetryableError as exc:
            raise Unavailable(exc.message) from None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.client.close()
