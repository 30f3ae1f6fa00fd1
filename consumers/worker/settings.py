"""The worker role's configuration: one frozen object, built and validated once in ``main``.

What jobs may reach (see ``policy.py``; each is checked at run time, on every attempt):

- ``DUETIME_WORKER_PYTHON_MODULES``: comma list of module prefixes whose ``module:function``
  refs may be imported and run (``myapp`` allows ``myapp.tasks:send``). The modules of
  ``DUETIME_WORKER_IMPORTS`` are allowed too; registered task names always are. Default: none.
- ``DUETIME_WORKER_KAFKA_TOPICS``: comma list of the topics Kafka targets may publish to (an
  entry ending in ``*`` is a prefix). Default: any topic except duetime's own (under the topic
  prefix, or ``duetime.``) and Kafka's internal ones (``__*``), which are never allowed.
- ``DUETIME_WORKER_EGRESS_ALLOW``: comma list of ``loopback``, ``private`` and CIDRs that HTTP
  targets may reach besides public addresses. Default: public addresses only. Link-local
  (cloud metadata), multicast and other special ranges are denied whatever it says.
- ``DUETIME_SECRET_<NAME>``: the value ``${secret:NAME}`` stands for in an HTTP target's header
  values. Read once at start; never logged, never in this object's ``repr``.

Which work it takes:

- ``DUETIME_WORKER_QUEUES``: comma list of the queues this worker serves (default
  ``default``); it subscribes to their execution topics only. A queue whose topics are missing
  stops the worker at start with an error naming it (``duetime queues create NAME``).
- ``DUETIME_WORKER_NEW_GROUP_START``: where a partition the worker group has never committed
  starts: ``end`` (default: a new pool does not replay the topics' history; what it skips and
  nobody answers is re-emitted by the scheduler's rescuer) or ``beginning``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from duetime.consumers.tasks import check_module_prefixes
from duetime.core.config import CommonSettings, Env, check_heartbeat
from duetime.core.errors import ConfigError
from duetime.core.priority import reserved_slots
from duetime.core.topics import DEFAULT_QUEUE, check_queue

from .policy import EgressPolicy, check_topic_allow_list

CANCEL_CHECK_S = 2.0
"""The longest gap between two renewals, so between a cancel and the holder reading it."""


@dataclass(frozen=True)
class WorkerSettings:
    common: CommonSettings
    concurrency: int = 100
    """Executions running at once in this process (slots)."""
    critical_share: float = 0.1
    """Share of the slots only critical work may use (at least one when > 0)."""
    aging_s: float = 30.0
    """A waiting non-critical execution is promoted one level per this many seconds."""
    buffer: int = 1000
    """Fetched executions not yet finished, at most (the partitions pause beyond it); those
    held until their due time count apart (``hold_buffer``)."""
    hold_buffer: int = 20_000
    """Fetched executions held until their due time (the scheduler's fire lead and crowd
    lead), at most (the partitions pause beyond it). They cost no slot and no CPU while they
    wait: a burst fired seconds ahead waits here, claimed, and starts at its time. ~3 KB each
    (2.6 KB decoded, by tracemalloc, and the Kafka message): 60 MB at the default."""
    lease_ttl_s: float = 10.0
    """A lease not renewed for this long may be claimed by another worker."""
    shutdown_s: float = 30.0
    """On SIGTERM, how long in-flight executions may still run before being handed back."""
    imports: tuple[str, ...] = ()
    """Modules imported at start whose ``@duetime.task`` functions become runnable."""
    group_id: str | None = None
    """Consumer group; default ``<prefix>workers`` (separate pools use separate groups)."""
    session_timeout_ms: int = 3000
    """The workers' group session timeout: a worker silent this long (SIGKILLed, cut off,
    frozen) loses its partitions, and the records it had not claimed move to the others.
    KIP-848: set on the group at start, with ``heartbeat_interval_ms`` (the broker's
    ``group.consumer.min/max.*`` bound both; Kafka's defaults are 45 s and 5 s, so a dead
    worker's queued work would wait 45 s). Classic: the member's own setting."""
    heartbeat_interval_ms: int = 1000
    """KIP-848 only: the workers' group heartbeat interval, set on the group at start. A
    worker learns of partitions given to it or taken from it at its next heartbeat. Not the
    schedulers' 500 ms: librdkafka times a KIP-848 heartbeat out after one interval, and on a
    loaded host the coordinator's answer took longer than 500 ms; each timeout cost the
    member its place for a while (bench/README.md: "Why a heartbeat times out so easily")."""
    group_protocol: str = "consumer"
    """``consumer`` (KIP-848, Kafka ≥ 4.0): the broker's range assignor splits every priority
    topic evenly over the workers, with incremental rebalances. ``classic``: the
    cooperative-sticky assignor, for older brokers; it balances partition counts, not
    topics, so two workers may split the four priority topics two and two and one of them
    get all of the normal priority's work."""
    db_pool_size: int = 4
    running_event_after_s: float = 0.5
    """Publish an attempt's ``running`` event once it has run this long (0: at its start).
    Shorter attempts report only their outcome, which carries ``started_at`` too. A ``running``
    event costs a result record, a state record and a projection; at 0.1 s a loaded worker
    published one for nearly every no-op job (2.17 results per job, bench/README.md). It
    only moves a long run's rescue deadline, and a shorter run reports its outcome first."""
    commit_interval_s: float = 1.0
    """How often finished offsets are committed (asynchronously; synchronously on revoke).
    Each commit is a request and a write to ``__consumer_offsets`` on the broker; what a crash
    redelivers since the last one finds its lease done and is committed without running."""
    result_linger_ms: int = 200
    """How long a result may wait for more of its partition's results before it is sent
    (the results producer's ``linger.ms``): the broker's cost is per batch and per request,
    not per record. Nothing waits on a result's first tens of milliseconds: the scheduler
    commits what results change at most every ``DUETIME_SCHEDULER_COMMIT_INTERVAL_S`` (0.5 s),
    offsets are committed every ``commit_interval_s``; start lateness does not depend on it.
    200 ms, not 50: with the scheduler's 1 s lead and 0.5 s commits, 28 % less CPU a job in
    all (docs/decisions.md 22); a result reaches the projector and the resolver up to ~150 ms
    later."""
    complete_gather_ms: int = 20
    """How long a finished attempt's lease completion may wait for others to share its
    PostgreSQL round trip (one statement and one WAL flush for all of them); its result is
    published right after. Runs started one at a time at their due times finish one at a
    time, so without a wait nearly every completion went alone (1.2 a round trip at 350
    jobs/s on two workers). Like ``result_linger_ms``, it delays only the result, never a
    start nor a slot (the slot is freed when the target returns)."""
    report_defer_s: float = 10.0
    """While due work waits for a slot, a finished run's report (its lease completion and
    result) waits for the starts, at most this long (0: never). On a box the roles share, a
    burst's reports (PostgreSQL, the broker, the scheduler's and the projector's work for
    each result) otherwise take the CPU its starts need. Its lease stays held and renewed;
    its result and its run's status arrive up to this much later, only under such a backlog.
    Well inside the scheduler's rescue window (the job's timeout + the lease TTL + 30 s)."""
    lease_retention_s: float = 7 * 24 * 3600.0
    """Finished leases are deleted after this long (the execution topics keep 7 days)."""
    max_early_wait_s: float = 60.0
    """A request this much (or less) before its due time by this worker's clock waits for it
    (outside the slots, without a lease); one further ahead is handed back to the scheduler's
    rescuer without running (``DUETIME_WORKER_MAX_EARLY_WAIT_S``): holding it would pin its
    partition's committed offset and fill the buffer with a skewed scheduler's work."""
    python_modules: tuple[str, ...] = ()
    """Module prefixes whose ``module:function`` refs may run (DUETIME_WORKER_PYTHON_MODULES)."""
    kafka_topics: tuple[str, ...] = ()
    """If set, the only topics Kafka targets may publish to (``*`` suffix: a prefix)."""
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    """Which addresses HTTP targets may reach (``DUETIME_WORKER_EGRESS_ALLOW``)."""
    queues: tuple[str, ...] = (DEFAULT_QUEUE,)
    """The queues this worker serves (``DUETIME_WORKER_QUEUES``)."""
    new_group_start: str = "end"
    """``end`` or ``beginning``: where a partition without a committed offset starts."""
    secrets: Mapping[str, str] = field(
        default_factory=lambda: MappingProxyType({}), repr=False, compare=False, hash=False
    )
    """``{NAME: value}`` from ``DUETIME_SECRET_<NAME>``, for ``${secret:NAME}`` references."""

    def _check_queues(self) -> None:
        if not self.queues:
            raise ConfigError(
                "DUETIME_WORKER_QUEUES names no queue",
                details={"variable": "DUETIME_WORKER_QUEUES"},
            )
        if len(set(self.queues)) != len(self.queues):
            raise ConfigError(
                f"DUETIME_WORKER_QUEUES names a queue twice: {','.join(self.queues)[:300]}",
                details={"variable": "DUETIME_WORKER_QUEUES"},
            )
        for queue in self.queues:
            try:
                check_queue(queue)
            except ValueError as exc:
                raise ConfigError(
                    f"DUETIME_WORKER_QUEUES: {exc}", details={"variable": "DUETIME_WORKER_QUEUES"}
                ) from None

    @property
    def reserved_critical(self) -> int:
        return reserved_slots(self.concurrency, self.critical_share)

    @property
    def group(self) -> str:
        return self.group_id or f"{self.common.topic_prefix}workers"

    @property
    def renew_interval_s(self) -> float:
        """A third of the TTL, and at most CANCEL_CHECK_S: a renewal is also where a cancel
        request is read (``cancel.py``), and a cancel must stop the work within 5 s."""
        return min(self.lease_ttl_s / 3, CANCEL_CHECK_S)

    @property
    def allowed_modules(self) -> tuple[str, ...]:
        """What ``module:function`` refs may import: the listed prefixes and the imports."""
        return self.python_modules + self.imports

    @classmethod
    def from_env(cls, env: Env, secrets: Mapping[str, str] | None = None) -> WorkerSettings:
        """``secrets``: the ``DUETIME_SECRET_*`` values (``policy.secrets_from_environ``)."""
        settings = cls(
            common=CommonSettings.from_env(env),
            concurrency=env.integer("DUETIME_WORKER_CONCURRENCY", cls.concurrency, 1, 100_000),
            critical_share=env.number(
                "DUETIME_WORKER_CRITICAL_SHARE", cls.critical_share, 0.0, 0.99
            ),
            aging_s=env.number("DUETIME_WORKER_AGING_S", cls.aging_s, 0.001, 86400.0),
            buffer=env.integer("DUETIME_WORKER_BUFFER", cls.buffer, 1, 1_000_000),
            hold_buffer=env.integer("DUETIME_WORKER_HOLD_BUFFER", cls.hold_buffer, 1, 1_000_000),
            lease_ttl_s=env.number("DUETIME_LEASE_TTL_S", cls.lease_ttl_s, 0.5, 3600.0),
            shutdown_s=env.number("DUETIME_WORKER_SHUTDOWN_S", cls.shutdown_s, 0.0, 3600.0),
            imports=env.items("DUETIME_WORKER_IMPORTS"),
            group_id=env.opt_str("DUETIME_WORKER_GROUP"),
            session_timeout_ms=env.integer(
                "DUETIME_SESSION_TIMEOUT_MS", cls.session_timeout_ms, 500, 300_000
            ),
            heartbeat_interval_ms=env.integer(
                "DUETIME_WORKER_HEARTBEAT_INTERVAL_MS", cls.heartbeat_interval_ms, 100, 60_000
            ),
            group_protocol=env.choice(
                "DUETIME_WORKER_GROUP_PROTOCOL", cls.group_protocol, ("consumer", "classic")
            ),
            db_pool_size=env.integer("DUETIME_WORKER_DB_POOL", cls.db_pool_size, 1, 100),
            running_event_after_s=env.number(
                "DUETIME_WORKER_RUNNING_EVENT_AFTER_S", cls.running_event_after_s, 0.0, 3600.0
            ),
            commit_interval_s=env.number(
                "DUETIME_WORKER_COMMIT_INTERVAL_S", cls.commit_interval_s, 0.01, 60.0
            ),
            result_linger_ms=env.integer(
                "DUETIME_WORKER_RESULT_LINGER_MS", cls.result_linger_ms, 0, 1000
            ),
            complete_gather_ms=env.integer(
                "DUETIME_WORKER_COMPLETE_GATHER_MS", cls.complete_gather_ms, 0, 1000
            ),
            report_defer_s=env.number(
                "DUETIME_WORKER_REPORT_DEFER_S", cls.report_defer_s, 0.0, 30.0
            ),
            lease_retention_s=env.number(
                "DUETIME_LEASE_RETENTION_S", cls.lease_retention_s, 3600.0, 365 * 86400.0
            ),
            max_early_wait_s=env.number(
                "DUETIME_WORKER_MAX_EARLY_WAIT_S", cls.max_early_wait_s, 0.0, 3600.0
            ),
            python_modules=env.items("DUETIME_WORKER_PYTHON_MODULES"),
            kafka_topics=env.items("DUETIME_WORKER_KAFKA_TOPICS"),
            egress=EgressPolicy.parse(env.items("DUETIME_WORKER_EGRESS_ALLOW")),
            queues=(
                env.items("DUETIME_WORKER_QUEUES")
                if env.raw("DUETIME_WORKER_QUEUES") is not None
                else (DEFAULT_QUEUE,)
            ),
            new_group_start=env.choice(
                "DUETIME_WORKER_NEW_GROUP_START", cls.new_group_start, ("end", "beginning")
            ),
            secrets=MappingProxyType(dict(secrets or {})),
        )
        settings.validate()
        return settings

    def validate(self) -> None:
        if self.group_protocol == "consumer":  # classic: the member's own heartbeat
            check_heartbeat(
                self.heartbeat_interval_ms,
                self.session_timeout_ms,
                "DUETIME_WORKER_HEARTBEAT_INTERVAL_MS",
            )
        for variable, items in (
            ("DUETIME_WORKER_PYTHON_MODULES", self.python_modules),
            ("DUETIME_WORKER_IMPORTS", self.imports),
        ):
            try:
                check_module_prefixes(items, variable)
            except ValueError as exc:
                raise ConfigError(str(exc), details={"variable": variable}) from None
        check_topic_allow_list(self.kafka_topics, "DUETIME_WORKER_KAFKA_TOPICS")
        self._check_queues()
        if self.buffer < self.concurrency:
            raise ConfigError(
                f"DUETIME_WORKER_BUFFER={self.buffer} must be at least "
                f"DUETIME_WORKER_CONCURRENCY={self.concurrency}",
                details={"variable": "DUETIME_WORKER_BUFFER"},
            )
        try:
            self.reserved_critical  # noqa: B018 - validates the share against the slots
        except ConfigError as exc:
            raise ConfigError(
                f"DUETIME_WORKER_CRITICAL_SHARE: {exc.message}",
                details={"variable": "DUETIME_WORKER_CRITICAL_SHARE"},
            ) from None
