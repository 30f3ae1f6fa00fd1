"""Integration tests of the Docker-free local stack: a real Kafka 4.1 broker and PostgreSQL.

They start both servers in a temporary home on free ports, check that they serve what
duetime needs (metadata, transactions with a read_committed consumer, short session
timeouts, password login to PostgreSQL), that a second start() reuses them, that a SIGKILLed
server starts again on the same files, that a taken port gives a clear error, and that
stop() leaves no process behind. The first run fetches the broker's jars with Maven (cached
in ~/.cache/duetime) and may install Debian's postgresql package.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from duetime.infra.local_kafka import MAIN_JAR, LocalKafka
from duetime.infra.local_postgres import LocalPostgres
from duetime.infra.process import InfraError, free_port, pid_alive, wait_until


@pytest.fixture(scope="module")
def home() -> Iterator[Path]:
    # Not pytest's tmp_path: /tmp/pytest-of-root is 0700 and the postgres OS user must be
    # able to reach its data directory.
    path = Path(tempfile.mkdtemp(prefix="duetime-infra-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def kafka(home: Path) -> Iterator[LocalKafka]:
    k = LocalKafka(home, port=free_port(), controller_port=free_port(), heap_mb=384)
    k.start(timeout_s=300)
    yield k
    k.stop()


@pytest.fixture(scope="module")
def postgres(home: Path) -> Iterator[LocalPostgres]:
    pg = LocalPostgres(home, port=free_port(), fast_unsafe=True)
    pg.start(timeout_s=600)
    yield pg
    pg.stop()


def _create_topic(bootstrap: str, name: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)])
    for fut in futures.values():
        fut.result(timeout=30)


def _transactional_roundtrip(bootstrap: str, topic: str) -> None:
    """Commit one record in a transaction and read it back with read_committed."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"test-{uuid.uuid4()}"}
    )
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce(topic, key=b"k", value=b"committed")
    producer.commit_transaction(30)

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-{uuid.uuid4()}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            # Below the broker's default minimum of 6 s: the broker is configured to allow it.
            "session.timeout.ms": 2000,
            "heartbeat.interval.ms": 500,
        }
    )
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                assert err.code() == KafkaError._PARTITION_EOF, err
                continue
            assert msg.value() == b"committed"
            return
        pytest.fail(f"no committed record read from {topic} within 60 s")
    finally:
        consumer.close()


def test_kafka_answers_metadata_and_serves_transactions(kafka: LocalKafka) -> None:
    assert kafka.is_running()
    md = AdminClient({"bootstrap.servers": kafka.bootstrap}).list_topics(timeout=10)
    assert 1 in md.brokers
    _create_topic(kafka.bootstrap, "infra-txn")
    _transactional_roundtrip(kafka.bootstrap, "infra-txn")


def test_kafka_does_not_auto_create_topics(kafka: LocalKafka) -> None:
    md = AdminClient({"bootstrap.servers": kafka.bootstrap}).list_topics(
        "never-created", timeout=10
    )
    assert md.topics["never-created"].error is not None


def test_postgres_answers_select_1_and_creates_databases(postgres: LocalPostgres) -> None:
    assert postgres.is_running()
    postgres.create_database("duetime")
    postgres.create_database("duetime")  # idempotent
    with psycopg.connect(postgres.url("duetime"), connect_timeout=5) as conn:
        assert conn.execute("select 1").fetchone() == (1,)
        row = conn.execute(
            "select current_user, rolsuper, rolcreatedb from pg_roles where rolname = current_user"
        ).fetchone()
        assert row == ("duetime", False, True)
    postgres.drop_database("duetime")
    postgres.drop_database("duetime")  # idempotent
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(postgres.url("duetime"), connect_timeout=5).close()


