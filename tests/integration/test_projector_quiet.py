"""The projector's quiet partitions against the real broker: paused when idle, fetched again
for every new record (plain or transactional), and not fetched again for a commit marker."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer

from duetime.consumers.projector import metrics
from duetime.consumers.projector.service import Projector
from duetime.consumers.projector.settings import ProjectorSettings
from duetime.core.config import CommonSettings
from duetime.core.topics import Topics
from duetime.producers.sdk import JobClient
from duetime.schemas.codec import Codec
from tests.helpers import wait_for
from tests.integration.test_projector_support import pg_rows

HTTP = {"type": "http", "url": "http://127.0.0.1:9/none"}


@pytest.fixture
def projector(settings: CommonSettings) -> Iterator[Projector]:
    p = Projector(
        ProjectorSettings(common=settings, poll_s=0.05, quiet_after_s=0.5, quiet_probe_s=0.05)
    )
    thread = threading.Thread(target=p.run, daemon=True)
    thread.start()
    wait_for(lambda: len(p.assigned) >= 8 * settings.partitions, 30, "the assignment")
    yield p
    p.stop()
    thread.join(30)
    assert not thread.is_alive()


def all_quiet(p: Projector) -> bool:
    return bool(p.assigned) and p._quiet.paused == p.assigned


def status_of(settings: CommonSettings, job_id: str) -> str | None:
    got = pg_rows(settings, "SELECT status FROM jobs WHERE job_id = %s", job_id)
    return got[0][0] if got else None


def resumes() -> float:
    return float(metrics.QUIET_RESUMES._value.get())


def test_quiet_partitions_are_paused_and_fetched_again_for_new_records(
    settings: CommonSettings, projector: Projector
) -> None:
    wait_for(lambda: all_quiet(projector), 15, "every partition to go quiet")
    before = resumes()
    # a plain (idempotent) record in a paused partition
    with JobClient(settings=settings) as client:
        plain = client.create_job(name="plain", schedule={"cron": "0 3 * * *"}, target=HTTP)
    wait_for(lambda: status_of(settings, plain.job_id) == "pending", 15, "the plain record")
    assert resumes() > before

    # a transactional one: the partition ends with a commit marker, past the last record
    with JobClient(settings=settings) as client:
        definition = client.build(name="txn", schedule={"cron": "0 3 * * *"}, target=HTTP)
    producer = Producer(
        {"bootstrap.servers": settings.bootstrap_servers, "transactional.id": "quiet-test"}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(
        Topics(settings.topic_prefix).jobs,
        key=definition.job_id,
        value=Codec().dump(definition),
        partition=0,
    )
    producer.commit_transaction(30)
    wait_for(lambda: status_of(settings, definition.job_id) == "pending", 15, "the txn record")

    # quiet again, and the marker does not wake the partition up probe after probe
    wait_for(lambda: all_quiet(projector), 15, "every partition to go quiet again")
    settled = resumes()
    time.sleep(1.5)  # ~30 probes, each longer than quiet_after_s apart from a resume
    assert resumes() == settled
    assert all_quiet(projector)


def test_quiet_partitions_off_fetches_every_partition(settings: CommonSettings) -> None:
    p = Projector(ProjectorSettings(common=settings, poll_s=0.05, quiet_after_s=0))
    thread = threading.Thread(target=p.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(p.assigned) >= 8 * settings.partitions, 30, "the assignment")
        time.sleep(0.5)
        assert not p._quiet.paused
        with JobClient(settings=settings) as client:
            job = client.create_job(name="j", schedule={"cron": "0 3 * * *"}, target=HTTP)
        wait_for(lambda: status_of(settings, job.job_id) == "pending", 15, "the record")
    finally:
        p.stop()
        thread.join(30)
