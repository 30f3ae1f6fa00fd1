"""Codec.projection: a reader that builds only some fields of an event. What it builds must
be exactly those fields of the whole decode, for records of every published version."""

from __future__ import annotations

import io

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.consumers.projector.rows import DefinitionRevision, StateHead, kept_fields
from duetime.core.errors import DecodeError
from duetime.core.jobspec import build_job
from duetime.core.models import Status
from duetime.core.records import InflightExecution, SchedulerState
from duetime.schemas.codec import MAGIC, Codec, load_history

CODEC = Codec()
HISTORY = load_history()["duetime.SchedulerState"]
NOW_MS = 1_790_000_000_000


def _state(status: Status = Status.RUNNING, next_run_at_ms: int | None = None) -> SchedulerState:
    definition = build_job(
        {
            "name": "projected",
            "schedule": {"cron": "*/5 * * * *", "timezone": "Europe/Berlin"},
            "target": {"type": "http", "url": "http://127.0.0.1:9/x", "headers": {"a": "b"}},
            "payload": {"k": [1, 2, {"z": None}]},
            "labels": {"team": "x"},
        },
        now_ms=NOW_MS,
    )
    inflight = InflightExecution(
        execution_id="7d3a8a50-9a7c-4f3b-8c4e-3f4f2f3b7e11",
        attempt=1,
        scheduled_at_ms=NOW_MS,
        due_at_ms=NOW_MS,
        status=Status.RUNNING,
    )
    return SchedulerState(
        job_id=definition.job_id,
        definition=definition,
        status=status,
        next_run_at_ms=next_run_at_ms,
        inflight=[inflight],
        updated_at_ms=NOW_MS + 7,
        dag_runs={"r1": Status.SUCCESS},
    )


_TOP_FIELDS = [str(f["name"]) for f in CODEC.schema("state")["fields"]]


@settings(max_examples=60, deadline=None)
@given(
    st.sets(st.sampled_from(_TOP_FIELDS), min_size=1),
    st.sampled_from(list(Status)),
    st.one_of(st.none(), st.integers(0, 2**62)),
)
def test_a_projection_builds_exactly_the_kept_fields_of_the_whole_decode(
    kept: set[str], status: Status, next_run_at_ms: int | None
) -> None:
    data = CODEC.dump(_state(status, next_run_at_ms))
    whole = CODEC.decode("state", data)
    reader = CODEC.projection("state", dict.fromkeys(kept))
    assert CODEC.decode("state", data, reader=reader) == {k: whole[k] for k in kept}


def test_a_nested_projection_and_the_partial_record() -> None:
    state = _state(Status.PAUSED, 123)
    data = CODEC.dump(state)
    reader = CODEC.projection("state", kept_fields(StateHead))
    head = CODEC.load(StateHead, data, reader=reader)
    assert head == StateHead(
        job_id=state.job_id,
        definition=DefinitionRevision(revision=state.definition.revision),
        status=Status.PAUSED,
        next_run_at_ms=123,
        updated_at_ms=state.updated_at_ms,
    )


def _as_version(version: int, state: SchedulerState) -> bytes:
    """``state`` written as published version ``version`` wrote it: the fields that version
    declares (fastavro's resolution trims the rest), framed with that version."""
    current = CODEC._event("state").reader
    old = fastavro.parse_schema(HISTORY[version], named_schemas={})
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, current, CODEC.decode("state", CODEC.dump(state)))
    buffer.seek(0)
    trimmed = fastavro.schemaless_reader(buffer, current, old)
    out = io.BytesIO()
    out.write(bytes([MAGIC]) + version.to_bytes(2))
    fastavro.schemaless_writer(out, old, trimmed)
    return out.getvalue()


def test_every_published_state_version_reads_through_the_projection() -> None:
    reader = CODEC.projection("state", kept_fields(StateHead))
    state = _state(Status.QUEUED, 99)
    for version in sorted(HISTORY):
        head = CODEC.load(StateHead, _as_version(version, state), reader=reader)
        assert head.definition.revision == state.definition.revision, version
        assert (head.job_id, head.status, head.next_run_at_ms, head.updated_at_ms) == (
            state.job_id,
            Status.QUEUED,
            99,
            state.updated_at_ms,
        ), version


def test_garbage_through_a_projection_is_a_decode_error() -> None:
    reader = CODEC.projection("state", kept_fields(StateHead))
    data = CODEC.dump(_state())
    with pytest.raises(DecodeError, match="state"):
        CODEC.load(StateHead, data[: len(data) // 2], reader=reader, topic="t", offset=3)


def test_a_projection_names_what_it_cannot_build() -> None:
    with pytest.raises(ValueError, match="no field"):
        CODEC.projection("state", {"job_id": None, "nope": None})
    with pytest.raises(ValueError, match="no field"):
        CODEC.projection("state", {"definition": {"revision": None, "nope": None}})
    with pytest.raises(ValueError, match="only an inline record"):
        CODEC.projection("state", {"status": {"x": None}})
    reader = CODEC.projection("state", {"job_id": None})
    with pytest.raises(ValueError, match="cannot read"):
        CODEC.decode("job", b"\xd7\x00\x01", reader=reader)
