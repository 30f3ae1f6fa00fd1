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

from .pagination import BadRequest

log = logging.getLogger("duetime.api")


class Unauthorized(DuetimeError):
    code = "unauthorized"


class Unavailable(RetryableError):
    """Kafka or PostgreSQL did not answer in time (REST 503)."""

    code = "unavailable"


_STATUS: tuple[tuple[type[DuetimeError], int], ...] = (
    (BadRequest, 400),
    (Unauthorized, 401),
    (NotFound, 404),
    (Conflict, 409),
    (PayloadTooLarge, 413),
    (ValidationError, 422),
    (RetryableError, 503),
)

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


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
