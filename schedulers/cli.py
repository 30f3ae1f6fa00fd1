"""``duetime scheduler``: run one scheduler process."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from duetime.core.clock import Clock


def add_scheduler_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus metrics here (overrides DUETIME_METRICS_PORT)",
    )


def run_scheduler(args: argparse.Namespace, clock: Clock | None = None) -> int:
    """``clock``: the system clock unless given (tests/offset_clock.py starts a scheduler
    whose wall clock is off, the way an operator's badly set clock would be)."""
    from duetime.core import tracing
    from duetime.core.collector import tune_collector
    from duetime.core.config import Env
    from duetime.core.logs import setup_logging
    from duetime.core.metrics_server import serve_metrics

    from .service import run
    from .settings import SchedulerSettings

    # the scheduler keeps ~15 objects a near-term job decoded (store.py), and a burst allocates
    # ~100 a fire: with the default the collector ran every few fires and a full collection,
    # over every kept object, every few hundred (measured: 16,000 fires in one partition cost
    # 68-80 us each instead of 90)
    tune_collector()
    settings = SchedulerSettings.from_env(Env())
    setup_logging(settings.common.log_format, settings.common.log_level, role="scheduler")
    serve_metrics(
        args.metrics_port if args.metrics_port is not None else settings.common.metrics_port,
        settings.common.metrics_host,
    )
    # spans only with the otel extra and an exporter in OTEL_* (duetime/core/tracing.py)
    tracing.configure("scheduler")
    try:
        return run(settings, clock)
    finally:
        tracing.shutdown()  # export what is buffered
