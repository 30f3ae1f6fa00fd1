"""Poison records on every topic a role consumes, against the real roles as processes.

For each consumed topic (jobs, control, results, the four execution topics, dlq, dags,
dag_runs, state) three kinds of bad record are published between good traffic:

- random bytes;
- a real record of that topic cut in half (truncated Avro);
- a real record of that topic, re-encoded with content no role can act on (a job id that is
  not a UUID, a negative attempt, a cron that never fires, a DAG run whose node depends on a
  key it does not have).

Every role that consumes the topic must copy each bad record it cannot use to the poison
topic, once, with its original bytes and headers naming the source topic, partition, offset,
the error and the role; the partition moves on (committed offsets past the bad record), the
good jobs around it run exactly once (one execution request, one delivery at the sink, status
``success`` in the projection), a DAG still releases its dependant, and after every role is
restarted nothing is parked again (no redelivery loop).
"""

from __future__ import annotations

import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer

from duetime.core.clock import SYSTEM_CLOCK
from duetime.core.config import CommonSettings
from duetime.core.topics import Topics
from duetime.producers.sdk import JobClient
from duetime.schemas.codec import Codec
from tests.e2e.procs import Role, role_env
from tests.faults.harness import size
from tests.faults.support import parked, write_counts
from tests.helpers import TopicReader, committed_offsets, wait_for
from tests.integration.test_dag_support import delete_internal_topics, wait_known
from tests.integration.test_worker_support import Sink

NOW = {"at": "2020-01-01T00:00:00Z"}
JOBS_PER_PHASE = {"ci": 20, "full": 200}[size()]
NOT_A_UUID = "not-a-uuid"


def consumers_of(topics: Topics) -> dict[str, set[str]]:
    """Which roles consume each topic (and so must park a bad record found there)."""
    out = {
        topics.jobs: {"scheduler", "projector"},
        topics.control: {"scheduler", "projector"},
        topics.results: {"scheduler", "resolver", "projector"},
        topics.dlq: {"resolver", "projector"},
        topics.dags: {"projector"},
        topics.dag_runs: {"resolver", "projector"},
        topics.state: {"projector"},
    }
    for t in topics.executions:
        out[t] = {"worker", "projector"}
    return out


@dataclass
class Injected:
    kind: str
    topic: str
    partition: int
    offset: int
    value: bytes
    roles: set[str]
    """The roles expected to park it."""


# --- the roles ----------------------------------------------------------------------------


class Roles:
    def __init__(self, settings: CommonSettings, state_dir: Path) -> None:
        self.settings = settings
        self.state_dir = state_dir
        self.running: dict[str, Role] = {}

    def start(self) -> None:
        env = role_env(
            self.settings,
            DUETIME_SCHEDULER_STATE_DIR=str(self.state_dir),
            DUETIME_LEASE_TTL_S="5",
            # the sink's listen backlog is 5: more calls at once are refused and retried 10 s
            # later, which only slows the phases down
            DUETIME_WORKER_CONCURRENCY="4",
            DUETIME_RESOLVER_COMMIT_INTERVAL_S="0.5",
        )
        for name in ("scheduler", "worker", "projector", "resolver"):
            self.running[name] = Role.start(f"poison-{name}", [name], env)

    def stop(self) -> None:
        for role in self.running.values():
            role.stop(30)
        self.running.clear()

    def kill(self) -> None:
        for role in self.running.values():
            role.kill()
        self.running.clear()

    def check_alive(self) -> None:
        for name, role in self.running.items():
            code = role.process.poll()
            assert code is None, f"{name} exited with {code}:\n{role.log()[-3000:]}"


@pytest.fixture
def roles(settings: CommonSettings, tmp_path: Path) -> Iterator[Roles]:
    r = Roles(settings, tmp_path / "scheduler-state")
    yield r
    r.kill()
    delete_internal_topics(settings)


# --- good traffic -------------------------------------------------------------------------


@dataclass
class Phase:
    jobs: list[str]
    dead_job: str
    dag_run_id: str


