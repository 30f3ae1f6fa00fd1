"""The local stack without Docker: Apache Kafka (KRaft) and PostgreSQL as plain processes.

``up()`` installs what is missing (broker jars through Maven, Debian's postgresql package),
starts both on 127.0.0.1, creates the database, the topics and the tables, and reports how
long each part took. ``down()`` stops both. Data lives under ``DUETIME_HOME`` (default
``.duetime`` in the working directory), so a rerun reuses it and a killed run is recovered.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from duetime.core.config import CommonSettings, Env

from .local_kafka import LocalKafka
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

    @classmethod
    def from_env(cls, env: Env, home: Path | None = None) -> StackSettings:
        return cls(
            home=(home or Path(env.text("DUETIME_HOME", str(cls.home)))).resolve(),
            kafka_port=env.integer("DUETIME_KAFKA_PORT", cls.kafka_port, 1, 65535),
            controller_port=env.integer(
                "DUETIME_KAFKA_CONTROLLER_PORT", cls.controller_port, 1, 65535
            ),
            pg_port=env.integer("DUETIME_PG_PORT", cls.pg_port, 1, 65535),
            kafka_heap_mb=env.integer("DUETIME_KAFKA_HEAP_MB", cls.kafka_heap_mb, 128, 16384),
        )


@dataclass
class LocalStack:
    settings: StackSettings
    timings_s: dict[str, float] = field(default_factory=dict)

    @property
    def kafka(self) -> LocalKafka:
        s = self.settings
        return LocalKafka(
            s.home, port=s.kafka_port, controller_port=s.controller_port, heap_mb=s.kafka_heap_mb
        )

    @property
    def postgres(self) -> LocalPostgres:
        return LocalPostgres(self.settings.home, port=self.settings.pg_port)

    @property
    def bootstrap_servers(self) -> str:
        return self.kafka.bootstrap

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
        self.kafka.ensure_jars()
        self.timings_s["kafka_jars"] = time.monotonic() - started
        started = time.monotonic()
        self.postgres.ensure_installed()
        self.timings_s["postgres_install"] = time.monotonic() - started

    def up(self) -> None:
        self.settings.home.mkdir(parents=True, exist_ok=True)
        self.install()
        self.timings_s["kafka_start"] = self.kafka.start()
        pg = self.postgres
        self.timings_s["postgres_start"] = pg.start()
        pg.create_database(self.settings.database)

    def prepare(self, common: CommonSettings) -> None:
        """Topics and tables for ``common`` (its prefix and its database)."""
        from duetime.core.topics import Topics

        from .migrate import migrate
        from .topics import create_topics

        started = time.monotonic()
        create_topics(
            common.bootstrap_servers,
            Topics(common.topic_prefix).specs(common.partitions),
            common.replication_factor,
        )
        migrate(common.database_url)
        self.timings_s["topics_and_migrations"] = time.monotonic() - started

    def down(self) -> None:
        self.kafka.stop()
        self.postgres.stop()

    # --- sharing one stack between processes (parallel test sessions) ----------------------

    def acquire(self) -> None:
        """Register this process as a user of the stack (see ``release``)."""
        users = self.settings.home / "users"
        users.mkdir(parents=True, exist_ok=True)
        (users / str(os.getpid())).touch()

    def release(self) -> bool:
        """Unregister; stop the services when no other live process uses them. True if stopped."""
        users = self.settings.home / "users"
        (users / str(os.getpid())).unlink(missing_ok=True)
        others = [f for f in users.iterdir() if f.name.isdigit() and pid_alive(int(f.name))]
        for stale in set(users.iterdir()) - set(others):
            stale.unlink(missing_ok=True)
        if others:
            log.info("stack still used by pids %s: leaving it running", [f.name for f in others])
            return False
        self.down()
        return True
