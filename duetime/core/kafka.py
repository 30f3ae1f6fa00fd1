"""Kafka client factories and the one place where Kafka errors are classified.

Every non-default client setting carries a comment saying why. Roles build their clients here
so that the same tuning (and the same reasons) apply everywhere.

Each client's configuration is layered: duetime's defaults, then the operator's librdkafka
properties (``settings.kafka_properties``: TLS, SASL, tuning; see docs/kafka-security.md),
then what the calling role asks for that one client. A configuration that librdkafka refuses
raises :class:`~duetime.core.errors.ConfigError` naming where the properties were set, with
every secret value masked.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from .config import CommonSettings
from .errors import ConfigError, RetryableError

# Properties of classic-protocol members that a KIP-848 member may not set (the broker's
# group.consumer.* settings decide): an operator setting them for the schedulers' classic
# groups must not stop the workers from starting.
_CLASSIC_MEMBER_ONLY = frozenset({"session.timeout.ms", "heartbeat.interval.ms"})


_UNREACHABLE_RE = re.compile(
    r"Connect to .* failed|Connection refused|all brokers are down|Receive failed|"
    r"Disconnected|Failed to resolve|timed out|Connection reset",
    re.IGNORECASE,
)


class LibrdkafkaLogs(logging.Filter):
    """librdkafka's own lines (``%3|...|FAIL|...`` on stderr by default), through duetime's
    logging instead, rate-limited: a broker that went away makes librdkafka log each failed
    connection attempt (about 10 lines a second per client), which buried everything else.

    Each client's lines of one kind (facility) pass at most once per ``every_s``, with the
    number held back since; a failed connection becomes one duetime-level WARNING that says
    what it means (the client retries on its own; nothing to do unless it persists).
    """

    def __init__(self, every_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.every_s = every_s
        self.clock = clock
        self._lock = threading.Lock()  # clients of several threads log through one logger
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}
        """(client, kind) → (when one last passed, how many were held back since)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not (isinstance(args, tuple) and len(args) == 3):
            return True  # not a librdkafka line (confluent-kafka logs "%s [%s] %s")
        facility, client, text = (str(a) for a in args)
        unreachable = record.levelno >= logging.WARNING and bool(_UNREACHABLE_RE.search(text))
        kind = "unreachable" if unreachable else facility
        now = self.clock()
        with self._lock:
            last, held = self._seen.get((client, kind), (-float("inf"), 0))
            if now - last < self.every_s:
                self._seen[(client, kind)] = (last, held + 1)
                return False
            self._seen[(client, kind)] = (now, 0)
        more = f" ({held} more like it in the last {self.every_s:g} s)" if held else ""
        if unreachable:
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg = "Kafka broker unreachable from %s: %s; the client keeps retrying%s"
            record.args = (client, text, more)
        else:
            record.msg = "librdkafka %s [%s] %s%s"
            record.args = (facility, client, text, more)
        return True


LIBRDKAFKA_LOG = logging.getLogger("duetime.kafka.librdkafka")
"""Every client the factories build logs through this (confluent-kafka's ``logger``
property), served by the client's own poll calls."""
LIBRDKAFKA_LOG.addFilter(LibrdkafkaLogs())


def _layered(
    settings: CommonSettings,
    defaults: dict[str, Any],
    overrides: dict[str, Any],
    skip: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """duetime's defaults, then the operator's properties, then the role's own overrides."""
    operator = {k: v for k, v in settings.kafka_properties.as_dict().items() if k not in skip}
    return {"logger": LIBRDKAFKA_LOG, **defaults, **operator, **overrides}


def _refused(settings: CommonSettings, kind: str, exc: KafkaException) -> ConfigError:
    """librdkafka's refusal of a client configuration, as an error an operator can act on."""
    props = settings.kafka_properties
    err = exc.args[0] if exc.args else None
    text = props.redact(err.str() if isinstance(err, KafkaError) else str(exc))
    if not props:  # no operator property: duetime's own configuration is wrong, a bug
        raise exc
    named = [name for name, _ in props.items if name in text] or [n for n, _ in props.items]
    where = ", ".join(sorted({props.source(name) for name in named}))
    return ConfigError(
        f"the Kafka {kind} configuration was refused: {text} (properties set by: {where})",
        details={"variable": where},
    )


def producer(settings: CommonSettings, **overrides: Any) -> Producer:
    defaults: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap_servers,
        # idempotence: a retried send is never written twice (and it is required by transactions)
        "enable.idempotence": True,
        # a small linger batches bursts without costing the 5 s start budget anything visible
        "linger.ms": 2,
        "client.id": f"duetime-{settings.instance_id}",
    }
    conf = _layered(settings, defaults, overrides)
    try:
        return Producer(conf)
    except KafkaException as exc:
        raise _refused(settings, "producer", exc) from None


