"""Lost executions (issue 14, item 2): a member of the workers' group that takes execution
requests and commits their offsets without running them (``commit``), or that first claims
their leases in PostgreSQL, as a worker about to run them, and never renews them (``claim``:
a holder that died after committing past its offset), beside real workers, while one-time
jobs fall due. The requests it swallowed are never seen by a real worker; the scheduler's
rescuer re-emits each once its deadline passes (timeout + lease TTL + grace) and the real
workers run it: every job must still have exactly one effect.

The only duplicate requests allowed are the rescuer's copies (same execution id and attempt),
each matched by a "rescued" line of the scheduler's log; anything else fails the check.
CI size: 300 jobs over 15 s; full size (``./run faults``): 3,000 jobs over 60 s.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from confluent_kafka import Consumer

from duetime.core.kafka import kip848_consumer
from tests.faults.harness import Scenario, size, utc_ms, wait_for, write_figures

SIZES = {
    "ci": {"jobs": 300, "spread_s": 15, "swallow_s": 8},
    "full": {"jobs": 3000, "spread_s": 60, "swallow_s": 30},
}
TIMEOUT_S = 5
LEASE_TTL_S = "3"
# the scheduler's rescue window is then 5 + 3 + 2 = 10 s
SCHEDULER_ENV = {"DUETIME_LEASE_TTL_S": LEASE_TTL_S, "DUETIME_SCHEDULER_RESCUE_GRACE_S": "2"}
SWALLOWER_TTL_S = 12.0
"""The swallower's lease TTL: longer than the rescue window, so a copy meets a held lease."""
WORKER_ENV = {"DUETIME_WORKER_CONCURRENCY": "50", "DUETIME_LEASE_TTL_S": LEASE_TTL_S}


class Swallower:
    """A consumer in the workers' group that commits what it is given and runs nothing: the
    requests of its partitions vanish. With ``claim``, it first claims each lease (with the
    workers' own LeaseStore) and never renews nor completes it: the first copy finds the
    lease held (its TTL outlasts the rescue window), waits for it to expire, takes it over and
    runs; a later copy finds it done and has the result republished."""

    def __init__(self, scenario: Scenario, mode: str) -> None:
        self.mode = mode
        self.database_url = scenario.settings.database_url
        self.consumer: Consumer = kip848_consumer(
            scenario.settings, f"{scenario.settings.topic_prefix}workers"
        )
        self.consumer.subscribe(scenario.topics.executions)
        self.swallowed: set[str] = set()
        self.assigned = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="swallower", daemon=True)

    def start(self) -> Swallower:
        self._thread.start()
        return self

    def _run(self) -> None:
        asyncio.run(self._swallow())

    async def _swallow(self) -> None:
        from duetime.consumers.worker.leases import LeaseStore
        from duetime.core.records import ExecutionRequest
        from duetime.schemas.codec import Codec

        codec = Codec()
        leases = LeaseStore(self.database_url, "swallower", SWALLOWER_TTL_S)
        await leases.open()
        try:
            while not self._stop.is_set():
                if self.consumer.assignment():
                    self.assigned.set()
                msg = self.consumer.poll(0.2)
                if msg is None or msg.error() is not None or msg.value() is None:
                    continue
                request = codec.load(ExecutionRequest, msg.value() or b"", topic=msg.topic())
                if self.mode == "claim":  # a copy of one it holds is swallowed as well
                    await leases.claim(request.execution_id, request.attempt, request.job_id)
                self.swallowed.add(request.execution_id)
                self.consumer.commit(message=msg, asynchronous=False)
        finally:
            await leases.close()
            self.consumer.close()  # leaves the group: its partitions go to the real workers

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def create_jobs(scenario: Scenario, n: int, start: datetime, spread_s: float) -> None:
    with scenario.job_client() as client:
        for i in range(n):
            at = start + timedelta(seconds=spread_s * i / n)
            created = client.create_job(
                name=f"lost-{i}",
                schedule={"at": at.isoformat()},
                target={"type": "http", "url": scenario.sink.url},
                payload={"sleep_s": 0.1, "i": i},
                retry={"max_retries": 5, "base_delay_s": 1, "max_delay_s": 5},
                timeout_s=TIMEOUT_S,
                wait=False,
            )
            scenario.record_job(created, [utc_ms(at)])
        client.flush()


