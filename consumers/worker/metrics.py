"""The worker's Prometheus metrics (version 2; documented in the README's metrics table).

Names and labels are part of the contract, like the schemas: add freely, never rename.
Version 2: every metric with a ``priority`` label has a ``queue`` label too (the queue of the
execution topic the request came from: one of the worker's ``DUETIME_WORKER_QUEUES``, so its
values are bounded by the configuration, never by what a record says).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

LATENESS_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800, 3600)

START_LATENESS = Histogram(
    "duetime_worker_start_lateness_seconds",
    "Start of an attempt minus the time it became due",
    ["queue", "priority"],
    buckets=LATENESS_BUCKETS,
)
STARTED = Counter(
    "duetime_worker_executions_started_total",
    "Attempts started (lease claimed)",
    ["queue", "priority"],
)
FINISHED = Counter(
    "duetime_worker_executions_finished_total",
    "Attempts finished and reported, by outcome",
    ["queue", "priority", "status", "reason"],
)
DURATION = Histogram(
    "duetime_worker_execution_seconds",
    "How long targets ran",
    ["queue", "priority"],
    buckets=DURATION_BUCKETS,
)
INFLIGHT = Gauge("duetime_worker_inflight", "Executions running now (slots in use)")
BUFFERED = Gauge(
    "duetime_worker_buffered", "Fetched executions not finished yet (queued, running, reporting)"
)
QUEUED = Gauge("duetime_worker_queued", "Executions waiting for a slot", ["queue", "priority"])
REPORTING = Gauge(
    "duetime_worker_reporting", "Runs finished and not reported yet (lease completion, result)"
)
REPORTS_WAITING = Gauge(
    "duetime_worker_reports_waiting",
    "Finished runs' reports waiting for the starts (DUETIME_WORKER_REPORT_DEFER_S)",
)
PAUSED = Gauge("duetime_worker_paused_partitions", "Assigned partitions paused (buffer full)")
LEASE_CONFLICTS = Counter(
    "duetime_worker_lease_conflicts_total",
    "Claims refused: busy (held elsewhere), done (already finished), stale (newer attempt)",
    ["kind"],
)
LEASES_LOST = Counter(
    "duetime_worker_leases_lost_total",
    "Leases taken over by another worker while this one held them (result not reported)",
)
LEASE_BATCH_SECONDS = Histogram(
    "duetime_worker_lease_batch_seconds",
    "Round trip of one lease statement (a batch)",
    ["op"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5),
)
LEASE_BATCH_SIZE = Histogram(
    "duetime_worker_lease_batch_size",
    "Leases per batched statement",
    ["op"],
    buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500),
)
DB_ERRORS = Counter(
    "duetime_worker_db_errors_total", "Lease statements retried because PostgreSQL failed", ["op"]
)
CONSUMER_LAG = Gauge(
    "duetime_worker_consumer_lag",
    "Records behind the end of the assigned partitions (not yet finished), per topic",
    ["topic"],
)
POISON = Counter(
    "duetime_worker_poison_records_total", "Undecodable execution requests parked", ["topic"]
)
REPUBLISHED = Counter(
    "duetime_worker_results_republished_total",
    "Recorded results published again for a redelivered, already finished execution",
)
ABANDONED_THREADS = Gauge(
    "duetime_worker_abandoned_threads", "Threads of timed-out sync tasks still running"
)
LOOP_ERRORS = Counter("duetime_worker_loop_errors_total", "Failed housekeeping iterations")
ABANDONED_TASKS = Gauge(
    "duetime_worker_abandoned_tasks",
    "Coroutine tasks the worker cancelled (timeout, lost lease, shutdown) still not finished",
)
TARGET_ERRORS = Counter(
    "duetime_worker_target_errors_total",
    "Attempts failed by an unexpected error in the worker's own target code (a bug: logged)",
)
HANDLING_ERRORS = Counter(
    "duetime_worker_handling_errors_total",
    "Execution requests whose handling raised unexpectedly and were parked on the poison "
    "topic (stage: accept = decoding and checks, execute = lease, run and report)",
    ["stage"],
)
CANCELLED = Counter(
    "duetime_worker_cancelled_total",
    "Attempts stopped by a cancel request read from their lease, by where they were",
    ["stage"],
)
EXPIRED = Counter(
    "duetime_worker_expired_total",
    "Attempts not run because they could not start within their job's start_within_s "
    "(reported expired)",
    ["queue", "priority"],
)
EARLY = Counter(
    "duetime_worker_early_arrivals_total",
    "Execution requests fetched before their due time by this worker's clock, by what the "
    "worker did: waited (outside the slots) or handed_back (beyond "
    "DUETIME_WORKER_MAX_EARLY_WAIT_S: left to the scheduler's rescuer, not run)",
    ["action"],
)
EARLY_SECONDS = Histogram(
    "duetime_worker_early_arrival_seconds",
    "How long before its due time an early execution request arrived",
    buckets=(0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600),
)
LIMIT_WAITING = Gauge(
    "duetime_worker_limit_waiting",
    "Executions waiting for a limit per key (outside the slots, without a lease), by reason: "
    "concurrency (no free slot of their key) or rate (no token in their key's bucket)",
    ["reason"],
)
LIMIT_REFUSED = Counter(
    "duetime_worker_limit_refusals_total",
    "Lease claims refused by a limit per key, by reason (concurrency, rate)",
    ["reason"],
)
LIMIT_WAIT_SECONDS = Histogram(
    "duetime_worker_limit_wait_seconds",
    "How long an execution a limit held back waited for its slot or token",
    buckets=LATENESS_BUCKETS,
)
