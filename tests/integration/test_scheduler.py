"""The scheduler against the real broker: fires, pause/resume/misfire, cancel, trigger, poison."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from confluent_kafka import Producer

from duetime.core.config import CommonSettings
from duetime.core.models import Status
from duetime.core.records import SchedulerState
from duetime.core.topics import Topics
from duetime.producers.sdk import JobClient
from duetime.schedulers.settings import SchedulerSettings
from duetime.schemas.codec import Codec
from tests.helpers import RunningScheduler as Running
from tests.helpers import TopicReader, execution_reader, wait_for

HTTP_TARGET = {"type": "http", "url": "http://127.0.0.1:9/none"}
CODEC = Codec()


@pytest.fixture
def scheduler(settings: CommonSettings) -> Iterator[Running]:
    running = Running(SchedulerSettings(common=settings, misfire_threshold_s=1.0))
    wait_for(
        lambda: running.owned() == settings.partitions, 30, "the scheduler to own all partitions"
    )
    yield running
    running.stop()


@pytest.fixture
def client(settings: CommonSettings) -> Iterator[JobClient]:
    with JobClient(settings=settings) as c:
        yield c


@pytest.fixture
def executions(settings: CommonSettings) -> Iterator[TopicReader]:
    reader = execution_reader(settings)
    yield reader
    reader.close()


@pytest.fixture
def states(settings: CommonSettings) -> Iterator[TopicReader]:
    """The scheduler's changelog, raw (held commands share it under other keys)."""
    reader = TopicReader(settings, [Topics(settings.topic_prefix).state], None)
    yield reader
    reader.close()


def latest_state(states: TopicReader, job_id: str) -> SchedulerState | None:
    """The job's latest state as its scheduler committed it, or None while it has none."""
    key = job_id.encode()
    for msg in reversed(list(states.raw)):
        if msg.key() == key and msg.value():
            return CODEC.load(SchedulerState, msg.value())
    return None


def wait_status(states: TopicReader, job_id: str, status: Status) -> SchedulerState:
    """Wait until the scheduler has committed the job in ``status``; its state then."""

    def in_status() -> SchedulerState | None:
        state = latest_state(states, job_id)
        return state if state is not None and state.status is status else None

    found = wait_for(in_status, 15, f"job {job_id} to be {status} on the changelog")
    assert found is not None
    return found


def iso(dt: datetime) -> str:
    return dt.isoformat().replace("+00:00", "Z")


def of_job(reader: TopicReader, job_id: str) -> list[dict[str, Any]]:
    return [r for r in reader.snapshot() if r["job_id"] == job_id]


def test_one_time_job_fires_once_on_time(
    scheduler: Running, client: JobClient, executions: TopicReader
) -> None:
    at = datetime.now(UTC) + timedelta(seconds=1.5)
    job = client.create_job(name="once", schedule={"at": iso(at)}, target=HTTP_TARGET)
    got = wait_for(lambda: of_job(executions, job.job_id), 15, "the one-time job to fire")
    time.sleep(1.5)  # the subject: no second fire within 1.5 s
    got = of_job(executions, job.job_id)
    assert len(got) == 1
    request = got[0]
    assert request["scheduled_at_ms"] == int(at.timestamp() * 1000)
    assert request["attempt"] == 1 and request["trigger"] == "schedule"
    # emitted at most the fire lead ahead of its time (the worker holds it until then)
    assert request["emitted_at_ms"] >= request["scheduled_at_ms"] - SchedulerSettings.fire_lead_ms
    assert request["_topic"].endswith("exec.normal")


def fire_at_once(
    scheduler: SchedulerSettings,
    client: JobClient,
    executions: TopicReader,
    n: int,
    ahead_s: float,
) -> tuple[list[dict[str, Any]], int]:
    """``n`` one-time jobs due at one instant ``ahead_s`` from now, fired by a scheduler of
    these settings: (their execution requests, the instant); each job fired once."""
    running = Running(scheduler)
    try:
        wait_for(
            lambda: running.owned() == scheduler.common.partitions,
            30,
            "the scheduler to own all partitions",
        )
        at = datetime.now(UTC) + timedelta(seconds=ahead_s)
        jobs = client.create_jobs(
            [{"name": f"burst-{i}", "schedule": {"at": iso(at)}, "target": HTTP_TARGET}
             for i in range(n)]
        )  # fmt: skip
        ids = {job.job_id for job in jobs}

        def burst() -> list[dict[str, Any]]:
            return [r for r in executions.snapshot() if r["job_id"] in ids]

        wait_for(lambda: len(burst()) >= n, 30, f"the {n} jobs due at once to fire")
        got = burst()
        assert Counter(r["job_id"] for r in got) == Counter(ids)  # each once
        return got, int(at.timestamp() * 1000)
    finally:
        running.stop()