def rescue_copies(scenario: Scenario) -> tuple[Counter[tuple[str, int]], int]:
    """Copies beyond the first per (execution id, attempt) seen by the recorder, and how
    many "rescued" lines the schedulers logged."""
    requests = [e for e in scenario.history.events() if e["kind"] == "request"]
    per_attempt = Counter((r["execution_id"], r["attempt"]) for r in requests)
    copies = Counter({k: n - 1 for k, n in per_attempt.items() if n > 1})
    logged = sum(s.log().count(" rescued (") for s in scenario.of_kind("scheduler"))
    return copies, logged


def explained(scenario: Scenario, copies: Counter[tuple[str, int]]) -> list[Any]:
    """The copies no "rescued" line of the scheduler accounts for (must be none)."""
    log = "".join(s.log() for s in scenario.of_kind("scheduler"))
    return [
        (eid, attempt, n)
        for (eid, attempt), n in copies.items()
        if log.count(f"execution {eid} attempt {attempt} rescued (") < n
    ]


@pytest.mark.parametrize("mode", ["commit", "claim"])
def test_swallowed_requests_are_rescued_and_run_exactly_once(
    new_scenario: Callable[..., Scenario], mode: str
) -> None:
    sized = SIZES[size()]
    n = sized["jobs"]
    name = "lost-execution" if mode == "commit" else "lost-execution-claimed"
    scenario = new_scenario(name, effects=True, terminal=True)
    scenario.start_role("scheduler", **SCHEDULER_ENV)
    scenario.start_role("projector")
    for i in range(2):
        scenario.start_role("worker", f"worker-{i + 1}", **WORKER_ENV)
    scenario.schedulers_own_all(1)
    scenario.workers_assigned()
    swallower = Swallower(scenario, mode).start()
    wait_for(swallower.assigned.is_set, 90, "the swallower to get partitions")
    start = datetime.now(UTC) + timedelta(seconds=3)
    create_jobs(scenario, n, start, sized["spread_s"])

    with scenario.fault("swallowing-member"):
        wait_for(
            lambda: datetime.now(UTC) >= start + timedelta(seconds=sized["swallow_s"]),
            sized["swallow_s"] + 60,
            "the swallowing phase",
        )
        swallower.stop()
    swallowed = len(swallower.swallowed)
    assert swallowed > 0, "the swallower got no request: the scenario tested nothing"
    wait_for(lambda: scenario.sink.effects() >= n, 300, f"{n} effects", interval_s=1)
    report = scenario.finish()

    copies, logged = rescue_copies(scenario)
    unexplained = explained(scenario, copies)
    # the rescuer's copies are the one legitimate kind of repeated request: judged against
    # the scheduler's log, then taken out of the checker's duplicates
    if not unexplained:
        report.duplicate_requests = [d for d in report.duplicate_requests if "execution_ids" in d]
    # with claim, the copies met the swallower's held lease and waited for it to expire
    lease_waits = sum(w.log().count("lease held by swallower") for w in scenario.of_kind("worker"))
    config: dict[str, Any] = {
        "mode": mode,
        "lease_waits": lease_waits,
        "workers": 2,
        "swallowed": swallowed,
        "rescued_copies": sum(copies.values()),
        "rescue_log_lines": logged,
        "spread_s": sized["spread_s"],
        "swallow_s": sized["swallow_s"],
        "timeout_s": TIMEOUT_S,
        "scheduler_env": SCHEDULER_ENV,
        "worker_env": WORKER_ENV,
        "partitions": scenario.settings.partitions,
    }
    write_figures(name, report, size(), config)
    print("figures:", report.figures(), "config:", config)
    assert unexplained == [], f"repeated requests without a rescue: {unexplained[:5]}"
    assert report.ok, report.summary()
    assert report.figures()["lost"] == 0 and report.effects == n
    assert report.figures()["duplicate_effects"] == 0
    # every swallowed execution came back through a rescue
    assert logged >= swallowed
    assert (lease_waits > 0) == (mode == "claim")
