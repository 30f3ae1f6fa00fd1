"""The worker's start gate against the real broker and database (issue 14, items 4 and 8).

Requests are produced straight to an execution topic (no scheduler), so each test sets the
due time and the window it needs:

- a request whose window has already passed is claimed, reported ``expired`` (not retryable)
  and never run; one inside its window runs;
- a request that arrives before its due time by the worker's clock starts no earlier than
  its due time, without holding a slot meanwhile (a concurrency-1 worker runs due work while
  the early one waits); one further ahead than ``max_early_wait_s`` is handed back unrun and
  its offset committed.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer
from prometheus_client import REGISTRY

from duetime.core.cancel import flag_cancelled_jobs
from duetime.core.config import CommonSettings
from duetime.core.topics import Topics
from duetime.schemas.codec import Codec
from tests.helpers import TopicReader, wait_for
from tests.integration import test_worker_support as support
from tests.integration.test_worker import committed, final, start_worker
from tests.integration.test_worker_support import RunningWorker

TRACKED = "tests.integration.test_worker_support:tracked"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Requests:
    def __init__(self, settings: CommonSettings) -> None:
        self.topic = Topics(settings.topic_prefix).execution("normal")
        self.codec = Codec()
        self.producer = Producer({"bootstrap.servers": settings.bootstrap_servers})

    def send(
        self,
        *,
        due_at_ms: int,
        start_within_s: float | None = None,
        sleep_s: float = 0.0,
        emitted_at_ms: int | None = None,
    ) -> dict[str, Any]:
        """A request; ``emitted_at_ms``: the emitting scheduler's clock (now by default: a
        request due later was fired ahead of its time on purpose, its fire lead)."""
        record: dict[str, Any] = {
            "execution_id": str(uuid.uuid4()),
            "job_id": str(uuid.uuid4()),
            "name": "gated",
            "attempt": 1,
            "scheduled_at_ms": due_at_ms,
            "due_at_ms": due_at_ms,
            "emitted_at_ms": now_ms() if emitted_at_ms is None else emitted_at_ms,
            "priority": "normal",
            "target": {"ref": TRACKED},
            "payload_json": json.dumps({"sleep_s": sleep_s}),
            "timeout_s": 60.0,
            "trigger": "schedule",
            "start_within_s": start_within_s,
        }
        self.producer.produce(
            self.topic, self.codec.encode("execution", record), key=record["job_id"]
        )
        self.producer.flush(30)
        return record


@pytest.fixture
def requests(settings: CommonSettings) -> Iterator[Requests]:
    support.reset()
    yield Requests(settings)


@pytest.fixture
def worker(settings: CommonSettings) -> Iterator[RunningWorker]:
    # one slot: an early request that held it would keep the due one from running
    running = start_worker(settings, concurrency=1, buffer=10, max_early_wait_s=5.0)
    yield running
    running.stop()


def sample(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_stale_request_ends_expired_and_is_not_run(
    requests: Requests, worker: RunningWorker, results: TopicReader
) -> None:
    labels = {"queue": "default", "priority": "normal"}  # the metric's labels since queues
    before = sample("duetime_worker_expired_total", labels)
    stale = requests.send(due_at_ms=now_ms() - 10_000, start_within_s=2.0)
    fresh = requests.send(due_at_ms=now_ms() - 10_000, start_within_s=3600.0)
    [expired] = final(results, stale["job_id"])
    assert expired["status"] == "failure", expired
    assert expired["error"]["reason"] == "expired" and expired["error"]["retryable"] is False
    assert "start window of 2 s" in expired["error"]["message"]
    [ran] = final(results, fresh["job_id"])
    assert ran["status"] == "success", ran
    assert stale["execution_id"] not in support.STARTED  # never run
    assert fresh["execution_id"] in support.STARTED
    assert sample("duetime_worker_expired_total", labels) == before + 1


def test_an_early_request_starts_no_earlier_than_due_and_holds_no_slot(
    requests: Requests, worker: RunningWorker, results: TopicReader
) -> None:
    waited = sample("duetime_worker_early_arrivals_total", {"action": "waited"})
    # from a scheduler whose clock runs 2.5 s ahead: emitted at its due time, by that clock
    due_ms = now_ms() + 2_500
    early = requests.send(due_at_ms=due_ms, emitted_at_ms=due_ms)
    due = requests.send(due_at_ms=now_ms())  # behind the early one on the same topic
    [ran_due] = final(results, due["job_id"])
    assert ran_due["status"] == "success"
    # the only slot was free while the early request waited: the due one ran first
    assert early["execution_id"] not in support.STARTED
    [ran_early] = final(results, early["job_id"])
    assert ran_early["status"] == "success", ran_early
    assert ran_early["started_at_ms"] >= early["scheduled_at_ms"]
    assert support.STARTED[early["execution_id"]] * 1000 >= early["scheduled_at_ms"]
    assert sample("duetime_worker_early_arrivals_total", {"action": "waited"}) == waited + 1


def test_a_request_fired_ahead_waits_for_its_time_and_is_not_counted_as_early(
    requests: Requests, worker: RunningWorker, results: TopicReader
) -> None:
    """The scheduler's fire lead: a request emitted 1.5 s before its time by a right clock is
    held until then, without a slot, and is no clock anomaly (no count, no log line)."""
    waited = sample("duetime_worker_early_arrivals_total", {"action": "waited"})
    led = requests.send(due_at_ms=now_ms() + 1_500)
    due = requests.send(due_at_ms=now_ms())  # behind it on the same topic, one slot
    [ran_due] = final(results, due["job_id"])
    assert ran_due["status"] == "success"
    assert led["execution_id"] not in support.STARTED
    [ran_led] = final(results, led["job_id"])
    assert ran_led["status"] == "success", ran_led
    assert support.STARTED[led["execution_id"]] * 1000 >= led["due_at_ms"]
    assert sample("duetime_worker_early_arrivals_total", {"action": "waited"}) == waited


def test_held_requests_beyond_the_buffer_keep_the_partitions_fetching(
    settings: CommonSettings, requests: Requests, results: TopicReader
) -> None:
    """A crowd fired ahead waits at the worker (DUETIME_WORKER_HOLD_BUFFER), not in its
    buffer: with three times the buffer held, a request due now is still fetched and run
    before their time, and each held one starts no earlier than its own."""
    running = start_worker(settings, concurrency=1, buffer=10, hold_buffer=1_000)
    try:
        due_ms = now_ms() + 5_000
        held = [requests.send(due_at_ms=due_ms) for _ in range(30)]
        wait_for(
            lambda: sum(running.worker.state.held.values()) == len(held),
            10,
            "every request fired ahead to be held",
        )
        due = requests.send(due_at_ms=now_ms())
        [ran_due] = final(results, due["job_id"])
        assert ran_due["status"] == "success"
        assert ran_due["started_at_ms"] < due_ms
        for request in held:
            [ran] = final(results, request["job_id"])
            assert ran["status"] == "success", ran
            assert support.STARTED[request["execution_id"]] * 1000 >= due_ms
    finally:
        running.stop()


@pytest.mark.parametrize("defer_s", [10.0, 0.0])
def test_finished_runs_report_after_the_starts_waiting_for_a_slot(
    settings: CommonSettings, requests: Requests, results: TopicReader, defer_s: float
) -> None:
    """Starts before reports (report_gate.py): with one slot and six requests due at once,
    every run's result is published after the last of them started; with
    DUETIME_WORKER_REPORT_DEFER_S=0 the first result is out before the last run starts."""
    running = start_worker(settings, concurrency=1, buffer=10, report_defer_s=defer_s)
    try:
        due_ms = now_ms() + 1_500
        sent = [requests.send(due_at_ms=due_ms, sleep_s=0.1) for _ in range(6)]
        ran = [final(results, request["job_id"])[0] for request in sent]
        assert all(r["status"] == "success" for r in ran), ran
        last_start = max(r["started_at_ms"] for r in ran)
        first_out = min(r["_timestamp_ms"] for r in ran)
        assert (first_out >= last_start) is (defer_s > 0), (first_out, last_start)
    finally:
        running.stop()


def lease_of(settings: CommonSettings, execution_id: str) -> tuple[str, bool] | None:
    """(state, expired) of the execution's lease row; None: no row."""
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT state, expires_at <= now() FROM leases WHERE execution_id = %s",
            (execution_id,),
        ).fetchone()
    return None if row is None else (str(row[0]), bool(row[1]))


