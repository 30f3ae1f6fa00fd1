"""The foundation against the real broker and database: topics, migrations, Avro over Kafka."""

from __future__ import annotations

import uuid
from dataclasses import replace

import psycopg
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from duetime.core.config import CommonSettings
from duetime.core.errors import ConfigError
from duetime.core.jobspec import build_job
from duetime.core.records import JobDefinition
from duetime.core.topics import Topics
from duetime.infra.migrate import migrate
from duetime.infra.topics import create_topics
from duetime.schemas.codec import Codec
from tests.helpers import wait_for


def test_topics_create_is_idempotent_and_refuses_a_partition_mismatch(
    settings: CommonSettings,
) -> None:
    specs = Topics(settings.topic_prefix).specs(settings.partitions)
    assert create_topics(settings.bootstrap_servers, specs) == []  # the fixture made them
    wrong = Topics(settings.topic_prefix).specs(settings.partitions + 1)
    with pytest.raises(ConfigError) as info:
        create_topics(settings.bootstrap_servers, wrong)
    assert "DUETIME_PARTITIONS" in info.value.details["variable"]
    assert settings.topic_prefix + "jobs" in info.value.message


def test_compacted_topics_are_compacted(settings: CommonSettings) -> None:
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    topics = Topics(settings.topic_prefix)
    resources = [ConfigResource("topic", t) for t in (topics.jobs, topics.state, topics.results)]
    configs = {r.name: f.result() for r, f in admin.describe_configs(resources).items()}
    assert configs[topics.jobs]["cleanup.policy"].value == "compact"
    assert configs[topics.state]["cleanup.policy"].value == "compact"
    assert configs[topics.results]["cleanup.policy"].value == "delete"
    # the changelog rolls small segments, so compaction reaches all but the newest 64 MiB
    assert int(configs[topics.state]["segment.bytes"].value) == 64 * 2**20
    assert int(configs[topics.state]["segment.ms"].value) == 3600 * 1000
    assert int(configs[topics.jobs]["segment.bytes"].value) != 64 * 2**20  # the broker's default


def test_migrations_are_idempotent_and_tables_work(database_url: str) -> None:
    assert migrate(database_url) == []  # the template was migrated already
    with psycopg.connect(database_url) as conn:
        made = conn.execute(
            "SELECT duetime_ensure_execution_partitions(current_date, 3)"
        ).fetchone()
        assert made is not None and made[0] == 3
        execution_id = uuid.uuid4()
        conn.execute(
            "INSERT INTO executions (execution_id, scheduled_at, job_id, priority, status, attempt)"
            " VALUES (%s, now(), %s, 'normal', 'queued', 1)",
            (execution_id, uuid.uuid4()),
        )
        row = conn.execute(
            "SELECT tableoid::regclass::text FROM executions WHERE execution_id = %s",
            (execution_id,),
        ).fetchone()
        assert row is not None and row[0].startswith("executions_2")  # a daily partition


def test_transactional_avro_events_are_read_committed(settings: CommonSettings) -> None:
    topics = Topics(settings.topic_prefix)
    codec = Codec()
    job = build_job(
        {
            "name": "t",
            "schedule": {"cron": "0 2 * * *", "timezone": "Europe/Berlin"},
            "target": {"type": "http", "url": "http://127.0.0.1:9/x"},
        },
        now_ms=1_700_000_000_000,
    )
    producer = Producer(
        {"bootstrap.servers": settings.bootstrap_servers, "transactional.id": f"t-{uuid.uuid4()}"}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topics.jobs, key=job.job_id, value=codec.dump(replace(job, name="aborted")))
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topics.jobs, key=job.job_id, value=codec.dump(job))
    producer.commit_transaction(30)

    consumer = Consumer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": f"t-{uuid.uuid4()}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
    )
    md = consumer.list_topics(topics.jobs, timeout=10)
    consumer.assign([TopicPartition(topics.jobs, p, 0) for p in md.topics[topics.jobs].partitions])
    seen: list[JobDefinition] = []

    def read() -> bool:
        for msg in consumer.consume(10, 0.2):
            if not msg.error():
                seen.append(codec.load(JobDefinition, msg.value() or b"", topic=msg.topic()))
        return bool(seen)

    wait_for(read, 20, "the committed job event")
    consumer.consume(10, 1.0)  # nothing else arrives: the aborted record stays invisible
    consumer.close()
    assert [r.name for r in seen] == ["t"]
    assert seen[0] == job