def test_second_start_reuses_running_servers(
    home: Path, kafka: LocalKafka, postgres: LocalPostgres
) -> None:
    kafka_pid, pg_pid = kafka.pid, postgres.pid
    # Fresh objects, as a second process would build them from the same home.
    k2 = LocalKafka(home, port=kafka.port, controller_port=kafka.controller_port)
    pg2 = LocalPostgres(home, port=postgres.port)
    assert k2.start(timeout_s=30) < 5
    assert pg2.start(timeout_s=30) < 5
    assert (k2.pid, pg2.pid) == (kafka_pid, pg_pid)


def test_reusing_a_broker_of_other_jars_says_so(
    home: Path, kafka: LocalKafka, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # As after an upgrade of KAFKA_VERSION: the running broker came from another jar cache.
    other = LocalKafka(
        home, port=kafka.port, controller_port=kafka.controller_port, jar_cache=tmp_path / "libs"
    )
    with caplog.at_level("INFO", logger="duetime.infra"):
        other.start(timeout_s=30)
    assert other.pid == kafka.pid
    assert "keeps its own version until stopped" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="duetime.infra"):
        LocalKafka(home, port=kafka.port, controller_port=kafka.controller_port).start(30)
    assert "reusing running Kafka broker" in caplog.text
    assert "keeps its own version" not in caplog.text


def test_taken_port_gives_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        with pytest.raises(InfraError, match=rf"127\.0\.0\.1:{port}.*pid {os.getpid()}"):
            LocalKafka(tmp_path / "k", port=port, controller_port=free_port()).start(10)
        pg_home = Path(tempfile.mkdtemp(prefix="duetime-infra-port-"))
        try:
            pg_home.chmod(0o755)
            with pytest.raises(InfraError, match=rf"127\.0\.0\.1:{port}.*pid {os.getpid()}"):
                LocalPostgres(pg_home, port=port).start(30)
        finally:
            shutil.rmtree(pg_home, ignore_errors=True)


def test_sigkilled_kafka_starts_again_on_the_same_storage(kafka: LocalKafka) -> None:
    pid = kafka.pid
    assert pid is not None
    os.killpg(pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(pid), 10, f"killed broker {pid} to die")
    assert not kafka.is_running()
    kafka.start(timeout_s=120)
    assert kafka.pid not in (None, pid)
    # The topic made before the kill is still there, and transactions still work.
    md = AdminClient({"bootstrap.servers": kafka.bootstrap}).list_topics(timeout=10)
    assert "infra-txn" in md.topics
    _transactional_roundtrip(kafka.bootstrap, "infra-txn")


def test_sigkilled_postgres_starts_again(postgres: LocalPostgres) -> None:
    postgres.create_database("survivor")
    pid = postgres.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(pid), 10, f"killed postmaster {pid} to die")
    assert not postgres.is_running()
    postgres.start(timeout_s=60)
    assert postgres.pid not in (None, pid)
    with psycopg.connect(postgres.url("survivor"), connect_timeout=5) as conn:
        assert conn.execute("select 1").fetchone() == (1,)


def test_jar_cache_without_marker_is_fetched_again(kafka: LocalKafka, tmp_path: Path) -> None:
    k = LocalKafka(tmp_path, jar_cache=tmp_path / "libs")
    libs = k.ensure_jars()
    main_jar = libs / MAIN_JAR
    assert main_jar.exists() and (libs / ".duetime-complete").exists()
    # As if the copy had been killed half-way: no marker, a jar missing.
    (libs / ".duetime-complete").unlink()
    main_jar.unlink()
    assert k.ensure_jars() == libs
    assert main_jar.exists() and (libs / ".duetime-complete").exists()


def test_stop_leaves_no_process(kafka: LocalKafka, postgres: LocalPostgres) -> None:
    kafka_pid, pg_pid = kafka.pid, postgres.pid
    assert kafka_pid is not None and pg_pid is not None
    kafka.stop()
    postgres.stop()
    assert not pid_alive(kafka_pid)
    assert not pid_alive(pg_pid)
    assert not kafka.is_running() and not postgres.is_running()
    assert not kafka.pid_file.exists()
    # Stopping twice is harmless.
    with contextlib.suppress(InfraError):
        kafka.stop()
    postgres.stop()