def test_a_request_fired_ahead_claims_its_lease_early_and_gives_it_back_unrun(
    settings: CommonSettings, requests: Requests, results: TopicReader
) -> None:
    """Held for the lead, a request's lease is claimed at once (claims of a fetch share a
    round trip; its start needs none). A worker that stops before the due time releases it:
    the next worker runs the request at its time, not a lease TTL later."""
    # claimed ahead when at most half the TTL early
    first = start_worker(settings, concurrency=1, buffer=10, lease_ttl_s=60.0)
    try:
        led = requests.send(due_at_ms=now_ms() + 6_000)
        wait_for(
            lambda: lease_of(settings, led["execution_id"]) == ("held", False),
            5,
            "the lease claimed while the request waits for its time",
        )
        assert now_ms() < led["due_at_ms"] and led["execution_id"] not in support.STARTED
    finally:
        first.stop()
    assert led["execution_id"] not in support.STARTED
    assert lease_of(settings, led["execution_id"]) == ("held", True)  # released: expired now
    second = start_worker(settings, concurrency=1, buffer=10, lease_ttl_s=60.0)
    try:
        [ran] = final(results, led["job_id"])
        assert ran["status"] == "success", ran
        assert support.STARTED[led["execution_id"]] * 1000 >= led["due_at_ms"]
    finally:
        second.stop()