TXN_RETRY_BACKOFF_MS = 10
"""A transactional producer's first retry backoff (librdkafka's default: 100 ms). A transaction
begun right after its producer's last commit is answered CONCURRENT_TRANSACTIONS until the
coordinator has written that commit's markers, and retried after this: back-to-back
transactions (begin, a record, send_offsets, commit) cycled every 103-107 ms at 100 ms and every
14-22 ms at 10 ms on the local broker (``./run bench txn``). The Java client lowered its
backoff for this case to 20 ms (KAFKA-5477); librdkafka backs off exponentially from here up
to ``retry.backoff.max.ms`` on repeated errors. An operator's ``retry.backoff.ms`` wins."""


def transactional_producer(
    settings: CommonSettings, transactional_id: str, **overrides: Any
) -> Producer:
    return producer(settings, **transactional_overrides(settings, transactional_id, **overrides))


def init_transactions(producer: Producer, timeout_s: float = 30.0) -> None:
    """``producer.init_transactions``, after the producer has connected and read the cluster's
    metadata: called on a brand-new producer, librdkafka 2.16 often asked for its producer id
    before the transaction coordinator's connection was up and then waited for its fixed 500 ms
    retry timer (a probe of 40 fresh producers on a quiet local broker: 9-20 of 40 took
    0.51 s, p50 58-509 ms; with a metadata request first, all 40 took 2-56 ms, p50 6 ms). Half
    a second of every scheduler hand-over that met it (bench/README.md, "The warm standby")."""
    deadline = time.monotonic() + timeout_s
    with contextlib.suppress(KafkaException):  # init_transactions waits and reports on its own
        producer.list_topics(timeout=min(5.0, timeout_s))
    producer.init_transactions(max(1.0, deadline - time.monotonic()))


def transactional_overrides(
    settings: CommonSettings, transactional_id: str, **overrides: Any
) -> dict[str, Any]:
    """What a transactional producer sets on top of :func:`producer`'s configuration."""
    operator = settings.kafka_properties.as_dict()
    backoff = {} if "retry.backoff.ms" in operator else {"retry.backoff.ms": TXN_RETRY_BACKOFF_MS}
    return {
        **backoff,
        "transactional.id": transactional_id,
        # A new owner's init_transactions aborts a dead owner's open transaction at once
        # (transactional ids are per partition), so failover does not wait for this. It
        # only bounds how long an owner that died with nobody to take over blocks
        # read_committed readers, and it must stay far above a busy cycle's transaction,
        # or the broker aborts it and fences the producer.
        "transaction.timeout.ms": 30_000,
        **overrides,
    }


def consumer(settings: CommonSettings, group_id: str, **overrides: Any) -> Consumer:
    """A member of a classic-protocol group, with the range assignor (co-partitioning)."""
    defaults: dict[str, Any] = {
        **_member_conf(settings, group_id),
        # range keeps partition p of every co-partitioned topic on the same member
        "partition.assignment.strategy": "range",
        # detect a dead member fast: failover budget is 5 s (default is 45 s)
        "session.timeout.ms": 3000,
        "heartbeat.interval.ms": 500,
    }
    return _consumer(settings, _layered(settings, defaults, overrides))


