"""The resolver as a faust-streaming application: two agents, two tables.

Data flow::

    results, dlq, dag_runs ──route──► <prefix>resolver.by_run (key dag_run_id) ──resolve──►
        control (release, skip, dag_run_end)     dag_runs (node_status, completed)

Why two hops: a run's progress lives in faust tables keyed by dag_run_id, and a faust table
is partitioned like the stream that writes it (its changelog partition is the partition of
the event being handled). The inputs are keyed by job_id (results, dlq) and dag_id
(dag_runs), so a run's events are spread over every partition. ``route`` re-keys each
DAG-run event by its dag_run_id into an internal topic (what ``stream.group_by`` does, with
the original Avro bytes and a header naming the event type); ``resolve`` then sees every event
of a run on one partition, in order, and owns that run's table entries together with the
partition: a changelog restore or a standby brings them back on whichever process gets it.

Guarantees: at-least-once (faust flushes what an agent sent, changelog writes included,
before it commits the offsets of what was consumed; a partition with nothing committed is read
again from its first record after every rebalance: :func:`seek_to_committed_or_start`),
idempotent outputs (``progress``), and read_committed input: the dlq and the started events
are written in scheduler transactions, and a resolver must not act on an aborted dead letter.
faust 0.15 reads read_uncommitted unless ``processing_guarantee="exactly_once"``, whose own
reports of duplicates and crashes DESIGN.md tells us to avoid; :class:`_ReadCommittedThread`
sets the isolation level alone.

Bad records: an input record that does not decode, or a ``started`` event whose nodes do not
form a DAG, is copied to the poison topic (original bytes and headers, plus its source topic,
partition, offset and the error) and the stream moves on; so is a by_run event ``resolve``
cannot apply. The copy is sent before the input's offset is committed (at least once).

Partitioning of what it writes: control commands must reach the scheduler owning the job,
i.e. the partition the SDK's librdkafka producer chose for the job id (CRC-32 of the key,
librdkafka's ``consistent_random``). faust's aiokafka producer partitions by murmur2, so the
partition is computed here (:func:`librdkafka_partition`) and passed explicitly.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Mapping, Set
from pathlib import Path
from typing import Any, TypeAlias

import faust
from faust.transport.drivers import aiokafka as faust_aiokafka

from duetime.core.aiokafka_auth import aiokafka_auth
from duetime.core.clock import SYSTEM_CLOCK, Clock
from duetime.core.config import CommonSettings
from duetime.core.dag import children, validate_dag
from duetime.core.errors import CONTENT_ERRORS
from duetime.core.models import ControlKind, DagRunEventKind, DagRunStatus, ResultStatus, Status
from duetime.core.poison import PRODUCER_MAX_BYTES, park_record
from duetime.core.records import DagRunEvent, DeadLetter, ExecutionResult
from duetime.core.topics import Topics
from duetime.schemas.codec import Codec

from . import metrics, progress
from .progress import Progress, Shape
from .settings import TABLES, ResolverSettings

log = logging.getLogger("duetime.resolver")

SWEEP = "sweep"
"""On the by_run topic: a retention marker (header value and key), not an event of a run."""
EVENT_HEADER = "duetime-event"
"""On the by_run topic: the Avro event type of the value (result, dead_letter, dag_run)."""

Input: TypeAlias = ExecutionResult | DeadLetter | DagRunEvent
INPUTS: Mapping[str, type[Input]] = {
    cls.EVENT_TYPE: cls for cls in (ExecutionResult, DeadLetter, DagRunEvent) if cls.EVENT_TYPE
}
"""The event types the resolver reads (its input topics' values), by name."""


def librdkafka_partition(key: str, partitions: int) -> int:
    """The partition librdkafka's default partitioner picks for ``key`` (CRC-32 mod n)."""
    return zlib.crc32(key.encode()) % partitions


# --- faust plumbing: read_committed without exactly_once; the seek after a rebalance -------


async def seek_to_committed_or_start(consumer: Any, changelog_topics: Set[str]) -> dict[Any, Any]:
    """Seek every assigned partition to its committed offset, and every stream partition
    without one (nothing committed yet, or 0) to its beginning; returns the committed offsets
    (aiokafka's ``seek_to_committed`` answer, None where there is none).

    faust seeks only the partitions with a committed offset above 0 after a rebalance
    (``Consumer.perform_seek``) and leaves the others where the fetcher stands. But during the
    recovery the fetcher already fetches the stream partitions, and faust drops what it
    fetched for a partition it paused in the meantime: aiokafka's position is then past
    records no one handled. Reproduced: a resolver taking over from a SIGKILLed one (nothing
    committed) started at dag_runs offset 6 and never saw the run's events (3 of 24 runs of
    tests/e2e/test_dag_resolver.py beside two busy cores; 0 of 18 with this seek). A partition
    without a committed offset therefore starts again from its first record, which is what
    ``auto_offset_reset=earliest`` promises and at-least-once needs. The changelog partitions
    are left to faust's recovery, which seeks them itself.
    """
    committed: dict[Any, Any] = await consumer.seek_to_committed()
    unstarted = [
        tp
        for tp, offset in committed.items()
        if (offset is None or offset <= 0) and tp.topic not in changelog_topics
    ]
    if unstarted:
        await consumer.seek_to_beginning(*unstarted)
    return committed


class _ReadCommittedThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # faust hard-codes read_uncommitted outside exactly_once; aiokafka reads this attribute
        # when the consumer starts (checked against aiokafka 0.14)
        consumer._isolation_level = "read_committed"
        return consumer

    async def seek_to_committed(self) -> Mapping[Any, int]:
        changelogs = set(self.app.tables.changelog_topics)
        return await self.call_thread(  # type: ignore[no-any-return]
            seek_to_committed_or_start, self._ensure_consumer(), changelogs
        )


class _Consumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> Any:
        return _ReadCommittedThread(self, loop=self.loop, beacon=self.beacon)


class _Transport(faust_aiokafka.Transport):
    Consumer = _Consumer


class ResolverApp(faust.App):
    def _new_transport(self) -> Any:
        return _Transport(self.conf.broker_consumer, self)


# --- the app -------------------------------------------------------------------------------


def broker_credentials(common: CommonSettings) -> Any:
    """faust's credentials for the operator's Kafka security properties (None: plaintext).

    The resolver is the one role on aiokafka rather than librdkafka: the same variables are
    translated (``duetime.core.aiokafka_auth``), and what aiokafka cannot do as configured
    (GSSAPI, OAUTHBEARER, inline PEM) stops start-up with an error naming the variable rather
    than connecting with less security than the operator asked for."""
    auth = aiokafka_auth(common.kafka_properties)
    if auth.ignored:
        log.info(
            "Kafka properties the resolver's client does not take (tuning): %s",
            ", ".join(auth.ignored),
        )
    if auth.sasl_mechanism is not None:
        return faust.SASLCredentials(
            username=auth.username,
            password=auth.password,
            mechanism=auth.sasl_mechanism,
            ssl_context=auth.ssl_context(),
        )
    context = auth.ssl_context()
    return None if context is None else faust.SSLCredentials(context)


def build_app(settings: ResolverSettings, data_dir: Path, clock: Clock = SYSTEM_CLOCK) -> faust.App:
    """A configured resolver app with its agents registered (nothing runs until a worker).

    ``data_dir``: where faust keeps its local files (nothing durable with the memory store;
    without it faust writes ``<app id>-data`` into the working directory).
    """
    common = settings.common
    app = ResolverApp(
        settings.app_id,
        datadir=str(data_dir),
        broker=[f"kafka://{server.strip()}" for server in common.bootstrap_servers.split(",")],
        # the changelog topics are the durable copy: a restarted resolver restores from them
        store="memory://",
        # not exactly_once: faust's transactional mode has open duplicate and crash reports
        processing_guarantee="at_least_once",
        topic_partitions=common.partitions,
        topic_replication_factor=common.replication_factor,
        table_standby_replicas=settings.standby_replicas,
        # fast failure detection, as every role (the default is 60 s)
        broker_session_timeout=settings.session_timeout_ms / 1000,
        broker_heartbeat_interval=min(0.5, settings.session_timeout_ms / 3000),
        broker_commit_interval=settings.commit_interval_s,
        broker_client_id=f"duetime-resolver-{common.instance_id}",
        producer_acks=-1,  # a release must survive a broker restart once the input is committed
        # it parks copies of bad input records, up to ~1 MiB each (the default is 1,000,000)
        producer_max_request_size=PRODUCER_MAX_BYTES,
        # TLS / SASL from the same DUETIME_KAFKA_* variables as the librdkafka roles
        broker_credentials=broker_credentials(common),
        web_enabled=False,
        autodiscover=False,
    )
    Resolver(app, settings, clock)
    return app


class Resolver:
    """The two agents and the tables, registered on ``app`` explicitly."""

    def __init__(
        self, app: faust.App, settings: ResolverSettings, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        common = settings.common
        self.app = app
        self.clock = clock
        self.partitions = common.partitions
        self.codec = Codec(registry_url=common.schema_registry_url)
        self.topics = Topics(common.topic_prefix)
        raw: dict[str, Any] = {"key_serializer": "raw", "value_serializer": "raw"}
        self.inputs = app.topic(self.topics.results, self.topics.dlq, self.topics.dag_runs, **raw)
        self.by_run = app.topic(
            settings.by_run_topic, partitions=self.partitions, internal=True, **raw
        )
        self.control = app.topic(self.topics.control, **raw)
        self.dag_runs = app.topic(self.topics.dag_runs, **raw)
        self.poison = app.topic(self.topics.poison, **raw)
        progress_table, shapes_table = TABLES
        self.progress = app.Table(
            progress_table, default=None, partitions=self.partitions, help="run → progress"
        )
        self.shapes = app.Table(
            shapes_table, default=None, partitions=self.partitions, help="run → its nodes"
        )
        self._kids: dict[str, Mapping[str, list[str]]] = {}  # a cache of the shapes' child maps
        self.settings = settings
        app.agent(self.inputs, name="duetime.resolver.route")(self.route)
        app.agent(self.by_run, name="duetime.resolver.resolve")(self.resolve)
        app.timer(settings.sweep_interval_s, name="duetime.resolver.sweep")(self.send_sweeps)

    # --- agent 1: re-key by dag_run_id -----------------------------------------------------

    async def route(self, stream: Any) -> None:
        async for event in stream.events():
            message = event.message
            topic = message.topic
            event_type = self.topics.event_type_of(topic) or ""
            try:
                record = self.codec.load(
                    INPUTS[event_type], event.value, topic=topic, partition=message.partition
                )
                run_id = _run_of(record)
                if isinstance(record, DagRunEvent) and record.kind is DagRunEventKind.STARTED:
                    validate_dag({n.key: n.depends_on for n in record.nodes})
            except CONTENT_ERRORS as exc:
                await self._park(message, f"{type(exc).__name__}: {exc}")
                continue
            if run_id is not None:
                await self.by_run.send(
                    key=run_id.encode(),
                    value=event.value,
                    headers={EVENT_HEADER: event_type.encode()},
                )

    # --- agent 2: one run's events, in order -----------------------------------------------

    async def resolve(self, stream: Any) -> None:
        async for event in stream.events():
            try:
                event_type = _header(event.message.headers, EVENT_HEADER)
                if event_type == SWEEP:
                    self.sweep(event.message.partition, self.clock.now_ms())
                    continue
                run_id = event.key.decode()
                record = self.codec.load(INPUTS[event_type], event.value, topic=event.message.topic)
                actions = self.apply(run_id, record, self.clock.now_ms(), event.message.partition)
            except CONTENT_ERRORS as exc:
                await self._park(event.message, f"{type(exc).__name__}: {exc}")
                continue
            await self._send(actions)
            if isinstance(record, ExecutionResult) and record.status is ResultStatus.SUCCESS:
                finished_ms = record.finished_at_ms
                if finished_ms and any(c.kind is ControlKind.RELEASE for c in actions.commands):
                    delay_ms = max(0, self.clock.now_ms() - finished_ms)
                    metrics.RELEASE_DELAY.observe(delay_ms / 1000)

    async def _send(self, actions: progress.Actions) -> None:
        """The commands to the control topic, the events to dag_runs, each to the partition
        the SDK's producer would have chosen for its key (see the module's docstring)."""
        for command in actions.commands:
            metrics.COMMANDS.labels(kind=command.kind.value).inc()
            await self.control.send(
                key=command.job_id.encode(),
                value=self.codec.dump(command, topic=self.topics.control),
                partition=librdkafka_partition(command.job_id, self.partitions),
            )
        for dag_event in actions.events:
            if dag_event.kind is DagRunEventKind.COMPLETED and dag_event.status is not None:
                metrics.RUNS_COMPLETED.labels(outcome=dag_event.status.value).inc()
            await self.dag_runs.send(
                key=dag_event.dag_id.encode(),
                value=self.codec.dump(dag_event, topic=self.topics.dag_runs),
                partition=librdkafka_partition(dag_event.dag_id, self.partitions),
            )

    async def _park(self, message: Any, error: str) -> None:
        """Copy a record the resolver cannot use to the poison topic; the stream moves on."""
        parked = park_record(
            topic=message.topic,
            partition=message.partition,
            offset=message.offset,
            key=message.key,
            value=message.value,
            headers=message.headers,
            error=error,
            role="resolver",
            logger=log,
        )
        metrics.BAD_RECORDS.labels(topic=message.topic).inc()
        await self.poison.send(
            key=parked.key, value=parked.value, partition=parked.partition, headers=parked.headers
        )

    def apply(self, run_id: str, record: Input, now_ms: int, partition: int) -> progress.Actions:
        """Apply one event to the run's tables; returns the Actions to send."""
        stored = self.progress.get(run_id)
        # a fresh object each time: the table's entry is never mutated in place
        state = (
            progress.new_progress(run_id, record.dag_id, now_ms)
            if stored is None
            else Progress.from_table(stored)
        )
        state.partition = partition  # which sweep may drop it (see ``sweep``)
        stored_shape = self.shapes.get(run_id)
        shape = None if stored_shape is None else Shape.from_table(stored_shape)
        if isinstance(record, DagRunEvent):
            metrics.EVENTS.labels(kind=record.kind.value).inc()
            if record.kind is DagRunEventKind.STARTED and shape is None and state.done is None:
                shape = Shape.of(record)
                self.shapes[run_id] = shape.to_table()
            actions = self._on_run_event(run_id, record, state, shape, now_ms)
        else:
            key, status = _node_of(record, shape)
            metrics.EVENTS.labels(kind=status.value).inc()
            if key is None:
                log.warning(
                    "a DAG-run result without a dag_key ignored",
                    extra={"dag_run_id": run_id, "job_id": record.job_id},
                )
                return progress.Actions()
            kids = None if shape is None else self._children(run_id, shape)
            actions = progress.on_node(state, shape, kids, key, status, now_ms, record.execution_id)
        if actions.progress_changed:
            self.progress[run_id] = state.to_table()
        if state.done is DagRunStatus.SUCCESS and shape is not None:
            # the run is over for good: only its progress (statuses, outcome) is kept; a run
            # that ended otherwise keeps its shape, so that it can be repaired
            del self.shapes[run_id]
            self._kids.pop(run_id, None)
        return actions

    def _on_run_event(
        self, run_id: str, record: DagRunEvent, state: Progress, shape: Shape | None, now_ms: int
    ) -> progress.Actions:
        """A DagRunEvent routed here: a run started, a repair request, a member cancelled."""
        kids = self._children(run_id, shape)
        if record.kind is DagRunEventKind.RETRY:
            if shape is None:
                log.warning(
                    "repair of a DAG run this resolver does not hold (never started, "
                    "succeeded, or older than DUETIME_RESOLVER_REPAIR_RETENTION_S) ignored",
                    extra={"dag_run_id": run_id, "dag_id": record.dag_id},
                )
            # a request without an id (not one of ours) is told apart by its time and node
            request_id = record.request_id or f"{record.at_ms}/{record.node_key or '*'}"
            actions = progress.on_retry(
                state, shape, kids, request_id, record.node_key, now_ms, _replayed(record)
            )
            metrics.REPAIRS.labels(result=_repair_result(shape, actions)).inc()
            return actions
        if record.kind is DagRunEventKind.NODE_CANCELLED:
            if record.node_key is None:
                raise ValueError("a node_cancelled DagRunEvent without its node_key")
            return progress.on_node(
                state, shape, kids if shape else None, record.node_key, Status.CANCELLED, now_ms
            )
        return progress.on_started(state, shape, kids, now_ms)

    # --- retention: a sweep marker per partition, handled in the stream ----------------------

    async def send_sweeps(self) -> None:
        """Ask every partition's owner to drop expired runs (every process sends; harmless)."""
        for p in range(self.partitions):
            await self.by_run.send(
                key=SWEEP.encode(), value=b"", partition=p, headers={EVENT_HEADER: SWEEP.encode()}
            )

    def sweep(self, partition: int, now_ms: int) -> int:
        """Drop this partition's expired runs. Runs in the stream, so that the tombstones go
        to the changelog partition the entries were written to."""
        s = self.settings
        dropped = 0
        for run_id, stored in list(self.progress.items()):
            state = Progress.from_table(stored)
            if state.partition != partition:
                continue
            has_shape = self.shapes.get(run_id) is not None
            if progress.expired(
                state,
                has_shape,
                now_ms,
                int(s.done_retention_s * 1000),
                int(s.orphan_retention_s * 1000),
                int(s.repair_retention_s * 1000),
            ):
                del self.progress[run_id]
                if has_shape:
                    del self.shapes[run_id]
                self._kids.pop(run_id, None)
                dropped += 1
        if dropped:
            log.info("swept %s expired DAG runs", dropped, extra={"partition": partition})
        return dropped

    def _children(self, run_id: str, shape: Shape | None) -> Mapping[str, list[str]]:
        if shape is None:
            return {}
        kids = self._kids.get(run_id)
        if kids is None:
            kids = self._kids[run_id] = children(shape.nodes)
        return kids


# --- helpers -------------------------------------------------------------------------------


def _run_of(record: Input) -> str | None:
    """The dag_run_id of a record the resolver acts on, or None (a DAG run event other than
    ``started``, ``retry`` and ``node_cancelled`` is the resolver's own output, or the
    projector's business)."""
    if isinstance(record, DagRunEvent):
        return record.dag_run_id if record.kind in _ROUTED_KINDS else None
    return record.dag_run_id


def _repair_result(shape: Shape | None, actions: progress.Actions) -> str:
    """What came of a repair request, for the metric."""
    if shape is None:
        return "replayed_alone" if actions.commands else "run_not_held"
    return "repaired" if actions.commands else "nothing_to_repair"


def _replayed(record: DagRunEvent) -> progress.Replayed | None:
    """The dead execution a member's replay names (its scheduler puts the member, with its
    job id, in ``nodes`` and the execution in the request id), else None."""
    request_id = record.request_id or ""
    if not request_id.startswith(progress.REPLAY_PREFIX) or len(record.nodes) != 1:
        return None
    [node] = record.nodes
    execution_id = request_id.removeprefix(progress.REPLAY_PREFIX)
    return progress.Replayed(job_id=node.job_id, execution_id=execution_id)


_ROUTED_KINDS = frozenset(
    {DagRunEventKind.STARTED, DagRunEventKind.RETRY, DagRunEventKind.NODE_CANCELLED}
)
"""The DagRunEvents the resolver acts on; the others are its own output (or unknown to it)."""

_RESULT_STATUS: dict[ResultStatus, progress.NodeEvent] = {
    ResultStatus.RUNNING: Status.RUNNING,
    ResultStatus.SUCCESS: Status.SUCCESS,
    ResultStatus.FAILURE: Status.FAILED,
}


def _node_of(
    record: ExecutionResult | DeadLetter, shape: Shape | None
) -> tuple[str | None, progress.NodeEvent]:
    status: progress.NodeEvent
    if isinstance(record, DeadLetter):
        key, status = record.request.dag_key, Status.DEAD
    else:
        key, status = record.dag_key, _RESULT_STATUS[record.status]
    if key is None and shape is not None:
        by_job = {job_id: k for k, job_id in shape.job_ids.items()}
        key = by_job.get(record.job_id)
    return key, status


def _header(headers: Any, name: str) -> str:
    items = headers.items() if isinstance(headers, Mapping) else (headers or [])
    for key, value in items:
        if key == name:
            return bytes(value).decode()
    raise KeyError(f"record without the {name} header")