def claimed_live(settings: CommonSettings, execution_id: str) -> bool:
    return lease_of(settings, execution_id) == ("held", False)


def test_a_lease_claimed_ahead_is_renewed_while_its_request_waits_for_a_slot(
    settings: CommonSettings, requests: Requests, results: TopicReader
) -> None:
    """A request claimed ahead whose start waits longer than the lease TTL (all slots busy,
    or a crowd fired seconds ahead) keeps its lease: the worker renews it with the running
    ones, so no other worker could take it over before it starts. The renewal also carries a
    cancel to it: a request cancelled while it waits is reported ``cancelled`` unrun."""
    running = start_worker(settings, concurrency=1, buffer=10, lease_ttl_s=6.0)
    try:
        led = requests.send(due_at_ms=now_ms() + 1_400)  # claimed at once (within TTL/2)
        doomed = requests.send(due_at_ms=now_ms() + 1_400)
        for eid in (led["execution_id"], doomed["execution_id"]):
            wait_for(
                functools.partial(claimed_live, settings, eid),
                5,
                "the lease claimed while the request waits for its time",
            )
        with psycopg.connect(settings.database_url, autocommit=True) as conn:
            assert flag_cancelled_jobs(conn, [doomed["job_id"]]) == 1
        busy = requests.send(due_at_ms=now_ms(), sleep_s=12.0)  # the one slot, for 12 s
        wait_for(lambda: busy["execution_id"] in support.STARTED, 10, "the slot taken")
        assert led["execution_id"] not in support.STARTED  # its time came with the slot busy
        time.sleep(6.6)  # longer than the TTL since the claim; the slot is still busy
        assert led["execution_id"] not in support.STARTED
        assert lease_of(settings, led["execution_id"]) == ("held", False)  # renewed
        [ran] = final(results, led["job_id"])
        assert ran["status"] == "success", ran
        assert ran["attempt"] == 1
        [stopped] = final(results, doomed["job_id"])
        assert stopped["error"]["reason"] == "cancelled", stopped
        assert doomed["execution_id"] not in support.STARTED
    finally:
        running.stop()