def kip848_consumer(settings: CommonSettings, group_id: str, **overrides: Any) -> Consumer:
    """A member of a KIP-848 (``group.protocol=consumer``) group, with the broker's range
    assignor: every topic split evenly, partition p of each topic on one member, incremental
    rebalances. Its session timeout and heartbeat interval are the broker's
    (``group.consumer.*``), so the client may not set them."""
    defaults: dict[str, Any] = {
        **_member_conf(settings, group_id),
        "group.protocol": "consumer",
        "group.remote.assignor": "range",
    }
    return _consumer(settings, _layered(settings, defaults, overrides, _CLASSIC_MEMBER_ONLY))


def set_group_timing(
    settings: CommonSettings, group_id: str, session_timeout_ms: int, heartbeat_interval_ms: int
) -> Exception | None:
    """Give a KIP-848 group its own session timeout and heartbeat interval; None once set.

    Under KIP-848 both are the broker's (``group.consumer.*``: 45 s and 5 s by default), set
    per group with IncrementalAlterConfigs (Kafka 4.0+). What stops it (values outside the
    broker's ``group.consumer.min/max.*``, no ALTER_CONFIGS right on the group, an older
    broker, no answer within 10 s) is returned, not raised: the group keeps the broker's
    values and the role runs on, saying so.
    """
    resource = ConfigResource(
        ResourceType.GROUP,
        group_id,
        incremental_configs=[
            ConfigEntry(name, str(value), incremental_operation=AlterConfigOpType.SET)
            for name, value in (
                ("consumer.session.timeout.ms", session_timeout_ms),
                ("consumer.heartbeat.interval.ms", heartbeat_interval_ms),
            )
        ],
    )
    try:
        client = admin(settings)  # kept referenced: its destruction fails the call
        for future in client.incremental_alter_configs([resource]).values():
            future.result(timeout=10)
    except Exception as exc:  # refused, timed out, or not a KIP-848-capable broker
        return exc
    return None


def _consumer(settings: CommonSettings, conf: dict[str, Any]) -> Consumer:
    try:
        return Consumer(conf)
    except KafkaException as exc:
        raise _refused(settings, "consumer", exc) from None


def _member_conf(settings: CommonSettings, group_id: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": settings.bootstrap_servers,
        "group.id": group_id,
        "client.id": f"duetime-{settings.instance_id}",
        # offsets are committed explicitly, after the work (or inside a transaction)
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        # never see records of aborted or still-open transactions
        "isolation.level": "read_committed",
    }


def admin(settings: CommonSettings) -> AdminClient:
    conf = _layered(settings, {"bootstrap.servers": settings.bootstrap_servers}, {})
    try:
        return AdminClient(conf)
    except KafkaException as exc:
        raise _refused(settings, "admin client", exc) from None


# librdkafka codes that mean "the configuration is wrong", not "the broker is away"
_CREDENTIALS = (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED)
_TLS_ALERT_RE = re.compile(r"ssl/tls alert|SSL alert number|certificate required", re.IGNORECASE)


