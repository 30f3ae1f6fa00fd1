"""Every error answer has API.md's body ``{"error": {"code", "message", "details"}}``.

duetime's own errors map to their status here (validation 422, payload 413, unknown id 404,
illegal state change 409, Kafka unavailable 503); FastAPI's and Starlette's own errors
(unknown route, bad query parameter) are rewritten to the same shape.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from psycopg_pool import PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from duetime.core.errors import (
    Conflict,
    DuetimeError,
    NotFound,
    PayloadTooLarge,
    RetryableError,
    ValidationError,
)
from duetime.core.redact import escape_control, redact_text

from .pagination import BadRequest

log = logging.getLogger("duetime.api")


class Unauthorized(DuetimeError):
    code = "unauthorized"


class UnsupportedMediaType(DuetimeError):
    """A request body that is not declared application/json (REST 415)."""

    code = "unsupported_media_type"


class PreconditionFailed(Conflict):
    """An ``If-Match`` revision that is no longer the job's current one (REST 412)."""

    code = "precondition_failed"


class Unavailable(RetryableError):
    """Kafka or PostgreSQL did not answer in time (REST 503)."""

    code = "unavailable"


_STATUS: tuple[tuple[type[DuetimeError], int], ...] = (
    (BadRequest, 400),
    (Unauthorized, 401),
    (NotFound, 404),
    (PreconditionFailed, 412),
    (Conflict, 409),
    (PayloadTooLarge, 413),
    (UnsupportedMediaType, 415),
    (ValidationError, 422),
    (RetryableError, 503),
)

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    403: "forbidden",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


def _suspect_field(request: Request) -> str:
    """The query parameter most likely at fault (one holding a control character), or ''."""
    for key, value in request.query_params.multi_items():
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
            return key
    return ""


def status_of(exc: DuetimeError) -> int:
    for kind, status in _STATUS:
        if isinstance(exc, kind):
            return status
    return 400


def body(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details or {}}}


def install(app: FastAPI) -> None:
    @app.exception_handler(DuetimeError)
    async def _duetime(request: Request, exc: DuetimeError) -> JSONResponse:
        status = status_of(exc)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        if status >= 500:
            log.warning("%s %s: %s", request.method, request.url.path, exc.message)
        return JSONResponse(exc.to_body(), status_code=status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _request_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"field": ".".join(str(p) for p in e.get("loc", ())), "message": e.get("msg", "")}
            for e in exc.errors()
        ]
        first = errors[0] if errors else {"field": "", "message": "invalid request"}
        return JSONResponse(
            body(
                "bad_request",
                f"{first['field']}: {first['message']}",
                {"field": first["field"], "errors": errors},
            ),
            status_code=400,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(exc.status_code, "error")
        return JSONResponse(
            body(code, str(exc.detail)),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(psycopg.DataError)
    async def _database_refused_input(request: Request, exc: psycopg.DataError) -> JSONResponse:
        # a value PostgreSQL cannot hold or compare (a NUL, a timestamp out of its range, a
        # number too large): the request's fault, whatever check let it through
        reason = escape_control(redact_text(str(getattr(exc.diag, "message_primary", None) or exc)))
        log.info("%s %s: refused by PostgreSQL: %s", request.method, request.url.path, reason)
        return JSONResponse(
            body(
                "bad_request",
                f"a value of this request cannot be stored or compared: {reason}"[:300],
                {"field": _suspect_field(request)},
            ),
            status_code=400,
        )

    @app.exception_handler(OverflowError)
    async def _overflow(request: Request, exc: OverflowError) -> JSONResponse:
        # only input reaches a number or date this far out of range (a 400-digit integer,
        # a timestamp whose offset moves it past year 9999)
        log.info("%s %s: out of range: %s", request.method, request.url.path, exc)
        return JSONResponse(
            body("bad_request", f"a number or time is out of range: {exc}"[:300], {}),
            status_code=400,
        )

    @app.exception_handler(psycopg.OperationalError)
    @app.exception_handler(PoolTimeout)
    async def _database_down(request: Request, exc: Exception) -> JSONResponse:
        log.warning("%s %s: PostgreSQL unavailable: %s", request.method, request.url.path, exc)
        return JSONResponse(
            body("unavailable", "PostgreSQL did not answer; try again", {}), status_code=503
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return JSONResponse(body("internal", "internal error; see the API's log"), 500)
