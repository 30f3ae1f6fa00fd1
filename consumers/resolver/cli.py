"""``duetime resolver``: run one DAG resolver process (a faust-streaming worker)."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

SHUTDOWN_DEADLINE_S = 20.0
"""faust's shutdown waits for the broker (offset commits, producer flush); with the broker gone
it would wait forever. Past this deadline the process exits anyway: the resolver is
at-least-once, so what it had not committed is processed again by the next owner."""


def _exit_after(deadline_s: float) -> None:
    import logging
    import os
    import threading

    def watchdog() -> None:
        logging.getLogger("duetime.resolver").error(
            "shutdown did not finish within %.0f s: exiting", deadline_s
        )
        os._exit(1)

    timer = threading.Timer(deadline_s, watchdog)
    timer.daemon = True
    timer.start()


def add_resolver_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus metrics here (overrides DUETIME_METRICS_PORT)",
    )


def run_resolver(args: argparse.Namespace) -> int:
    import faust

    from duetime.core.collector import tune_collector
    from duetime.core.config import Env
    from duetime.core.logs import setup_logging
    from duetime.core.metrics_server import serve_metrics
    from duetime.infra.topics import create_topics, requested_replication

    from .app import build_app
    from .settings import ResolverSettings

    settings = ResolverSettings.from_env(Env())
    common = settings.common

    class Worker(faust.Worker):
        """faust's worker with duetime's logging (no banner, no stdout redirection)."""

        def _setup_logging(self) -> None:
            setup_logging(common.log_format, common.log_level, role="resolver")

        def _on_sigterm(self) -> None:
            _exit_after(SHUTDOWN_DEADLINE_S)
            super()._on_sigterm()

        def _on_sigint(self) -> None:
            _exit_after(SHUTDOWN_DEADLINE_S)
            super()._on_sigint()

    setup_logging(common.log_format, common.log_level, role="resolver")
    serve_metrics(
        args.metrics_port if args.metrics_port is not None else common.metrics_port,
        common.metrics_host,
    )
    # DUETIME_REPLICATION_FACTOR unset: min(3, brokers), as duetime topics create
    create_topics(common, settings.own_topics(), requested_replication(Env(), common))
    with tempfile.TemporaryDirectory(prefix="duetime-resolver-") as data_dir:
        app = build_app(settings, Path(data_dir))
        worker: Any = Worker(app, quiet=True, redirect_stdouts=False, loglevel=common.log_level)
        tune_collector()
        try:
            worker.execute_from_commandline()  # runs until SIGTERM / SIGINT, then stops cleanly
        except SystemExit as exc:
            return int(exc.code or 0)
    return 0
