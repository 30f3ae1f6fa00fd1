"""``POST /v1/jobs`` served past FastAPI's routing and dependency solving: the create path.

The profile of the API at 350 creates/s (bench/README.md) put a third of the API's CPU a
create in the framework around the route: matching the path against every route, solving the
``/v1`` router's dependencies (bearer token, query check), validating and serializing the
answer through its response model, and the ASGI layers between. This plain ASGI middleware,
innermost of the app's own (inside ``ObserveRequests``, ``Guard`` and CORS, so they apply as
before), answers ``POST /v1/jobs`` itself by calling the same pieces FastAPI would call:

- the same bearer-token check (``deps.require_token`` with the same ``HTTPBearer``);
- the same route function (``jobs.create_job``) with a Request and a sub-Response, as FastAPI
  passes them, its status code and headers carried over the same way;
- the same response model (``JobCreatedOut``, defaults left out) for the body;
- the same exception handlers (``errors.install``), looked up as Starlette's
  ``ExceptionMiddleware`` looks them up; an exception none handles goes on up to
  ``ServerErrorMiddleware`` (500), as before.

A request with a query string goes the framework's way (its unknown-parameter 400 is the
framework's), as does every other route. The route stays declared in FastAPI for the OpenAPI
document. Measured: see bench/README.md, "The API's create path".
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from . import jobs
from .deps import check_token
from .jobs import create_job
from .schemas import JobCreatedOut

PATH = "/v1/jobs"


class FastCreate:
    def __init__(self, app: ASGIApp, api: FastAPI) -> None:
        self.app = app
        self.api = api
        self.route: APIRoute | None = None
        self.handlers: dict[Any, Any] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope.get("path") != PATH
            or scope.get("method") != "POST"
            or scope.get("type") != "http"
            or scope.get("query_string")
        ):
            await self.app(scope, receive, send)
            return
        route = self._route()
        scope.update(route=route)  # the route template ObserveRequests labels the request with
        request = Request(scope, receive)
        try:
            await check_token(request)
            sub = Response()
            del sub.headers["content-length"]
            sub.status_code = None  # type: ignore[assignment]  # as FastAPI: unset until set
            result = await create_job(request, sub)
            body = JobCreatedOut.model_validate(result).model_dump_json(exclude_defaults=True)
            response = Response(
                body, status_code=sub.status_code or route.status_code or 200,
                media_type="application/json",
            )  # fmt: skip
            response.headers.raw.extend(sub.headers.raw)
        except Exception as exc:
            handler = self._handler(exc)
            if handler is None:
                raise  # ServerErrorMiddleware answers it (500), as for any route
            response = await handler(request, exc)
        await response(scope, receive, send)

    def _route(self) -> APIRoute:
        """The APIRoute that declares ``create_job`` (its status code, its path for labels)."""
        if self.route is None:
            self.route = next(
                r
                for r in jobs.router.routes
                if isinstance(r, APIRoute) and r.endpoint is create_job
            )
        return self.route

    def _handler(self, exc: Exception) -> Any:
        """The app's handler of ``exc`` as Starlette's ExceptionMiddleware finds it (by the
        exception's classes, most specific first), the catch-all left to ServerErrorMiddleware;
        None when only the catch-all would answer."""
        if self.handlers is None:
            self.handlers = {
                k: v for k, v in self.api.exception_handlers.items() if k not in (500, Exception)
            }
        for cls in type(exc).__mro__:
            if cls in self.handlers:
                return self.handlers[cls]
        return None
