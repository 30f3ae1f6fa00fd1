"""What every route needs: the app's resources, the bearer-token check, JSON bodies, ids."""

from __future__ import annotations

import hmac
import json
import math
import uuid
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from psycopg_pool import AsyncConnectionPool

from duetime.core.errors import NotFound, PayloadTooLarge, ValidationError
from duetime.producers.sdk import JobClient

from .errors import Unauthorized
from .pagination import BadRequest
from .settings import ApiSettings
from .writer import Writer


@dataclass
class Resources:
    settings: ApiSettings
    pool: AsyncConnectionPool[Any]
    client: JobClient
    writer: Writer


def resources(request: Request) -> Resources:
    res: Resources = request.app.state.resources
    return res


Res = Annotated[Resources, Depends(resources)]
"""A route parameter that receives the app's resources."""

_bearer = HTTPBearer(auto_error=False, description="one of DUETIME_API_TOKENS, when set")


async def require_token(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    tokens = resources(request).settings.tokens
    if not tokens:
        return
    given = b"" if credentials is None else credentials.credentials.encode()
    # compare against every token (no early exit) so the timing says nothing
    ok = False
    for token in tokens:
        ok |= hmac.compare_digest(given, token.encode())
    if credentials is None or credentials.scheme.lower() != "bearer" or not ok:
        raise Unauthorized("a valid bearer token is required (Authorization: Bearer <token>)")


def _query_names(dependant: Any) -> set[str]:
    names = {p.alias for p in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


async def no_unknown_query(request: Request) -> None:
    """A query parameter the route does not declare is a mistake worth a 400, not silence."""
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


async def read_json(request: Request, limit_bytes: int) -> Any:
    """The request's JSON body, read with a size bound: 413 above it, 400 if malformed."""
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
    try:
        body = json.loads(raw, parse_float=_finite, parse_constant=_no_constants)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise BadRequest(f"malformed JSON: {exc}"[:300]) from None
    lowered = raw.lower()
    if b"\\u0000" in lowered:
        raise ValidationError("strings may not contain NUL (\\u0000)", field="")
    if b"\\ud" in lowered:  # a lone surrogate cannot be stored as UTF-8
        try:
            json.dumps(body, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise BadRequest("malformed JSON: unpaired surrogate in a string") from None
    return body


def parse_id(value: str, what: str) -> str:
    """A path id; anything but a UUID names nothing we have (404)."""
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise NotFound(f"no {what} {value!r}", details={f"{what}_id": value}) from None
