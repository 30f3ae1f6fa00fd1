"""The resolver's Prometheus metrics (names and labels are part of the documented list)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

EVENTS = Counter(
    "duetime_resolver_events_total",
    "DAG-run events handled by the resolver, by kind (started, retry, node_cancelled, running, "
    "failed, success, dead).",
    ["kind"],
)
COMMANDS = Counter(
    "duetime_resolver_commands_total",
    "Control commands sent by the resolver, by kind (release, skip, dag_run_end, replay).",
    ["kind"],
)
RUNS_COMPLETED = Counter(
    "duetime_resolver_runs_completed_total",
    "DAG runs that ended, by outcome (success, failed, cancelled); a redelivery may count one "
    "twice, and a repaired run ends again.",
    ["outcome"],
)
REPAIRS = Counter(
    "duetime_resolver_repairs_total",
    "Requests to repair a DAG run, by result: repaired (jobs released again), "
    "nothing_to_repair (already being repaired, or nothing dead), run_not_held (unknown, "
    "succeeded or past DUETIME_RESOLVER_REPAIR_RETENTION_S), replayed_alone (a member's replay "
    "for a run not held, handed back as a plain replay); a redelivery may count one twice.",
    ["result"],
)
BAD_RECORDS = Counter(
    "duetime_resolver_bad_records_total",
    "Input records the resolver could not decode (skipped; the scheduler parks them).",
    ["topic"],
)
RELEASE_DELAY = Histogram(
    "duetime_resolver_release_delay_seconds",
    "From an upstream's success (worker's finished_at) to the release of its dependant.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1, 2.5, 5, 10),
)
