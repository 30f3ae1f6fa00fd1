"""Session-scoped Kafka and PostgreSQL for every test, and per-test isolation.

Where the servers come from, in order:
1. ``DUETIME_KAFKA_BOOTSTRAP`` and ``DUETIME_DATABASE_URL`` set: those servers;
2. a Docker engine answers: testcontainers (Kafka in KRaft mode, PostgreSQL);
3. otherwise the local processes of ``infra/`` (real Apache Kafka and PostgreSQL), started in
   ``.duetime/test`` on their own ports and stopped at the end of the session.

Each test that asks for ``settings`` gets its own topic prefix (its topics are created for it
and deleted afterwards) and its own database cloned from a migrated template. Nothing here
mocks Kafka or PostgreSQL.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import hypothesis
import psycopg
import pytest
from psycopg import sql

from duetime.core.config import CommonSettings, Env
from duetime.core.topics import Topics
from duetime.infra.process import pid_alive

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tests.helpers import RunningScheduler
    from tests.integration.test_worker_support import Sink

# no per-example deadline: hypothesis's default (200 ms) is a timing assertion, and the suite
# runs three sessions side by side on two cores (examples took 250 ms at load 14)
hypothesis.settings.register_profile("duetime", deadline=None)
hypothesis.settings.load_profile("duetime")

ROOT = Path(__file__).resolve().parent.parent
# one template per test session: parallel sessions each migrate their own (one session's
# DROP of a shared template failed another's CREATE DATABASE ... TEMPLATE mid-run)
TEMPLATE_DB = f"duetime_template_{os.getpid()}"


@dataclass(frozen=True)
class Services:
    bootstrap_servers: str
    admin_database_url: str
    """A URL whose user may CREATE DATABASE; the database part is replaced per test."""
    origin: str

    def database_url(self, name: str) -> str:
        base, _, _ = self.admin_database_url.rpartition("/")
        return f"{base}/{name}"


def _docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return (
            subprocess.run(
                ["docker", "info"], capture_output=True, timeout=5, check=False
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def services() -> Iterator[Services]:
    env = Env()
    bootstrap = env.opt_str("DUETIME_KAFKA_BOOTSTRAP")
    database_url = env.opt_str("DUETIME_DATABASE_URL")
    if bootstrap and database_url:
        yield Services(bootstrap, database_url, "external")
        return
    if _docker_answers():
        yield from _containers()
        return
    from duetime.infra.stack import LocalStack, StackSettings

    stack = LocalStack(
        StackSettings(
            home=ROOT / ".duetime" / "test",
            kafka_port=29092,
            controller_port=29093,
            pg_port=25432,
            kafka_heap_mb=512,
            scratch_kafka=True,
        )
    )
    stack.acquire()  # registers this session and brings the servers up, under the stack's lock
    try:
        yield Services(stack.bootstrap_servers, stack.database_url, "local")
    finally:
        stack.release()  # stops the servers unless another test session still uses them


def _containers() -> Iterator[Services]:
    from testcontainers.kafka import KafkaContainer
    from testcontainers.postgres import PostgresContainer

    kafka = KafkaContainer().with_kraft()
    # one broker: the transaction log must accept replication factor 1 (see DESIGN.md)
    kafka.with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
    kafka.with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
    kafka.with_env("KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS", "0")
    # workers use KIP-848's consumer protocol: fast failure detection is the broker's setting
    for name, value in (
        ("MIN_SESSION_TIMEOUT_MS", "500"),
        ("MIN_HEARTBEAT_INTERVAL_MS", "100"),
        ("SESSION_TIMEOUT_MS", "3000"),
        ("HEARTBEAT_INTERVAL_MS", "500"),
    ):
        kafka.with_env(f"KAFKA_GROUP_CONSUMER_{name}", value)
    postgres = PostgresContainer(
        "postgres:16", username="duetime", password="duetime", dbname="duetime", driver=None
    )
    with kafka, postgres:
        yield Services(kafka.get_bootstrap_server(), postgres.get_connection_url(), "docker")


@pytest.fixture(scope="session")
def template_database(services: Services) -> Iterator[str]:
    """A migrated database that every test's database is cloned from."""
    from duetime.infra.migrate import migrate

    with psycopg.connect(services.admin_database_url, autocommit=True) as conn:
        names = conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE 'duetime\\_template\\_%'"
        ).fetchall()
        for (name,) in names:  # this session's, and those of sessions that died
            pid = name.rpartition("_")[2]
            if name == TEMPLATE_DB or (pid.isdigit() and not pid_alive(int(pid))):
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(TEMPLATE_DB)))
    migrate(services.database_url(TEMPLATE_DB))
    yield TEMPLATE_DB
    _drop_database(services, TEMPLATE_DB)


