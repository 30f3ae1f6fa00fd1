"""Group commit of single creates (``producers/api/group.py``) against the real broker and
database: creates of the same few milliseconds share one transaction, and each request keeps
its own answer: 201 for a new job, 200 for an existing same job, 409 for another body, 503 for
the new ones of a group whose Kafka write failed (nothing written), and a value PostgreSQL
refuses fails only its own create."""

from __future__ import annotations

import asyncio
import re
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import httpx
import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition
from psycopg_pool import AsyncConnectionPool

from duetime.core.config import CommonSettings
from duetime.core.topics import Topics
from duetime.infra.process import free_port
from duetime.producers.api.group import Created, CreateGroups
from duetime.producers.api.writer import Writer
from duetime.producers.sdk import JobClient
from tests.integration.test_api import assert_error, job_body
from tests.integration.test_api_batch import rows
from tests.integration.test_api_support import RunningApi, settle

WAIT_MS = 400.0
"""Long enough that requests sent together from threads certainly join one group."""


def group_sizes(c: httpx.Client) -> tuple[float, float]:
    """(groups written, creates in them) from the API's /metrics."""
    text = c.get("/metrics").text

    def value(name: str) -> float:
        match = re.search(rf"^{name} ([0-9.e+]+)$", text, re.MULTILINE)
        return float(match.group(1)) if match else 0.0

    return (
        value("duetime_api_create_group_size_count"),
        value("duetime_api_create_group_size_sum"),
    )


def post_all(c: httpx.Client, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(lambda b: c.post("/v1/jobs", json=b), bodies))


def jobs_topic_keys(settings: CommonSettings, wanted: set[str]) -> dict[str, int]:
    """How many records the jobs topic holds per key, for the keys in ``wanted``."""
    topic = Topics(settings.topic_prefix).jobs
    consumer = Consumer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": f"test-{uuid.uuid4()}",
            "enable.auto.commit": False,
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in partitions}  # fmt: skip
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        counts: dict[str, int] = {}
        done: set[int] = {p for p, end in ends.items() if end == 0}
        while len(done) < len(partitions):
            msg = consumer.poll(5)
            assert msg is not None, "the jobs topic was not read to its end within 5 s"
            if msg.error() is not None:
                continue
            key = (msg.key() or b"").decode()
            if key in wanted:
                counts[key] = counts.get(key, 0) + 1
            partition, offset = msg.partition(), msg.offset()
            assert partition is not None and offset is not None  # a record has both
            if offset + 1 >= ends[partition]:
                done.add(partition)
        return counts
    finally:
        consumer.close()


def test_creates_at_once_share_a_group_and_each_gets_its_own_answer(
    settings: CommonSettings,
) -> None:
    api = RunningApi(settings, group_wait_ms=WAIT_MS, group_max_jobs=64)
    try:
        with api.client() as c:
            existing = job_body(job_id=str(uuid.uuid4()), name="existing")
            assert c.post("/v1/jobs", json=existing).status_code == 201
            groups_before, creates_before = group_sizes(c)
            fresh = [job_body(job_id=str(uuid.uuid4()), name=f"new-{i}") for i in range(8)]
            twice = job_body(job_id=str(uuid.uuid4()), name="twice")
            other = {**existing, "name": "another body"}
            answers = post_all(c, [*fresh, existing, other, twice, twice])
            groups_after, creates_after = group_sizes(c)
            metrics = c.get("/metrics").text
        for stage in ("queued", "insert", "kafka", "commit"):  # where the latency went
            assert f'duetime_api_create_group_stage_seconds_count{{stage="{stage}"}}' in metrics
        for body, answer in zip(fresh, answers[:8], strict=True):
            assert answer.status_code == 201, answer.text
            assert answer.json() == {"job_id": body["job_id"], "status": "pending",
                                     "next_run_at": answer.json()["next_run_at"]}  # fmt: skip
        assert answers[8].status_code == 200 and answers[8].json()["job_id"] == existing["job_id"]
        conflict = assert_error(answers[9], 409, "conflict")
        assert conflict["details"] == {"job_id": existing["job_id"]}
        # one job id twice: never in one group; the later one finds the first one's row
        assert sorted(a.status_code for a in answers[10:]) == [200, 201]
        assert creates_after - creates_before == 12
        assert groups_after - groups_before < 12, "no two creates shared a group"
        new_ids = {b["job_id"] for b in fresh} | {twice["job_id"]}
        assert rows(settings, sorted(new_ids)) == new_ids
        settle()
        published = jobs_topic_keys(settings, new_ids | {existing["job_id"]})
        assert published == {job_id: 1 for job_id in new_ids | {existing["job_id"]}}
    finally:
        api.stop()


