"""The FastAPI application: resources opened in the lifespan, routers, errors, metrics.

``create_app(settings)`` builds an app (nothing is connected until it starts);
``factory()`` builds one from the environment, for ``uvicorn --factory`` and workers > 1.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Response
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from psycopg_pool import AsyncConnectionPool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from duetime import __version__
from duetime.core import kafka
from duetime.core.clock import SYSTEM_CLOCK, Clock
from duetime.core.collector import tune_collector
from duetime.core.config import Env
from duetime.core.redact import redact_text
from duetime.producers.sdk import JobClient

from . import (
    backfill,
    batch,
    calendars,
    cluster,
    dags,
    dlq,
    docs,
    errors,
    jobs,
    metrics,
    openapi,
    stats,
    store,
    ui,
)
from .deps import Res, Resources, no_unknown_query, require_token
from .fastcreate import FastCreate
from .group import CreateGroups
from .guard import Guard
from .schemas import ErrorBody, Health
from .settings import ApiSettings, is_loopback
from .writer import Writer

log = logging.getLogger("duetime.api")

DESCRIPTION = """duetime's REST API (see API.md). Writes go to Kafka through the SDK's
validation; reads come from the PostgreSQL projection. Every error has the body
`{"error": {"code", "message", "details"}}`."""


def create_app(settings: ApiSettings, *, clock: Clock = SYSTEM_CLOCK) -> FastAPI:
    """The app; ``clock`` is the one wall clock of its writes and reads (``Resources.now``)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            settings.common.database_url,
            min_size=min(2, settings.pool_size),
            max_size=settings.pool_size,
            kwargs={"autocommit": True, "connect_timeout": 5},
            timeout=settings.db_timeout_s,  # waiting for a connection: then 503
            configure=store.configure,  # JSON too deep to decode safely is not decoded
            open=False,
        )
        await pool.open(wait=False)
        client = JobClient(
            settings=settings.common,
            max_payload_bytes=settings.max_payload_bytes,
            clock=clock,
            # an event the request stopped waiting for (503) is dropped, not written later
            timeout_s=settings.publish_timeout_s,
        )
        writer = Writer(client, settings.publish_timeout_s)
        # one admin client for the process: each one holds its own broker connections and
        # threads (a new one per /readyz grew the API from 11 to 39 threads over 80 calls)
        admin = kafka.admin(settings.common)
        groups = None
        if settings.group_max_jobs > 1:
            groups = CreateGroups(
                pool, writer, client, settings.group_max_jobs, settings.group_wait_ms / 1000
            )
        app.state.resources = Resources(settings, pool, client, writer, admin, groups=groups)
        log.info(
            "api ready on http://%s:%s (answers for hosts %s)",
            settings.host,
            settings.port,
            ", ".join(settings.hosts()),
        )
        if not settings.tokens:
            log.warning(
                "api runs without authentication (DUETIME_API_TOKENS is not set)%s",
                " on loopback only"
                if is_loopback(settings.host)
                else " behind a gateway that must authenticate (DUETIME_API_ALLOW_NO_AUTH)",
            )
        try:
            yield
        finally:
            if groups is not None:  # creates already taken are written before Kafka closes
                await groups.close(settings.publish_timeout_s)
            writer.close()
            await pool.close()

    app = FastAPI(
        title="duetime",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # served from the package by docs.install (FastAPI's uses a CDN)
        redoc_url=None,
    )
    errors.install(app)
    # a dependency added here must also run in fastcreate.py, which serves POST /v1/jobs
    # without solving them (tests/integration/test_api_fastcreate.py compares both paths)
    v1 = APIRouter(prefix="/v1", dependencies=[Depends(require_token), Depends(no_unknown_query)])
    v1.include_router(batch.router, tags=["jobs"])  # before /jobs/{job_id}: its own path
    v1.include_router(jobs.router, tags=["jobs"])
    v1.include_router(backfill.router, tags=["jobs"])
    v1.include_router(calendars.router, tags=["calendars"])
    v1.include_router(dags.router, tags=["dags"])
    v1.include_router(dlq.router, tags=["dlq"])
    v1.include_router(stats.router, tags=["stats"])
    v1.include_router(cluster.router, tags=["cluster"])
    app.include_router(v1)
    _operations(app)
    ui.install(app)
    docs.install(app)
    openapi.install(app)

    # innermost of the app's own middleware: POST /v1/jobs past FastAPI's routing and
    # dependency solving (the same checks, route, model and error handlers: fastcreate.py)
    app.add_middleware(FastCreate, api=app)
    if settings.allowed_origins:
        # the listed foreign origins may call the API from a browser (a JSON body needs a
        # CORS preflight); the Guard below has already refused every other origin's writes
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.allowed_origins),
            allow_methods=["GET", "POST", "PATCH", "DELETE"],
            allow_headers=["Authorization", "Content-Type"],
            max_age=600,
        )
    app.add_middleware(Guard, settings=settings)
    app.add_middleware(ObserveRequests)
    return app


