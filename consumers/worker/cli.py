"""``duetime worker``: run one worker process."""

from __future__ import annotations

import argparse


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus metrics here (overrides DUETIME_METRICS_PORT)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="executions at once (overrides DUETIME_WORKER_CONCURRENCY)",
    )
    parser.add_argument(
        "--imports",
        default=None,
        help="comma-separated modules with @duetime.task functions "
        "(overrides DUETIME_WORKER_IMPORTS)",
    )


def run_worker(args: argparse.Namespace) -> int:
    import os

    from duetime.core import tracing
    from duetime.core.collector import tune_collector
    from duetime.core.config import Env
    from duetime.core.logs import setup_logging
    from duetime.core.metrics_server import serve_metrics

    from .policy import secrets_from_environ
    from .service import run
    from .settings import WorkerSettings

    environ = dict(os.environ)
    if args.concurrency is not None:
        environ["DUETIME_WORKER_CONCURRENCY"] = str(args.concurrency)
    if args.imports is not None:
        environ["DUETIME_WORKER_IMPORTS"] = args.imports
    # the secrets are read here, once, with everything else (policy.secrets_from_environ)
    settings = WorkerSettings.from_env(Env(environ), secrets=secrets_from_environ(environ))
    setup_logging(settings.common.log_format, settings.common.log_level, role="worker")
    serve_metrics(
        args.metrics_port if args.metrics_port is not None else settings.common.metrics_port,
        settings.common.metrics_host,
    )
    # spans only with the otel extra and an exporter in OTEL_* (duetime/core/tracing.py)
    tracing.configure("worker")
    tune_collector()  # a collection's pause is a pause of every start due in it
    try:
        return run(settings)
    finally:
        tracing.shutdown()  # export what is buffered
