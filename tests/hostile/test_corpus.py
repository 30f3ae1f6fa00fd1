"""A generated corpus of hostile inputs, through every channel, against one stack of roles.

Hypothesis draws job bodies with unknown fields, wrong types, huge numbers, NULs, control
characters and odd Unicode in strings, reserved prefixes, deep nesting and big sizes, and sends
them through REST (never a 5xx; every 4xx has the documented error body; a refused body with a
traceable job_id left nothing behind) and through the SDK (``JobClient.create_job``: it
succeeds or raises a ``DuetimeError`` subclass, nothing else). It also writes raw records past
every producer: random bytes and valid Avro with hostile field values, on the jobs, control,
results and normal execution topics. Every undecodable record must be parked by a role with a
reason, and the last test asserts the roles survived it all (same PIDs, plain jobs fire).

Bounded and reproducible: ``derandomize=True``, a fixed number of examples per channel, no
shrinking against the live stack (a failure prints the example as drawn).
"""

from __future__ import annotations

import base64
import decimal
import json
import math
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import pytest
from confluent_kafka import Producer
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from duetime.core.errors import DuetimeError
from duetime.schemas.codec import Codec
from tests.helpers import TopicReader, wait_for
from tests.hostile.conftest import FAR, HostileStack, assert_refused

EXAMPLES = 150
CORPUS = hsettings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
        HealthCheck.large_base_example,
    ],
)

JOB_KEYS = [
    "job_id", "name", "schedule", "priority", "target", "payload", "retry", "timeout_s",
    "misfire", "overlap", "labels", "dag_id", "dag_key", "depends_on",
]  # fmt: skip
NASTY_TEXT = [
    "",
    " ",
    "\x00",
    "a\x00b",
    "\n",
    "line\nINJECTED",
    "\r\n",
    "\x1b[31m",
    "\u202e",
    "\ufeff",
    "\U0001f4a5",
    "duetime.dag",
    "duetime.",
    "sys:exit",
    "os:path.__class__.__subclasses__",
    "__consumer_offsets",
    "duetime.jobs",
    "${secret:X}",
    "../../etc/passwd",
    "http://169.254.169.254/latest/meta-data/",
    "http://user:pw@127.0.0.1:1/?api_key=k",
    "* * * * * *",
    "0 0 31 2 *",
    "0001-01-01T00:00:00+14:00",
    "9999-12-31T23:59:59-14:00",
    "Europe/Nowhere",
    "x" * 5000,
    "é" * 300,
]
HUGE_NUMBERS = [10**400, -(10**400), 2**63, -(2**63) - 1, 2**64, 2**31, -1, 0, 1e308, -0.0]

texts = st.one_of(
    st.sampled_from(NASTY_TEXT),
    st.text(max_size=40),
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x1F), max_size=10),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from(HUGE_NUMBERS),
    st.floats(allow_nan=False, allow_infinity=False),
    texts,
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)
targets = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {"type": st.sampled_from(["http", "python", "kafka"]) | texts},
        optional={
            "url": texts | st.just("http://127.0.0.1:9/x"),
            "method": st.sampled_from(["POST", "GET", "TRACE", "CONNECT"]) | texts,
            "headers": st.dictionaries(texts, texts | json_values, max_size=3),
            "ref": texts | st.sampled_from(["builtins:print", "tests.hostile.tasks:ok"]),
            "topic": texts,
            "extra": json_values,
        },
    ),
)
schedules = st.one_of(
    json_values,
    st.fixed_dictionaries({"at": texts | st.sampled_from(HUGE_NUMBERS) | json_values}),
    st.fixed_dictionaries(
        {"cron": texts, "timezone": texts | st.sampled_from(["UTC", "Europe/Berlin"])},
        optional={"start_at": texts | json_values, "end_at": texts | json_values},
    ),
)
OVERRIDES: dict[str, st.SearchStrategy[Any]] = {
    "job_id": texts | st.just("00000000-0000-0000-0000-000000000000") | json_values,
    "name": texts | json_values,
    "schedule": schedules,
    "target": targets,
    "payload": json_values,
    "retry": json_values
    | st.dictionaries(
        st.sampled_from(["max_retries", "base_delay_s", "max_delay_s", "jitter", "x"]),
        st.sampled_from(HUGE_NUMBERS) | scalars,
        max_size=4,
    ),
    "timeout_s": st.sampled_from(HUGE_NUMBERS) | scalars | json_values,
    "labels": json_values | st.dictionaries(texts, texts, max_size=3),
    "depends_on": json_values | st.lists(texts, max_size=3),
}