def check_connection(settings: CommonSettings, timeout_s: float = 10.0) -> None:
    """Return once the brokers answer a metadata request with this configuration.

    Raises ConfigError when they refuse the credentials or the TLS handshake fails (trying
    again will not help: the variables must change), RetryableError when nobody answered
    within ``timeout_s``. The message quotes librdkafka's own reason with every secret
    masked, and names where the security properties were set. A bare metadata timeout
    ("Broker transport failure") hides that reason, so the client's error events are kept.
    """
    seen: list[KafkaError] = []
    conf = _layered(settings, {"bootstrap.servers": settings.bootstrap_servers}, {})
    conf["error_cb"] = seen.append
    try:
        client = AdminClient(conf)
    except KafkaException as exc:
        raise _refused(settings, "admin client", exc) from None
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    # Short metadata requests, serving the error events in between (error_cb runs only in
    # poll): a refused login is reported within a second instead of after the whole timeout.
    while True:
        try:
            client.list_topics(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
            return
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            last = err.str() if isinstance(err, KafkaError) else str(exc)
        client.poll(0)
        refused = [e for e in seen if _refusal(e)]
        if refused:
            raise _login_refused(settings, refused[-1])
        if time.monotonic() >= deadline:
            break
    reason = settings.kafka_properties.redact(seen[-1].str() if seen else last)
    raise RetryableError(
        f"Kafka at {settings.bootstrap_servers} did not answer within {timeout_s:g} s: {reason}",
        details={"variable": "DUETIME_KAFKA_BOOTSTRAP"},
    )


def _refusal(err: KafkaError) -> bool:
    """A refused login or TLS handshake (a broker that is merely away is no refusal)."""
    return err.code() in (*_CREDENTIALS, KafkaError._SSL) or _tls_alert(err)


def _tls_alert(err: KafkaError) -> bool:
    # A broker refusing the client's certificate (or the lack of one) under TLS 1.3 answers
    # with an alert after the handshake: librdkafka reports a transport error quoting it.
    return err.code() == KafkaError._TRANSPORT and bool(_TLS_ALERT_RE.search(err.str()))


def _login_refused(settings: CommonSettings, err: KafkaError) -> ConfigError:
    props = settings.kafka_properties
    tls = err.code() == KafkaError._SSL or _tls_alert(err)
    what = "TLS handshake failed" if tls else "refused the login"
    security = [n for n, _ in props.items if n.startswith(("sasl.", "ssl.", "security."))]
    where = ", ".join(sorted({props.source(n) for n in security})) or "no security property"
    return ConfigError(
        f"Kafka at {settings.bootstrap_servers}: {what}: {props.redact(err.str())} "
        f"(security properties set by: {where})",
        details={"variable": where, "kafka_error": err.name()},
    )


class ErrorClass(enum.Enum):
    RETRIABLE = "retriable"
    ABORT = "abort"  # abort the transaction, rewind, retry
    RECREATE = "recreate"  # unknown outcome (e.g. commit timed out): recreate the producer
    FATAL = "fatal"


def classify(exc: BaseException) -> ErrorClass:
    """How a transactional path must react to ``exc`` (confluent-kafka's transactional API)."""
    if not isinstance(exc, KafkaException) or not exc.args:
        return ErrorClass.FATAL
    err = exc.args[0]
    if not isinstance(err, KafkaError):
        return ErrorClass.FATAL
    if err.fatal():
        return ErrorClass.FATAL
    if err.txn_requires_abort():
        return ErrorClass.ABORT
    if err.code() in (KafkaError._TIMED_OUT, KafkaError._TIMED_OUT_QUEUE):
        return ErrorClass.RECREATE
    if err.retriable():
        return ErrorClass.RETRIABLE
    return ErrorClass.ABORT


def watermarks(
    client: Consumer, topic: str, partition: int, timeout_s: float = 30.0
) -> tuple[int, int]:
    """(low, high) of a partition, retrying while the cluster settles (e.g. a fresh topic
    whose leader the client does not know yet answers NOT_LEADER for a moment)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            low, high = client.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=5, cached=False
            )
            return int(low), int(high)
        except KafkaException as exc:
            if classify(exc) is ErrorClass.FATAL or time.monotonic() > deadline:
                raise
            # A client that only queries a topic (the scheduler's restore reader and its
            # inputs) keeps a dead leader cached: after that broker is lost, the query fails
            # _UNKNOWN_PARTITION until the topic's metadata is asked for again (seen on a
            # three-broker cluster: tests/faults/test_cluster_leader_kill.py).
            with contextlib.suppress(KafkaException):
                client.list_topics(topic, timeout=2)
            time.sleep(0.1)


def new_id() -> str:
    return str(uuid.uuid4())


def read_batch(consumer: Consumer, max_records: int, timeout_s: float) -> list[Message]:
    """Up to ``max_records`` records, returning as soon as one is there.

    ``consume(n, timeout)`` waits for n records or the whole timeout, which under a steady
    trickle is the timeout every time; ``poll`` returns with the first record, and
    ``consume(timeout=0)`` then takes whatever else is already fetched without waiting.
    Error events (partition EOF, ...) are returned as they are: the caller decides.
    """
    first = consumer.poll(timeout_s)
    if first is None:
        return []
    if max_records <= 1:
        return [first]
    return [first, *consumer.consume(max_records - 1, 0)]
