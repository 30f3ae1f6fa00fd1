"""The projector against the real broker and database: rows, ordering, rebuild, retention."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta

import psycopg
import pytest
from confluent_kafka import Producer

from duetime.consumers.projector.store import ProjectionStore, checksums
from duetime.core.config import CommonSettings
from duetime.core.jobspec import build_job
from duetime.core.models import Status
from duetime.core.state_head import HEAD_HEADER, encode_head
from duetime.core.topics import Topics
from duetime.producers.sdk import JobClient
from duetime.schedulers import logic
from duetime.schedulers.settings import SchedulerSettings
from duetime.schemas.codec import Codec
from tests.helpers import RunningScheduler, TopicReader, committed_offsets, wait_for
from tests.integration.test_projector_support import (
    RunningProjector,
    SimWorker,
    pg_rows,
    project_all,
)

HTTP = {"type": "http", "url": "http://127.0.0.1:9/none"}


@pytest.fixture
def scheduler(settings: CommonSettings) -> Iterator[RunningScheduler]:
    running = RunningScheduler(SchedulerSettings(common=settings, misfire_threshold_s=1.0))
    wait_for(lambda: running.owned() == settings.partitions, 30, "the scheduler to own partitions")
    yield running
    running.stop()


@pytest.fixture
def worker(settings: CommonSettings) -> Iterator[SimWorker]:
    w = SimWorker(settings)
    yield w
    w.close()


def iso(dt: datetime) -> str:
    return dt.isoformat().replace("+00:00", "Z")


def status_of(settings: CommonSettings, job_id: str) -> str | None:
    got = pg_rows(settings, "SELECT status FROM jobs WHERE job_id = %s", job_id)
    return got[0][0] if got else None


def scheduler_knows(settings: CommonSettings, job_id: str) -> bool:
    got = pg_rows(settings, "SELECT state_offset FROM jobs WHERE job_id = %s", job_id)
    return bool(got) and got[0][0] >= 0


def test_projection_follows_jobs_executions_and_dead_letters_then_rebuilds_identically(
    settings: CommonSettings, scheduler: RunningScheduler, worker: SimWorker
) -> None:
    projector = RunningProjector(settings)
    try:
        with JobClient(settings=settings) as client:
            ok = client.create_job(
                name="ok", schedule={"at": iso(datetime.now(UTC))}, target=HTTP, payload={"a": 1}
            )
            fail = client.create_job(
                name="fail-always",
                schedule={"at": iso(datetime.now(UTC))},
                target=HTTP,
                retry={"max_retries": 1, "base_delay_s": 0.1, "jitter": False},
            )
            later = client.create_job(name="later", schedule={"cron": "0 3 * * *"}, target=HTTP)
            paused = client.create_job(name="paused", schedule={"cron": "0 3 * * *"}, target=HTTP)
            # the scheduler must know the job before a command about it (it drops the others)
            wait_for(lambda: scheduler_knows(settings, paused.job_id), 30, "the job's state")
            client.pause(paused.job_id)
        wait_for(lambda: status_of(settings, ok.job_id) == "success", 30, "ok to succeed")
        wait_for(lambda: status_of(settings, fail.job_id) == "dead", 30, "fail to go dead")
        wait_for(lambda: status_of(settings, paused.job_id) == "paused", 30, "paused job")
        assert status_of(settings, later.job_id) == "pending"

        (row,) = pg_rows(
            settings,
            "SELECT status, attempt, trigger, worker_id, queued_at, started_at, finished_at, "
            "lateness_ms, priority, name FROM executions WHERE job_id = %s",
            ok.job_id,
        )
        status, attempt, trigger, worker_id, queued, started, finished, lateness, prio, name = row
        assert (status, attempt, trigger, worker_id, prio, name) == (
            "success",
            1,
            "schedule",
            "sim-worker",
            "normal",
            "ok",
        )
        assert queued <= started <= finished and lateness is not None and lateness >= 0
        (attempts,) = pg_rows(
            settings, "SELECT attempts FROM executions WHERE job_id = %s", ok.job_id
        )[0]
        # the columns hold the instants of the attempt's history, to the millisecond
        times = [datetime.fromisoformat(attempts[-1][k]) for k in ("queued_at", "started_at")]
        assert [queued, started] == times
        assert finished == datetime.fromisoformat(attempts[-1]["finished_at"])
        (dead_row,) = pg_rows(
            settings,
            "SELECT status, attempt, attempts, error FROM executions WHERE job_id = %s",
            fail.job_id,
        )
        assert dead_row[0] == "dead" and dead_row[1] == 2
        assert [a["status"] for a in dead_row[2]] == ["failed", "dead"]
        assert dead_row[3]["type"] == "SimulatedError"
        (dl,) = pg_rows(
            settings, "SELECT attempts, name FROM dead_letters WHERE job_id = %s", fail.job_id
        )
        assert dl == (2, "fail-always")
        (last,) = pg_rows(
            settings, "SELECT last_execution_id IS NOT NULL FROM jobs WHERE job_id = %s", ok.job_id
        )
        assert last == (True,)
        projector.caught_up()
    finally:
        projector.stop()
    scheduler.stop()
    worker.close()

    with psycopg.connect(settings.database_url) as conn:
        live = checksums(conn)
    assert live["jobs"][0] == 4 and live["executions"][0] == 2 and live["dead_letters"][0] == 1
    project_all(settings, rebuild=True)
    with psycopg.connect(settings.database_url) as conn:
        rebuilt = checksums(conn)
    assert rebuilt == live


def test_status_never_moves_backwards_and_replays_are_idempotent(
    settings: CommonSettings,
) -> None:
    """States arrive, then an older definition and a duplicate of every record: nothing moves."""
    topics, codec = Topics(settings.topic_prefix), Codec()
    with JobClient(settings=settings) as client:
        definition = client.build(name="x", schedule={"cron": "0 3 * * *"}, target=HTTP)
    job_id = definition.job_id
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})

    def state(status: str, at_ms: int) -> bytes:
        return codec.encode(
            "state",
            {
                "job_id": job_id,
                "definition": definition.to_avro(),
                "status": status,
                "next_run_at_ms": None,
                "last_scheduled_at_ms": None,
                "paused_at_ms": None,
                "inflight": [],
                "queued_occurrence_ms": None,
                "fired_count": 0,
                "updated_at_ms": at_ms,
                "dag_runs": {},
            },
        )

    producer.produce(topics.state, key=job_id, value=state("queued", 1000), partition=0)
    # a state with an *older* clock but a later offset is still the newer one
    producer.produce(topics.state, key=job_id, value=state("paused", 500), partition=0)
    producer.flush(10)
    project_all(settings)
    assert status_of(settings, job_id) == "paused"
    # the definition (status pending) arrives late: the status stays
    producer.produce(topics.jobs, key=job_id, value=codec.dump(definition), partition=0)
    producer.flush(10)
    project_all(settings)
    assert status_of(settings, job_id) == "paused"
    # a projector that forgot its offsets re-reads everything: same tables
    with psycopg.connect(settings.database_url) as conn:
        before = checksums(conn)
        conn.execute("DELETE FROM projector_offsets")
    project_all(settings)
    with psycopg.connect(settings.database_url) as conn:
        assert checksums(conn) == before
        offsets = conn.execute("SELECT count(*) FROM projector_offsets").fetchone()
    assert offsets is not None and offsets[0] >= 2


def test_partitions_are_made_ahead_and_dropped_after_retention(settings: CommonSettings) -> None:
    store = ProjectionStore(settings.database_url, "test", retention_days=30)
    now = datetime(2026, 3, 10, 12, tzinfo=UTC)
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        conn.execute("SELECT duetime_ensure_execution_partitions(%s, 3)", (date(2026, 2, 1),))
        # an execution of an old occurrence that ran recently is kept; a long-finished one not
        for execution_id, finished in (
            ("00000000-0000-0000-0000-000000000001", now - timedelta(days=1)),
            ("00000000-0000-0000-0000-000000000002", now - timedelta(days=40)),
        ):
            conn.execute(
                "INSERT INTO executions (execution_id, scheduled_at, job_id, priority, status, "
                "attempt, finished_at) VALUES (%s, '2025-01-01', %s, 'normal', 'success', 1, %s)",
                (execution_id, execution_id, finished),
            )
    done = store.housekeeping(now)
    assert done["created"] == 3 and done["dropped"] == 3 and done["deleted_executions"] == 1
    names = {
        r[0]
        for r in pg_rows(
            settings,
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'executions'::regclass",
        )
    }
    assert names == {
        "executions_default",
        "executions_20260310",
        "executions_20260311",
        "executions_20260312",
    }
    kept = pg_rows(settings, "SELECT execution_id::text FROM executions")
    assert kept == [("00000000-0000-0000-0000-000000000001",)]
    assert json.dumps(store.housekeeping(now)) == json.dumps(
        {"created": 0, "dropped": 0, "deleted_executions": 0, "deleted_dead_letters": 0}
    )


def test_two_projectors_share_and_hand_over_partitions_without_a_difference(
    settings: CommonSettings,
) -> None:
    """Partitions move between projectors while events flow; the tables equal a rebuild."""
    with JobClient(settings=settings) as client:
        first = RunningProjector(settings)
        for i in range(150):
            client.create_job(
                name=f"a-{i}", schedule={"cron": "0 3 * * *"}, target=HTTP, wait=False
            )
        client.flush()
        second = RunningProjector(settings)  # joins: the group rebalances
        for i in range(150):
            client.create_job(
                name=f"b-{i}", schedule={"cron": "0 3 * * *"}, target=HTTP, wait=False
            )
        client.flush()
        wait_for(lambda: second.projector.assigned, 30, "the second projector's share")
        first.stop()  # leaves: its partitions move to the second
        for i in range(150):
            client.create_job(
                name=f"c-{i}", schedule={"cron": "0 3 * * *"}, target=HTTP, wait=False
            )
        client.flush()
        second.caught_up()
        second.stop()
    with psycopg.connect(settings.database_url) as conn:
        live = checksums(conn)
    assert live["jobs"][0] == 450
    project_all(settings, rebuild=True)
    with psycopg.connect(settings.database_url) as conn:
        assert checksums(conn) == live


def test_kafka_offsets_reach_the_projected_ones_once_idle(
    settings: CommonSettings, scheduler: RunningScheduler, worker: SimWorker
) -> None:
    """The projector commits its (informational) Kafka offsets at most once a second; the
    last batch's offsets must still reach Kafka when nothing follows it, or lag tools would
    show a lag that never drains."""
    projector = RunningProjector(settings)
    try:
        with JobClient(settings=settings) as client:
            job = client.create_job(
                name="lag", schedule={"at": iso(datetime.now(UTC))}, target=HTTP
            )
        wait_for(lambda: status_of(settings, job.job_id) == "success", 30, "the job to succeed")
        projector.caught_up()
        stored = {
            (t, p): o
            for t, p, o in pg_rows(
                settings,
                "SELECT topic, partition, next_offset FROM projector_offsets WHERE consumer = %s",
                projector.projector.settings.group_id,
            )
        }
        assert stored

        group = projector.projector.settings.group_id
        wait_for(
            lambda: committed_offsets(settings.bootstrap_servers, group, stored) == stored,
            10,
            "Kafka's offsets to reach PostgreSQL's",
        )
    finally:
        projector.stop()


def test_an_unwatched_projector_does_not_check_whether_it_is_caught_up(
    settings: CommonSettings,
) -> None:
    """A caught-up check names every partition in a ListOffsets request; only a run until
    caught up or a caller watching ``idle`` needs one, so a service's idle loop sends none."""
    running = RunningProjector(settings, watch_idle=False)
    projector = running.projector
    try:
        expected = len(projector._types) * settings.partitions
        wait_for(lambda: len(projector.assigned) == expected, 30, "every partition assigned")
        time.sleep(1.5)  # an idle loop checked every 0.2 s before
        assert not projector.idle.is_set()  # caught up (the topics are empty): not asked
    finally:
        running.stop()


