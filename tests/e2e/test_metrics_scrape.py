"""Every role, run as a real process, exports the metrics the README lists (issue 7).

The roles run one job end to end, then each /metrics endpoint is scraped; a metric counts as
exported when its ``# TYPE`` line is there (labelled metrics without samples yet still
declare themselves).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from duetime.core.config import CommonSettings
from duetime.infra.harness import scrape
from duetime.infra.process import free_port
from duetime.producers.sdk import JobClient
from tests.e2e.procs import Role, role_env
from tests.helpers import wait_for

EXPECTED = {
    "scheduler": {
        "duetime_scheduler_emit_lateness_seconds",
        "duetime_executions_emitted_total",
        "duetime_dead_letters_total",
        "duetime_transaction_aborts_total",
        "duetime_scheduler_pending_jobs",
        "duetime_scheduler_owned_partitions",
        "duetime_scheduler_partitions",
        "duetime_scheduler_consumer_lag",
        "duetime_poison_records_total",
    },
    "worker": {
        "duetime_worker_start_lateness_seconds",
        "duetime_worker_executions_started_total",
        "duetime_worker_executions_finished_total",
        "duetime_worker_inflight",
        "duetime_worker_reporting",
        "duetime_worker_reports_waiting",
        "duetime_worker_consumer_lag",
        "duetime_worker_lease_conflicts_total",
    },
    "resolver": {"duetime_resolver_events_total", "duetime_resolver_commands_total"},
    "projector": {"duetime_projector_lag_seconds", "duetime_dlq_depth"},
    "api": {"duetime_api_requests_total"},
}


@pytest.fixture
def roles(settings: CommonSettings) -> Iterator[dict[str, tuple[Role, int]]]:
    started: dict[str, tuple[Role, int]] = {}
    try:
        for name in EXPECTED:
            port = free_port()
            extra = {"DUETIME_METRICS_PORT": str(port)}
            if name == "api":
                extra = {"DUETIME_API_PORT": str(port), "DUETIME_METRICS_PORT": "0"}
            if name == "worker":
                extra["DUETIME_WORKER_IMPORTS"] = "duetime.demo"
            started[name] = (Role.start(name, [name], role_env(settings, **extra)), port)
        yield started
    finally:
        for role, _ in started.values():
            role.stop(10)


def test_every_role_exports_its_metrics(
    settings: CommonSettings, roles: dict[str, tuple[Role, int]]
) -> None:
    with JobClient(settings=settings) as client:
        client.create_job(
            name="scrape-me",
            schedule={"at": datetime.now(UTC).isoformat()},
            target={"type": "python", "ref": "duetime.demo:hello"},
        )
    for name, (role, port) in roles.items():
        # fails at once, with the role's log, if the role exits instead
        text = role.wait_metrics(port, 60)
        declared = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
        missing = EXPECTED[name] - declared
        assert not missing, f"{name} does not export {sorted(missing)}"
    # the job ran end to end: the worker counted a finished execution
    wait_for(
        lambda: "duetime_worker_executions_finished_total{" in (scrape(roles["worker"][1]) or ""),
        60,
        "the worker to report the job's execution",
    )
