"""``duetime scheduler``: run one scheduler process."""

from __future__ import annotations

import argparse
import gc
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from duetime.core.clock import Clock

GC_GENERATION0 = 50_000
"""Allocations between two collections of the cyclic collector's youngest generation."""


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
    from duetime.core.config import Env
    from duetime.core.logs import setup_logging
    from duetime.core.metrics_server import serve_metrics

    from .service import run
    from .settings import SchedulerSettings

    # the cyclic collector's first generation every 50,000 allocations instead of 700: the
    # scheduler keeps ~15 objects a near-term job decoded (store.py), and a burst allocates
    # ~100 a fire, so the default ran a collection every few fires and a full one, over every
    # kept object, every few hundred (measured: 16,000 fires in one partition cost 68-80 us
    # each instead of 90). Cycles are rare here (reference counting frees the rest)
    gc.set_threshold(GC_GENERATION0, *gc.get_threshold()[1:])
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
