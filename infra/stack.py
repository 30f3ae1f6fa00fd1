"""The local stack without Docker: Apache Kafka (KRaft) and PostgreSQL as plain processes.

``up()`` installs what is missing (broker jars through Maven, Debian's postgresql package),
starts both on 127.0.0.1, creates the database, the topics and the tables, and reports how
long each part took. ``down()`` stops both. Data lives under ``DUETIME_HOME`` (default
``.duetime`` in the working directory), so a rerun reuses it and a killed run is recovered.

``brokers=3`` (``infra up --brokers 3``) runs a three-node KRaft
cluster instead of the single broker (``infra/local_cluster.py``), in ``home/kafka-cluster``:
node i (from 0) on the broker and controller ports plus 2*i, so node 1 has the single
broker's ports and the same bootstrap address works for both layouts. ``down`` and
``status`` cover both layouts whatever ``brokers`` says (what is running is what counts).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from duetime.core.config import CommonSettings, Env

from .local_cluster import CLUSTER_HEAP_MB, LocalCluster, cluster_ports
from .local_kafka import JVM_OPTS, LocalKafka
from .local_postgres import LocalPostgres
from .process import pid_alive

log = logging.getLogger("duetime.infra.stack")


@dataclass(frozen=True)
class StackSettings:
    home: Path = Path(".duetime")
    kafka_port: int = 9092
    controller_port: int = 9093
    pg_port: int = 55432
    kafka_heap_mb: int = 512
    database: str = "duetime"
    brokers: int = 1
    """1: the single broker; 3: a three-node cluster (replication factor 3, min ISR 2)."""
    cluster_heap_mb: int = CLUSTER_HEAP_MB
    """Each cluster node's heap (three JVMs: the single broker's 512 MB would be too much)."""
    scratch_kafka: bool = False
    """Start a stopped single broker on empty storage (the test stack: every test creates and
    deletes its own topics, so nothing there outlives a session, while the KRaft metadata log of
    thousands of created and deleted topics grew to where loading it took the broker past its
    start deadline on a busy machine)."""
    kafka_jvm_opts: tuple[str, ...] | None = None
    """The single broker's JVM options beside its heap; None: ``local_kafka.JVM_OPTS`` (C1 only,
    for brokers that live minutes); ``()``: the JVM's default JIT, as a production broker."""

    @classmethod
    def from_env(cls, env: Env, home: Path | None = None, brokers: int = 1) -> StackSettings:
        return cls(
            brokers=brokers,
            home=(home or Path(env.text("DUETIME_HOME", str(cls.home)))).resolve(),
            kafka_port=env.integer("DUETIME_KAFKA_PORT", cls.kafka_port, 1, 65535),
            controller_port=env.integer(
                "DUETIME_KAFKA_CONTROLLER_PORT", cls.controller_port, 1, 65535
            ),
            pg_port=env.integer("DUETIME_PG_PORT", cls.pg_port, 1, 65535),
            kafka_heap_mb=env.integer("DUETIME_KAFKA_HEAP_MB", cls.kafka_heap_mb, 128, 16384),
            cluster_heap_mb=env.integer("DUETIME_KAFKA_HEAP_MB", cls.cluster_heap_mb, 128, 16384),
        )


