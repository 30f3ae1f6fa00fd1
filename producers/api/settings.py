"""The API role's configuration, built once from the environment in ``main``.

Besides where to listen and how large a body may be, it holds the API's edge against hostile
callers (see ``guard``): which ``Host`` names it answers for (DNS rebinding), which foreign
``Origin`` may change state (CSRF), how deep a JSON body may nest, and whether it may serve
without tokens on an address other than loopback (``check_exposure``).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from duetime.core.config import CommonSettings, Env
from duetime.core.errors import ConfigError
from duetime.core.jobspec import DEFAULT_MAX_PAYLOAD_BYTES

_TOKEN_RE = re.compile(r"^[A-Za-z0-9._~+/=-]{16,}$")
_HOST_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(:[0-9]{1,5})?$")
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]", "")


def is_loopback(host: str) -> bool:
    """Whether a bind address only accepts connections from this machine. A name other than
    ``localhost`` could resolve to anything, so it does not count."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_entry(host: str) -> str:
    """A bind host as it appears in a Host header (an IPv6 address in brackets)."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]"
    return host


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
    max_json_depth: int = 64
    """Request bodies nested deeper than this are refused (400) before they are parsed."""
    pool_size: int = 16
    """PostgreSQL connections of one API process."""
    db_timeout_s: float = 5.0
    """How long a request waits for a PostgreSQL connection before answering 503."""
    publish_timeout_s: float = 10.0
    """How long a write waits for Kafka's acknowledgement before answering 503."""
    group_max_jobs: int = 64
    """Single creates written in one transaction at most (1: each alone; see ``group``)."""
    group_wait_ms: float = 2.0
    """How long a group's first create waits for more creates to join it."""
    workers: int = 1
    allowed_hosts: tuple[str, ...] | None = None
    """``Host`` header values answered (``name`` matches any port, ``name:port`` that port,
    ``*`` any host); None: loopback names and the bind host, with the port."""
    allowed_origins: tuple[str, ...] = ()
    """Foreign origins (``scheme://host[:port]``) allowed to change state, and answered with
    CORS headers; same-origin requests (an Origin whose host is an allowed host) always are."""
    allow_no_auth: bool = False
    """Serve without tokens on a non-loopback address (only behind an authenticating gateway)."""

    def hosts(self) -> tuple[str, ...]:
        """The Host header values this API answers for (lower case)."""
        if self.allowed_hosts is not None:
            return tuple(h.lower() for h in self.allowed_hosts)
        names = list(LOOPBACK_NAMES)
        if self.host not in WILDCARD_HOSTS:
            names.append(host_entry(self.host).lower())
        return tuple(dict.fromkeys(f"{n}:{self.port}" for n in names))

    def check_exposure(self) -> None:
        """Refuse to serve without auth anywhere but loopback (a ConfigError naming what to
        set), unless told that a gateway in front authenticates."""
        if self.tokens or self.allow_no_auth or is_loopback(self.host):
            return
        raise ConfigError(
            f"the API would listen on {self.host} without authentication: set "
            "DUETIME_API_TOKENS (bearer tokens), or listen on loopback (DUETIME_API_HOST / "
            "--host 127.0.0.1), or, only behind a gateway that authenticates every request, "
            "DUETIME_API_ALLOW_NO_AUTH=true",
            details={"variable": "DUETIME_API_TOKENS"},
        )

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
        hosts = env.items("DUETIME_API_ALLOWED_HOSTS")
        for entry in hosts:
            if entry != "*" and not _HOST_RE.match(entry):
                raise ConfigError(
                    f"DUETIME_API_ALLOWED_HOSTS: {entry!r} is not host, host:port or *",
                    details={"variable": "DUETIME_API_ALLOWED_HOSTS"},
                )
        origins = tuple(_origin(o) for o in env.items("DUETIME_API_ALLOWED_ORIGINS"))
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
            max_json_depth=env.integer("DUETIME_API_MAX_JSON_DEPTH", cls.max_json_depth, 2, 512),
            pool_size=env.integer("DUETIME_API_DB_POOL", cls.pool_size, 1, 1000),
            group_max_jobs=env.integer("DUETIME_API_GROUP_MAX_JOBS", cls.group_max_jobs, 1, 1000),
            group_wait_ms=env.number("DUETIME_API_GROUP_WAIT_MS", cls.group_wait_ms, 0.0, 1000.0),
            workers=env.integer("DUETIME_API_WORKERS", cls.workers, 1, 64),
            allowed_hosts=hosts or None,
            allowed_origins=origins,
            allow_no_auth=env.flag("DUETIME_API_ALLOW_NO_AUTH", cls.allow_no_auth),
        )


def _origin(text: str) -> str:
    """``scheme://host[:port]`` in lower case, or a ConfigError naming the variable."""
    parts = urlsplit(text.lower().rstrip("/"))
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path or parts.query:
        raise ConfigError(
            f"DUETIME_API_ALLOWED_ORIGINS: {text!r} is not an origin (scheme://host[:port])",
            details={"variable": "DUETIME_API_ALLOWED_ORIGINS"},
        )
    return f"{parts.scheme}://{parts.netloc}"