def good_traffic(client: JobClient, sink: Sink, dag: Any, tag: str) -> Phase:
    jobs = [
        client.create_job(
            name=f"good-{tag}-{i}",
            schedule=NOW,
            target={"type": "http", "url": sink.url},
            payload={"i": i},
            wait=False,
        ).job_id
        for i in range(JOBS_PER_PHASE)
    ]
    dead = client.create_job(
        name=f"dead-{tag}",
        schedule=NOW,
        target={"type": "http", "url": sink.url},
        payload={"fail_times": 100},
        retry={"max_retries": 0, "base_delay_s": 0.1},
    ).job_id
    run_id = client.trigger_dag(dag.dag_id)
    client.flush()
    return Phase(jobs, dead, run_id)


def dsn_query(settings: CommonSettings, query: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        return list(conn.execute(query, args))


def statuses(settings: CommonSettings, job_ids: list[str]) -> dict[str, str]:
    rows = dsn_query(
        settings, "SELECT job_id::text, status FROM jobs WHERE job_id = ANY(%s::uuid[])", job_ids
    )
    return dict((r[0], r[1]) for r in rows)


def wait_phase_done(settings: CommonSettings, roles: Roles, phase: Phase, dag: Any) -> None:
    want = {j: "success" for j in phase.jobs} | {phase.dead_job: "dead"}

    def done() -> bool:
        roles.check_alive()
        got = statuses(settings, [*want, dag.job_ids["b"]])
        return all(got.get(j) == s for j, s in want.items())

    wait_for(done, 120, "every good job of the phase to be projected success (and one dead)")


# --- bad records --------------------------------------------------------------------------


def sample(reader: TopicReader, topic: str, codec: Codec, event_type: str, **match: Any) -> Any:
    for msg in reader.raw:
        if msg.topic() != topic or not msg.value():
            continue
        try:
            record = codec.decode(event_type, msg.value())
        except Exception:
            continue
        if all(record.get(k) == v for k, v in match.items()):
            return record
    raise AssertionError(f"no record of {topic} matching {match} to start from")


def invalid_content(
    topics: Topics, topic: str, reader: TopicReader, codec: Codec
) -> list[tuple[str, bytes, bytes, set[str]]]:
    """(kind, key, value, roles that must park it) for valid Avro no role can act on."""
    event_type = topics.event_type_of(topic)
    assert event_type is not None
    source = topics.execution("normal") if topic in topics.executions else topic
    out: list[tuple[str, bytes, bytes, set[str]]] = []
    if event_type == "job":
        r = sample(reader, source, codec, "job", dag_id=None)
        bad = {**r, "job_id": NOT_A_UUID}
        out.append(("job-id-not-uuid", NOT_A_UUID.encode(), codec.encode("job", bad), set()))
        never = {
            **r,
            "job_id": str(uuid.uuid4()),
            "schedule": {"cron": "0 0 31 2 *", "timezone": "UTC"},
        }
        out.append(
            ("cron-never-fires", never["job_id"].encode(), codec.encode("job", never), set())
        )
        out[0][3].update({"scheduler", "projector"})
        out[1][3].update({"scheduler", "projector"})
        # a timeout no API allows: its rescue deadline would not fit a state record (the
        # hostile corpus found a scheduler partition retrying that transaction forever)
        far = {**r, "job_id": str(uuid.uuid4()), "timeout_s": -4.4e16}
        out.append(
            (
                "timeout-far-negative",
                far["job_id"].encode(),
                codec.encode("job", far),
                {"scheduler"},
            )
        )
    elif event_type == "control":
        r = sample(reader, source, codec, "control")
        bad = {**r, "kind": "replay", "job_id": NOT_A_UUID, "execution_id": NOT_A_UUID}
        out.append(
            (
                "replay-not-uuid",
                NOT_A_UUID.encode(),
                codec.encode("control", bad),
                {"scheduler", "projector"},
            )
        )
    elif event_type == "result":
        r = sample(reader, source, codec, "result", dag_run_id=None)
        bad = {**r, "execution_id": NOT_A_UUID, "attempt": -1}
        out.append(
            (
                "result-negative-attempt",
                r["job_id"].encode(),
                codec.encode("result", bad),
                {"scheduler", "projector"},
            )
        )
        late = {**r, "retry_after_s": 1e300}
        out.append(
            (
                "result-retry-after-huge",
                r["job_id"].encode(),
                codec.encode("result", late),
                {"scheduler"},
            )
        )
    elif event_type == "execution":
        r = sample(reader, source, codec, "execution")
        bad = {**r, "execution_id": NOT_A_UUID, "attempt": -1}
        out.append(
            (
                "request-negative-attempt",
                r["job_id"].encode(),
                codec.encode("execution", bad),
                {"worker", "projector"},
            )
        )
    elif event_type == "dead_letter":
        r = sample(reader, source, codec, "dead_letter")
        request = {**r["request"], "execution_id": NOT_A_UUID}
        bad = {**r, "execution_id": NOT_A_UUID, "request": request}
        out.append(
            (
                "dead-letter-not-uuid",
                r["job_id"].encode(),
                codec.encode("dead_letter", bad),
                {"projector"},
            )
        )
    elif event_type == "dag":
        r = sample(reader, source, codec, "dag")
        bad = {**r, "dag_id": NOT_A_UUID}
        out.append(
            ("dag-id-not-uuid", NOT_A_UUID.encode(), codec.encode("dag", bad), {"projector"})
        )
    elif event_type == "dag_run":
        r = sample(reader, source, codec, "dag_run", kind="started")
        nodes = [{**n, "depends_on": ["no-such-key"]} for n in r["nodes"]]
        # the projector may record such a run (it only shows it); the resolver cannot run it
        bad = {**r, "dag_run_id": str(uuid.uuid4()), "nodes": nodes}
        out.append(
            (
                "dag-run-dangling-dependency",
                r["dag_id"].encode(),
                codec.encode("dag_run", bad),
                {"resolver"},
            )
        )
    elif event_type == "state":
        r = sample(reader, source, codec, "state")
        bad = {**r, "job_id": NOT_A_UUID, "definition": {**r["definition"], "job_id": NOT_A_UUID}}
        out.append(("state-not-uuid", b"poison-state", codec.encode("state", bad), {"projector"}))
    return out


def inject(
    settings: CommonSettings, reader: TopicReader, codec: Codec, rng: random.Random
) -> list[Injected]:
    """Publish every kind of bad record on every consumed topic; return where they landed."""
    topics = Topics(settings.topic_prefix)
    consumers = consumers_of(topics)
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers, "acks": "all"})
    injected: list[Injected] = []

    def delivered(kind: str, roles: set[str]) -> Any:
        def callback(err: Any, msg: Any) -> None:
            assert err is None, err
            injected.append(
                Injected(kind, msg.topic(), msg.partition(), msg.offset(), msg.value(), roles)
            )

        return callback

    for topic in sorted(consumers):
        everyone = consumers[topic]
        event_type = topics.event_type_of(topic)
        assert event_type is not None
        # the execution topics other than normal carry nothing here: normal's records serve
        source = topics.execution("normal") if topic in topics.executions else topic
        real = next(m.value() for m in reader.raw if m.topic() == source and m.value())
        bad: list[tuple[str, bytes, bytes, set[str]]] = [
            (
                "random-bytes",
                str(uuid.uuid4()).encode(),
                rng.randbytes(rng.randint(1, 300)),
                set(everyone),
            ),
            ("truncated-avro", str(uuid.uuid4()).encode(), real[: len(real) // 2], set(everyone)),
        ]
        bad += invalid_content(topics, topic, reader, codec)
        for p in range(settings.partitions):
            for kind, key, value, roles in bad:
                headers: list[tuple[str, str | bytes | None]] = [("origin", b"fault-campaign")]
                producer.produce(
                    topic,
                    key=key,
                    value=value,
                    partition=p,
                    headers=headers,
                    on_delivery=delivered(kind, roles),
                )
    assert producer.flush(30) == 0
    return injected


def corrupt_states(
    settings: CommonSettings, originals: list[Any], rng: random.Random
) -> list[Injected]:
    """Random bytes under the keys (and partitions) of real job states, with a wake-up time
    of now: what a scheduler restoring the partition will try to fire."""
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers, "acks": "all"})
    out: list[Injected] = []
    wake = str(SYSTEM_CLOCK.now_ms()).encode()
    for original in originals:

        def delivered(err: Any, msg: Any) -> None:
            assert err is None, err
            out.append(
                Injected(
                    "corrupt-state",
                    msg.topic(),
                    msg.partition(),
                    msg.offset(),
                    msg.value(),
                    {"projector"},
                )
            )

        producer.produce(
            original.topic(),
            key=original.key(),
            value=rng.randbytes(64),
            partition=original.partition(),
            headers=[("duetime-wake-ms", wake)],
            on_delivery=delivered,
        )
    assert producer.flush(30) == 0
    return out