def test_a_request_too_far_ahead_is_handed_back_unrun(
    settings: CommonSettings, requests: Requests, worker: RunningWorker, results: TopicReader
) -> None:
    handed = sample("duetime_worker_early_arrivals_total", {"action": "handed_back"})
    topic = requests.topic
    start = committed(settings, topic)
    far = requests.send(due_at_ms=now_ms() + 3_600_000)  # beyond max_early_wait_s=5
    after = requests.send(due_at_ms=now_ms())
    [ran] = final(results, after["job_id"])
    assert ran["status"] == "success"
    wait_for(
        lambda: (
            sample("duetime_worker_early_arrivals_total", {"action": "handed_back"}) == handed + 1
        ),
        30,
        "the far-early request to be handed back",
    )
    # both offsets move on (the scheduler's rescuer owns the handed-back execution)
    wait_for(lambda: committed(settings, topic) >= start + 2, 30, "both offsets committed")
    assert far["execution_id"] not in support.STARTED
    assert not [r for r in results.snapshot() if r["job_id"] == far["job_id"]]


def test_one_timer_waits_for_the_held_requests(worker: RunningWorker) -> None:
    """However the held requests come and go, the worker keeps one timer for the earliest of
    them: a request held while the timer's own round starts work must not leave a second
    timer behind (each would wake the loop again, and arm another)."""
    w = worker.worker

    def timers() -> int:  # the event loop's pending timers that wake the held requests
        scheduled = list(getattr(worker.loop, "_scheduled", []))
        return sum(1 for h in scheduled if h._callback == w._wait_over and not h.cancelled())

    first: Any = SimpleNamespace(key="held-first")  # a request's key is all a wait keeps
    another: Any = SimpleNamespace(key="held-in-the-round")

    def start_ready_holding_another() -> None:
        w._wait(another, 30.0)

    async def round_that_holds_another() -> int:
        w._start_ready = start_ready_holding_another  # type: ignore[method-assign]
        try:
            w._wait(first, 20.0)
            fired = w._wait_timer
            assert fired is not None
            fired.cancel()  # as if it had fired: its round runs now
            w._wait_over()  # ... and holds one more request
            return timers()
        finally:
            del w._start_ready

    assert asyncio.run_coroutine_threadsafe(round_that_holds_another(), worker.loop).result(10) == 1


def test_held_requests_due_at_one_instant_start_in_one_round(
    settings: CommonSettings, requests: Requests, results: TopicReader
) -> None:
    """Requests due at one instant, held for it, start together in one round of the timer
    (their waits, reckoned from whole milliseconds, end up to a millisecond apart), and none
    before its due time."""
    running = start_worker(settings, concurrency=20, buffer=50, max_early_wait_s=5.0)
    w = running.worker
    rounds: list[int] = [0]
    started_in: dict[str, int] = {}
    wait_over, start = w._wait_over, w.executor.start

    def counted_wait_over() -> None:
        rounds[0] += 1
        wait_over()

    def noted_start(item: Any) -> None:
        started_in[item.execution_id] = rounds[0]
        start(item)

    async def install() -> None:  # on the worker's loop, before anything is held
        w._wait_over = counted_wait_over  # type: ignore[method-assign]
        w.executor.start = noted_start  # type: ignore[method-assign]

    asyncio.run_coroutine_threadsafe(install(), running.loop).result(10)
    try:
        due_at_ms = now_ms() + 2_500
        sent = []
        for _ in range(5):  # held at moments apart: their waits end apart, within a ms
            sent.append(requests.send(due_at_ms=due_at_ms))
            time.sleep(0.1)
        for record in sent:
            [ran] = final(results, record["job_id"])
            assert ran["status"] == "success", ran
            assert support.STARTED[record["execution_id"]] * 1000 >= due_at_ms
        assert now_ms() >= due_at_ms
        assert len({started_in[r["execution_id"]] for r in sent}) == 1, started_in
    finally:
        running.stop()
