"""The projector role's configuration, built once from the environment in ``main``."""

from __future__ import annotations

from dataclasses import dataclass

from duetime.core.config import CommonSettings, Env


@dataclass(frozen=True)
class ProjectorSettings:
    common: CommonSettings
    batch_size: int = 5000
    """Records per PostgreSQL transaction at most."""
    poll_s: float = 0.2
    """How long an idle loop waits for the first record of a batch."""
    retention_days: int = 30
    """Execution history kept; older daily partitions are dropped."""
    housekeeping_interval_s: float = 3600.0
    """How often partitions are created ahead and old ones dropped."""
    gather_s: float = 0.1
    """A batch is written at most this often: what arrives meanwhile joins the next one
    (fewer, larger PostgreSQL transactions under load; an idle projector writes at once)."""

    @property
    def group_id(self) -> str:
        """The consumer group, and the name under which offsets are stored in PostgreSQL."""
        return f"{self.common.topic_prefix}projector"

    @classmethod
    def from_env(cls, env: Env) -> ProjectorSettings:
        return cls(
            common=CommonSettings.from_env(env),
            batch_size=env.integer("DUETIME_PROJECTOR_BATCH", cls.batch_size, 1, 100_000),
            retention_days=env.integer("DUETIME_RETENTION_DAYS", cls.retention_days, 1, 3650),
            housekeeping_interval_s=env.number(
                "DUETIME_PROJECTOR_HOUSEKEEPING_S", cls.housekeeping_interval_s, 1, 86400
            ),
            gather_s=env.integer("DUETIME_PROJECTOR_GATHER_MS", int(cls.gather_s * 1000), 0, 10_000)
            / 1000,
        )