def test_a_burst_is_fired_in_slices_of_the_cycle_limit_each_job_once(
    settings: CommonSettings, client: JobClient, executions: TopicReader
) -> None:
    # a cycle's requests are visible only once it commits: a burst is fired and committed in
    # slices of DUETIME_SCHEDULER_CYCLE_FIRE_LIMIT, so workers start on the first slice early
    limit, n = 7, 40
    scheduler = SchedulerSettings(
        common=settings,
        misfire_threshold_s=1.0,
        cycle_fire_limit=limit,
        # no lead: each slice commits in its own cycle, so no two cycles share a
        # millisecond (the emission instant this test tells the slices by)
        fire_lead_ms=0,
    )
    got, _ = fire_at_once(scheduler, client, executions, n, 3.0)
    # one emission instant per cycle: at most `limit` requests share one
    emitted = Counter(r["emitted_at_ms"] for r in got)
    assert max(emitted.values()) <= limit and len(emitted) >= -(-n // limit)


def test_a_crowd_is_emitted_ahead_by_the_time_it_takes_each_job_once(
    settings: CommonSettings, client: JobClient, executions: TopicReader
) -> None:
    """The crowd lead: 300 jobs due at one instant, planned at 60 jobs/s (~100 a partition at
    20/s each), go out ~5 s before their wake-up, never more than the cap ahead; each once,
    carrying its due time (the workers hold it)."""
    lead_ms, cap_ms, rate, n = 200, 6_000, 60.0, 300
    scheduler = SchedulerSettings(
        common=settings, fire_lead_ms=lead_ms, crowd_rate=rate, crowd_lead_max_ms=cap_ms
    )
    got, at_ms = fire_at_once(scheduler, client, executions, n, 9.0)
    assert {r["scheduled_at_ms"] for r in got} == {at_ms}
    per_partition = Counter(r["_partition"] for r in got)
    for r in got:
        # (jobs of its partition − 1) / its share of the rate, less a 25 ms bucket
        ahead_ms = (per_partition[r["_partition"]] - 1) * 1000 / (rate / settings.partitions)
        extra_ms = min(cap_ms, ahead_ms) - 25
        assert r["emitted_at_ms"] <= at_ms - lead_ms - extra_ms + 100  # a cycle's slack
        assert r["emitted_at_ms"] >= at_ms - lead_ms - cap_ms


def test_past_one_time_job_runs_now_and_recreate_is_idempotent(
    scheduler: Running, client: JobClient, executions: TopicReader
) -> None:
    body = {
        "name": "past",
        "schedule": {"at": "2020-01-01T00:00:00Z"},
        "target": HTTP_TARGET,
        "priority": "critical",
    }
    job = client.create_job(body)
    client.create_job({**body, "job_id": job.job_id})  # the same job again: a no-op
    wait_for(lambda: of_job(executions, job.job_id), 15, "the past job to run now")
    time.sleep(1.0)  # the subject: the re-create fires nothing more within 1 s
    got = of_job(executions, job.job_id)
    assert len(got) == 1 and got[0]["_topic"].endswith("exec.critical")


def test_six_field_cron_fires_once_per_occurrence(
    scheduler: Running, client: JobClient, executions: TopicReader
) -> None:
    job = client.create_job(
        name="every-second", schedule={"cron": "* * * * * *"}, target=HTTP_TARGET, overlap="allow"
    )
    wait_for(lambda: len(of_job(executions, job.job_id)) >= 4, 20, "four fires of a 1 s cron")
    times = [r["scheduled_at_ms"] for r in of_job(executions, job.job_id)]
    assert all(t % 1000 == 0 for t in times), "fires are on the seconds grid"
    assert len(times) == len(set(times)), "no occurrence fires twice"
    assert sorted(times) == times
    assert all(b - a == 1000 for a, b in itertools.pairwise(times)), times


def _pause_then_resume(
    client: JobClient, executions: TopicReader, states: TopicReader, misfire: str, paused_s: float
) -> tuple[list[int], list[dict[str, Any]]]:
    job = client.create_job(
        name=f"pause-{misfire}",
        schedule={"cron": "* * * * * *"},
        target=HTTP_TARGET,
        overlap="allow",
        misfire=misfire,
    )
    wait_for(lambda: of_job(executions, job.job_id), 15, "the first fire")
    client.pause(job.job_id)
    # every run fired before the pause took effect is counted in the paused state: read them
    paused_at = wait_status(states, job.job_id, Status.PAUSED).fired_count
    wait_for(
        lambda: len(of_job(executions, job.job_id)) >= paused_at, 15, "the runs before the pause"
    )
    time.sleep(paused_s)  # the subject: occurrences fall due while the job is paused
    during = len(of_job(executions, job.job_id))
    assert during == paused_at, "a paused job must not fire"
    resumed_ms = int(time.time() * 1000)
    client.resume(job.job_id)
    # the first regular fire after the resume comes after its catch-up runs in the same
    # partition, so once it is read, so are they
    wait_for(
        lambda: [
            r
            for r in of_job(executions, job.job_id)[during:]
            if r["trigger"] == "schedule" and r["emitted_at_ms"] > resumed_ms
        ],
        15,
        "a regular fire after the resume",
    )
    after = of_job(executions, job.job_id)[during:]
    return [resumed_ms], [r for r in after if r["emitted_at_ms"] <= resumed_ms + 700]


@pytest.mark.parametrize("misfire", ["skip", "run_once", "run_all"])
def test_pause_resume_follows_the_misfire_policy(
    scheduler: Running,
    client: JobClient,
    executions: TopicReader,
    states: TopicReader,
    misfire: str,
) -> None:
    _, catch_up = _pause_then_resume(client, executions, states, misfire, paused_s=3.0)
    missed = [r for r in catch_up if r["trigger"] == "misfire"]
    if misfire == "skip":
        assert missed == []
    elif misfire == "run_once":
        assert len(missed) == 1
    else:
        assert len(missed) >= 3, [r["scheduled_at_ms"] for r in catch_up]
        times = [r["scheduled_at_ms"] for r in missed]
        assert len(set(times)) == len(times)


def test_cancel_stops_and_trigger_runs_once(
    scheduler: Running, client: JobClient, executions: TopicReader, states: TopicReader
) -> None:
    manual = client.create_job(name="manual", target=HTTP_TARGET)  # no schedule: trigger only
    assert wait_status(states, manual.job_id, Status.PENDING).fired_count == 0
    assert of_job(executions, manual.job_id) == []
    client.trigger(manual.job_id)
    wait_for(lambda: of_job(executions, manual.job_id), 15, "the triggered run")
    time.sleep(1.0)  # the subject: one trigger, one run (nothing more within 1 s)
    got = of_job(executions, manual.job_id)
    assert len(got) == 1 and got[0]["trigger"] == "manual"

    cron = client.create_job(
        name="to-cancel", schedule={"cron": "* * * * * *"}, target=HTTP_TARGET, overlap="allow"
    )
    wait_for(lambda: of_job(executions, cron.job_id), 15, "the cron's first fire")
    client.cancel(cron.job_id)
    # every run fired before the cancel took effect is counted in the cancelled state
    before = wait_status(states, cron.job_id, Status.CANCELLED).fired_count
    wait_for(lambda: len(of_job(executions, cron.job_id)) >= before, 15, "the runs before")
    time.sleep(2.5)  # the subject: occurrences fall due while the job is cancelled
    assert len(of_job(executions, cron.job_id)) == before, "a cancelled job must not fire"


def test_undecodable_records_go_to_the_poison_topic(
    settings: CommonSettings, scheduler: Running, client: JobClient, executions: TopicReader
) -> None:
    topics = Topics(settings.topic_prefix)
    poison = TopicReader(settings, [topics.poison], None)
    try:
        producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
        for value in (b"", b"\xd7\x00\x01garbage", b"not avro at all"):
            producer.produce(topics.jobs, key=b"k", value=value)
        producer.flush(10)
        wait_for(lambda: len(poison.raw) >= 3, 20, "three records on the poison topic")
        headers = dict(poison.raw[0].headers())
        assert headers["duetime-source-topic"] == topics.jobs.encode()
        assert "duetime-error" in headers
        assert {m.value() for m in poison.raw} == {b"", b"\xd7\x00\x01garbage", b"not avro at all"}
        # the partition moved on: a valid job after the poison still fires
        job = client.create_job(
            name="after-poison", schedule={"at": "2020-01-01T00:00:00Z"}, target=HTTP_TARGET
        )
        wait_for(lambda: of_job(executions, job.job_id), 15, "a job after poison records")
    finally:
        poison.close()


def test_state_survives_a_restart(
    settings: CommonSettings, client: JobClient, executions: TopicReader, states: TopicReader
) -> None:
    """A new scheduler restores due jobs from the changelog and fires each exactly once."""
    first = Running(SchedulerSettings(common=settings))
    wait_for(lambda: first.owned() == settings.partitions, 30, "the first scheduler to own all")
    base = datetime.now(UTC) + timedelta(seconds=4)
    jobs = [
        client.create_job(
            name=f"r{i}",
            schedule={"at": iso(base + timedelta(milliseconds=20 * i))},
            target=HTTP_TARGET,
            wait=False,
        )
        for i in range(50)
    ]
    client.flush()
    ids = {j.job_id for j in jobs}
    wait_for(
        lambda: all(latest_state(states, i) is not None for i in ids),
        15,
        "the first scheduler to write every job's state",
    )
    first.stop()
    second = Running(SchedulerSettings(common=replace(settings, instance_id="second")))
    try:
        wait_for(
            lambda: ids <= {r["job_id"] for r in executions.snapshot()},
            30,
            "all 50 jobs to fire after the restart",
        )
        time.sleep(1.0)  # the subject: each fires once (no second fire within 1 s)
        counts = Counter(r["job_id"] for r in executions.snapshot() if r["job_id"] in ids)
        assert set(counts.values()) == {1}
    finally:
        second.stop()


def test_a_command_that_overtakes_its_job_is_held_until_the_job_arrives(
    settings: CommonSettings, scheduler: Running, executions: TopicReader, states: TopicReader
) -> None:
    """trigger is published before the definition: it must not be lost."""
    with JobClient(settings=settings) as c:
        definition = c.build(name="late-definition", target=HTTP_TARGET)
        c.trigger(definition.job_id)
        held = f"held/{definition.job_id}/".encode()
        wait_for(  # the scheduler sees the command first, and holds it
            lambda: any((m.key() or b"").startswith(held) for m in list(states.raw)),
            15,
            "the command to be held",
        )
        assert of_job(executions, definition.job_id) == []
        c.publish_definition(definition)
    got = wait_for(lambda: of_job(executions, definition.job_id), 15, "the held trigger to run")
    time.sleep(1.0)  # the subject: the held command runs once (nothing more within 1 s)
    got = of_job(executions, definition.job_id)
    assert len(got) == 1 and got[0]["trigger"] == "manual"


def test_a_job_that_breaks_the_transform_is_quarantined_not_the_partition(
    settings: CommonSettings, scheduler: Running, client: JobClient, executions: TopicReader
) -> None:
    """Issue 13, finding 1: a plain job carrying the DAG trigger's label (written past the
    edge, which refuses the label) made fire() raise TypeError, and the scheduler exited at
    every restore. Now that job alone ends dead with a dead letter naming the error; the
    partition and the process go on, and a restarted scheduler does not meet it again."""
    topics = Topics(settings.topic_prefix)
    dlq = TopicReader(settings, [topics.dlq], "dead_letter")
    try:
        hostile = client._build(  # internal: the reserved label, as a raw writer could set it
            {
                "name": "fake-dag-trigger",
                "schedule": {"at": "2020-01-01T00:00:00Z"},
                "target": HTTP_TARGET,
                "labels": {"duetime.dag": "00000000-0000-0000-0000-000000000001"},
            },
            int(time.time() * 1000),
            internal=True,
        )
        client.publish_definition(hostile)
        dead = wait_for(
            lambda: [r for r in dlq.snapshot() if r["job_id"] == hostile.job_id],
            20,
            "a dead letter for the quarantined job",
        )
        error = dead[0]["errors"][0]["error"]
        assert error["type"] == "SchedulerError" and "TypeError" in error["message"]
        assert scheduler.thread.is_alive()
        job = client.create_job(
            name="after-quarantine", schedule={"at": "2020-01-01T00:00:00Z"}, target=HTTP_TARGET
        )
        wait_for(lambda: of_job(executions, job.job_id), 15, "a plain job after the quarantine")
        assert of_job(executions, hostile.job_id) == []
        assert scheduler.thread.is_alive()
    finally:
        dlq.close()
    scheduler.stop()
    again = Running(SchedulerSettings(common=replace(settings, instance_id="again")))
    try:
        wait_for(
            lambda: again.owned() == settings.partitions, 30, "a restarted scheduler to own all"
        )
        later = client.create_job(
            name="after-restart", schedule={"at": "2020-01-01T00:00:00Z"}, target=HTTP_TARGET
        )
        wait_for(lambda: of_job(executions, later.job_id), 15, "a plain job after the restart")
        assert again.thread.is_alive()
    finally:
        again.stop()


def test_a_definition_may_not_move_a_job_into_a_dag(
    settings: CommonSettings, scheduler: Running, client: JobClient
) -> None:
    """Finding 7, past the API: a DAG member written with an existing job's id is parked."""
    topics = Topics(settings.topic_prefix)
    poison = TopicReader(settings, [topics.poison], None)
    try:
        job = client.create_job(name="victim", target=HTTP_TARGET)
        wait_for(  # the revision comes from the build's clock: the takeover's must be later
            lambda: (
                client.build(name="probe", target=HTTP_TARGET).revision > job.definition.revision
            ),
            1,
            "a later revision",
        )
        takeover = client.build(
            job_id=job.job_id,
            name="taken-over",
            target=HTTP_TARGET,
            dag_id="00000000-0000-0000-0000-0000000000d1",
            dag_key="k",
        )
        client.publish_definition(takeover)
        got = wait_for(lambda: poison.raw, 20, "the takeover on the poison topic")
        assert b"into, out of or between DAGs" in dict(got[0].headers())["duetime-error"]
    finally:
        poison.close()


def test_a_dag_run_too_large_for_one_record_quarantines_its_trigger_only(
    settings: CommonSettings, scheduler: Running, client: JobClient, executions: TopicReader
) -> None:
    """Finding 3, past the SDK: a trigger job whose definition fits but whose run event (every
    node twice) would not. It used to abort every transaction of its partition forever."""
    topics = Topics(settings.topic_prefix)
    dlq = TopicReader(settings, [topics.dlq], "dead_letter")
    try:
        nodes = [
            {"key": f"{i:05d}" + "k" * 195, "job_id": str(uuid.uuid4()), "depends_on": []}
            for i in range(2500)
        ]
        dag_id = str(uuid.uuid4())
        trigger = client._build(
            {
                "name": "huge-dag",
                "schedule": {"at": "2020-01-01T00:00:00Z"},
                "target": {"type": "python", "ref": "duetime.dag_trigger"},
                "payload": {"nodes": nodes},
                "labels": {"duetime.dag": dag_id},
            },
            int(time.time() * 1000),
            internal=True,
        )
        client.publish_definition(trigger)
        dead = wait_for(
            lambda: [r for r in dlq.snapshot() if r["job_id"] == trigger.job_id],
            30,
            "a dead letter for the oversized DAG trigger",
        )
        assert "over the record limit" in dead[0]["errors"][0]["error"]["message"]
        job = client.create_job(
            name="same-partitions", schedule={"at": "2020-01-01T00:00:00Z"}, target=HTTP_TARGET
        )
        wait_for(lambda: of_job(executions, job.job_id), 15, "a plain job after the big DAG")
        assert scheduler.thread.is_alive()
    finally:
        dlq.close()


@pytest.mark.parametrize("net", [False, True], ids=["refused-at-input", "caught-at-encode"])
def test_an_input_whose_state_cannot_be_written_is_parked_not_retried(
    settings: CommonSettings,
    scheduler: Running,
    client: JobClient,
    executions: TopicReader,
    monkeypatch: pytest.MonkeyPatch,
    net: bool,
) -> None:
    """The hostile corpus found it: a raw job with ``timeout_s = -4.4e16`` gave its in-flight
    execution a rescue deadline no state record can hold; the transaction failed at encoding,
    and the partition restored and retried it forever, so no job on it fired again. Now the
    scheduler refuses such a definition at input; and whatever input still makes a state or an
    output that cannot be written (``net``: the input check switched off) is parked when it
    is applied, or quarantines its job when it is fired, while the partition goes on."""
    from duetime.schedulers import logic

    if net:
        monkeypatch.setattr(logic, "check_input", lambda record: None)
    topics = Topics(settings.topic_prefix)
    poison = TopicReader(settings, [topics.poison], None)
    dlq = TopicReader(settings, [topics.dlq], "dead_letter")
    try:
        good = client.create_job(
            name="before", schedule={"at": "2020-01-01T00:00:00Z"}, target=HTTP_TARGET
        )
        wait_for(lambda: of_job(executions, good.job_id), 15, "a plain job to fire")
        hostile = replace(
            client.build(
                name="far-timeout", schedule={"at": "2020-01-01T00:00:00Z"}, target=HTTP_TARGET
            ),
            timeout_s=-4.4e16,
        )
        client.publish_definition(hostile)  # the SDK builds, validates, then this is changed
        if net:  # accepted; its first fire cannot be written: that job alone is quarantined
            dead = wait_for(
                lambda: [r for r in dlq.snapshot() if r["job_id"] == hostile.job_id],
                20,
                "a dead letter for the job whose fire could not be written",
            )
            error = dead[0]["errors"][0]["error"]["message"]
            assert "deadline_ms" in error, error
        else:
            parked = wait_for(
                lambda: [m for m in poison.raw if m.key() == hostile.job_id.encode()],
                20,
                "the hostile definition on the poison topic",
            )
            error = dict(parked[0].headers() or [])["duetime-error"].decode()
            assert "timeout_s" in error, error
        after = [
            client.create_job(
                name=f"after-{i}", schedule={"at": "2020-01-01T00:00:00Z"}, target=HTTP_TARGET
            )
            for i in range(2 * settings.partitions)
        ]
        waiting = {job.job_id for job in after}
        wait_for(
            lambda: not {j for j in waiting if not of_job(executions, j)},
            20,
            "every job created after it to fire",
        )
        assert of_job(executions, hostile.job_id) == []
        assert scheduler.thread.is_alive()
    finally:
        poison.close()
        dlq.close()


def test_a_commit_that_blocks_past_the_stall_limit_starts_its_partition_over(
    settings: CommonSettings, client: JobClient, executions: TopicReader
) -> None:
    # librdkafka 2.16's send_offsets_to_transaction can wait forever for a group coordinator
    # cached before a broker restart (confluentinc/librdkafka#5456): such a partition is given
    # up after DUETIME_SCHEDULER_COMMIT_STALL_S and taken back with a new producer, and the
    # scheduler's other partitions never wait on it. The stuck call is simulated by holding
    # the first commit of one partition on an event (the Kafka client itself is real).
    running = Running(
        SchedulerSettings(common=settings, misfire_threshold_s=30.0, commit_stall_s=1.0)
    )
    release = threading.Event()
    try:
        wait_for(lambda: running.owned() == settings.partitions, 30, "all partitions owned")
        stuck = running.scheduler.owners[0]
        real_commit = stuck.commit

        def blocked(consumer: Any, now_ms: int) -> int | None:
            release.wait(60)
            return real_commit(consumer, now_ms)

        stuck.commit = blocked  # type: ignore[method-assign]
        at = datetime.now(UTC) + timedelta(seconds=2)
        # 40 jobs: some land in partition 0 (all of them miss it with odds of (2/3)^40 at 3)
        jobs = client.create_jobs(
            [{"name": f"stall-{i}", "schedule": {"at": iso(at)}, "target": HTTP_TARGET}
             for i in range(40)]
        )  # fmt: skip
        ids = {job.job_id for job in jobs}

        def fired() -> Counter[str]:
            return Counter(r["job_id"] for r in executions.snapshot() if r["job_id"] in ids)

        wait_for(lambda: set(fired()) == ids, 60, "every job to fire, the stuck partition's too")
        assert running.scheduler.owners[0] is not stuck and stuck.abandoned
        release.set()  # the blocked call returns now: it must change nothing
        wait_for(lambda: not running.scheduler._lost, 10, "no partition left to take back")
        assert max(fired().values()) == 1
    finally:
        release.set()
        running.stop()
