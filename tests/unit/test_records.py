"""The typed records (duetime.core.records) against the Avro schemas they stand for."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duetime.core import records as r
from duetime.core.models import Priority, Status
from duetime.schemas.codec import EVENT_TYPES, Codec, bundle_schema, load_named_types

from .test_schemas import PROPERTY, execution_record, job_record
from .test_schemas import records as avro_records

NAMED = load_named_types()


@pytest.fixture(scope="module")
def codec() -> Codec:
    return Codec()


@pytest.mark.parametrize("cls", r.RECORDS, ids=lambda c: c.__name__)
def test_fields_are_the_schema_fields_in_order_with_its_defaults(cls: type[Any]) -> None:
    schema = bundle_schema(cls.AVRO_NAME, NAMED)
    assert [f.name for f in dataclasses.fields(cls)] == [f["name"] for f in schema["fields"]]
    for f, avro in zip(dataclasses.fields(cls), schema["fields"], strict=True):
        if "default" not in avro:
            assert f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            continue
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
            default = default.to_avro() if isinstance(default, r.AvroRecord) else default
        else:
            default = f.default
        assert default == avro["default"], f"{cls.__name__}.{f.name}"


def test_every_topic_value_has_a_record_class() -> None:
    assert set(r.BY_EVENT_TYPE) == set(EVENT_TYPES)
    for event_type, cls in r.BY_EVENT_TYPE.items():
        assert EVENT_TYPES[event_type] == cls.AVRO_NAME


@pytest.mark.parametrize("event_type", list(EVENT_TYPES))
@PROPERTY
@given(data=st.data())
def test_typed_round_trip_gives_back_the_plain_record(
    codec: Codec, event_type: str, data: st.DataObject
) -> None:
    plain = data.draw(avro_records(codec.schema(event_type)), label="record")
    cls = r.BY_EVENT_TYPE[event_type]
    typed = codec.load(cls, codec.encode(event_type, plain))
    assert isinstance(typed, cls)
    assert codec.decode(event_type, codec.dump(typed)) == plain


def test_enums_and_unions_decode_to_their_types(codec: Codec) -> None:
    request = codec.load(r.ExecutionRequest, codec.encode("execution", execution_record()))
    assert request.priority is Priority.HIGH
    assert request.target == r.PythonTarget(ref="reports.tasks:nightly")
    job = codec.load(r.JobDefinition, codec.encode("job", job_record()))
    assert isinstance(job.schedule, r.CronSchedule)
    assert isinstance(job.target, r.HttpTarget) and job.target.method == "POST"
    assert job.retry == r.RetrySpec()


def test_content_no_record_holds_is_refused_naming_it() -> None:
    plain = job_record()
    with pytest.raises(TypeError, match="colour"):
        r.JobDefinition.from_avro({**plain, "colour": "red"})
    with pytest.raises(ValueError, match="'urgent' is not a valid Priority"):
        r.JobDefinition.from_avro({**plain, "priority": "urgent"})
    with pytest.raises(ValueError, match="matches none"):
        r.JobDefinition.from_avro({**plain, "target": {"path": "/x"}})


def test_records_that_travel_are_frozen_and_state_is_not() -> None:
    job = r.JobDefinition.from_avro(job_record())
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.name = "other"  # type: ignore[misc]
    state = r.SchedulerState(
        job_id=job.job_id, definition=job, status=Status.PENDING, updated_at_ms=1
    )
    state.status = Status.QUEUED
    assert state.to_avro()["status"] == "queued"
