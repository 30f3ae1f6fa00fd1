"""Serve a role's Prometheus metrics (port 0 = do not serve).

The address is ``DUETIME_METRICS_HOST`` (``CommonSettings.metrics_host``, default 127.0.0.1):
loopback keeps the metrics private on a shared host; a container sets ``0.0.0.0`` so that a
Prometheus on another container can scrape it.
"""

from __future__ import annotations

import logging

from prometheus_client import start_http_server

log = logging.getLogger("duetime.metrics")


def serve_metrics(port: int, host: str = "127.0.0.1") -> None:
    if port:
        start_http_server(port, addr=host)
        log.info("metrics on http://%s:%s/metrics", host, port)
