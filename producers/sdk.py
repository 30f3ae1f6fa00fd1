"""The Python SDK: ``JobClient`` publishes job events straight to Kafka.

Same validation as the REST API (``duetime.core.jobspec``): a bad job raises before anything
is written. Writes are keyed by job id, so every event of a job lands on the partition its
scheduler owns. ``create_job`` waits for the broker's acknowledgement by default; pass
``wait=False`` for bulk loads and call :meth:`flush` (``close`` and the context manager flush).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any

from confluent_kafka import KafkaError, Message

from duetime.core import kafka
from duetime.core.config import CommonSettings, Env
from duetime.core.errors import RetryableError
from duetime.core.jobspec import DEFAULT_MAX_PAYLOAD_BYTES, build_job, parse_uuid
from duetime.core.schedule import first_fire
from duetime.core.topics import Topics
from duetime.schemas.codec import Codec

CONTROL_KINDS = ("pause", "resume", "cancel", "trigger", "release", "skip", "replay")


@dataclass(frozen=True)
class JobCreated:
    job_id: str
    status: str
    next_run_at: str | None
    definition: dict[str, Any]


class JobClient:
    def __init__(
        self,
        bootstrap_servers: str | None = None,
        *,
        topic_prefix: str | None = None,
        settings: CommonSettings | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        base = settings or CommonSettings.from_env(Env())
        if bootstrap_servers is not None:
            base = replace(base, bootstrap_servers=bootstrap_servers)
        if topic_prefix is not None:
            base = replace(base, topic_prefix=topic_prefix)
        self.settings = base
        self.topics = Topics(base.topic_prefix)
        self.codec = Codec(registry_url=base.schema_registry_url)
        self.max_payload_bytes = max_payload_bytes
        # acks=all: a create that was acknowledged survives a broker restart
        self._producer = kafka.producer(base, **{"acks": "all", "linger.ms": 1})
        self._errors: list[KafkaError] = []

    # --- jobs -----------------------------------------------------------------------------

    def build(self, spec: Mapping[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
        """Validate a job without publishing it; returns its JobDefinition record."""
        body = {**(spec or {}), **fields}
        return build_job(body, now_ms=_now_ms(), max_payload_bytes=self.max_payload_bytes)

    def create_job(
        self, spec: Mapping[str, Any] | None = None, *, wait: bool = True, **fields: Any
    ) -> JobCreated:
        """Validate and publish a job. Re-creating the same job_id with the same body is a no-op."""
        definition = self.build(spec, **fields)
        self.publish_definition(definition, wait=wait)
        return JobCreated(
            job_id=definition["job_id"],
            status="blocked" if definition["depends_on"] else "pending",
            next_run_at=_first_run(definition),
            definition=definition,
        )

    def publish_definition(self, definition: Mapping[str, Any], *, wait: bool = True) -> None:
        self._send(self.topics.jobs, definition["job_id"], self.codec.encode("job", definition))
        if wait:
            self.flush()

    def cancel(self, job_id: str, *, wait: bool = True) -> str:
        return self.command(job_id, "cancel", wait=wait)

    def pause(self, job_id: str, *, wait: bool = True) -> str:
        return self.command(job_id, "pause", wait=wait)

    def resume(self, job_id: str, *, wait: bool = True) -> str:
        return self.command(job_id, "resume", wait=wait)

    def trigger(self, job_id: str, *, wait: bool = True) -> str:
        return self.command(job_id, "trigger", wait=wait)

    def replay(self, job_id: str, execution_id: str, *, wait: bool = True) -> str:
        return self.command(job_id, "replay", execution_id=execution_id, wait=wait)

    def command(
        self,
        job_id: str,
        kind: str,
        *,
        wait: bool = True,
        dag_id: str | None = None,
        dag_run_id: str | None = None,
        execution_id: str | None = None,
        reason: str | None = None,
        requested_by: str | None = None,
    ) -> str:
        """Publish a control command; returns its command_id."""
        job_id = parse_uuid(job_id, "job_id")
        command_id = str(uuid.uuid4())
        record = {
            "command_id": command_id,
            "job_id": job_id,
            "kind": kind,
            "issued_at_ms": _now_ms(),
            "dag_id": dag_id,
            "dag_run_id": dag_run_id,
            "execution_id": execution_id,
            "reason": reason,
            "requested_by": requested_by,
        }
        self._send(self.topics.control, job_id, self.codec.encode("control", record))
        if wait:
            self.flush()
        return command_id

    # --- delivery -------------------------------------------------------------------------

    def _send(self, topic: str, key: str, value: bytes) -> None:
        while True:
            try:
                self._producer.produce(topic, key=key, value=value, on_delivery=self._delivered)
                self._producer.poll(0)
                return
            except BufferError:
                self._producer.poll(0.05)  # the local queue is full: let deliveries drain

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self._errors.append(err)

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every event is acknowledged; raise if any was refused."""
        remaining = self._producer.flush(timeout_s)
        if remaining:
            raise RetryableError(f"{remaining} job events not acknowledged after {timeout_s} s")
        if self._errors:
            errors, self._errors = self._errors, []
            raise RetryableError(f"{len(errors)} job events failed: {errors[0].str()}")

    def close(self) -> None:
        self.flush()
        self.codec.close()

    def __enter__(self) -> JobClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _first_run(definition: Mapping[str, Any]) -> str | None:
    from duetime.core.jobspec import schedule_to_api
    from duetime.core.schedule import parse_schedule

    raw = schedule_to_api(definition.get("schedule"))
    if raw is None or definition.get("depends_on"):
        return None
    from datetime import UTC, datetime

    first = first_fire(
        parse_schedule(raw), datetime.fromtimestamp(definition["created_at_ms"] / 1000, tz=UTC)
    )
    return None if first is None else first.isoformat().replace("+00:00", "Z")


__all__ = ["CONTROL_KINDS", "JobClient", "JobCreated"]