class ObserveRequests:
    """Counts and times every request by route template (a plain ASGI middleware: Starlette's
    BaseHTTPMiddleware would copy every response through a memory stream)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", "unmatched")
            if scope["path"].startswith("/v1/") and not path.startswith("/v1"):
                path = "/v1" + path  # routes of the /v1 router carry their own path only
            metrics.REQUESTS.labels(scope["method"], path, str(status)).inc()
            metrics.LATENCY.labels(scope["method"], path).observe(time.perf_counter() - started)


def _operations(app: FastAPI) -> None:
    @app.get("/healthz", response_model=Health, tags=["operations"], summary="liveness")
    async def healthz() -> dict[str, Any]:
        return {"status": "ok", "checks": {}}

    @app.get(
        "/readyz",
        response_model=Health,
        responses={503: {"model": ErrorBody, "description": "Kafka or PostgreSQL unreachable"}},
        tags=["operations"],
        summary="readiness: Kafka and PostgreSQL reachable",
    )
    async def readyz(res: Res) -> Any:
        checks = dict(
            zip(
                ("postgresql", "kafka"),
                await asyncio.gather(_check_pg(res), _check_kafka(res)),
                strict=True,
            )
        )
        if all(v == "ok" for v in checks.values()):
            return {"status": "ok", "checks": checks}
        failing = ", ".join(k for k, v in checks.items() if v != "ok")
        return JSONResponse(
            errors.body("unavailable", f"not ready: {failing} unreachable", {"checks": checks}),
            status_code=503,
        )

    @app.get(
        "/metrics",
        tags=["operations"],
        summary="Prometheus metrics",
        response_class=Response,
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
    )
    async def prometheus() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


async def _check_pg(res: Resources) -> str:
    try:
        async with asyncio.timeout(2.0), res.pool.connection() as conn:
            await conn.execute("SELECT 1")
        return "ok"
    except Exception as exc:
        return f"unreachable: {redact_text(str(exc))}"[:200]


async def _check_kafka(res: Resources) -> str:
    def probe() -> str:
        md = res.admin.list_topics(res.client.topics.jobs, timeout=2.0)
        topic = md.topics.get(res.client.topics.jobs)
        if topic is None or topic.error is not None:
            return f"topic {res.client.topics.jobs} missing"
        return "ok"

    # one probe at a time: callers arriving while one runs share its answer, so a flood of
    # /readyz (or a hung broker) cannot pile up threads
    if res.kafka_probe is None or res.kafka_probe.done():
        res.kafka_probe = asyncio.ensure_future(asyncio.wait_for(asyncio.to_thread(probe), 3.0))
    try:
        return await asyncio.shield(res.kafka_probe)
    except Exception as exc:
        return f"unreachable: {redact_text(str(exc)) or type(exc).__name__}"[:200]


def factory() -> FastAPI:
    """Each ``--workers`` process's app (uvicorn imports it by name)."""
    settings = ApiSettings.from_env(Env())
    settings.check_exposure()
    app = create_app(settings)
    tune_collector()
    return app
