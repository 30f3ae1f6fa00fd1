"""``duetime topics create``: create every topic with its configuration, idempotently.

An existing topic is accepted when its partition count matches; a different count stops the
command with an error naming the topic, because co-partitioning would silently break.
"""

from __future__ import annotations

import logging

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from duetime.core import kafka
from duetime.core.config import CommonSettings
from duetime.core.errors import ConfigError
from duetime.core.topics import TopicSpec

log = logging.getLogger("duetime.infra.topics")


def create_topics(
    bootstrap_servers: str | CommonSettings,
    specs: list[TopicSpec],
    replication_factor: int = 1,
    timeout_s: float = 30,
) -> list[str]:
    """Create the missing topics; returns the names created. Raises ConfigError on a mismatch.

    ``bootstrap_servers``: the servers, or a role's settings, whose Kafka client properties
    (TLS, SASL: docs/kafka-security.md) then apply too.
    """
    if isinstance(bootstrap_servers, CommonSettings):
        admin = kafka.admin(bootstrap_servers)
    else:
        admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    metadata = admin.list_topics(timeout=timeout_s)
    existing = metadata.topics
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
        [NewTopic(s.name, s.partitions, replication_factor, config=s.config) for s in missing],
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
