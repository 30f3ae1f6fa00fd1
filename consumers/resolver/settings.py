"""The resolver role's configuration, built once from the environment in ``main``."""

from __future__ import annotations

from dataclasses import dataclass

from duetime.core.config import CommonSettings, Env
from duetime.core.topics import TopicSpec

TABLES = ("progress", "shapes")
"""The resolver's faust tables (dag_run_id → progress / the run's nodes)."""


@dataclass(frozen=True)
class ResolverSettings:
    common: CommonSettings
    session_timeout_ms: int = 3000
    """Consumer-group session timeout: how fast a killed resolver's partitions move."""
    commit_interval_s: float = 1.0
    """How often consumed offsets are committed (faust's default is 2.8 s); a crash
    re-processes at most this much, and re-processing is idempotent."""
    standby_replicas: int = 1
    """Table copies kept warm on other resolver processes, for a fast failover."""

    done_retention_s: float = 3600.0
    """How long a finished run's progress is kept (a redelivery then finds it finished)."""
    repair_retention_s: float = 7 * 86400.0
    """How long a run that ended failed keeps its shape and progress, so it can be repaired
    (``POST /v1/dags/{dag_id}/runs/{run_id}/retry`` or a replay of its dead letter): a
    repair asked for later finds no run and does nothing (logged)."""
    orphan_retention_s: float = 24 * 3600.0
    """How long events of a run whose started event never came are kept."""
    sweep_interval_s: float = 300.0
    """How often the tables are swept of expired runs."""

    @property
    def app_id(self) -> str:
        """The faust app id: consumer group and the prefix of its changelog topics."""
        return f"{self.common.topic_prefix}resolver"

    @property
    def by_run_topic(self) -> str:
        """Internal topic: every DAG-run event re-keyed by dag_run_id (co-partitioning)."""
        return f"{self.common.topic_prefix}resolver.by_run"

    def changelog_topic(self, table: str) -> str:
        """faust's name for a table's changelog topic."""
        return f"{self.app_id}-{table}-changelog"

    def own_topics(self) -> list[TopicSpec]:
        """The topics of the resolver itself, created before faust starts.

        faust creates them too, but asynchronously: a consumer group that forms before the
        broker lists a new topic leaves it unassigned until the next metadata refresh
        (minutes). Created first, the internal topic is in the very first assignment.
        """
        n = self.common.partitions
        events = {"cleanup.policy": "delete", "retention.ms": str(7 * 24 * 3600 * 1000)}
        return [
            TopicSpec(self.by_run_topic, n, events, None),
            *(
                TopicSpec(self.changelog_topic(t), n, {"cleanup.policy": "compact"}, None)
                for t in TABLES
            ),
        ]

    @classmethod
    def from_env(cls, env: Env) -> ResolverSettings:
        return cls(
            common=CommonSettings.from_env(env),
            session_timeout_ms=env.integer(
                "DUETIME_SESSION_TIMEOUT_MS", cls.session_timeout_ms, 500, 300_000
            ),
            commit_interval_s=env.number(
                "DUETIME_RESOLVER_COMMIT_INTERVAL_S", cls.commit_interval_s, 0.05, 60
            ),
            standby_replicas=env.integer(
                "DUETIME_RESOLVER_STANDBY_REPLICAS", cls.standby_replicas, 0, 5
            ),
            done_retention_s=env.number(
                "DUETIME_RESOLVER_RETENTION_S", cls.done_retention_s, 1, 30 * 86400
            ),
            repair_retention_s=env.number(
                "DUETIME_RESOLVER_REPAIR_RETENTION_S", cls.repair_retention_s, 1, 365 * 86400
            ),
            sweep_interval_s=env.number(
                "DUETIME_RESOLVER_SWEEP_INTERVAL_S", cls.sweep_interval_s, 0.1, 86400
            ),
        )
