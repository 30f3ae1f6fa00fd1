"""The projector's gathering against the real broker and database: under a stream of records
a batch is written at most every ``gather_s``; a backlog (full batches) is read at once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from confluent_kafka import Producer
from prometheus_client import REGISTRY

from duetime.consumers.projector.settings import ProjectorSettings
from duetime.core.config import CommonSettings
from duetime.core.topics import Topics
from duetime.producers.sdk import JobClient
from duetime.schemas.codec import Codec
from tests.helpers import wait_for
from tests.integration.test_projector_support import RunningProjector, pg_rows

HTTP = {"type": "http", "url": "http://127.0.0.1:9/none"}


@contextmanager
def projecting(settings: ProjectorSettings) -> Iterator[RunningProjector]:
    running = RunningProjector(settings.common, projector_settings=settings)
    try:
        yield running
    finally:
        running.stop()


def definitions(settings: CommonSettings, n: int) -> list[tuple[str, bytes]]:
    codec = Codec()
    with JobClient(settings=settings) as client:
        built = [
            client.build(name=f"g{i}", schedule={"cron": "0 3 * * *"}, target=HTTP)
            for i in range(n)
        ]
    return [(d.job_id, codec.dump(d)) for d in built]


def jobs_projected(settings: CommonSettings) -> int:
    (row,) = pg_rows(settings, "SELECT count(*) FROM jobs")
    return int(row[0])


def batches() -> float:
    value = REGISTRY.get_sample_value("duetime_projector_batches_total")
    return 0.0 if value is None else value


def test_a_stream_of_records_is_written_in_gathered_batches(settings: CommonSettings) -> None:
    records = definitions(settings, 40)
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers, "linger.ms": 0})
    jobs = Topics(settings.topic_prefix).jobs
    gathered = ProjectorSettings(common=settings, poll_s=0.05, gather_s=0.4)
    with projecting(gathered):
        first_id, first = records[0]
        producer.produce(jobs, key=first_id, value=first)
        producer.flush(10)
        wait_for(lambda: jobs_projected(settings) == 1, 30, "the first record")
        before = batches()
        for job_id, value in records[1:]:  # ~1 s of records, one every 25 ms
            producer.produce(jobs, key=job_id, value=value)
            producer.flush(10)
            time.sleep(0.025)
        wait_for(lambda: jobs_projected(settings) == 40, 30, "every record")
    # one batch per fetch would be ~39; gathered for 0.4 s, a handful
    assert batches() - before <= 6, batches() - before


def test_a_backlog_is_read_without_gathering(settings: CommonSettings) -> None:
    records = definitions(settings, 60)
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    jobs = Topics(settings.topic_prefix).jobs
    for job_id, value in records:
        producer.produce(jobs, key=job_id, value=value)
    producer.flush(10)
    # full batches of 10 are a backlog: six of them must not wait 5 s apart (25 s)
    slow = ProjectorSettings(common=settings, poll_s=0.05, gather_s=5.0, batch_size=10)
    with projecting(slow):
        wait_for(lambda: jobs_projected(settings) == 60, 15, "the backlog")
