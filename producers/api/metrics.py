"""Prometheus metrics of the API (names are part of the documented metrics list)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

REQUESTS = Counter(
    "duetime_api_requests_total", "HTTP requests answered", ["method", "route", "status"]
)
LATENCY = Histogram(
    "duetime_api_request_seconds",
    "Time to answer a request",
    ["method", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
)
