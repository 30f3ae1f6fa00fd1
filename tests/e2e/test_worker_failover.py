"""Workers as real processes: SIGKILL with 100 executions in flight, a SIGSTOPped zombie, and
SIGTERM hand-back, against the real broker and database and an HTTP sink on 127.0.0.1."""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from duetime.consumers.worker.leases import LeaseStore
from duetime.core.config import CommonSettings
from duetime.core.topics import Topics
from duetime.producers.sdk import JobClient
from tests.e2e.procs import Role, role_env
from tests.helpers import RunningScheduler, TopicReader, wait_for
from tests.integration.test_worker_support import Sink

ROOT = Path(__file__).resolve().parents[2]
NOW = {"at": "2020-01-01T00:00:00Z"}
SESSION_TIMEOUT_S = 3.0


def start_worker(settings: CommonSettings, name: str, **env: str) -> Role:
    extra = {
        "PYTHONPATH": str(ROOT),
        "DUETIME_WORKER_CONCURRENCY": "200",
        "DUETIME_WORKER_BUFFER": "400",
        "DUETIME_LEASE_TTL_S": "3",
        "DUETIME_SESSION_TIMEOUT_MS": str(int(SESSION_TIMEOUT_S * 1000)),
        **env,
    }
    return Role.start(name, ["worker"], role_env(settings, **extra))


def assigned(role: Role) -> bool:
    return "assigned" in role.log()


_NOW_RE = re.compile(r"partitions \(now (\d+)\)")


def partitions_of(role: Role) -> int:
    """How many partitions the worker said it holds in its last assignment or revocation."""
    counts = _NOW_RE.findall(role.log())
    return int(counts[-1]) if counts else 0


@pytest.fixture
def results(settings: CommonSettings) -> Iterator[TopicReader]:
    reader = TopicReader(settings, [Topics(settings.topic_prefix).results], "result")
    yield reader
    reader.close()


@pytest.fixture
def roles() -> Iterator[list[Role]]:
    started: list[Role] = []
    yield started
    for role in started:
        role.kill()