def test_a_command_held_for_a_job_not_yet_known_is_not_parked(
    settings: CommonSettings, scheduler: RunningScheduler
) -> None:
    """A command that overtakes its job is held by the scheduler in the state changelog
    (key ``held/...``, a ControlCommand as value): scheduler bookkeeping, not a state the
    projector failed to decode. It is skipped, not copied to the poison topic."""
    topics = Topics(settings.topic_prefix)
    state = TopicReader(settings, [topics.state], None)
    poison = TopicReader(settings, [topics.poison], None)
    projector = RunningProjector(settings)
    try:
        with JobClient(settings=settings) as client:
            client.cancel(str(uuid.uuid4()))  # a job id nobody created (yet)
            wait_for(
                lambda: any((m.key() or b"").startswith(b"held/") for m in state.raw),
                30,
                "the scheduler to hold the command in its changelog",
            )
            job = client.create_job(
                name="after", schedule={"at": iso(datetime.now(UTC))}, target=HTTP
            )
        wait_for(lambda: status_of(settings, job.job_id) is not None, 30, "the job's row")
        projector.caught_up()
        assert poison.raw == []
    finally:
        projector.stop()
        state.close()
        poison.close()


def test_state_heads_come_from_their_header_or_else_from_their_value(
    settings: CommonSettings,
) -> None:
    """A scheduler writes each state's head in a header (``duetime.core.state_head``) so the
    projector need not read past the embedded definition. A state without the header (an
    earlier build's) or with one that does not parse is read from its value; with a header
    that parses, the value is not read for the status columns at all."""
    topics = Topics(settings.topic_prefix)
    codec = Codec(registry_url=settings.schema_registry_url)
    now_ms = int(time.time() * 1000)
    body = {"schedule": {"at": "2100-01-01T00:00:00Z"}, "target": HTTP}
    cases = ("header", "bad-header", "no-header", "header-only")
    definitions = {c: build_job({**body, "name": c}, now_ms=now_ms) for c in cases}
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    for d in definitions.values():
        producer.produce(topics.jobs, codec.dump(d, topic=topics.jobs), d.job_id)
    producer.flush(10)
    projector = RunningProjector(settings)
    try:
        wait_for(
            lambda: all(status_of(settings, d.job_id) == "pending" for d in definitions.values()),
            30,
            "the jobs' rows",
        )
        for case, d in definitions.items():
            state = replace(logic.new_state(d, now_ms), status=Status.PAUSED, updated_at_ms=now_ms)
            value = codec.dump(state, topic=topics.state)
            headers: list[tuple[str, str | bytes | None]] = []
            if case in ("header", "header-only"):
                headers = [(HEAD_HEADER, encode_head(state))]
            elif case == "bad-header":
                headers = [(HEAD_HEADER, b"1 pausd x 2")]
            if case == "header-only":
                value = b"\x00not a state"  # the header suffices: the value is not read
            producer.produce(topics.state, value, d.job_id, headers=headers)
        producer.flush(10)
        projector.caught_up()
        for case, d in definitions.items():
            assert status_of(settings, d.job_id) == "paused", case
    finally:
        projector.stop()
