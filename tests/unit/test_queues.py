"""Queues (issue 14.1), the pure parts: topic names and their parsing, queue-name validation,
the metadata cache, the worker's settings, the scheduler's refusal of an unroutable request,
the lag arithmetic. No broker: the integration tests (tests/integration/test_queues.py) and
the two-pool end-to-end test (tests/e2e/test_queue_pools.py) do the rest."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duetime.consumers.worker.settings import WorkerSettings
from duetime.core.config import Env
from duetime.core.errors import ConfigError, ValidationError
from duetime.core.jobspec import build_job, job_to_api
from duetime.core.lag import record_gap
from duetime.core.models import PRIORITY_ORDER, Priority, Status
from duetime.core.queues import QueueDirectory
from duetime.core.records import ExecutionRequest, JobDefinition
from duetime.core.topics import DEFAULT_QUEUE, QUEUE_PATTERN, Topics, check_queue
from duetime.infra.queues import check_partitions
from duetime.schedulers import logic
from duetime.schemas.codec import Codec

NOW = 1_800_000_000_000
queue_names = st.from_regex(re.compile(f"^{QUEUE_PATTERN}$"), fullmatch=True)
prefixes = st.sampled_from(["duetime.", "t0a1b2c3d4.", "acme.prod.", ""])


# --- topic names ----------------------------------------------------------------------------


@given(prefixes, queue_names, st.sampled_from(PRIORITY_ORDER))
def test_a_queue_topic_parses_back_to_its_queue_and_priority(
    prefix: str, queue: str, priority: Priority
) -> None:
    topics = Topics(prefix)
    name = topics.execution(priority, queue)
    assert topics.parse_execution(name) == (queue, priority)
    assert topics.event_type_of(name) == "execution"
    assert re.fullmatch(topics.executions_regex[1:], name)  # the projector's subscription


@given(prefixes, st.text(max_size=80))
def test_parsing_any_name_never_raises_and_accepts_only_what_execution_writes(
    prefix: str, tail: str
) -> None:
    topics = Topics(prefix)
    parsed = topics.parse_execution(prefix + "exec." + tail)
    if parsed is not None:
        assert topics.execution(parsed[1], parsed[0]) == prefix + "exec." + tail


def test_the_default_queue_keeps_todays_topics() -> None:
    topics = Topics("duetime.")
    assert topics.execution("normal") == "duetime.exec.normal"
    assert topics.executions == [f"duetime.exec.{p.value}" for p in PRIORITY_ORDER]
    assert topics.executions_of("emails") == [f"duetime.exec.emails.{p}" for p in PRIORITY_ORDER]
    # one spelling per topic: the default queue is never exec.default.<priority>
    assert topics.parse_execution("duetime.exec.default.normal") is None
    for bad in ("duetime.exec.a.b.c", "duetime.exec.urgent", "duetime.jobs", "x.exec.normal"):
        assert topics.parse_execution(bad) is None
    specs = {s.name: s for s in topics.specs(3)}
    assert {t: specs[t].config for t in topics.executions} == {
        s.name: s.config for s in topics.queue_specs(DEFAULT_QUEUE, 3)
    }


def test_a_queue_exists_when_its_four_topics_do() -> None:
    topics = Topics("p.")
    names = [*topics.executions, *topics.executions_of("a"), *topics.executions_of("b")[:3]]
    assert topics.complete_queues(names) == {"default", "a"}
    assert topics.queues_in(names)["b"] == set(PRIORITY_ORDER[:3])


@given(st.text(max_size=60))
def test_queue_names_outside_the_pattern_are_refused(name: str) -> None:
    if re.fullmatch(QUEUE_PATTERN, name):
        assert check_queue(name) == name
    else:
        with pytest.raises(ValueError, match="queue name"):
            check_queue(name)


@pytest.mark.parametrize("name", ["", "A", "a.b", "-a", "a" * 49, "ü", "a b", "../x", 7])
def test_bad_queue_names_are_named_in_the_error(name: object) -> None:
    with pytest.raises(ValueError):
        check_queue(name)


# --- job validation -------------------------------------------------------------------------


def _job(**fields: object) -> JobDefinition:
    body = {"name": "q", "target": {"type": "http", "url": "http://127.0.0.1:9/x"}, **fields}
    return build_job(body, now_ms=NOW)


def test_a_job_has_a_queue_default_default() -> None:
    assert _job().queue == "default"
    assert _job(queue="emails").queue == "emails"
    assert job_to_api(_job(queue="emails"))["queue"] == "emails"


@pytest.mark.parametrize("queue", ["Emails", "a.b", "", None, 3, "x" * 49])
def test_an_invalid_queue_is_refused_naming_the_field(queue: object) -> None:
    with pytest.raises(ValidationError) as info:
        _job(queue=queue)
    assert info.value.details["field"] == "queue"


def test_the_queue_survives_the_codec() -> None:
    # (records of the previous schema versions decoding to "default": test_schemas.py)
    codec = Codec()
    definition = _job(queue="emails")
    assert codec.load(JobDefinition, codec.dump(definition)).queue == "emails"


# --- the metadata cache ---------------------------------------------------------------------


class FakeCluster:
    def __init__(self, topics: Mapping[str, int]) -> None:
        self.topics = dict(topics)
        self.calls = 0
        self.down = False

    def __call__(self, timeout_s: float) -> Mapping[str, int]:
        self.calls += 1
        if self.down:
            raise RuntimeError("broker down")
        return dict(self.topics)


class Ticks:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_directory_caches_and_sees_a_new_queue_within_a_second() -> None:
    topics = Topics("p.")
    cluster, clock = FakeCluster(dict.fromkeys(topics.executions_of("a"), 3)), Ticks()
    d = QueueDirectory(topics, cluster, refresh_s=10, recheck_s=1, monotonic=clock)
    assert d.exists("default") is True and cluster.calls == 0  # never asked for the default
    assert d.exists("a") is True and d.exists("a") is True and cluster.calls == 1
    assert d.exists("b") is False and cluster.calls == 1  # a miss right after a read: cached
    cluster.topics.update(dict.fromkeys(topics.executions_of("b"), 3))
    clock.now += 1.5
    assert d.exists("b") is True and cluster.calls == 2
    del cluster.topics[topics.execution("low", "a")]
    clock.now += 5
    assert d.exists("a") is True  # within refresh_s a known queue is not re-read
    clock.now += 6
    assert d.exists("a") is False and cluster.calls == 3


def test_the_directory_cannot_tell_when_the_broker_is_down_and_does_not_hammer_it() -> None:
    topics = Topics("p.")
    cluster, clock = FakeCluster({}), Ticks()
    cluster.down = True
    d = QueueDirectory(topics, cluster, refresh_s=10, recheck_s=1, monotonic=clock)
    assert d.exists("a") is None and d.exists("a") is None and cluster.calls == 1
    clock.now += 11
    cluster.down = False
    assert d.exists("a") is False and cluster.calls == 2


def test_a_queue_with_fewer_partitions_than_the_jobs_topic_counts_as_missing() -> None:
    topics = Topics("p.")
    cluster = FakeCluster({**dict.fromkeys(topics.executions_of("a"), 2)})
    d = QueueDirectory(topics, cluster, min_partitions=3, monotonic=Ticks())
    assert d.exists("a") is False


def test_queues_create_takes_the_jobs_topics_partition_count_only() -> None:
    assert check_partitions(None, 6) == 6 and check_partitions(6, 6) == 6
    with pytest.raises(ValidationError, match="DUETIME_PARTITIONS"):
        check_partitions(12, 6)


# --- the worker's settings ------------------------------------------------------------------


def test_worker_queues_default_and_list() -> None:
    assert WorkerSettings.from_env(Env({})).queues == ("default",)
    s = WorkerSettings.from_env(Env({"DUETIME_WORKER_QUEUES": " emails , default"}))
    assert s.queues == ("emails", "default") and s.new_group_start == "end"
    assert (
        WorkerSettings.from_env(Env({"DUETIME_WORKER_NEW_GROUP_START": "beginning"}))
    ).new_group_start == "beginning"


@pytest.mark.parametrize(
    ("value", "says"),
    [("Emails", "queue name"), ("a,a", "twice"), (",", "no queue"), ("a.b", "queue name")],
)
def test_bad_worker_queues_name_the_variable(value: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says) as info:
        WorkerSettings.from_env(Env({"DUETIME_WORKER_QUEUES": value}))
    assert info.value.details["variable"] == "DUETIME_WORKER_QUEUES"


# --- the scheduler --------------------------------------------------------------------------


def test_a_request_to_a_missing_queue_is_dead_lettered_and_the_job_goes_on() -> None:
    definition = _job(queue="gone", schedule={"at": "2020-01-01T00:00:00Z"})
    state, _ = logic.on_definition(None, definition, NOW)
    out = logic.fire_due(state, NOW, logic.Policy())
    [request] = out.executions
    assert request.queue == "gone" and state.inflight[0].queue == "gone"
    logic.refuse_unroutable(state, request.execution_id, "queue 'gone' does not exist", NOW, out)
    assert out.executions == [] and state.inflight == []
    [dead] = out.dead_letters
    assert dead.errors[-1].error.type == "UnknownQueue"
    assert "gone" in dead.errors[-1].error.message and not dead.errors[-1].error.retryable
    assert state.status is Status.DEAD
    assert dead.request.queue == "gone"


def test_retries_and_rescues_go_to_the_executions_own_queue() -> None:
    state, _ = logic.on_definition(
        None, _job(queue="a", schedule={"at": "2020-01-01T00:00:00Z"}), NOW
    )
    [request] = logic.fire_due(state, NOW, logic.Policy()).executions
    state.definition = replace(state.definition, queue="b")  # the job moved to queue b
    again = logic.execution_request(state, state.inflight[0], NOW + 1)
    assert isinstance(again, ExecutionRequest) and again.queue == "a" == request.queue


def test_a_raw_definition_with_a_bad_queue_is_refused_by_the_scheduler() -> None:
    bad = replace(_job(), queue="../x")
    with pytest.raises(ValueError, match="queue name"):
        logic.check_input(bad)


# --- lag ------------------------------------------------------------------------------------


@given(st.integers(0, 50), st.integers(0, 50), st.sets(st.integers(0, 120)))
def test_the_record_gap_counts_only_records_in_the_range(
    start: int, width: int, offsets: set[int]
) -> None:
    end = start + width
    assert record_gap(start, end, offsets) == len([o for o in offsets if start <= o < end])
    assert 0 <= record_gap(start, end, offsets) <= width
