"""``duetime api``: serve the REST API with uvicorn."""

from __future__ import annotations

import argparse


def add_api_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=None, help="listen here (overrides DUETIME_API_HOST)")
    parser.add_argument("--port", type=int, default=None, help="overrides DUETIME_API_PORT")
    parser.add_argument(
        "--workers", type=int, default=None, help="processes (overrides DUETIME_API_WORKERS)"
    )
    parser.add_argument(
        "--allow-no-auth",
        action="store_true",
        default=None,
        help="serve without DUETIME_API_TOKENS on a non-loopback address: only behind a gateway "
        "that authenticates, or a port published on loopback (sets DUETIME_API_ALLOW_NO_AUTH)",
    )


def run_api(args: argparse.Namespace) -> int:
    import os
    from dataclasses import replace

    import uvicorn

    from duetime.core.collector import tune_collector
    from duetime.core.config import Env
    from duetime.core.logs import setup_logging
    from duetime.core.metrics_server import serve_metrics

    from .app import create_app
    from .server import HTTP_PROTOCOL, LOOP
    from .settings import ApiSettings

    settings = ApiSettings.from_env(Env())
    settings = replace(
        settings,
        host=args.host or settings.host,
        port=settings.port if args.port is None else args.port,
        workers=args.workers or settings.workers,
        allow_no_auth=bool(args.allow_no_auth) or settings.allow_no_auth,
    )
    setup_logging(settings.common.log_format, settings.common.log_level, role="api")
    # no tokens: loopback only (or an explicit gateway opt-out); a ConfigError names the
    # variables and `duetime` prints it and exits before anything listens
    settings.check_exposure()
    if settings.workers == 1:
        # the same registry as GET /metrics, on the port every role uses for Prometheus
        serve_metrics(settings.common.metrics_port, settings.common.metrics_host)
    if settings.workers > 1:
        # workers re-read the environment: pass the flags on through it
        os.environ["DUETIME_API_HOST"] = settings.host
        os.environ["DUETIME_API_PORT"] = str(settings.port)
        if settings.allow_no_auth:
            os.environ["DUETIME_API_ALLOW_NO_AUTH"] = "true"
        uvicorn.run(
            "duetime.producers.api.app:factory",
            factory=True,
            host=settings.host,
            port=settings.port,
            workers=settings.workers,
            http=HTTP_PROTOCOL,
            loop=LOOP,
            log_config=None,
            access_log=False,
        )
        return 0
    app = create_app(settings)
    tune_collector()  # (with --workers, each worker's factory does)
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        http=HTTP_PROTOCOL,
        loop=LOOP,
        log_config=None,
        access_log=False,
    )
    return 0
