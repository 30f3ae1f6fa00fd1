"""The scheduler's Prometheus metrics (documented in the README's metrics table)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

LATENESS_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

LATENESS = Histogram(
    "duetime_scheduler_emit_lateness_seconds",
    "Emit time minus due time of execution requests",
    ["priority"],
    buckets=LATENESS_BUCKETS,
)
EMITTED = Counter(
    "duetime_executions_emitted_total", "Execution requests emitted", ["priority", "trigger"]
)
DEAD_LETTERS = Counter("duetime_dead_letters_total", "Executions that ended dead")
TRANSACTIONS = Counter(
    "duetime_scheduler_transactions_total",
    "Scheduler transactions committed (one per partition and cycle with work)",
)
TXN_ABORTS = Counter(
    "duetime_transaction_aborts_total", "Scheduler transactions that failed", ["reason"]
)
POISON = Counter("duetime_poison_records_total", "Undecodable input records parked", ["topic"])
QUARANTINED = Counter(
    "duetime_scheduler_quarantined_jobs_total",
    "Jobs stopped (dead, with a dead letter) because the scheduler could not fire them",
)
PENDING = Gauge(
    "duetime_scheduler_pending_jobs", "Jobs with a wake-up time per owned partition", ["partition"]
)
OWNED = Gauge("duetime_scheduler_owned_partitions", "Partitions this scheduler owns")
RESTORING = Gauge(
    "duetime_scheduler_restoring_partitions",
    "Partitions assigned to this scheduler still being fenced and restored (not firing yet)",
)
FAIRNESS_HELD = Gauge(
    "duetime_scheduler_fairness_held",
    "Due executions held per owned partition because their fairness key has its cap in flight",
    ["partition"],
)
RESTORE_SECONDS = Histogram(
    "duetime_scheduler_restore_seconds", "Time to restore a partition from its changelog"
)
LOOP_ERRORS = Counter("duetime_scheduler_loop_errors_total", "Scheduler cycles that failed")
PARTITIONS = Gauge(
    "duetime_scheduler_partitions", "Partitions of the job-keyed topics (all of them, owned or not)"
)
CONSUMER_LAG = Gauge(
    "duetime_scheduler_consumer_lag",
    "Records of the scheduler's inputs not consumed yet, per topic (owned partitions)",
    ["topic"],
)
RESCUES = Counter(
    "duetime_scheduler_rescues_total",
    "Execution requests re-emitted because no result came by their deadline, by the "
    "execution's status then (queued: never started; running: its result never came)",
    ["status"],
)
SKIPPED = Counter(
    "duetime_scheduler_occurrences_skipped_total",
    "Scheduled (or backfilled) occurrences not run, by reason: calendar (the job's calendar "
    "excludes the date), overlap (overlap=skip or queue_one while an earlier run is live)",
    ["reason"],
)
LOST = Counter(
    "duetime_scheduler_lost_attempts_total",
    "Attempts failed with reason lost: no result through every rescue (the retry policy applies)",
)
CLOCK_OFFSET = Gauge(
    "duetime_scheduler_clock_offset_seconds",
    "This scheduler's wall clock minus the broker's (LogAppendTime of its clock probes; "
    "positive: ahead)",
)
CLOCK_ERROR = Gauge(
    "duetime_scheduler_clock_offset_error_seconds",
    "How far the last clock offset measurement may be off (half its round trip)",
)
CLOCK_PROBE_FAILURES = Counter(
    "duetime_scheduler_clock_probe_failures_total",
    "Clock probes that got no broker timestamp (firing stops once no verdict is fresh)",
)
FIRING = Gauge(
    "duetime_scheduler_firing",
    "1 while this scheduler fires due jobs; 0 while its clock is skewed or unchecked",
)
CLOCK_GIVE_UPS = Counter(
    "duetime_scheduler_clock_give_ups_total",
    "Times this scheduler left the group because its clock stayed skewed or unchecked",
)
STANDBY_PARTITIONS = Gauge(
    "duetime_scheduler_standby_partitions",
    "Partitions this scheduler follows as a warm standby (DUETIME_SCHEDULER_STANDBY): the ones "
    "it does not own",
)
STANDBY_RECORDS = Counter(
    "duetime_scheduler_standby_records_total",
    "Changelog records written into this scheduler's standby copies",
)
STANDBY_ERRORS = Counter(
    "duetime_scheduler_standby_errors_total",
    "Times the standby gave its copies up after an error and followed again from the start",
)
STANDBY_RESTORES = Counter(
    "duetime_scheduler_standby_restores_total",
    "Partitions taken from a standby copy (restored from its offset on, not from the start)",
)
