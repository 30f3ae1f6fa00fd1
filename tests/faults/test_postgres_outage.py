"""PostgreSQL stopped during load (issue 8): the roles back off and recover, nothing is lost or
doubled, and the projection converges to what a rebuild from the log gives.

A scheduler (no PostgreSQL), two workers (leases in PostgreSQL) and a projector run while
one-time jobs fall due; PostgreSQL is stopped (a clean shutdown: every connection is refused
until it is back) for 15 s in CI, 60 s at full size, then started again. Every job must reach
the sink once; the roles must still be running; the projection's checksum must equal the
checksum after ``duetime projector --rebuild`` replays every topic into the same tables.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from duetime.consumers.projector.store import checksums
from tests.faults.harness import (
    FaultStack,
    Scenario,
    size,
    utc_ms,
    wait_for,
    write_figures,
)
from tests.faults.support import lateness_vs_schedule_ms

SIZES: dict[str, dict[str, Any]] = {
    "ci": {"jobs": 200, "spread_s": 20, "down_s": 15},
    "full": {"jobs": 3000, "spread_s": 180, "down_s": 60},
}
WORKER_ENV = {"DUETIME_WORKER_CONCURRENCY": "50", "DUETIME_LEASE_TTL_S": "5"}


def rebuild_checksums(scenario: Scenario) -> dict[str, tuple[int, str]]:
    rebuild = scenario.role(
        "projector-rebuild", ["projector", "--rebuild", "--until-caught-up"]
    ).spawn()
    try:
        assert rebuild.process.wait(180) == 0, rebuild.log()[-3000:]
    finally:
        rebuild.kill()
    with psycopg.connect(scenario.settings.database_url) as conn:
        return checksums(conn)


@pytest.mark.slow
def test_postgres_outage_roles_recover_and_projection_matches_a_rebuild(
    new_scenario: Callable[..., Scenario], fault_stack: FaultStack
) -> None:
    sized = SIZES[size()]
    n = sized["jobs"]
    scenario = new_scenario("postgres-outage", effects=True, terminal=True)
    roles = [
        scenario.start_role("scheduler"),
        scenario.start_role("worker", "worker-1", **WORKER_ENV),
        scenario.start_role("worker", "worker-2", **WORKER_ENV),
        scenario.start_role("projector"),
    ]
    scenario.schedulers_own_all(1)
    scenario.workers_assigned()
    start = datetime.now(UTC) + timedelta(seconds=3)
    with scenario.job_client() as client:
        for i in range(n):
            at = start + timedelta(seconds=sized["spread_s"] * i / n)
            created = client.create_job(
                name=f"pg-{i}",
                schedule={"at": at.isoformat()},
                target={"type": "http", "url": scenario.sink.url},
                payload={"i": i, "sleep_s": 0.2},
                retry={"max_retries": 5, "base_delay_s": 1, "max_delay_s": 5},
                wait=False,
            )
            scenario.record_job(created, [utc_ms(at)])
        client.flush()
    wait_for(lambda: scenario.sink.effects() >= n // 4, 120, f"{n // 4} effects before the stop")
    with scenario.fault("postgres-down"):
        fault_stack.stop_postgres()
        time.sleep(sized["down_s"])  # the outage's duration: the fault itself, not a settling
        fault_stack.start_postgres()
    wait_for(lambda: scenario.sink.effects() >= n, 300, f"all {n} effects after the outage", 1.0)
    exited = {r.name: r.log()[-2000:] for r in roles if not r.running}
    assert not exited, f"roles exited during the outage: {exited}"
    report = scenario.finish()
    with psycopg.connect(scenario.settings.database_url) as conn:
        live = checksums(conn)
    rebuilt = rebuild_checksums(scenario)
    config = {
        **sized,
        "partitions": scenario.settings.partitions,
        "roles": [r.name for r in roles],
        "worker_env": WORKER_ENV,
        "projection_rows": {t: c for t, (c, _) in live.items()},
        "projection_matches_rebuild": live == rebuilt,
        "max_lateness_vs_schedule_ms": lateness_vs_schedule_ms(scenario),
    }
    write_figures("postgres-outage", report, size(), config)
    print("figures:", report.figures(), "config:", config)
    assert report.ok, report.summary()
    assert report.figures()["lost"] == 0 and report.effects == n
    assert live == rebuilt, {t: (live[t], rebuilt[t]) for t in live if live[t] != rebuilt[t]}