@dataclass
class LocalStack:
    settings: StackSettings
    timings_s: dict[str, float] = field(default_factory=dict)

    @property
    def kafka(self) -> LocalKafka:
        s = self.settings
        return LocalKafka(
            s.home,
            port=s.kafka_port,
            controller_port=s.controller_port,
            heap_mb=s.kafka_heap_mb,
            jvm_opts=JVM_OPTS if s.kafka_jvm_opts is None else s.kafka_jvm_opts,
        )

    @property
    def cluster(self) -> LocalCluster:
        s = self.settings
        # always three nodes: down and status look at the cluster whatever brokers says
        ports = cluster_ports(3, s.kafka_port, s.controller_port)
        return LocalCluster(self.cluster_home, ports, heap_mb=s.cluster_heap_mb)

    @property
    def cluster_home(self) -> Path:
        return self.settings.home / "kafka-cluster"

    @property
    def postgres(self) -> LocalPostgres:
        return LocalPostgres(self.settings.home, port=self.settings.pg_port)

    @property
    def bootstrap_servers(self) -> str:
        return self.cluster.bootstrap if self.settings.brokers > 1 else self.kafka.bootstrap

    def kafka_status(self) -> list[tuple[str, str, bool]]:
        """(name, address, running) of the single broker and, when it exists or is asked for,
        of each cluster node."""
        rows = [("kafka", self.kafka.bootstrap, self.kafka.is_running())]
        if self.settings.brokers > 1 or self.cluster_home.exists():
            rows += [(f"kafka-{n.node_id}", n.bootstrap, up) for n, up in self.cluster.status()]
        return rows

    @property
    def database_url(self) -> str:
        return self.postgres.url(self.settings.database)

    def settings_for(self, common: CommonSettings, env: Env) -> CommonSettings:
        """``common`` pointed at this stack, unless the variables name other servers."""
        return replace(
            common,
            bootstrap_servers=env.text("DUETIME_KAFKA_BOOTSTRAP", self.bootstrap_servers),
            database_url=env.text("DUETIME_DATABASE_URL", self.database_url),
        )

    def install(self) -> None:
        """Fetch the broker jars and make sure PostgreSQL's server binaries exist."""
        started = time.monotonic()
        self.kafka.ensure_jars()  # the cluster's nodes share the same jar cache
        self.timings_s["kafka_jars"] = time.monotonic() - started
        started = time.monotonic()
        self.postgres.ensure_installed()
        self.timings_s["postgres_install"] = time.monotonic() - started

    def up(self) -> None:
        self.settings.home.mkdir(parents=True, exist_ok=True)
        self.install()
        # no live broker of ours: nobody uses its storage
        if self.settings.scratch_kafka and self.settings.brokers == 1 and self.kafka.pid is None:
            shutil.rmtree(self.kafka.data_dir, ignore_errors=True)
        kafka = self.cluster if self.settings.brokers > 1 else self.kafka
        self.timings_s["kafka_start"] = kafka.start()
        pg = self.postgres
        self.timings_s["postgres_start"] = pg.start()
        pg.create_database(self.settings.database)

    def prepare(self, common: CommonSettings, replication_factor: int | None = None) -> None:
        """Topics and tables for ``common`` (its prefix and its database); the topics'
        replication factor is ``replication_factor``, or min(3, brokers) when None."""
        from duetime.core.topics import Topics

        from .migrate import migrate
        from .topics import create_topics

        started = time.monotonic()
        create_topics(
            common.bootstrap_servers,
            Topics(common.topic_prefix).specs(common.partitions),
            replication_factor,
        )
        migrate(common.database_url)
        self.timings_s["topics_and_migrations"] = time.monotonic() - started

    def down(self) -> None:
        self.kafka.stop()
        # only a stack that ever ran a cluster has one to stop (and ports that fit one)
        if self.cluster_home.exists():
            self.cluster.stop()
        self.postgres.stop()

    # --- sharing one stack between processes (parallel test sessions) ----------------------

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """Hold the stack's lock file: parallel sessions bring the services up and down one at a
        time (two sessions starting PostgreSQL at once made one fail; one stopping it while
        another started it left the other without a server)."""
        self.settings.home.mkdir(parents=True, exist_ok=True)
        with open(self.settings.home / "stack.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def acquire(self) -> None:
        """Register this process as a user of the stack and bring it up (see ``release``)."""
        with self._exclusive():
            users = self.settings.home / "users"
            users.mkdir(parents=True, exist_ok=True)
            (users / str(os.getpid())).touch()
            self.up()

    def other_users(self) -> list[str]:
        """The pids of the other live processes registered as users of the stack."""
        users = self.settings.home / "users"
        if not users.is_dir():
            return []
        me = str(os.getpid())
        return [
            f.name
            for f in users.iterdir()
            if f.name.isdigit() and f.name != me and pid_alive(int(f.name))
        ]

    def release(self) -> bool:
        """Unregister; stop the services when no other live process uses them. True if stopped."""
        with self._exclusive():
            users = self.settings.home / "users"
            (users / str(os.getpid())).unlink(missing_ok=True)
            others = self.other_users()
            for stale in users.iterdir():
                if stale.name not in others:
                    stale.unlink(missing_ok=True)
            if others:
                log.info("stack still used by pids %s: leaving it running", others)
                return False
            self.down()
            return True