@pytest.fixture
def database_url(services: Services, template_database: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(services.admin_database_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template_database)
            )
        )
    try:
        yield services.database_url(name)
    finally:
        _drop_database(services, name)


def _drop_database(services: Services, name: str, timeout_s: float = 15.0) -> None:
    """Drop a test's database. FORCE ends the test's own sessions; a session PostgreSQL will
    not let us end (e.g. of another role) is waited out, and at worst the database stays:
    that only costs disk in the test cluster, so it is not a test failure."""
    import time
    import warnings

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with psycopg.connect(services.admin_database_url, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )
            return
        except psycopg.Error as exc:
            if time.monotonic() > deadline:
                warnings.warn(f"test database {name} left behind: {exc}", stacklevel=2)
                return
            time.sleep(0.5)


@pytest.fixture
def settings(services: Services, database_url: str) -> Iterator[CommonSettings]:
    """Settings for one test: its own topics (created now, deleted after) and database."""
    from confluent_kafka.admin import AdminClient

    from duetime.infra.topics import create_topics

    base = CommonSettings.from_env(Env({}))
    common = replace(
        base,
        bootstrap_servers=services.bootstrap_servers,
        database_url=database_url,
        topic_prefix=f"t{uuid.uuid4().hex[:10]}.",
        partitions=int(os.environ.get("DUETIME_TEST_PARTITIONS", "3")),
        instance_id=f"test-{uuid.uuid4().hex[:6]}",
    )
    specs = Topics(common.topic_prefix).specs(common.partitions)
    create_topics(common.bootstrap_servers, specs)
    try:
        yield common
    finally:
        admin = AdminClient({"bootstrap.servers": common.bootstrap_servers})
        for future in admin.delete_topics([s.name for s in specs]).values():
            with contextlib.suppress(Exception):
                future.result()


@pytest.fixture
def sink() -> Iterator[Sink]:
    """An HTTP target on 127.0.0.1 that records every delivery (stopped after the test)."""
    from tests.integration.test_worker_support import Sink

    s = Sink().start()
    yield s
    s.stop()


@pytest.fixture
def scheduler(settings: CommonSettings) -> Iterator[RunningScheduler]:
    """A scheduler in this process (default settings) owning every partition; a module that
    needs other settings defines its own ``scheduler``."""
    from duetime.schedulers.settings import SchedulerSettings
    from tests.helpers import RunningScheduler as Running
    from tests.helpers import wait_for

    running = Running(SchedulerSettings(common=settings))
    wait_for(lambda: running.owned() == settings.partitions, 30, "the scheduler to own it all")
    yield running
    running.stop()


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """duetime's tracing on a fresh OpenTelemetry provider whose spans are kept in memory (the
    ``otel`` extra, part of the test extra), switched off again after the test."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from duetime.core import tracing

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracing.install(provider)
    try:
        yield memory
    finally:
        tracing.install(None)


# Tests that run alone, after the parallel phase of `./run test` (see ./run): the roles as
# processes with timing-sensitive checks (failover, fencing, the browser), the fault campaign's
# own stacks, and the modules that start their own brokers or install packages (a JVM or a pip
# install each, which would starve the tests running beside them on a 2-core machine).
SERIAL_DIRS = frozenset({"e2e", "faults"})
SERIAL_MODULES = frozenset(
    {"test_local_infra", "test_kafka_security", "test_packaging", "test_worker_priority"}
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = item.path
        if path.parent.name in SERIAL_DIRS or path.stem in SERIAL_MODULES:
            item.add_marker(pytest.mark.serial)
