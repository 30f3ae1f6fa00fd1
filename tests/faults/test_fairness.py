"""Fairness keys under a backlog and a worker crash (issue 18, item 4: the issue's proof).

Tenant A's backlog (100,000 jobs at full size, 5,000 at CI size) falls due at once; once it is
running, tenant B's jobs fall due one at a time, a quarter of a second apart. Two workers run them;
one is SIGKILLed halfway through B's jobs and restarted. The sink records when each call
arrived, so for every B job the scenario counts the A calls that arrived between the B job's
due time and its own call: the executions it waited behind. Without fairness that is the A
requests ahead of it in its execution partition (about A's remaining backlog / partitions);
with it, at most the scheduler's cap of A requests per partition are out of the scheduler,
and the workers serve keys round-robin.

Every job must have exactly one effect (0 lost, 0 duplicate effects: the campaign's checker).
Figures: bench/results/faults-fairness(-ci).json.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from duetime.producers.sdk import JobCreated
from tests.faults.harness import Scenario, size, utc_ms, wait_for, write_figures

SIZES = {
    "ci": {"backlog": 5000, "b_jobs": 10},
    "full": {"backlog": 100_000, "b_jobs": 20},
}
CAP = 32  # the default DUETIME_SCHEDULER_FAIRNESS_INFLIGHT, stated for the figures
SLEEP_S = 0.05
B_LEAD_S = 1.0
# B jobs come 4 a second: on a quiet machine two workers run off 2,000 A jobs in ~3 s, and at one
# B a second the later B jobs found no backlog left to be fair against (the scenario asserts
# that the backlog was still there when the last B job came)
B_PACE_S = 0.25
"""A B job is created this long before its due time (the checker expects its occurrence)."""
WORKER_ENV = {
    "DUETIME_WORKER_CONCURRENCY": "50",
    "DUETIME_WORKER_BUFFER": "1000",
    "DUETIME_LEASE_TTL_S": "3",
    "DUETIME_WORKER_SHUTDOWN_S": "3",
}


def spec(scenario: Scenario, tenant: str, at: datetime) -> dict[str, Any]:
    return {
        "schedule": {"at": at.isoformat()},
        "target": {"type": "http", "url": scenario.sink.url},
        "payload": {"tenant": tenant, "sleep_s": SLEEP_S},
        "fairness": {"key": "{payload.tenant}"},
        "retry": {"max_retries": 5, "base_delay_s": 1, "max_delay_s": 5},
        "timeout_s": 300,
    }


def expected_ms(created: JobCreated, due: datetime) -> list[int]:
    """A one-time job is due at max(at, created_at): on a loaded machine some of a large
    backlog are created after their ``at`` and run off it."""
    return [max(utc_ms(due), created.definition.created_at_ms)]


def arrivals(scenario: Scenario) -> list[tuple[int, str]]:
    """(arrival ms, job_id) of every call the sink received, in arrival order."""
    calls = [
        (int(e["at_ms"]), str(e["job_id"]))
        for e in scenario.history.events()
        if e.get("kind") == "delivery"
    ]
    return sorted(calls)


def first_requests(scenario: Scenario) -> dict[str, dict[str, Any]]:
    """job_id → its first execution request as the recorder read it (partition, emitted_at)."""
    out: dict[str, dict[str, Any]] = {}
    for e in scenario.history.events():
        if e.get("kind") == "request":
            out.setdefault(str(e["job_id"]), e)
    return out


def ahead_at_emission(
    b: str, requests: dict[str, dict[str, Any]], first_call: dict[str, int], a_ids: set[str]
) -> tuple[int, int]:
    """(A requests in B's execution partition, A requests in all) emitted before B's request
    and not yet called when it was emitted: what B's request found ahead of it."""
    mine = requests[b]
    at = int(mine["emitted_at_ms"])
    ahead = [
        requests[a]
        for a in a_ids
        if a in requests and int(requests[a]["emitted_at_ms"]) <= at < first_call.get(a, 2**62)
    ]
    return sum(1 for r in ahead if r["partition"] == mine["partition"]), len(ahead)


def test_a_backlog_of_one_tenant_delays_another_by_a_few_executions(
    new_scenario: Callable[..., Scenario],
) -> None:
    sized = SIZES[size()]
    backlog, b_jobs = sized["backlog"], sized["b_jobs"]
    scenario = new_scenario("fairness", effects=True, terminal=True)
    scenario.start_role("scheduler")
    scenario.start_role("projector")
    workers = [scenario.start_role("worker", f"worker-{i + 1}", **WORKER_ENV) for i in range(2)]
    scenario.schedulers_own_all(1)
    scenario.workers_assigned()
    # every A job created before its due time (a job created past it runs off the occurrence)
    lead_s = 5 + backlog / 250
    due_a = (datetime.now(UTC) + timedelta(seconds=lead_s)).replace(microsecond=0)
    a_ids: set[str] = set()
    with scenario.job_client() as client:
        for i in range(backlog):
            created = client.create_job(name=f"a-{i}", wait=False, **spec(scenario, "a", due_a))
            scenario.record_job(created, expected_ms(created, due_a))
            a_ids.add(created.job_id)
        client.flush()
    wait_for(lambda: scenario.sink.effects() >= 200, 600, "tenant A's backlog to be running")

    b_due: dict[str, int] = {}
    victim = workers[0]
    with scenario.job_client() as client:
        for i in range(b_jobs):
            due_b = datetime.now(UTC) + timedelta(seconds=B_LEAD_S)
            created = client.create_job(name=f"b-{i}", **spec(scenario, f"b{i}", due_b))
            scenario.record_job(created, expected_ms(created, due_b))
            b_due[created.job_id] = expected_ms(created, due_b)[0]
            if i == b_jobs // 2:
                with scenario.fault(f"sigkill-{victim.name}"):
                    victim.kill()
                    victim.spawn()
            time.sleep(B_PACE_S)  # the scenario's pace
    victim.wait_log("assigned", 90, since_start=True)
    a_left_at_last_b = backlog - sum(1 for _, job in arrivals(scenario) if job in a_ids)
    total = backlog + b_jobs
    run_s = 600 if size() == "ci" else 7200  # 100,000 calls of 50 ms on two workers, loaded
    wait_for(lambda: scenario.sink.effects() >= total, run_s, f"{total} effects", interval_s=2)
    report = scenario.finish()

    calls = arrivals(scenario)
    first_call: dict[str, int] = {}
    for at_ms, job in calls:
        first_call.setdefault(job, at_ms)
    waited = sorted(
        len([job for at_ms, job in calls if job in a_ids and due_ms <= at_ms < first_call[b]])
        for b, due_ms in b_due.items()
    )
    start_ms = sorted(first_call[b] - due_ms for b, due_ms in b_due.items())
    # what FIFO would have made each B job wait behind: the A calls still to come at its due
    a_left_at_b_due = sorted(
        len([job for at_ms, job in calls if job in a_ids and at_ms >= due_ms])
        for due_ms in b_due.values()
    )
    requests = first_requests(scenario)
    ahead = [ahead_at_emission(b, requests, first_call, a_ids) for b in b_due]
    figures = {
        **report.figures(),
        "a_calls_before_each_b_call": waited,
        "a_calls_before_b_max": max(waited),
        "a_calls_before_b_p50": statistics.median(waited),
        "b_start_after_due_ms_p50": statistics.median(start_ms),
        "b_start_after_due_ms_max": max(start_ms),
        "a_backlog_left_when_the_last_b_was_created": a_left_at_last_b,
        "a_calls_still_to_come_at_each_b_due": a_left_at_b_due,
        "a_requests_ahead_of_b_in_its_partition_max": max(p for p, _ in ahead),
        "a_requests_ahead_of_b_in_all_partitions_max": max(n for _, n in ahead),
    }
    config: dict[str, Any] = {
        "backlog": backlog,
        "b_jobs": b_jobs,
        "workers": 2,
        "worker_env": WORKER_ENV,
        "fairness_inflight": CAP,
        "sleep_s": SLEEP_S,
        "sigkilled": victim.name,
    }
    write_figures("fairness", figures, size(), config)
    print("figures:", figures)
    assert report.ok, report.summary()
    assert report.figures()["lost"] == 0 and report.effects == total
    # the backlog was still there: without fairness B would have waited behind it
    assert a_left_at_last_b > backlog // 4, a_left_at_last_b
    # the scheduler's part: a B request never finds more than the cap of A requests ahead of
    # it in its execution partition (without fairness: A's whole remaining share there)
    assert all(in_partition <= CAP for in_partition, _ in ahead), ahead
    # the whole: a B job waits behind the A calls that arrive while the scheduler and a worker
    # pass it on (its own pipeline latency x A's throughput: seconds on a loaded machine, while
    # A's calls go on in every slot), a part of what FIFO would make it wait behind (all of
    # A's calls still to come: the worker reads the partitions side by side)
    assert max(waited) * 2 <= min(a_left_at_b_due), (waited, a_left_at_b_due)