def test_a_kafka_failure_answers_503_to_the_new_creates_of_the_group_and_writes_nothing(
    settings: CommonSettings,
) -> None:
    healthy = RunningApi(settings)
    try:
        with healthy.client() as c:
            existing = job_body(job_id=str(uuid.uuid4()), name="existing")
            assert c.post("/v1/jobs", json=existing).status_code == 201
    finally:
        healthy.stop()
    gone = replace(settings, bootstrap_servers=f"127.0.0.1:{free_port()}")
    api = RunningApi(gone, group_wait_ms=WAIT_MS, publish_timeout_s=2.0)
    fresh = [job_body(job_id=str(uuid.uuid4()), name=f"new-{i}") for i in range(5)]
    try:
        with api.client() as c:
            answers = post_all(c, [*fresh, existing])
    finally:
        api.stop()
    for answer in answers[:5]:
        assert_error(answer, 503, "unavailable")
    # the existing job's answer needs no Kafka write: it stands
    assert answers[5].status_code == 200, answers[5].text
    assert rows(settings, [b["job_id"] for b in fresh]) == set()
    again = RunningApi(settings, group_wait_ms=WAIT_MS)
    try:
        with again.client() as c:  # each client retries with its job id
            assert [a.status_code for a in post_all(c, fresh)] == [201] * 5
    finally:
        again.stop()


def test_a_value_postgresql_refuses_fails_its_own_create_only(settings: CommonSettings) -> None:
    async def run() -> list[Created | BaseException]:
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            settings.database_url, min_size=1, max_size=4, kwargs={"autocommit": True}, open=False
        )
        await pool.open(wait=True)
        client = JobClient(settings=settings)
        writer = Writer(client, 10.0)
        groups = CreateGroups(pool, writer, client, max_jobs=16, wait_s=0.2)
        try:
            good = [client.build(job_body(name=f"good-{i}")) for i in range(3)]
            # past validation only by building the record by hand: PostgreSQL text cannot
            # hold NUL, so its insert fails, and with it the group's first transaction
            bad = replace(client.build(job_body(name="bad")), name="bad\x00name")
            return list(
                await asyncio.gather(
                    *(groups.create(d, None) for d in [*good, bad]), return_exceptions=True
                )
            )
        finally:
            await groups.close(10.0)
            writer.close()
            await pool.close()

    *good, bad = asyncio.run(run())
    assert isinstance(bad, psycopg.DataError)
    assert all(isinstance(g, Created) and g.new for g in good), good
    ids = [g.job_id for g in good if isinstance(g, Created)]
    assert rows(settings, ids) == set(ids)


@pytest.mark.parametrize("max_jobs", [1, 3])
def test_groups_never_exceed_their_bound_and_grouping_can_be_off(
    settings: CommonSettings, max_jobs: int
) -> None:
    api = RunningApi(settings, group_wait_ms=WAIT_MS, group_max_jobs=max_jobs)
    try:
        with api.client() as c:
            before = group_sizes(c)
            bodies = [job_body(job_id=str(uuid.uuid4()), name=f"n-{i}") for i in range(7)]
            assert [a.status_code for a in post_all(c, bodies)] == [201] * 7
            after = group_sizes(c)
    finally:
        api.stop()
    groups, creates = after[0] - before[0], after[1] - before[1]
    if max_jobs == 1:
        assert (groups, creates) == (0, 0)  # off: every create takes the single path
    else:
        assert creates == 7 and groups >= 3  # 7 creates, at most 3 a group
    with psycopg.connect(settings.database_url) as conn:
        count = conn.execute(
            "SELECT count(*) FROM jobs WHERE job_id = ANY(%s::uuid[])",
            ([b["job_id"] for b in bodies],),
        ).fetchone()
    assert count is not None and count[0] == 7
