"""The Python SDK: ``JobClient`` publishes job events straight to Kafka.

Same validation as the REST API (``duetime.core.jobspec``): a bad job raises before anything
is written. Writes are keyed by job id, so every event of a job lands on the partition its
scheduler owns. ``create_job`` waits for the broker's acknowledgement by default; pass
``wait=False`` for bulk loads and call :meth:`flush` (``close`` and the context manager flush).

Definitions are typed records (``duetime.core.records``): :meth:`JobClient.build` returns a
``JobDefinition``, :meth:`JobClient.build_dag` a ``DagDefinition`` and its jobs, and
``JobCreated.definition`` / ``DagCreated.definition`` hold those records (read fields as
attributes: ``created.definition.name``; ``.to_avro()`` gives the plain form).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, TypeAlias

import psycopg
from confluent_kafka import KafkaError, Message

from duetime.core import kafka, tracing
from duetime.core.backfill import backfill_id
from duetime.core.calendars import UnknownCalendar, check_calendar_name
from duetime.core.clock import SYSTEM_CLOCK, Clock
from duetime.core.config import CommonSettings, Env
from duetime.core.dag import validate_dag_pairs
from duetime.core.errors import (
    Conflict,
    NotFound,
    PayloadTooLarge,
    RetryableError,
    ValidationError,
)
from duetime.core.jobspec import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    MAX_DEFINITION_BYTES,
    build_job,
    job_to_api,
    parse_uuid,
    schedule_of,
)
from duetime.core.models import (
    ControlKind,
    DagRunEventKind,
    DagRunStatus,
    Misfire,
    Status,
)
from duetime.core.queues import QueueDirectory, metadata_lister
from duetime.core.records import (
    ControlCommand,
    DagDefinition,
    DagNode,
    DagRunEvent,
    JobDefinition,
)
from duetime.core.redact import redact_text
from duetime.core.schedule import first_fire, parse_timestamp
from duetime.core.topics import Topics
from duetime.schemas.codec import Codec

from . import updates
from .execution_view import ExecutionView, read_execution

DeliveryCallback = Callable[[KafkaError | None], None]
KafkaHeaders: TypeAlias = list[tuple[str, str | bytes | None]] | None
"""Record headers as confluent-kafka takes them."""
"""Told the outcome of one published event: None once acknowledged, else the error."""

CONTROL_KINDS = ("pause", "resume", "cancel", "trigger", "release", "skip", "replay")


@dataclass(frozen=True)
class JobCreated:
    job_id: str
    status: str
    next_run_at: str | None
    definition: JobDefinition
    """The JobDefinition record that was published (typed: ``definition.name``)."""


@dataclass(frozen=True)
class DagCreated:
    dag_id: str
    job_ids: dict[str, str]
    """DAG key → job_id of each member (stable across updates of the same DAG)."""
    trigger_job_id: str
    """The hidden job that starts the DAG's runs (schedule, overlap); pause it to pause them."""
    next_run_at: str | None
    definition: DagDefinition
    """The DagDefinition record that was published (typed: ``definition.nodes``)."""


# Member and trigger job ids are derived from the dag_id, so re-publishing a DAG (an update)
# addresses the same jobs and the SDK and the API need no lookup to trigger a DAG.
_DAG_NS = uuid.UUID("0b5e7a52-2f3c-4d8e-9c61-3f2a9d4e7b18")
DAG_LABEL = "duetime.dag"
"""Label of a DAG's trigger job (value: the dag_id); the scheduler starts runs from it."""
_DAG_TRIGGER_TARGET = {"type": "python", "ref": "duetime.dag_trigger"}  # never sent to workers
_RUN_ID_PLACEHOLDER = "00000000-0000-0000-0000-000000000000"  # a UUID: the size of a run's id


def dag_member_job_id(dag_id: str, key: str) -> str:
    return str(uuid.uuid5(_DAG_NS, f"{dag_id}/job/{key}"))


def dag_trigger_job_id(dag_id: str) -> str:
    return str(uuid.uuid5(_DAG_NS, f"{dag_id}/trigger"))


DEFAULT_TIMEOUT_S = 15.0
"""How long the SDK waits for Kafka to acknowledge an event (``DUETIME_SDK_TIMEOUT_S``)."""