def deep(depth: int) -> Any:
    value: Any = 0
    for i in range(depth):
        value = [value] if i % 2 else {"d": value}
    return value


@st.composite
def job_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """A valid job body, then 1-4 hostile changes: a field replaced, removed or added."""
    body: dict[str, Any] = {
        "job_id": str(uuid.uuid4()),
        "name": "corpus",
        "schedule": FAR,
        "target": {"type": "http", "url": "http://127.0.0.1:9/never"},
        "payload": {},
    }
    for _ in range(draw(st.integers(1, 4))):
        change = draw(st.sampled_from(["replace", "replace", "remove", "unknown", "big", "deep"]))
        key = draw(st.sampled_from(JOB_KEYS))
        if change == "replace":
            body[key] = draw(OVERRIDES.get(key, json_values))
        elif change == "remove":
            body.pop(key, None)
        elif change == "unknown":
            body[draw(texts)] = draw(json_values)
        elif change == "big":
            body[draw(st.sampled_from(["payload", "name", "labels"]))] = "B" * draw(
                st.sampled_from([201, 70_000, 300_000])
            )
        else:
            body["payload"] = deep(draw(st.sampled_from([30, 65, 200, 900])))
    return body


NIL = str(uuid.UUID(int=0))


def traceable_id(body: dict[str, Any]) -> str | None:
    """The body's own job id, when a refusal can be traced by it: each body has a fresh one,
    except the nil UUID, which several bodies share (one may be created, another refused)."""
    raw = body.get("job_id")
    if not isinstance(raw, str):
        return None
    try:
        job_id = str(uuid.UUID(raw))
    except ValueError:
        return None
    return None if job_id == NIL else job_id


# --- REST ----------------------------------------------------------------------------------


@CORPUS
@given(body=job_bodies())
def test_rest_never_5xx(stack: HostileStack, body: dict[str, Any]) -> None:
    stack.injected_lines.add("INJECTED")  # NASTY_TEXT's "line\nINJECTED", e.g. as a field name
    raw = json.dumps(body).encode()  # big integers pass as JSON numbers, as a client sends them
    resp = stack.api.post("/v1/jobs", content=raw, headers={"Content-Type": "application/json"})
    assert resp.status_code < 500, f"{resp.status_code} for {raw[:300]!r}: {resp.text[:500]}"
    if resp.status_code >= 400:
        assert_refused(resp, None, (400, 409, 413, 415, 422))
        job_id = traceable_id(body)
        if job_id is not None and resp.status_code != 409:
            stack.refused_jobs.add(job_id)


def test_rest_refusals_wrote_nothing(stack: HostileStack) -> None:
    assert stack.refused_jobs, "the corpus refused nothing: it is not hostile"
    stack.assert_nothing_written(stack.refused_jobs)
    stack.assert_up()


@st.composite
def dag_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """A DAG of 1-6 hostile members: keys, dependencies (unknown keys, self-loops, cycles),
    member fields that are the DAG's, and the job-body mutations of ``job_bodies``."""
    # mostly a valid acyclic shape (so the members' own fields are reached); now and then a
    # hostile key, a duplicate, an unknown dependency or a cycle
    keys = [f"k{i}" for i in range(draw(st.integers(1, 6)))]
    if draw(st.integers(0, 4)) == 0:
        keys[draw(st.integers(0, len(keys) - 1))] = draw(texts)
    members: list[Any] = []
    for i, key in enumerate(keys):
        member = draw(job_bodies())
        for field in ("job_id", "schedule"):
            if draw(st.booleans()):
                member.pop(field, None)
        member["key"] = key
        earlier = st.lists(st.sampled_from(keys[:i]), max_size=2) if i else st.just([])
        member["depends_on"] = draw(
            earlier if draw(st.integers(0, 4)) else st.lists(st.sampled_from(keys) | texts)
        )
        if draw(st.integers(0, 9)) == 0:
            member[draw(st.sampled_from(["dag_id", "dag_key"]))] = draw(json_values)
        members.append(member)
    body: dict[str, Any] = {"dag_id": str(uuid.uuid4()), "name": "corpus-dag", "jobs": members}
    for _ in range(draw(st.integers(0, 2))):
        key = draw(st.sampled_from(["dag_id", "name", "jobs", "schedule", "overlap", "extra"]))
        body[key] = draw(OVERRIDES.get(key, json_values) if key != "jobs" else json_values)
    return body