def projector_offsets(settings: CommonSettings) -> dict[Any, int]:
    rows = dsn_query(
        settings,
        "SELECT topic, partition, next_offset FROM projector_offsets WHERE consumer = %s",
        f"{settings.topic_prefix}projector",
    )
    return {(t, p): o for t, p, o in rows}


def requests_in(reader: TopicReader, codec: Codec) -> list[dict[str, Any]]:
    """The execution requests a read_committed reader saw that decode (the bad ones do not,
    or carry the not-a-UUID execution id)."""
    out = []
    for msg in list(reader.raw):
        try:
            record = codec.decode("execution", msg.value() or b"")
        except Exception:
            continue
        if record["execution_id"] != NOT_A_UUID:
            out.append(record)
    return out


# --- the test -----------------------------------------------------------------------------


@pytest.mark.slow
def test_poison_on_every_topic_is_parked_once_and_every_role_moves_on(
    settings: CommonSettings, sink: Sink, roles: Roles
) -> None:
    topics = Topics(settings.topic_prefix)
    codec = Codec()
    rng = random.Random(8)
    everything = TopicReader(settings, sorted(consumers_of(topics)), None)
    executions = TopicReader(settings, topics.executions, None)  # bad ones are in there too
    roles.start()
    try:
        with JobClient(settings=settings) as client:
            dag = client.create_dag(
                "poison-dag",
                [
                    {"key": "a", "name": "a", "target": {"type": "http", "url": sink.url}},
                    {
                        "key": "b",
                        "name": "b",
                        "target": {"type": "http", "url": sink.url},
                        "depends_on": ["a"],
                    },
                ],
            )
            wait_known(settings, dag, timeout_s=90)
            first = good_traffic(client, sink, dag, "before")
            wait_phase_done(settings, roles, first, dag)
            wait_for(
                lambda: all(
                    any(m.topic() == t for m in everything.raw)
                    for t in set(consumers_of(topics)) - set(topics.executions)
                    | {topics.execution("normal")}
                ),
                30,
                "a real record on every topic to build bad ones from",
            )
            injected = inject(settings, everything, codec, rng)
            second = good_traffic(client, sink, dag, "after")
            wait_phase_done(settings, roles, second, dag)

            expected = Counter(
                (role, i.topic, i.partition, i.offset) for i in injected for role in i.roles
            )

            def all_parked() -> bool:
                roles.check_alive()
                got = Counter((p.role, p.topic, p.partition, p.offset) for p in parked(settings))
                return expected.keys() <= got.keys()

            try:
                wait_for(all_parked, 90, "every bad record to be parked by every role", 1.0)
            finally:
                got = Counter((p.role, p.topic, p.partition, p.offset) for p in parked(settings))
                missing = sorted(expected.keys() - got.keys())
                by_role = Counter(k[0] for k in missing)
                print(
                    f"injected {len(injected)}, expected parkings {len(expected)}, "
                    f"missing {len(missing)} by role {dict(by_role)}"
                )
                for k in missing[:40]:
                    kind = next(
                        i.kind for i in injected if (i.topic, i.partition, i.offset) == k[1:]
                    )
                    print("  missing", kind, k)

            # the runs of the DAG: b released once per run
            for phase in (first, second):
                b_requests = [
                    r
                    for r in requests_in(executions, codec)
                    if r["job_id"] == dag.job_ids["b"] and r["dag_run_id"] == phase.dag_run_id
                ]
                assert len(b_requests) == 1, (phase.dag_run_id, b_requests)

            # a corrupt changelog: states that do not decode, under the keys of jobs that ran,
            # due now; the restarted scheduler restores them and must carry on
            states = {m.key(): m for m in everything.raw if m.topic() == topics.state}
            corrupt = corrupt_states(settings, [states[j.encode()] for j in first.jobs[:3]], rng)
            injected += corrupt
            expected.update(
                (role, i.topic, i.partition, i.offset) for i in corrupt for role in i.roles
            )
            wait_for(all_parked, 60, "the projector to park the corrupt states", 1.0)

            # restart every role: nothing is parked again, new work still flows
            roles.stop()
            before_restart = Counter(
                (p.role, p.topic, p.partition, p.offset) for p in parked(settings)
            )
            roles.start()
            third = good_traffic(client, sink, dag, "restarted")
            wait_phase_done(settings, roles, third, dag)
            # "nothing is parked again": a window in which nothing may happen (a redelivered
            # bad record would be parked within it), so a sleep on purpose
            time.sleep(3.0)
            after_restart = Counter(
                (p.role, p.topic, p.partition, p.offset) for p in parked(settings)
            )
    finally:
        everything.close()
        executions.close()

    # each bad record: parked once per consuming role, with its bytes, error and source
    by_source = {(i.topic, i.partition, i.offset): i for i in injected}
    records = parked(settings)
    for p in records:
        if (p.topic, p.partition, p.offset) in by_source:
            assert p.value == by_source[(p.topic, p.partition, p.offset)].value
            assert p.error, p
    counts = Counter((p.role, p.topic, p.partition, p.offset) for p in records)
    assert {k: n for k, n in counts.items() if n > 1} == {}
    unexpected = set(counts) - set(expected)
    assert not unexpected, f"good records parked: {sorted(unexpected)[:10]}"
    assert after_restart == before_restart, "bad records were parked again after a restart"

    # committed offsets moved past every bad record, in every group
    injected_tps = sorted({(i.topic, i.partition) for i in injected})
    last: dict[tuple[str, int], int] = {}
    for i in injected:
        last[(i.topic, i.partition)] = max(last.get((i.topic, i.partition), -1), i.offset)
    groups = {
        "scheduler": f"{settings.topic_prefix}schedulers",
        "worker": f"{settings.topic_prefix}workers",
        "resolver": f"{settings.topic_prefix}resolver",
    }
    consumers = consumers_of(topics)
    for role, group in groups.items():
        tps = [tp for tp in injected_tps if role in consumers[tp[0]]]
        offsets = committed_offsets(settings.bootstrap_servers, group, tps)
        behind = {tp: offsets[tp] for tp in tps if offsets[tp] <= last[tp]}
        assert not behind, f"{role} committed offsets not past the bad records: {behind}"
    stored = projector_offsets(settings)
    behind = {tp: stored.get(tp, -1) for tp in injected_tps if stored.get(tp, -1) <= last[tp]}
    assert not behind, f"projector offsets not past the bad records: {behind}"

    # good records: one execution request and one delivery per job, all success
    good = first.jobs + second.jobs + third.jobs
    # one execution per job, each attempt requested once (a retry is a new attempt, not a copy)
    seen = requests_in(executions, codec)
    requests = Counter(r["job_id"] for r in seen if r["attempt"] == 1)
    copies = Counter((r["execution_id"], r["attempt"]) for r in seen)
    executions_of: dict[str, set[str]] = {}
    for r in seen:
        executions_of.setdefault(r["job_id"], set()).add(r["execution_id"])
    # effects: a job's deliveries under more than one Idempotency-Key would be two effects
    keys: dict[str, set[str]] = {}
    for d in sink.deliveries:
        keys.setdefault(d.job_id, set()).add(d.key)
    deliveries = Counter({j: len(k) for j, k in keys.items()})
    write_counts(
        "poison",
        {
            "jobs": len(good),
            "lost": sum(1 for j in good if deliveries[j] == 0),
            "duplicate_effects": sum(1 for j in good if deliveries[j] > 1),
            "duplicate_requests": sum(1 for n in copies.values() if n > 1)
            + sum(1 for j in good if len(executions_of.get(j, ())) > 1),
            "bad_records": len(injected),
            "parked_copies": sum(counts.values()),
            "parked_again_after_restart": sum((after_restart - before_restart).values()),
        },
        {
            "topics": sorted({i.topic.removeprefix(settings.topic_prefix) for i in injected}),
            "kinds": sorted({i.kind for i in injected}),
            "partitions": settings.partitions,
            "roles": ["scheduler", "worker", "projector", "resolver"],
        },
    )
    assert {j: requests[j] for j in good if requests[j] != 1} == {}
    assert {k: n for k, n in copies.items() if n > 1} == {}
    assert {j: e for j, e in executions_of.items() if j in set(good) and len(e) > 1} == {}
    assert {j: deliveries[j] for j in good if deliveries[j] != 1} == {}
    assert set(statuses(settings, good).values()) == {"success"}
    print(
        f"poison: {len(injected)} bad records on {len(injected_tps)} topic partitions, "
        f"{sum(counts.values())} parked copies, {len(good)} good jobs each run once"
    )
