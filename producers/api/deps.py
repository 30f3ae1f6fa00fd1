"""What every route needs: the app's resources, the bearer-token check, JSON bodies, ids."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

from confluent_kafka.admin import AdminClient
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from psycopg_pool import AsyncConnectionPool

from duetime.core.errors import DuetimeError, NotFound, PayloadTooLarge, ValidationError
from duetime.core.redact import escape_control
from duetime.producers.sdk import JobClient

from .errors import Unauthorized, UnsupportedMediaType
from .group import CreateGroups
from .guard import json_media_type, unsupported_media_type
from .jsondepth import deep_field, exceeds_depth, string_path
from .pagination import BadRequest
from .settings import ApiSettings
from .writer import Writer

log = logging.getLogger("duetime.api")
T = TypeVar("T")


@dataclass
class Resources:
    settings: ApiSettings
    pool: AsyncConnectionPool[Any]
    client: JobClient
    writer: Writer
    admin: AdminClient
    """The process's one Kafka admin client (readiness, consumer lag)."""
    kafka_probe: asyncio.Future[str] | None = None
    """The readiness probe of Kafka in flight, shared by concurrent /readyz calls."""
    cron_slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(2))
    """Cron evaluations (next_runs) running at once in threads; the others wait their turn."""
    cluster_describe: asyncio.Future[Any] | None = None
    """The describe of the cluster in flight (GET /v1/cluster), shared by concurrent calls."""
    groups: CreateGroups | None = None
    """The group committer of single creates (None: each create in its own transaction)."""

    def now(self) -> datetime:
        """Wall-clock time from the SDK client's Clock (the one Clock of the process)."""
        return datetime.fromtimestamp(self.client.clock.now_ms() / 1000, tz=UTC)


def resources_of(request: Request) -> Resources:
    """The app's resources, for a route that reads them itself (no dependency to solve)."""
    res: Resources = request.app.state.resources
    return res


async def resources(request: Request) -> Resources:
    # async on purpose: FastAPI runs a plain-def dependency in its thread pool, a thread hop
    # (queue, condition, wake-up) on every request for an attribute read (~6 % of a create's
    # CPU, profiled)
    return resources_of(request)


Res = Annotated[Resources, Depends(resources)]
"""A route parameter that receives the app's resources."""

_bearer = HTTPBearer(auto_error=False, description="one of DUETIME_API_TOKENS, when set")


async def require_token(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    tokens = resources_of(request).settings.tokens
    if not tokens:
        return
    given = b"" if credentials is None else credentials.credentials.encode()
    # compare against every token (no early exit) so the timing says nothing
    ok = False
    for token in tokens:
        ok |= hmac.compare_digest(given, token.encode())
    if credentials is None or credentials.scheme.lower() != "bearer" or not ok:
        raise Unauthorized("a valid bearer token is required (Authorization: Bearer <token>)")


async def check_token(request: Request) -> None:
    """``require_token`` as the ``/v1`` router's dependency runs it, for a caller that solves
    no dependencies (``fastcreate``)."""
    await require_token(request, await _bearer(request))


def _query_names(dependant: Any) -> set[str]:
    names = {p.alias for p in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


async def no_unknown_query(request: Request) -> None:
    """A query parameter the route does not declare is a mistake worth a 400, not silence;
    so is a control character (NUL above all: PostgreSQL cannot hold it) in any value."""
    for key, value in request.query_params.multi_items():
        if _CONTROL_RE.search(key) or _CONTROL_RE.search(value):
            field = key if not _CONTROL_RE.search(key) else "query"
            raise BadRequest(
                f"query parameter {escape_control(key)[:100]!s} holds a control character "
                "(NUL, newline, ...)",
                details={"field": field},
            )
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None or not request.query_params:
        return
    allowed = _query_names(dependant)
    unknown = sorted(set(request.query_params) - allowed)
    if unknown:
        raise BadRequest(
            f"unknown query parameter(s): {', '.join(repr(u) for u in unknown)[:200]}",
            details={"field": "query", "allowed": sorted(allowed)},
        )


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is out of range")
    return value


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


async def read_json(request: Request, settings: ApiSettings) -> Any:
    """The request's JSON body: 415 unless it is declared ``application/json``, 413 above
    ``max_body_bytes``, 400 when malformed or nested deeper than ``max_json_depth`` (checked
    on the bytes, before the parser recurses into it)."""
    content_type = request.headers.get("content-type")
    if not json_media_type(content_type):
        _, _, message, details = unsupported_media_type(content_type)
        raise UnsupportedMediaType(message, details=details)
    limit_bytes = settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit_bytes:
        raise PayloadTooLarge(
            f"request body of {declared} bytes is over the limit of {limit_bytes}",
            details={"size_bytes": int(declared), "limit_bytes": limit_bytes},
        )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit_bytes:
            raise PayloadTooLarge(
                f"request body is over the limit of {limit_bytes} bytes",
                details={"limit_bytes": limit_bytes},
            )
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        raise BadRequest("a JSON body is required")
    if len(raw) > _INLINE_BYTES:  # large bodies: scanned and parsed beside the event loop
        body = await asyncio.to_thread(_parse, raw, settings.max_json_depth)
    else:
        body = _parse(raw, settings.max_json_depth)
    lowered = raw.lower()
    if b"\\u0000" in lowered:  # PostgreSQL cannot hold NUL in text or jsonb
        where = string_path(body, lambda text: "\x00" in text) or ""
        raise ValidationError(
            f"{escape_control(where) or 'a string'}: strings may not contain NUL (\\u0000)",
            field=where,
        )
    if b"\\ud" in lowered:  # a lone surrogate cannot be stored as UTF-8
        surrogate = string_path(body, _unpaired_surrogate)
        if surrogate is not None:
            raise BadRequest(
                f"malformed JSON: unpaired surrogate in a string ({escape_control(surrogate)})",
                details={"field": surrogate},
            )
    return body


def _unpaired_surrogate(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return True
    return False


_INLINE_BYTES = 64 * 1024


def _parse(raw: bytes, max_depth: int) -> Any:
    if exceeds_depth(raw, max_depth):
        where = deep_field(raw, max_depth)
        raise BadRequest(
            f"{escape_control(where) or 'the JSON body'} nests deeper than {max_depth} levels "
            "(DUETIME_API_MAX_JSON_DEPTH)",
            details={"field": where, "max_depth": max_depth},
        )
    try:
        return json.loads(raw, parse_float=_finite, parse_constant=_no_constants)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise BadRequest(f"malformed JSON: {exc}"[:300]) from None


def validated(build: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``build(*args, **kwargs)``, a pure validation of request input: an arithmetic or value
    error escaping it (a 400-digit integer, a date past year 9999) was caused by the input,
    so it is a 422 naming what broke, never a 500. Logged with its traceback: a check is
    missing upstream."""
    try:
        return build(*args, **kwargs)
    except DuetimeError:
        raise
    except (OverflowError, ValueError, TypeError, RecursionError) as exc:
        log.warning("validation let %s through", type(exc).__name__, exc_info=exc)
        raise ValidationError(
            f"a value is out of range or of the wrong kind: {type(exc).__name__}: {exc}"[:300],
            field="",
        ) from None


def parse_id(value: str, what: str) -> str:
    """A path id; anything but a UUID names nothing we have (404)."""
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise NotFound(f"no {what} {value!r}", details={f"{what}_id": value}) from None
