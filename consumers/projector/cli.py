"""``duetime projector``: run one projector process (``--rebuild`` replays into empty tables)."""

from __future__ import annotations

import argparse


def add_projector_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rebuild",
        action="store_true",
        help="empty the projection (jobs, executions, DAGs, DLQ) and replay every topic from "
        "its beginning; stop the other projectors first",
    )
    parser.add_argument(
        "--until-caught-up",
        action="store_true",
        help="exit once every partition is read to its end (for scripts and rebuilds)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus metrics here (overrides DUETIME_METRICS_PORT)",
    )


def run_projector(args: argparse.Namespace) -> int:
    import signal

    from duetime.core.collector import tune_collector
    from duetime.core.config import Env
    from duetime.core.logs import setup_logging
    from duetime.core.metrics_server import serve_metrics

    from .service import Projector
    from .settings import ProjectorSettings

    settings = ProjectorSettings.from_env(Env())
    setup_logging(settings.common.log_format, settings.common.log_level, role="projector")
    serve_metrics(
        args.metrics_port if args.metrics_port is not None else settings.common.metrics_port,
        settings.common.metrics_host,
    )
    projector = Projector(settings)
    tune_collector()
    signal.signal(signal.SIGTERM, projector.stop)
    signal.signal(signal.SIGINT, projector.stop)
    if args.rebuild:
        projector.rebuild()
    projector.run(until_caught_up=args.until_caught_up)
    return 0
