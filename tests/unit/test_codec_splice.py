"""A scheduler state's bytes with its definition's kept bytes spliced in (schemas/codec.py):
identical to encoding the whole record, whichever way the definition's bytes were kept."""

from __future__ import annotations

import dataclasses
import gc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duetime.core.errors import DecodeError, ValidationError
from duetime.core.models import Status
from duetime.core.records import JobDefinition, SchedulerState, to_avro_without
from duetime.schemas.codec import Codec

from .test_schemas import PROPERTY, job_record
from .test_schemas import records as avro_records


@pytest.fixture(scope="module")
def codec() -> Codec:
    return Codec(keep_definitions=True)


def _state(codec: Codec, data: st.DataObject) -> SchedulerState:
    plain = data.draw(avro_records(codec.schema("state")), label="state")
    return codec.load(SchedulerState, codec.encode("state", plain))


@PROPERTY
@given(data=st.data())
def test_a_spliced_state_is_byte_for_byte_the_whole_encoding(
    codec: Codec, data: st.DataObject
) -> None:
    assert codec._state_splice is not None  # the schemas allow the splice: it is taken
    state = _state(codec, data)
    whole = codec.encode("state", state.to_avro())
    assert codec.dump(state) == whole  # the definition encoded and kept
    assert codec.dump(state) == whole  # the kept bytes spliced in
    assert codec.load(SchedulerState, whole) == state


@PROPERTY
@given(data=st.data())
def test_a_definition_read_from_the_jobs_topic_is_spliced_as_it_was_written(
    codec: Codec, data: st.DataObject
) -> None:
    plain = data.draw(avro_records(codec.schema("job")), label="definition")
    definition = codec.load(JobDefinition, codec.encode("job", plain))
    state = dataclasses.replace(_state(codec, data), definition=definition)
    spliced = codec.dump(state)
    assert spliced == codec.encode("state", state.to_avro())
    assert codec.load(SchedulerState, spliced) == state


@PROPERTY
@given(data=st.data())
def test_the_plain_form_without_the_definition_is_the_rest_of_the_whole(
    codec: Codec, data: st.DataObject
) -> None:
    # what the splice writes around the kept bytes (records.to_avro_without)
    state = _state(codec, data)
    whole = state.to_avro()
    del whole["definition"]
    assert to_avro_without(state, "definition") == whole


def test_the_plain_form_without_an_unknown_field_is_refused(codec: Codec) -> None:
    definition = codec.load(JobDefinition, codec.encode("job", job_record()))
    with pytest.raises(ValueError, match="no field 'nope'"):
        to_avro_without(definition, "nope")


def test_a_state_that_does_not_encode_still_names_its_field(codec: Codec) -> None:
    definition = codec.load(JobDefinition, codec.encode("job", job_record()))
    state = SchedulerState(
        job_id=definition.job_id,
        definition=definition,
        status=Status.PENDING,
        updated_at_ms=2**70,  # past Avro's long
    )
    with pytest.raises(ValidationError, match="updated_at_ms"):
        codec.dump(state)


def test_a_definitions_bytes_are_kept_while_it_lives() -> None:
    codec = Codec(keep_definitions=True)
    kept = []
    for i in range(10):
        record = job_record(job_id=f"6f1d3a56-1f9e-4a8e-9a55-0c0f3e1c2b{i:02d}")
        definition = codec.load(JobDefinition, codec.encode("job", record))
        if i % 2:
            kept.append(definition)
    del definition
    gc.collect()
    assert len(codec._parts) == 5  # the others' went with them
    assert all(codec._parts[id(d)][0]() is d for d in kept)
    kept.clear()
    gc.collect()
    assert not codec._parts


def test_other_roles_keep_no_definitions() -> None:
    codec = Codec()
    codec.load(JobDefinition, codec.encode("job", job_record()))
    assert codec._state_splice is None and not codec._parts


@PROPERTY
@given(data=st.data())
def test_a_state_read_back_keeps_its_definitions_bytes_for_the_next_write(
    codec: Codec, data: st.DataObject
) -> None:
    # a state the scheduler reads from its store is written again at its fire: its definition
    # is not encoded again, the bytes it was read with are spliced in
    whole = codec.encode("state", data.draw(avro_records(codec.schema("state")), label="state"))
    state = codec.load(SchedulerState, whole)
    definition_bytes = Codec().encode("job", state.definition.to_avro())[3:]  # past the frame
    ref, kept = codec._parts[id(state.definition)]
    assert ref() is state.definition and kept == definition_bytes
    assert codec.dump(state) == whole
    assert state == Codec().load(SchedulerState, whole)  # the record of a whole decoding


def test_a_state_that_does_not_decode_in_parts_still_names_the_problem(codec: Codec) -> None:
    whole = codec.encode("state", _plain_state(codec))
    for broken in (whole[:-1], whole + b"\x00"):
        with pytest.raises(DecodeError, match="undecodable state value"):
            codec.load(SchedulerState, broken, topic="duetime.state", offset=7)


def _plain_state(codec: Codec) -> dict[str, object]:
    definition = codec.load(JobDefinition, codec.encode("job", job_record()))
    state = SchedulerState(
        job_id=definition.job_id, definition=definition, status=Status.PENDING, updated_at_ms=1
    )
    return state.to_avro()
