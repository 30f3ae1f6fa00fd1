"""Configuration: one frozen settings object per role, built once from ``DUETIME_*`` variables.

Nothing else in duetime reads the environment. Every value is validated here; an invalid one
raises :class:`~duetime.core.errors.ConfigError` naming the variable, so a role stops at start
with a message an operator can act on. The README documents every variable.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TypeVar

from .errors import ConfigError
from .kafka_properties import ENV_PREFIX, NONE, KafkaProperties
from .redact import redact_url

T = TypeVar("T", int, float)

_PREFIX_RE = re.compile(r"^[A-Za-z0-9._-]{0,100}$")


class Env:
    """Typed, validated reads of ``DUETIME_*`` variables from one mapping."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._env = dict(os.environ if environ is None else environ)

    def raw(self, name: str) -> str | None:
        value = self._env.get(name)
        return None if value is None or value.strip() == "" else value.strip()

    def text(self, name: str, default: str) -> str:
        value = self.raw(name)
        return default if value is None else value

    def opt_str(self, name: str) -> str | None:
        return self.raw(name)

    def _number(self, name: str, default: T, kind: type[T], lo: T | None, hi: T | None) -> T:
        value = self.raw(name)
        if value is None:
            return default
        try:
            number = kind(value)
        except ValueError:
            raise ConfigError(
                f"{name}={value!r} is not a valid {kind.__name__}", details={"variable": name}
            ) from None
        # NaN compares false with every bound, so without its own test it passes them all
        if number != number or (lo is not None and number < lo) or (hi is not None and number > hi):
            raise ConfigError(
                f"{name}={value} is out of range [{lo}, {hi}]", details={"variable": name}
            )
        return number

    def integer(self, name: str, default: int, lo: int | None = None, hi: int | None = None) -> int:
        return self._number(name, default, int, lo, hi)

    def number(
        self, name: str, default: float, lo: float | None = None, hi: float | None = None
    ) -> float:
        return self._number(name, default, float, lo, hi)

    def flag(self, name: str, default: bool) -> bool:
        value = self.raw(name)
        if value is None:
            return default
        lowered = value.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ConfigError(
            f"{name}={value!r} is not a boolean (true/false)", details={"variable": name}
        )

    def choice(self, name: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.text(name, default)
        if value not in choices:
            raise ConfigError(
                f"{name}={value!r} must be one of {', '.join(choices)}", details={"variable": name}
            )
        return value

    def starting_with(self, prefix: str) -> dict[str, str]:
        """Every variable whose name starts with ``prefix``, as it is."""
        return {name: value for name, value in self._env.items() if name.startswith(prefix)}

    def items(self, name: str) -> tuple[str, ...]:
        value = self.raw(name)
        if value is None:
            return ()
        return tuple(part.strip() for part in value.split(",") if part.strip())


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# a host name of RFC 1123 labels (or an IP literal, checked by ipaddress): nothing that could
# smuggle a port, a path or whitespace into the address the metrics server binds
_HOST_RE = re.compile(
    r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)


def log_level(env: Env) -> str:
    """``DUETIME_LOG_LEVEL`` in any case (``debug``, ``Info``); ``WARN`` is ``WARNING``."""
    raw = env.text("DUETIME_LOG_LEVEL", "INFO")
    level = {"WARN": "WARNING"}.get(raw.upper(), raw.upper())
    if level not in LOG_LEVELS:
        raise ConfigError(
            f"DUETIME_LOG_LEVEL={raw!r} must be one of {', '.join(LOG_LEVELS)} (any case)",
            details={"variable": "DUETIME_LOG_LEVEL"},
        )
    return level


def metrics_host(env: Env) -> str:
    """``DUETIME_METRICS_HOST``: the address every role's metrics server binds."""
    raw = env.text("DUETIME_METRICS_HOST", "127.0.0.1")
    try:
        ipaddress.ip_address(raw)
        return raw
    except ValueError:
        pass
    if len(raw) > 253 or not _HOST_RE.match(raw):
        raise ConfigError(
            f"DUETIME_METRICS_HOST={raw!r} is not a host name or IP address",
            details={"variable": "DUETIME_METRICS_HOST"},
        )
    return raw


def check_heartbeat(heartbeat_ms: int, session_ms: int, variable: str) -> None:
    """A KIP-848 group's heartbeat interval (``variable``, the role's own) must be shorter than
    ``DUETIME_SESSION_TIMEOUT_MS``: the broker refuses the pair otherwise."""
    if heartbeat_ms >= session_ms:
        raise ConfigError(
            f"{variable} ({heartbeat_ms}) must be under DUETIME_SESSION_TIMEOUT_MS ({session_ms})",
            details={"variable": variable},
        )


@dataclass(frozen=True)
class CommonSettings:
    """What every role needs: where Kafka and PostgreSQL are, topic naming, logs, metrics."""

    bootstrap_servers: str = "127.0.0.1:9092"
    database_url: str = "postgresql://duetime:duetime@127.0.0.1:55432/duetime"
    topic_prefix: str = "duetime."
    partitions: int = 12
    replication_factor: int = 1
    schema_registry_url: str | None = None
    log_format: str = "text"
    log_level: str = "INFO"
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    """Where each role's metrics server listens: loopback unless an operator opens it (a
    container's Prometheus needs ``0.0.0.0``)."""
    instance_id: str = socket.gethostname()
    kafka_properties: KafkaProperties = NONE
    """librdkafka properties for every client (TLS, SASL, tuning): ``DUETIME_KAFKA_<NAME>``
    variables and ``DUETIME_KAFKA_PROPERTIES_FILE``; its repr masks secrets."""

    def __repr__(self) -> str:
        # A settings object may be logged or shown in an error: URLs lose their passwords
        # (kafka_properties masks its own secrets).
        shown = {
            f.name: redact_url(v) if f.name.endswith("_url") and isinstance(v, str) else v
            for f in fields(self)
            for v in (getattr(self, f.name),)
        }
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    @classmethod
    def from_env(cls, env: Env) -> CommonSettings:
        prefix = env.text("DUETIME_TOPIC_PREFIX", cls.topic_prefix)
        if not _PREFIX_RE.match(prefix):
            raise ConfigError(
                f"DUETIME_TOPIC_PREFIX={prefix!r} may only hold letters, digits, '.', '_' and '-'",
                details={"variable": "DUETIME_TOPIC_PREFIX"},
            )
        database_url = env.text("DUETIME_DATABASE_URL", cls.database_url)
        if not database_url.startswith(("postgresql://", "postgres://")):
            raise ConfigError(
                "DUETIME_DATABASE_URL must be a postgresql:// URL",
                details={"variable": "DUETIME_DATABASE_URL"},
            )
        return cls(
            bootstrap_servers=env.text("DUETIME_KAFKA_BOOTSTRAP", cls.bootstrap_servers),
            database_url=database_url,
            topic_prefix=prefix,
            partitions=env.integer("DUETIME_PARTITIONS", cls.partitions, 1, 10_000),
            replication_factor=env.integer(
                "DUETIME_REPLICATION_FACTOR", cls.replication_factor, 1, 7
            ),
            schema_registry_url=env.opt_str("DUETIME_SCHEMA_REGISTRY_URL"),
            log_format=env.choice("DUETIME_LOG_FORMAT", cls.log_format, ("text", "json")),
            log_level=log_level(env),
            metrics_port=env.integer("DUETIME_METRICS_PORT", cls.metrics_port, 0, 65535),
            metrics_host=metrics_host(env),
            instance_id=env.text("DUETIME_INSTANCE_ID", f"{socket.gethostname()}-{os.getpid()}"),
            kafka_properties=KafkaProperties.from_env(env.starting_with(ENV_PREFIX)),
        )
