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
GROUP_SIZE = Histogram(
    "duetime_api_create_group_size",
    "Single creates written in one transaction (group commit of POST /v1/jobs)",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000),
)
GROUP_STAGE_SECONDS = Histogram(
    "duetime_api_create_group_stage_seconds",
    "Time a group of creates spent per stage: queued (its oldest create, until the group "
    "started), insert (a connection, BEGIN, the INSERTs), kafka (every event acknowledged), "
    "commit",
    ["stage"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
)
