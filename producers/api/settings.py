"""The API role's configuration, built once from the environment in ``main``."""

from __future__ import annotations

import re
from dataclasses import dataclass

from duetime.core.config import CommonSettings, Env
from duetime.core.errors import ConfigError
from duetime.core.jobspec import DEFAULT_MAX_PAYLOAD_BYTES

_TOKEN_RE = re.compile(r"^[A-Za-z0-9._~+/=-]{16,}$")


@dataclass(frozen=True)
class ApiSettings:
    common: CommonSettings
    host: str = "127.0.0.1"
    port: int = 8080
    tokens: tuple[str, ...] = ()
    """Bearer tokens; when any is set, every /v1 route needs one of them."""
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    max_body_bytes: int = 4 * 1024 * 1024
    """Raw request bodies above this are refused (413) before they are parsed."""
    pool_size: int = 16
    """PostgreSQL connections of one API process."""
    db_timeout_s: float = 5.0
    """How long a request waits for a PostgreSQL connection before answering 503."""
    publish_timeout_s: float = 10.0
    """How long a write waits for Kafka's acknowledgement before answering 503."""
    workers: int = 1

    @classmethod
    def from_env(cls, env: Env) -> ApiSettings:
        tokens = env.items("DUETIME_API_TOKENS")
        for token in tokens:
            if not _TOKEN_RE.match(token):
                raise ConfigError(
                    "DUETIME_API_TOKENS: each token needs at least 16 characters of letters, "
                    "digits and ._~+/=-",
                    details={"variable": "DUETIME_API_TOKENS"},
                )
        max_payload = env.integer(
            "DUETIME_MAX_PAYLOAD_BYTES", DEFAULT_MAX_PAYLOAD_BYTES, 1, 64 * 1024 * 1024
        )
        return cls(
            common=CommonSettings.from_env(env),
            host=env.text("DUETIME_API_HOST", cls.host),
            port=env.integer("DUETIME_API_PORT", cls.port, 0, 65535),
            tokens=tokens,
            max_payload_bytes=max_payload,
            max_body_bytes=env.integer(
                "DUETIME_API_MAX_BODY_BYTES",
                max(cls.max_body_bytes, 2 * max_payload),
                1024,
                1024 * 1024 * 1024,
            ),
            pool_size=env.integer("DUETIME_API_DB_POOL", cls.pool_size, 1, 1000),
            workers=env.integer("DUETIME_API_WORKERS", cls.workers, 1, 64),
        )
