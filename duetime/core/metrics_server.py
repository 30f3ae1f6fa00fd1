"""Serve a role's Prometheus metrics on 127.0.0.1 (port 0 = do not serve)."""

from __future__ import annotations

import logging

from prometheus_client import start_http_server

log = logging.getLogger("duetime.metrics")


def serve_metrics(port: int, host: str = "127.0.0.1") -> None:
    if port:
        start_http_server(port, addr=host)
        log.info("metrics on http://%s:%s/metrics", host, port)
