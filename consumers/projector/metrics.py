"""Prometheus metrics of the projector (names are part of the documented metrics list)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

EVENTS = Counter("duetime_projector_events_total", "Events consumed, by event type", ["event_type"])
ROWS = Counter("duetime_projector_rows_total", "Rows upserted (after per-batch reduction)")
BATCHES = Counter("duetime_projector_batches_total", "PostgreSQL transactions committed")
FAILED_BATCHES = Counter(
    "duetime_projector_failed_batches_total", "Batches rolled back and retried after a rewind"
)
UNDECODABLE = Counter(
    "duetime_projector_undecodable_total", "Records skipped because they did not decode"
)
BATCH_SECONDS = Histogram(
    "duetime_projector_batch_seconds",
    "Time to write one batch to PostgreSQL",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
LAG_SECONDS = Gauge(
    "duetime_projector_lag_seconds",
    "How far the projection is behind: the oldest event of the last batch, Kafka timestamp to "
    "commit (0 while idle)",
)
EVENT_LAG_SECONDS = Histogram(
    "duetime_projector_event_lag_seconds",
    "From an event's Kafka timestamp to the commit of its projection (sampled per batch)",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
PARTITIONS_DROPPED = Counter(
    "duetime_projector_partitions_dropped_total", "Daily execution partitions dropped (retention)"
)
ASSIGNED = Gauge("duetime_projector_assigned_partitions", "Topic partitions this process owns")
DLQ_DEPTH = Gauge(
    "duetime_dlq_depth", "Dead-lettered executions not replayed yet (refreshed every 15 s)"
)
