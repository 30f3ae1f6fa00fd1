"""``duetime topics create``: create every topic with its configuration, idempotently.

An existing topic is accepted when its partition count matches; a different count stops the
command with an error naming the topic, because co-partitioning would silently break.

Replication: without an explicit factor (``DUETIME_REPLICATION_FACTOR`` unset) topics get
min(3, brokers in the cluster) replicas: 1 on the single local broker as before, 3 on
``infra up --brokers 3``. A factor above the broker count is refused, naming the variable.
Every replicated topic carries its own ``min.insync.replicas`` (a majority of its replicas:
2 of 3), set per topic rather than left to the broker default because the guarantee
belongs to the topic: on a platform cluster whose default is 1, an ``acks=all`` write would
otherwise be acknowledged by one replica and lost with it.
"""

from __future__ import annotations

import logging

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from duetime.core import kafka
from duetime.core.config import CommonSettings, Env
from duetime.core.errors import ConfigError
from duetime.core.topics import TopicSpec

log = logging.getLogger("duetime.infra.topics")


MAX_DEFAULT_REPLICAS = 3


def min_insync_replicas(replication_factor: int) -> int:
    """A majority of the replicas (1 of 1, 2 of 3, 3 of 5): an acknowledged write survives
    the loss of any minority, and writes go on while a minority is down."""
    if replication_factor < 1:
        raise ValueError(f"replication factor {replication_factor} must be at least 1")
    return replication_factor // 2 + 1


def cluster_replication(brokers: int) -> tuple[int, int]:
    """(replication factor, min.insync.replicas) for topics on ``brokers`` brokers."""
    if brokers < 1:
        raise ValueError(f"a cluster has at least one broker, not {brokers}")
    replicas = min(MAX_DEFAULT_REPLICAS, brokers)
    return replicas, min_insync_replicas(replicas)


def topic_config(config: dict[str, str], replication_factor: int) -> dict[str, str]:
    """A topic's configuration with ``min.insync.replicas`` for its replication factor (a
    spec that sets its own keeps it; an unreplicated topic is left to the broker)."""
    if replication_factor <= 1 or "min.insync.replicas" in config:
        return dict(config)
    return {**config, "min.insync.replicas": str(min_insync_replicas(replication_factor))}


def replication_for(requested: int | None, brokers: int) -> int:
    """The factor to create topics with: ``requested``, or min(3, brokers) when None.
    Raises ConfigError naming DUETIME_REPLICATION_FACTOR when the cluster is too small."""
    if requested is None:
        return cluster_replication(brokers)[0]
    if requested < 1 or requested > brokers:
        raise ConfigError(
            f"DUETIME_REPLICATION_FACTOR={requested} but the cluster has {brokers} "
            f"broker{'s' if brokers != 1 else ''}: a topic cannot have more replicas than "
            "brokers",
            details={"variable": "DUETIME_REPLICATION_FACTOR", "brokers": brokers},
        )
    return requested


def requested_replication(env: Env, common: CommonSettings) -> int | None:
    """``DUETIME_REPLICATION_FACTOR`` when it is set (validated by CommonSettings), else None:
    the cluster's own size decides."""
    return common.replication_factor if env.raw("DUETIME_REPLICATION_FACTOR") else None


def create_topics(
    bootstrap_servers: str | CommonSettings,
    specs: list[TopicSpec],
    replication_factor: int | None = None,
    timeout_s: float = 30,
) -> list[str]:
    """Create the missing topics; returns the names created. Raises ConfigError on a mismatch.

    ``bootstrap_servers``: the servers, or a role's settings, whose Kafka client properties
    (TLS, SASL: docs/kafka-security.md) then apply too. ``replication_factor``: None is
    min(3, brokers) (see the module docstring).
    """
    if isinstance(bootstrap_servers, CommonSettings):
        admin = kafka.admin(bootstrap_servers)
    else:
        admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    metadata = admin.list_topics(timeout=timeout_s)
    existing = metadata.topics
    replicas = replication_for(replication_factor, len(metadata.brokers))
    mismatched = [
        f"{s.name} has {len(existing[s.name].partitions)} partitions, configured {s.partitions}"
        for s in specs
        if s.name in existing and len(existing[s.name].partitions) != s.partitions
    ]
    if mismatched:
        raise ConfigError(
            "existing topics do not match DUETIME_PARTITIONS: "
            + "; ".join(mismatched)
            + " (all job-keyed topics must share one partition count)",
            details={"variable": "DUETIME_PARTITIONS", "topics": mismatched},
        )
    missing = [s for s in specs if s.name not in existing]
    if not missing:
        return []
    futures = admin.create_topics(
        [
            NewTopic(s.name, s.partitions, replicas, config=topic_config(s.config, replicas))
            for s in missing
        ],
        operation_timeout=timeout_s,
        request_timeout=timeout_s,
    )
    created = []
    for name, future in futures.items():
        try:
            future.result()
            created.append(name)
            log.info("created topic", extra={"topic": name})
        except KafkaException as exc:
            if exc.args and exc.args[0].code() == 36:  # TOPIC_ALREADY_EXISTS: a racing creator
                continue
            raise
    _wait_for_leaders(admin, [s.name for s in missing], timeout_s)
    return sorted(created)


def _wait_for_leaders(admin: AdminClient, names: list[str], timeout_s: float) -> None:
    """A new topic answers produce requests only once every partition has a leader."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        md = admin.list_topics(timeout=timeout_s)
        ready = all(
            n in md.topics
            and md.topics[n].partitions
            and all(p.leader >= 0 for p in md.topics[n].partitions.values())
            for n in names
        )
        if ready:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"topics {names} have no leader after {timeout_s}s")
        time.sleep(0.1)
