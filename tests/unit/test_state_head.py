"""The state head a scheduler writes in a header is the head the projector would read from the
state's value; a header that does not parse is refused (the value is read then)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from duetime.consumers.projector import rows
from duetime.core.jobspec import build_job
from duetime.core.models import Status
from duetime.core.state_head import decode_head, encode_head
from duetime.schedulers import logic
from duetime.schemas.codec import Codec

CODEC = Codec(registry_url=None)
HEAD_READER = CODEC.projection("state", rows.kept_fields(rows.StateHead))
LONGS = st.integers(-(2**63), 2**63 - 1)
DEFINITION = build_job(
    {
        "name": "head",
        "schedule": {"cron": "*/5 * * * *"},
        "target": {"type": "http", "url": "http://127.0.0.1:9/x"},
    },
    now_ms=1_790_000_000_000,
)


@given(
    revision=st.integers(0, 2**63 - 1),
    status=st.sampled_from(Status),
    next_ms=st.none() | LONGS,
    updated_ms=LONGS,
)
def test_the_header_holds_the_head_the_value_gives(
    revision: int, status: Status, next_ms: int | None, updated_ms: int
) -> None:
    state = replace(
        logic.new_state(replace(DEFINITION, revision=revision), 1_790_000_000_000),
        status=status,
        next_run_at_ms=next_ms,
        updated_at_ms=updated_ms,
    )
    value = CODEC.dump(state, topic="t.state")
    read = CODEC.load(rows.StateHead, value, reader=HEAD_READER)
    assert decode_head(encode_head(state)) == (
        read.definition.revision,
        read.status,
        read.next_run_at_ms,
        read.updated_at_ms,
    )


@given(st.binary(max_size=80) | st.text(max_size=80))
def test_any_header_is_a_head_or_refused_never_an_error(raw: bytes | str) -> None:
    head = decode_head(raw)
    if head is not None:  # then written again, it reads the same
        revision, status, next_ms, updated_ms = head
        again = f"{revision} {status} {'' if next_ms is None else next_ms} {updated_ms}"
        assert decode_head(again) == head


def test_what_int_would_take_and_a_scheduler_never_writes_is_refused() -> None:
    for raw in (
        b"1 pending  +5",
        b"1 pending  1_000",
        b"1 pending   7",
        b"1 pending 5 9223372036854775808",
        b"1 sleeping 5 6",
        b"1 pending 5",
        b"",
        None,
    ):
        assert decode_head(raw) is None, raw
    assert decode_head(b"3 running  -7") == (3, Status.RUNNING, None, -7)