class JobClient:
    def __init__(
        self,
        bootstrap_servers: str | None = None,
        *,
        topic_prefix: str | None = None,
        settings: CommonSettings | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        clock: Clock = SYSTEM_CLOCK,
        check_existing: bool = False,
        timeout_s: float | None = None,
    ) -> None:
        """``timeout_s`` (default ``DUETIME_SDK_TIMEOUT_S``, 15 s): how long an event may wait
        for Kafka's acknowledgement. With Kafka unreachable, a publish that waits raises
        :class:`RetryableError` after it, naming the bootstrap servers; an event not
        acknowledged by then is dropped from the client's queue, so it cannot arrive later
        behind the caller's back (job ids make a retry safe).

        ``check_existing``: ``create_job`` with a given ``job_id`` first reads the
        PostgreSQL projection (``database_url``), as REST does: an existing job with another
        body raises :class:`Conflict`, the same body publishes nothing. Off by default: over
        Kafka alone the SDK cannot see existing jobs (and a bulk load must not pay a query per
        job); a re-create with another body is then published as the job's next revision,
        which its scheduler applies. Change jobs with :meth:`update_job`."""
        self.check_existing = check_existing
        base = settings or CommonSettings.from_env(Env())
        if bootstrap_servers is not None:
            base = replace(base, bootstrap_servers=bootstrap_servers)
        if topic_prefix is not None:
            base = replace(base, topic_prefix=topic_prefix)
        self.settings = base
        self.topics = Topics(base.topic_prefix)
        self.codec = Codec(registry_url=base.schema_registry_url)
        self.max_payload_bytes = max_payload_bytes
        self.clock = clock
        self.timeout_s = (
            timeout_s
            if timeout_s is not None
            else Env().number("DUETIME_SDK_TIMEOUT_S", DEFAULT_TIMEOUT_S, lo=1.0, hi=3600.0)
        )
        # acks=all: a create that was acknowledged survives a broker restart;
        # message.timeout.ms: an event Kafka did not take in time fails (see timeout_s)
        self._producer = kafka.producer(
            base,
            **{"acks": "all", "linger.ms": 1, "message.timeout.ms": int(self.timeout_s * 1000)},
        )
        self._errors: list[KafkaError] = []
        # 2 s: the API validates a single create on its event loop (a miss in the cache, at
        # most once a second, waits for the metadata; a broker that cannot answer is asked
        # again only after 10 s)
        self.queues = QueueDirectory(self.topics, metadata_lister(self._producer), timeout_s=2.0)
        """Which queues exist (a job naming another is refused), from the topic metadata."""

    # --- jobs -----------------------------------------------------------------------------

    def build(self, spec: Mapping[str, Any] | None = None, **fields: Any) -> JobDefinition:
        """Validate a job without publishing it; returns its JobDefinition record. A calendar
        NAME in the schedule is read from PostgreSQL (``database_url``): the job carries a copy
        of its rules, as over REST."""
        body = self._with_calendar({**(spec or {}), **fields})
        return self._build(body, self.clock.now_ms())

    def calendar(self, name: str) -> dict[str, Any]:
        """A named calendar's rules (created with REST or ``duetime calendars create``), read
        from the projection's database; :class:`UnknownCalendar` (422) when there is none."""
        name = check_calendar_name(name, "schedule.calendar")
        with self._projection() as conn:
            row = conn.execute("SELECT rules FROM calendars WHERE name = %s", (name,)).fetchone()
        if row is None:
            raise UnknownCalendar(
                f"unknown calendar {name!r}: create it first (POST /v1/calendars)",
                field="schedule.calendar",
                details={"calendar": name},
            )
        return dict(row[0])

    def _with_calendar(self, body: dict[str, Any]) -> dict[str, Any]:
        schedule = body.get("schedule")
        name = schedule.get("calendar") if isinstance(schedule, Mapping) else None
        if isinstance(schedule, Mapping) and isinstance(name, str):
            return {**body, "schedule": {**schedule, "calendar": self.calendar(name)}}
        return body

    def _build(
        self, body: Mapping[str, Any], now_ms: int, *, internal: bool = False
    ) -> JobDefinition:
        definition = build_job(
            body,
            now_ms=now_ms,
            max_payload_bytes=(1 << 30) if internal else self.max_payload_bytes,
            topic_prefix=self.settings.topic_prefix,
            internal=internal,
        )
        self.check_queue(definition.queue)
        return definition

    def check_queue(self, queue: str) -> None:
        """:class:`ValidationError` naming ``queue`` when the cluster has no such queue. When
        the metadata cannot be read the job passes: its publish fails the same way, and a queue
        removed later is the scheduler's to report (a dead letter)."""
        if self.queues.exists(queue) is False:
            raise ValidationError(
                f"queue {queue!r} does not exist (its execution topics are missing): "
                f"create it with `duetime queues create {queue}`",
                field="queue",
            )

    def create_job(
        self,
        spec: Mapping[str, Any] | None = None,
        *,
        wait: bool = True,
        traceparent: str | None = None,
        **fields: Any,
    ) -> JobCreated:
        """Validate and publish a job. Re-creating the same job_id with the same body is a no-op;
        with another body it raises :class:`Conflict` when the client checks existing jobs
        (``check_existing=True``), else it is published as an update (see ``__init__``).
        ``traceparent`` (W3C; default: the caller's current OpenTelemetry span, if any): every
        execution of the job joins that trace (a malformed one is ignored)."""
        definition = self.build(spec, **fields)
        id_given = bool({**(spec or {}), **fields}.get("job_id"))
        return self._create(definition, id_given, wait, traceparent)

    def _create(
        self,
        definition: JobDefinition,
        id_given: bool,
        wait: bool,
        traceparent: str | None = None,
    ) -> JobCreated:
        if not (id_given and self.check_existing and self._exists_same(definition)):
            self.publish_definition(definition, wait=wait, traceparent=traceparent)
        return JobCreated(
            job_id=definition.job_id,
            status=(Status.BLOCKED if definition.depends_on else Status.PENDING).value,
            next_run_at=_first_run(definition),
            definition=definition,
        )

    def create_jobs(self, specs: Sequence[Mapping[str, Any]]) -> list[JobCreated]:
        """Create many jobs with one wait: every spec is validated first (a bad one raises
        :class:`ValidationError` naming ``jobs[i]`` and nothing is published), then all are
        published and flushed once (Kafka acknowledged every one when this returns). Each
        job is the same as ``create_job(spec)`` would make, with the same idempotency."""
        built: list[tuple[Mapping[str, Any], JobDefinition]] = []
        for index, spec in enumerate(specs):
            try:
                built.append((spec, self.build(spec)))
            except ValidationError as exc:
                raise ValidationError(
                    f"jobs[{index}]: {exc.message}", field=f"jobs[{index}]", details=exc.details
                ) from None
        created = [self._create(d, bool(spec.get("job_id")), wait=False) for spec, d in built]
        self.flush()
        return created

    def publish_definition(
        self,
        definition: JobDefinition,
        *,
        wait: bool = True,
        on_delivery: DeliveryCallback | None = None,
        traceparent: str | None = None,
    ) -> None:
        """Publish a built definition. ``on_delivery(error_or_None)`` reports this one event's
        fate (served by :meth:`poll` / :meth:`flush`); its error is then the caller's alone.
        The record carries ``traceparent`` (or the caller's ambient one) as a header."""
        value = self.codec.dump(definition, topic=self.topics.jobs)
        trace = tracing.parse(traceparent) if traceparent is not None else tracing.ambient()
        headers: KafkaHeaders = None if trace is None else [(tracing.HEADER, trace.encode())]
        self._send(self.topics.jobs, definition.job_id, value, on_delivery, headers)
        if wait:
            self.flush()

    def _exists_same(self, definition: JobDefinition) -> bool:
        """Whether the projection holds this job with this same body; :class:`Conflict` if it
        holds it with another one."""
        with self._projection() as conn:
            row = conn.execute(updates.CURRENT_SQL, (definition.job_id,)).fetchone()
        if row is None:
            return False
        body, _, _, _ = updates.current_body(definition.job_id, row)
        wanted = job_to_api(definition)
        if body != wanted:
            raise Conflict(
                f"job {definition.job_id} exists with a different definition",
                details={"job_id": definition.job_id},
            )
        return True

    def build_update(
        self,
        current: Mapping[str, Any],
        changes: Mapping[str, Any],
        *,
        revision: int,
        created_at: datetime,
    ) -> JobDefinition:
        """The next revision of a job whose current body (as a create takes it, with its
        ``job_id``) is at ``revision``: validated exactly as a create, nothing published."""
        now_ms = self.clock.now_ms()
        built = build_job(
            updates.merged(current, changes),
            now_ms=now_ms,
            max_payload_bytes=self.max_payload_bytes,
            revision=updates.next_revision(revision, now_ms),
            topic_prefix=self.settings.topic_prefix,
        )
        if "queue" in changes:  # a job whose queue went away may still change other fields
            self.check_queue(built.queue)
        return updates.with_history(built, created_at)

    def build_deleted(
        self, current: Mapping[str, Any], *, revision: int, created_at: datetime
    ) -> JobDefinition:
        """The revision that marks a job deleted: its definition with the reserved label."""
        now_ms = self.clock.now_ms()
        labels = {**(current.get("labels") or {}), updates.DELETED_LABEL: "true"}
        body = {k: v for k, v in current.items() if k not in ("dag_id", "dag_key", "depends_on")}
        built = build_job(
            {**body, "labels": labels},
            now_ms=now_ms,
            max_payload_bytes=1 << 30,  # the stored payload was accepted once: carried as is
            revision=updates.next_revision(revision, now_ms),
            topic_prefix=self.settings.topic_prefix,
            internal=True,  # the reserved label
        )
        return updates.with_history(built, created_at)

    def update_job(
        self,
        job_id: str,
        changes: Mapping[str, Any] | None = None,
        *,
        expected_revision: int | None = None,
        **fields: Any,
    ) -> JobDefinition:
        """Change a job: the fields given (``schedule``, ``target``, ``payload``, ``retry``,
        ``priority``, ``timeout_s``, ``misfire``, ``overlap``, ``labels``, ``name``) replace
        the current ones, validated as a create; published as the job's next revision, which
        its scheduler applies on its next cycle. Returns the published definition.

        The current definition is read from the PostgreSQL projection (``database_url`` of the
        client's settings, ``DUETIME_DATABASE_URL``), its row locked while the revision is
        published and written back, as the REST API does, so concurrent updates serialise.
        ``expected_revision``: refuse (:class:`Conflict`) if the job has moved past it.
        Raises :class:`NotFound` for an unknown job, :class:`Conflict` for a cancelled or
        deleted job and for DAG members and trigger jobs (change them through their DAG)."""
        job_id = parse_uuid(job_id, "job_id")
        wanted = {**(changes or {}), **fields}
        updates.merged({}, wanted)  # a bad field is refused before any connection

        def build(
            body: dict[str, Any], revision: int, created_at: datetime, status: Status
        ) -> JobDefinition:
            updates.check_changeable(job_id, body, status, "update")
            updates.check_revision(job_id, revision, expected_revision)
            return self.build_update(body, wanted, revision=revision, created_at=created_at)

        definition = self._revise(job_id, build)
        if definition is None:  # build always returns one
            raise RuntimeError(f"update of job {job_id} built nothing")
        return definition

    def delete_job(self, job_id: str) -> bool:
        """Delete a job: cancel it (a running execution finishes) and publish its next
        revision marked deleted, which hides it from ``GET /v1/jobs`` and the dashboard; ``GET
        /v1/jobs/{id}`` still answers (``deleted: true``) and its executions stay for the
        retention period. Reads the projection as :meth:`update_job` does. Returns False for
        a job already deleted (nothing is published then)."""
        job_id = parse_uuid(job_id, "job_id")

        def build(
            body: dict[str, Any], revision: int, created_at: datetime, status: Status
        ) -> JobDefinition | None:
            if updates.DELETED_LABEL in (body.get("labels") or {}):
                return None
            updates.check_changeable(job_id, body, status, "delete")
            if status is not Status.CANCELLED:
                self.command(job_id, "cancel", requested_by="sdk")
            return self.build_deleted(body, revision=revision, created_at=created_at)

        return self._revise(job_id, build) is not None

    def _revise(
        self, job_id: str, build: Callable[..., JobDefinition | None]
    ) -> JobDefinition | None:
        """Lock the job's row, ``build(body, revision, created_at, status)`` its next
        revision, publish it and write it back; commit (the lock is released) at the end."""
        with self._projection() as conn:
            row = conn.execute(updates.CURRENT_SQL, (job_id,)).fetchone()
            if row is None:
                raise updates.not_found(job_id)
            body, revision, created_at, status = updates.current_body(job_id, row)
            definition = build(body, revision, created_at, status)
            if definition is None:
                return None
            self.publish_definition(definition)
            conn.execute(updates.WRITE_SQL, updates.row_values(definition))
            return definition

    def get_execution(self, execution_id: str) -> ExecutionView:
        """One execution as ``GET /v1/executions/{id}`` shows it: status, attempts and their
        errors, the latest attempt's output and traceback (redacted). Read from the PostgreSQL
        projection (``database_url`` of the client's settings); :class:`ValidationError` for an
        id that is not a UUID, :class:`NotFound` for one the projection does not hold."""
        execution_id = parse_uuid(execution_id, "execution_id")
        with self._projection() as conn:
            return read_execution(conn, execution_id)

    @contextmanager
    def _projection(self) -> Iterator[psycopg.Connection[Any]]:
        """A transaction on the PostgreSQL projection (committed when the block ends)."""
        try:
            with psycopg.connect(self.settings.database_url, connect_timeout=5) as conn:
                yield conn
        except psycopg.OperationalError as exc:  # a URL in its message loses its password
            raise RetryableError(
                f"cannot reach PostgreSQL: {redact_text(str(exc))}"[:500]
            ) from None

    # A command for a job id the scheduler has not seen is held until that job arrives (a
    # command may overtake its job: they travel on two topics). Over Kafka alone the SDK
    # cannot tell a job not created yet from a mistyped id; with ``check_existing`` it reads
    # the projection first and raises NotFound, sending nothing, as REST answers 404.

    def cancel(self, job_id: str, *, wait: bool = True) -> str:
        return self.command(self._known(job_id), "cancel", wait=wait)

    def pause(self, job_id: str, *, wait: bool = True) -> str:
        return self.command(self._known(job_id), "pause", wait=wait)

    def resume(self, job_id: str, *, wait: bool = True) -> str:
        return self.command(self._known(job_id), "resume", wait=wait)

    def trigger(self, job_id: str, *, wait: bool = True) -> str:
        return self.command(self._known(job_id), "trigger", wait=wait)

    def backfill(
        self,
        job_id: str,
        start: datetime,
        end: datetime,
        *,
        wait: bool = True,
        requested_by: str | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> str:
        """Run the cron job's occurrences in [start, end] (aware datetimes), each once, as
        its overlap policy allows; returns the backfill id (the same range gives the same id,
        and asking again runs nothing twice). The REST route checks the job and the size of
        the range first (``POST /v1/jobs/{id}/backfill``) and shows the progress."""
        job_id = parse_uuid(job_id, "job_id")
        from_ms, to_ms = (
            int(parse_timestamp(value, name).timestamp() * 1000)
            for value, name in ((start, "from"), (end, "to"))
        )
        if to_ms < from_ms:
            raise ValidationError("backfill 'to' is before 'from'", field="to")
        command_id = backfill_id(job_id, from_ms, to_ms)
        record = ControlCommand(
            command_id=command_id,
            job_id=job_id,
            kind=ControlKind.BACKFILL,
            issued_at_ms=self.clock.now_ms(),
            requested_by=requested_by,
            backfill_from_ms=from_ms,
            backfill_to_ms=to_ms,
        )
        self._send(
            self.topics.control,
            job_id,
            self.codec.dump(record, topic=self.topics.control),
            on_delivery,
        )
        if wait:
            self.flush()
        return command_id

    def _known(self, job_id: str) -> str:
        job_id = parse_uuid(job_id, "job_id")
        if self.check_existing:
            with self._projection() as conn:
                row = conn.execute("SELECT 1 FROM jobs WHERE job_id = %s", (job_id,)).fetchone()
            if row is None:
                raise NotFound(
                    f"no job {job_id} (not created, or not projected yet): nothing was sent",
                    details={"job_id": job_id},
                )
        return job_id

    def replay(
        self, job_id: str, execution_id: str, *, wait: bool = True, dag_run_id: str | None = None
    ) -> str:
        """Run a dead execution again. ``dag_run_id`` (the dead letter's): a DAG member's
        replay repairs its run (its skipped descendants run too) instead of running alone."""
        return self.command(
            job_id, "replay", execution_id=execution_id, wait=wait, dag_run_id=dag_run_id
        )

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
        on_delivery: DeliveryCallback | None = None,
    ) -> str:
        """Publish a control command; returns its command_id (``on_delivery``: as in
        :meth:`publish_definition`)."""
        job_id = parse_uuid(job_id, "job_id")
        command_id = str(uuid.uuid4())
        record = ControlCommand(
            command_id=command_id,
            job_id=job_id,
            kind=_control_kind(kind),
            issued_at_ms=self.clock.now_ms(),
            dag_id=dag_id,
            dag_run_id=dag_run_id,
            execution_id=execution_id,
            reason=reason,
            requested_by=requested_by,
        )
        value = self.codec.dump(record, topic=self.topics.control)
        self._send(self.topics.control, job_id, value, on_delivery)
        if wait:
            self.flush()
        return command_id

    # --- DAGs -----------------------------------------------------------------------------

    def build_dag(
        self,
        name: str,
        jobs: Sequence[Mapping[str, Any]],
        *,
        schedule: Mapping[str, Any] | None = None,
        overlap: str = "skip",
        dag_id: str | None = None,
    ) -> tuple[DagDefinition, list[JobDefinition]]:
        """Validate a DAG without publishing it: (DagDefinition, job definitions to publish).

        The job definitions are the members (``dag_id``, ``dag_key``, ``depends_on``, no
        schedule of their own) followed by the DAG's trigger job, which carries the schedule
        and the overlap policy of the runs. Unknown or duplicate keys, self-loops and cycles
        raise :class:`ValidationError` / :class:`DagCycleError` (the cycle's path in
        ``details["cycle"]``); a bad member names its index and key.
        """
        if isinstance(jobs, str | bytes | Mapping) or not isinstance(jobs, Sequence):
            raise ValidationError("jobs must be a list of job objects", field="jobs")
        if not all(isinstance(j, Mapping) for j in jobs):
            raise ValidationError("jobs must be a list of job objects", field="jobs")
        for i, job in enumerate(jobs):
            if "key" not in job:
                raise ValidationError(f"jobs[{i}] has no 'key'", field=f"jobs[{i}].key")
        validate_dag_pairs((job["key"], job.get("depends_on") or []) for job in jobs)
        dag_id = parse_uuid(dag_id, "dag_id") if dag_id else str(uuid.uuid4())
        now_ms = self.clock.now_ms()
        members = [self._member(dag_id, i, job, now_ms) for i, job in enumerate(jobs)]
        nodes = [
            DagNode(key=m.dag_key or "", job_id=m.job_id, depends_on=list(m.depends_on))
            for m in members
        ]
        # the trigger job: the DAG's schedule and overlap policy; its payload lists the nodes
        trigger = self._build(
            {
                "job_id": dag_trigger_job_id(dag_id),
                "name": name,
                "schedule": schedule,
                "target": _DAG_TRIGGER_TARGET,
                "payload": {"nodes": [n.to_avro() for n in nodes]},
                "overlap": overlap,
                "misfire": Misfire.RUN_ONCE.value,
                "labels": {DAG_LABEL: dag_id},
            },
            now_ms,
            internal=True,  # the reserved label; the payload (node list) is sized below
        )
        definition = DagDefinition(
            dag_id=dag_id,
            name=trigger.name,
            revision=trigger.revision,
            created_at_ms=now_ms,
            schedule=trigger.schedule,
            overlap=trigger.overlap,
            nodes=nodes,
        )
        self._check_run_event_size(definition)
        return definition, [*members, trigger]

    def _check_run_event_size(self, definition: DagDefinition) -> None:
        """Refuse a DAG whose run would not fit in one record: the scheduler writes the run's
        ``started`` event (every node, its dependencies and its status) in the transaction
        that starts it, so an event over the record limit would abort that transaction, and
        every later one of its partition, forever. Measured encoded, as the scheduler will
        write it."""
        event = DagRunEvent(
            dag_id=definition.dag_id,
            dag_run_id=_RUN_ID_PLACEHOLDER,
            kind=DagRunEventKind.STARTED,
            at_ms=definition.created_at_ms,
            status=DagRunStatus.RUNNING,
            node_statuses={n.key: Status.BLOCKED for n in definition.nodes},
            nodes=list(definition.nodes),
            trigger_job_id=dag_trigger_job_id(definition.dag_id),
        )
        size = len(self.codec.dump(event, topic=self.topics.dag_runs))
        size = max(size, len(self.codec.dump(definition, topic=self.topics.dags)))
        if size > MAX_DEFINITION_BYTES:
            raise PayloadTooLarge(
                f"the DAG's run event would be {size} bytes, over the record limit of "
                f"{MAX_DEFINITION_BYTES}: use fewer nodes or shorter keys",
                details={"field": "jobs", "size_bytes": size, "limit_bytes": MAX_DEFINITION_BYTES},
            )

    def _member(
        self, dag_id: str, index: int, job: Mapping[str, Any], now_ms: int
    ) -> JobDefinition:
        key = job["key"]
        if job.get("schedule") is not None:
            raise ValidationError(
                f"job {key!r} has a schedule of its own: DAG members run when the DAG runs; "
                "give the DAG a schedule instead",
                field=f"jobs[{index}].schedule",
            )
        for field in ("dag_id", "dag_key"):
            if field in job:
                raise ValidationError(
                    f"job {key!r}: {field} is set by the DAG", field=f"jobs[{index}].{field}"
                )
        body = {k: v for k, v in job.items() if k != "key"}
        body.update(
            job_id=job.get("job_id") or dag_member_job_id(dag_id, key),
            dag_id=dag_id,
            dag_key=key,
            depends_on=list(job.get("depends_on") or []),
        )
        try:
            return self._build(body, now_ms)
        except ValidationError as exc:
            field = f"jobs[{index}].{exc.field}" if exc.field else f"jobs[{index}]"
            details = {k: v for k, v in exc.details.items() if k != "field"}
            raise type(exc)(f"job {key!r}: {exc.message}", field=field, details=details) from exc
        except PayloadTooLarge as exc:
            raise PayloadTooLarge(
                f"job {key!r}: {exc.message}", details={**exc.details, "key": key}
            ) from exc

    def create_dag(
        self,
        name: str,
        jobs: Sequence[Mapping[str, Any]],
        *,
        schedule: Mapping[str, Any] | None = None,
        overlap: str = "skip",
        dag_id: str | None = None,
        wait: bool = True,
    ) -> DagCreated:
        """Validate and publish a DAG: its members, its trigger job, its DagDefinition.

        ``jobs`` are job bodies (as ``create_job`` takes them) with a ``key`` and an optional
        ``depends_on`` (keys). ``schedule`` (cron or one-time) starts runs by itself; without
        one the DAG runs only when triggered. ``overlap`` (skip, allow, queue_one) decides what
        a due run does while an earlier run of the DAG is still going. Passing the ``dag_id``
        of an existing DAG updates it (validated the same way: a cycle is refused); runs
        already going keep the shape they started with. Nothing is published on an error.
        """
        definition, job_definitions = self.build_dag(
            name, jobs, schedule=schedule, overlap=overlap, dag_id=dag_id
        )
        # members first, then the trigger job: a run never starts before its members exist
        for job in job_definitions:
            self.publish_definition(job, wait=False)
        self.publish_dag_definition(definition, wait=wait)
        trigger = job_definitions[-1]
        return DagCreated(
            dag_id=definition.dag_id,
            job_ids={j.dag_key or "": j.job_id for j in job_definitions[:-1]},
            trigger_job_id=trigger.job_id,
            next_run_at=_first_run(trigger),
            definition=definition,
        )

    def publish_dag_definition(
        self,
        definition: DagDefinition,
        *,
        wait: bool = True,
        on_delivery: DeliveryCallback | None = None,
    ) -> None:
        """Publish a DagDefinition built by :meth:`build_dag` (after its jobs)."""
        value = self.codec.dump(definition, topic=self.topics.dags)
        self._send(self.topics.dags, definition.dag_id, value, on_delivery)
        if wait:
            self.flush()

    def trigger_dag(self, dag_id: str, *, wait: bool = True) -> str:
        """Start a run of the DAG now; returns its dag_run_id.

        The DAG's trigger job starts it in the scheduler's transaction: a ``dag_run_start``
        to every member (roots run at once, the others are blocked in the run) and the run's
        ``started`` event. A manual run does not wait for earlier runs (no overlap policy).
        """
        dag_id = parse_uuid(dag_id, "dag_id")
        dag_run_id = str(uuid.uuid4())
        self.command(
            dag_trigger_job_id(dag_id), "trigger", wait=wait, dag_id=dag_id, dag_run_id=dag_run_id
        )
        return dag_run_id

    def retry_dag_run(
        self,
        dag_id: str,
        dag_run_id: str,
        *,
        node_key: str | None = None,
        wait: bool = True,
        on_delivery: DeliveryCallback | None = None,
    ) -> str:
        """Repair a DAG run: re-run its dead nodes (``node_key``: only that one), put their
        skipped descendants back to blocked and carry on downstream; returns the request id.

        Published to the dag_runs topic for the DAG resolver, which owns the run's progress
        and decides: a run with nothing dead (still running, already being repaired, or a
        success) is left as it is, and so is a run it no longer holds (older than its
        ``DUETIME_RESOLVER_REPAIR_RETENTION_S``). Over Kafka alone nothing is answered: REST's
        ``POST /v1/dags/{dag_id}/runs/{run_id}/retry`` says what will run again, or why not.
        """
        dag_id = parse_uuid(dag_id, "dag_id")
        dag_run_id = parse_uuid(dag_run_id, "dag_run_id")
        request_id = str(uuid.uuid4())
        event = DagRunEvent(
            dag_id=dag_id,
            dag_run_id=dag_run_id,
            kind=DagRunEventKind.RETRY,
            at_ms=self.clock.now_ms(),
            node_key=node_key,
            request_id=request_id,
        )
        value = self.codec.dump(event, topic=self.topics.dag_runs)
        self._send(self.topics.dag_runs, dag_id, value, on_delivery)
        if wait:
            self.flush()
        return request_id

    # --- delivery -------------------------------------------------------------------------

    def _send(
        self,
        topic: str,
        key: str,
        value: bytes,
        on_delivery: DeliveryCallback | None = None,
        headers: KafkaHeaders = None,
    ) -> None:
        callback = self._delivered
        if on_delivery is not None:

            def callback(err: KafkaError | None, msg: Message) -> None:
                on_delivery(err)

        while True:
            try:
                self._producer.produce(
                    topic, key=key, value=value, on_delivery=callback, headers=headers
                )
                self._producer.poll(0)
                return
            except BufferError:
                self._producer.poll(0.05)  # the local queue is full: let deliveries drain

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self._errors.append(err)

    def poll(self, timeout_s: float = 0.0) -> int:
        """Serve delivery callbacks (for callers publishing with ``wait=False``)."""
        return int(self._producer.poll(timeout_s))

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every event is acknowledged (at most ``timeout_s``, default the client's
        own plus a second for the expiry to be reported); raise if any was not."""
        wait_s = self.timeout_s + 1.0 if timeout_s is None else timeout_s
        remaining = self._producer.flush(wait_s)
        if remaining:
            raise RetryableError(
                f"{remaining} job events not acknowledged by Kafka at "
                f"{self.settings.bootstrap_servers} within {wait_s:g} s: is it running and "
                "reachable? (DUETIME_KAFKA_BOOTSTRAP)",
                details={"variable": "DUETIME_KAFKA_BOOTSTRAP"},
            )
        if self._errors:
            errors, self._errors = self._errors, []
            first = errors[0]
            if first.code() == KafkaError._MSG_TIMED_OUT:
                raise RetryableError(
                    f"{len(errors)} job events not acknowledged by Kafka at "
                    f"{self.settings.bootstrap_servers} within {self.timeout_s:g} s "
                    "(DUETIME_SDK_TIMEOUT_S): is it running and reachable? "
                    "(DUETIME_KAFKA_BOOTSTRAP)",
                    details={"variable": "DUETIME_KAFKA_BOOTSTRAP"},
                )
            raise RetryableError(f"{len(errors)} job events failed: {first.str()}")

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


def _control_kind(kind: str) -> ControlKind:
    try:
        return ControlKind(kind)
    except ValueError:
        allowed = ", ".join(k.value for k in ControlKind)
        raise ValidationError(f"kind {kind!r} is not one of {allowed}", field="kind") from None


def _first_run(definition: JobDefinition) -> str | None:
    schedule = schedule_of(definition.schedule)
    if schedule is None or definition.depends_on:
        return None
    first = first_fire(schedule, datetime.fromtimestamp(definition.created_at_ms / 1000, tz=UTC))
    return None if first is None else first.isoformat().replace("+00:00", "Z")


__all__ = [
    "CONTROL_KINDS",
    "DagCreated",
    "JobClient",
    "JobCreated",
    "dag_member_job_id",
    "dag_trigger_job_id",
]
