"""Small things several of the fault scenarios share."""

from __future__ import annotations

from tests.faults.harness import Scenario


def lateness_vs_schedule_ms(scenario: Scenario) -> float:
    """Max of (first 2xx delivery - the time the job asked for). The checker measures from
    the request's ``due_at_ms``, which a misfired occurrence (fired late after a partition
    changed hands) resets to its emission: this one is what a user waiting for the job sees."""
    events = scenario.history.events()
    first: dict[str, int] = {}
    for e in events:
        if e["kind"] == "delivery" and 200 <= e["status"] < 300:
            first[e["job_id"]] = min(first.get(e["job_id"], e["at_ms"]), e["at_ms"])
    late = [
        first[e["job_id"]] - e["expect_ms"][0]
        for e in events
        if e["kind"] == "job" and e["expect_ms"] and e["job_id"] in first
    ]
    return float(max(late, default=0))