def by_execution(reader: TopicReader, status: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in reader.snapshot():
        if r["status"] == status:
            out.setdefault(r["execution_id"], []).append(r)
    return out


@pytest.mark.slow
def test_sigkill_with_100_in_flight_every_job_ends_with_one_effect(
    settings: CommonSettings,
    scheduler: RunningScheduler,
    sink: Sink,
    results: TopicReader,
    roles: list[Role],
) -> None:
    first = start_worker(settings, "worker-a")
    roles.append(first)
    wait_for(lambda: assigned(first), 30, "worker-a's assignment")
    rng = random.Random(4)
    sink.gate.clear()  # hold every request until the kill: all 100 are in flight then
    with JobClient(settings=settings) as client:
        jobs = [
            client.create_job(
                name=f"kill-{i}",
                schedule=NOW,
                target={"type": "http", "url": sink.url},
                payload={"sleep_s": round(rng.uniform(1, 3), 2), "gated": True},
                retry={"max_retries": 3, "base_delay_s": 0.2},
                wait=False,
            )
            for i in range(100)
        ]
    wait_for(lambda: len(sink.delivery_counts()) == 100, 30, "100 executions in flight")
    second = start_worker(settings, "worker-b")
    roles.append(second)
    wait_for(lambda: assigned(second), 30, "worker-b joining the group")
    # worker-b has been given half the partitions: it waits for worker-a's leases
    wait_for(lambda: "lease held by" in second.log(), 30, "worker-b meeting worker-a's leases")
    in_flight = set(sink.delivery_counts())
    assert len(in_flight) == 100 and not sink.effects
    first.kill()
    killed_at = time.time()
    sink.gate.set()  # the killed worker's requests now complete at the sink, unanswered

    def all_succeeded() -> dict[str, list[dict[str, Any]]]:
        got = by_execution(results, "success")
        return got if len(got) == 100 else {}

    success = wait_for(all_succeeded, 60, "a success for every execution")
    job_ids = {r[0]["job_id"] for r in success.values()}
    assert job_ids == {j.job_id for j in jobs}  # every job reached a terminal status: success
    # the downstream applied exactly one effect per execution (idempotency key)
    assert set(sink.effects) == set(success) and set(sink.effects.values()) == {1}
    # executions that were in flight on the killed worker ran again on the other one: visible
    running = by_execution(results, "running")
    rerun = {e for e in in_flight if any(r["worker_id"] == "worker-b" for r in running[e])}
    restarts = sorted(
        min(r["started_at_ms"] for r in running[e] if r["worker_id"] == "worker-b") / 1000
        - killed_at
        for e in rerun
    )
    deliveries = sink.delivery_counts()
    print(
        f"{len(in_flight)} in flight at the kill; {len(rerun)} re-executed by worker-b, "
        f"first after {restarts[0]:.2f} s, last after {restarts[-1]:.2f} s; "
        f"{sum(1 for n in deliveries.values() if n > 1)} executions delivered twice"
    )
    assert rerun == in_flight, "every execution in flight was run again by worker-b"
    for e in rerun:
        a_tokens = [r["lease_token"] for r in running[e] if r["worker_id"] == "worker-a"]
        assert all(r["lease_token"] > max(a_tokens, default=0) for r in success[e])
    # budget: failure detection (session timeout) + lease expiry (TTL 3 s) + a rebalance
    assert restarts[0] < SESSION_TIMEOUT_S + 3.0 + 3.0
    assert all(n <= 2 for n in deliveries.values())


@pytest.mark.slow
def test_a_stopped_zombie_is_fenced_out_and_its_result_never_counts(
    settings: CommonSettings,
    scheduler: RunningScheduler,
    sink: Sink,
    results: TopicReader,
    roles: list[Role],
) -> None:
    ttl = {"DUETIME_LEASE_TTL_S": "2"}
    workers = {name: start_worker(settings, name, **ttl) for name in ("worker-a", "worker-b")}
    roles.extend(workers.values())
    wait_for(lambda: all(assigned(r) for r in workers.values()), 30, "both assignments")
    wait_for(
        lambda: (
            all(partitions_of(r) for r in workers.values())
            and sum(partitions_of(r) for r in workers.values()) == 4 * settings.partitions
        ),
        30,
        "the two-member assignment to settle",
    )
    with JobClient(settings=settings) as client:
        job = client.create_job(
            name="zombie",
            schedule=NOW,
            target={"type": "http", "url": sink.url},
            payload={"sleep_s": 6},
        )
    [started] = wait_for(
        lambda: [r for r in results.snapshot() if r["job_id"] == job.job_id], 30, "a start"
    )
    zombie = workers[started["worker_id"]]
    survivor = next(r for r in workers.values() if r is not zombie)
    zombie.pause()  # SIGSTOP mid-run
    try:
        taken = wait_for(
            lambda: [
                r
                for r in results.snapshot()
                if r["job_id"] == job.job_id and r["worker_id"] == survivor.name
            ],
            30,
            "the survivor taking the execution over",
        )
        assert taken[0]["lease_token"] > started["lease_token"]
    finally:
        zombie.resume()  # SIGCONT: the zombie wakes up with a stale lease
    success = wait_for(
        lambda: [
            r for r in results.snapshot() if r["job_id"] == job.job_id and r["status"] == "success"
        ],
        30,
        "the execution's success",
    )
    # the zombie has woken up and found its lease taken: whatever it was going to report,
    # it has decided by now
    assert wait_for(lambda: "lease lost" in zombie.log(), 10, "the zombie noticing its loss")
    mine = [
        r
        for r in results.snapshot()
        if r["job_id"] == job.job_id
        and r["lease_token"] == started["lease_token"]
        and r["status"] != "running"
    ]
    assert mine == [], "the zombie reported an outcome with its stale token"
    assert {r["lease_token"] for r in success} == {taken[0]["lease_token"]}
    with psycopg.connect(settings.database_url) as conn:
        row = conn.execute(
            "SELECT owner, fencing_token, state, outcome FROM leases WHERE execution_id = %s",
            (started["execution_id"],),
        ).fetchone()
    assert row == (survivor.name, taken[0]["lease_token"], "done", "success")

    # the zombie's token is refused wherever it would write
    async def stale_writes() -> tuple[set[str], bool]:
        store = LeaseStore(settings.database_url, zombie.name, 2.0)
        await store.open()
        try:
            held = [(started["execution_id"], started["lease_token"])]
            lost = await store.renew(held)
            completed = await store.complete(*held[0], "success", b"zombie")
            return lost, completed
        finally:
            await store.close()

    lost, completed = asyncio.run(stale_writes())
    assert lost == {started["execution_id"]} and completed is False
    assert sink.effects[started["execution_id"]] == 1


@pytest.mark.slow
def test_sigterm_finishes_short_work_and_hands_long_work_back(
    settings: CommonSettings,
    scheduler: RunningScheduler,
    sink: Sink,
    results: TopicReader,
    roles: list[Role],
) -> None:
    env = {"DUETIME_LEASE_TTL_S": "30", "DUETIME_WORKER_SHUTDOWN_S": "1.5"}
    first = start_worker(settings, "worker-a", **env)
    roles.append(first)
    wait_for(lambda: assigned(first), 30, "worker-a's assignment")
    with JobClient(settings=settings) as client:
        short = client.create_job(
            name="short",
            schedule=NOW,
            target={"type": "http", "url": sink.url},
            payload={"sleep_s": 0.5},
        )
        long = client.create_job(
            name="long",
            schedule=NOW,
            target={"type": "http", "url": sink.url},
            payload={"sleep_s": 8},
        )
    wait_for(lambda: len(sink.delivery_counts()) == 2, 30, "both running on worker-a")
    second = start_worker(settings, "worker-b", **env)
    roles.append(second)
    wait_for(lambda: assigned(second), 30, "worker-b joining")
    stopped_at, stopped_wall = time.monotonic(), time.time()
    assert first.stop(timeout_s=20) == 0
    stop_s = time.monotonic() - stopped_at
    assert "handed 1 unfinished executions back" in first.log()
    assert "worker stopped" in first.log()

    def final(job_id: str) -> list[dict[str, Any]]:
        """The job's success results, one per attempt: a request redelivered after its lease
        was done republishes the recorded result (at-least-once publication, same token)."""
        by_token = {
            r["lease_token"]: r
            for r in results.snapshot()
            if r["job_id"] == job_id and r["status"] == "success"
        }
        return list(by_token.values())

    [short_done] = wait_for(lambda: final(short.job_id), 20, "the short job's success")
    assert short_done["worker_id"] == "worker-a"  # finished within the shutdown deadline
    [long_done] = wait_for(lambda: final(long.job_id), 30, "the long job's success")
    assert long_done["worker_id"] == "worker-b"
    restart_s = long_done["started_at_ms"] / 1000 - stopped_wall
    print(
        f"worker-a stopped in {stop_s:.1f} s; worker-b restarted the handed-back job "
        f"{restart_s:.1f} s after the SIGTERM"
    )
    assert restart_s < 15, "the released lease did not make worker-b wait for its 30 s TTL"