@hsettings(CORPUS, max_examples=EXAMPLES // 2)
@given(body=dag_bodies())
def test_rest_dags_never_5xx(stack: HostileStack, body: dict[str, Any]) -> None:
    raw = json.dumps(body).encode()
    resp = stack.api.post("/v1/dags", content=raw, headers={"Content-Type": "application/json"})
    assert resp.status_code < 500, f"{resp.status_code} for {raw[:300]!r}: {resp.text[:500]}"
    if resp.status_code >= 400:
        assert_refused(resp, None, (400, 409, 413, 415, 422))


@hsettings(CORPUS, max_examples=EXAMPLES // 2)
@given(body=dag_bodies())
def test_sdk_dags_raise_only_duetime_errors(stack: HostileStack, body: dict[str, Any]) -> None:
    try:
        stack.sdk.create_dag(
            body.get("name"),  # type: ignore[arg-type]  # hostile on purpose
            body.get("jobs"),  # type: ignore[arg-type]
            schedule=body.get("schedule"),
            overlap=body.get("overlap", "skip"),
            dag_id=body.get("dag_id"),
        )
    except DuetimeError:
        pass
    except Exception as exc:
        raise AssertionError(
            f"the SDK's create_dag raised {type(exc).__name__} (not a DuetimeError): "
            f"{exc!s:.300} for {body!r:.300}"
        ) from exc


def cursor_of(value: Any) -> str:
    """A cursor as the API encodes them (urlsafe base64 of JSON), around any value."""
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


CRAFTED_CURSORS = [
    cursor_of(["0001-01-01T00:00:00+14:00", str(uuid.uuid4())]),
    cursor_of(["9999-12-31T23:59:59-14:00", str(uuid.uuid4())]),
    cursor_of(["2026-01-01T00:00:00\x00", str(uuid.uuid4())]),
    cursor_of(["2026-01-01T00:00:00+00:00", "not-a-uuid"]),
    cursor_of([1, 2]),
    cursor_of({"a": 1}),
    cursor_of([None, None, None]),
    "!!!",
    "",
]
READ_PATHS = ["/v1/jobs", "/v1/dlq", "/v1/dags", "/v1/jobs/{id}/executions", "/v1/dags/{id}/runs"]
READ_PARAMS = ["limit", "cursor", "status", "priority", "name", "name_contains", "job_id", "count"]
query_values = st.one_of(
    texts,
    st.sampled_from(CRAFTED_CURSORS),
    st.sampled_from(HUGE_NUMBERS).map(str),
    st.integers().map(str),
)


@CORPUS
@given(
    path=st.sampled_from(READ_PATHS),
    ident=st.uuids().map(str) | texts,
    params=st.dictionaries(st.sampled_from(READ_PARAMS) | texts, query_values, max_size=3),
)
def test_rest_reads_never_5xx(
    stack: HostileStack, path: str, ident: str, params: dict[str, str]
) -> None:
    """List and read routes with hostile ids, filters, limits and forged cursors."""
    url = path.replace("{id}", quote(ident, safe="") or "%20")
    resp = stack.api.get(url, params=params)
    assert resp.status_code < 500, f"{resp.status_code} for GET {url} {params!r}: {resp.text[:300]}"
    if resp.status_code >= 400:
        assert_refused(resp, None, (400, 404, 405, 413, 422))


# --- SDK -------------------------------------------------------------------------------------

PYTHON_ONLY = [
    math.nan,
    math.inf,
    -math.inf,
    b"bytes",
    {1, 2},
    (1, 2),
    {1: "int key"},
    {None: "none key"},
    decimal.Decimal("1.5"),
    datetime(2026, 1, 1, tzinfo=UTC),
]


@CORPUS
@given(
    body=job_bodies(),
    python_value=st.none() | st.sampled_from(PYTHON_ONLY),
    where=st.sampled_from(
        ["payload", "payload", "in-payload", "timeout_s", "labels", "name", "schedule", "retry"]
    ),
)
def test_sdk_raises_only_duetime_errors(
    stack: HostileStack, body: dict[str, Any], python_value: Any, where: str
) -> None:
    if python_value is not None and where == "in-payload":
        body["payload"] = {"k": [python_value]}
    elif python_value is not None:
        body[where] = python_value
    try:
        stack.sdk.create_job(body)
    except DuetimeError:
        job_id = traceable_id(body)
        if job_id is not None:
            stack.refused_jobs.add(job_id)
    except Exception as exc:
        raise AssertionError(
            f"the SDK raised {type(exc).__name__} (not a DuetimeError): {exc!s:.300} "
            f"for {body!r:.300}"
        ) from exc


def test_sdk_refusals_wrote_nothing(stack: HostileStack) -> None:
    stack.assert_nothing_written(stack.refused_jobs)
    stack.assert_up()


# --- raw records past every producer ------------------------------------------------------


@dataclass
class Written:
    topic: str
    partition: int
    offset: int
    undecodable: bool


WRITTEN: list[Written] = []
_SAMPLES: dict[str, dict[str, Any]] = {}


def samples(stack: HostileStack) -> dict[str, dict[str, Any]]:
    """A real record of each event type to mutate (the stack's warm-up job made them)."""
    if _SAMPLES:
        return _SAMPLES
    t = stack.topics
    for event, topic in (("execution", t.execution("normal")), ("result", t.results)):
        reader = TopicReader(stack.settings, [topic], event)
        try:
            found = wait_for(reader.snapshot, 30, f"a {event} record on {topic}")[0]
        finally:
            reader.close()
        _SAMPLES[event] = {k: v for k, v in found.items() if not k.startswith("_")}
    _SAMPLES["job"] = stack.sdk.build(
        name="raw", schedule=FAR, target={"type": "http", "url": stack.sink.url}
    ).to_avro()
    _SAMPLES["control"] = {
        "command_id": str(uuid.uuid4()),
        "job_id": _SAMPLES["job"]["job_id"],
        "kind": "trigger",
        "issued_at_ms": 0,
        "dag_id": None,
        "dag_run_id": None,
        "execution_id": None,
        "reason": None,
        "requested_by": None,
    }
    return _SAMPLES


CONTROL_KINDS = [
    "pause", "resume", "cancel", "trigger", "release", "skip", "replay", "dag_run_start",
    "dag_run_end",
]  # fmt: skip
ids = texts | st.uuids().map(str) | st.just("not-a-uuid")
longs = st.integers(-(2**63), 2**63 - 1)
ints = st.integers(-(2**31), 2**31 - 1)
opt_text = st.none() | texts
avro_targets = st.one_of(
    st.fixed_dictionaries(
        {
            "url": texts | st.just("http://169.254.169.254/"),
            "method": st.sampled_from(["POST", "GET"]) | texts,
            "headers": st.dictionaries(texts, texts, max_size=2),
        }
    ),
    st.fixed_dictionaries({"ref": texts | st.sampled_from(["sys:exit", "os:_exit"])}),
    st.fixed_dictionaries({"topic": texts}),
)
RECORD_OVERRIDES: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "job": {
        "job_id": ids,
        "name": texts,
        "revision": longs,
        "created_at_ms": longs,
        "schedule": st.none()
        | st.fixed_dictionaries({"at_ms": longs})
        | st.fixed_dictionaries(
            {"cron": texts, "timezone": texts, "start_at_ms": st.none(), "end_at_ms": st.none()}
        ),
        "target": avro_targets,
        "payload_json": texts,
        "timeout_s": st.floats(),
        "dag_id": opt_text,
        "dag_key": opt_text,
        "depends_on": st.lists(texts, max_size=3),
        "labels": st.dictionaries(texts | st.just("duetime.dag"), texts, max_size=3),
    },
    "control": {
        "job_id": ids,
        "kind": st.sampled_from(CONTROL_KINDS),
        "issued_at_ms": longs,
        "dag_id": opt_text,
        "dag_run_id": opt_text,
        "execution_id": opt_text,
        "reason": opt_text,
    },
    "result": {
        "execution_id": ids,
        "job_id": ids,
        "attempt": ints,
        "status": st.sampled_from(["running", "success", "failure"]),
        "lease_token": longs,
        "scheduled_at_ms": longs,
        "output_json": opt_text,
        "retry_after_s": st.none() | st.floats(),
        "dag_id": opt_text,
        "dag_run_id": opt_text,
        "dag_key": opt_text,
    },
    "execution": {
        "execution_id": ids,
        "job_id": ids,
        "name": texts,
        "attempt": ints,
        "scheduled_at_ms": longs,
        "due_at_ms": longs,
        "target": avro_targets,
        "payload_json": texts,
        "timeout_s": st.floats(),
        "dag_id": opt_text,
        "dag_run_id": opt_text,
        "dag_key": opt_text,
    },
}
TOPIC_EVENTS = {"jobs": "job", "control": "control", "results": "result", "exec": "execution"}


@pytest.fixture(scope="module")
def raw_producer(stack: HostileStack) -> Any:
    producer = Producer({"bootstrap.servers": stack.settings.bootstrap_servers, "acks": "all"})
    yield producer
    producer.flush(30)


@CORPUS
@given(data=st.data())
def test_raw_records(stack: HostileStack, raw_producer: Any, data: st.DataObject) -> None:
    codec = Codec()
    which = data.draw(st.sampled_from(sorted(TOPIC_EVENTS)), label="topic")
    event = TOPIC_EVENTS[which]
    topic = {
        "jobs": stack.topics.jobs,
        "control": stack.topics.control,
        "results": stack.topics.results,
        "exec": stack.topics.execution("normal"),
    }[which]
    record = dict(samples(stack)[event])
    value: bytes
    if data.draw(st.integers(0, 3), label="random bytes?") == 0:
        value = data.draw(st.binary(min_size=0, max_size=300), label="bytes")
    else:
        table = RECORD_OVERRIDES[event]
        fields = data.draw(
            st.lists(st.sampled_from(sorted(table)), min_size=1, max_size=4, unique=True),
            label="fields",
        )
        for f in fields:
            record[f] = data.draw(table[f], label=f)
        try:
            value = codec.encode(event, record)
        except Exception:  # a value the schema cannot hold (e.g. NaN is fine, a str is not)
            value = data.draw(st.binary(min_size=1, max_size=300), label="bytes instead")
    key = data.draw(st.sampled_from([str(record.get("job_id", "")), str(uuid.uuid4()), ""]))
    where: list[tuple[int, int]] = []

    def delivered(err: Any, msg: Any) -> None:
        assert err is None, err
        where.append((msg.partition(), msg.offset()))

    raw_producer.produce(
        topic, key=key.encode(errors="replace"), value=value, on_delivery=delivered
    )
    assert raw_producer.flush(30) == 0
    try:
        codec.decode(event, value)
        undecodable = False
    except DuetimeError:
        undecodable = True
    WRITTEN.append(Written(topic, where[0][0], where[0][1], undecodable))


def test_undecodable_records_parked(stack: HostileStack) -> None:
    bad = {(w.topic, w.partition, w.offset) for w in WRITTEN if w.undecodable}
    assert bad, "the raw corpus wrote no undecodable record"

    def all_parked() -> set[tuple[str, int, int]]:
        stack.assert_up()
        parked = {(p.topic, p.partition, p.offset) for p in stack.parked() if p.error}
        return bad - parked or set()

    missing: set[tuple[str, int, int]] = set(bad)

    def none_missing() -> bool:
        nonlocal missing
        missing = all_parked()
        return not missing

    try:
        wait_for(none_missing, 90, "every undecodable record to be parked with a reason", 2.0)
    except AssertionError:
        raise AssertionError(
            f"{len(missing)} undecodable records never parked: {missing}"
        ) from None


# --- the end ---------------------------------------------------------------------------------


def test_stack_survived(stack: HostileStack) -> None:
    stack.assert_survived()
