"""Array literals (``duetime.core.pgarrays``) read back by the real PostgreSQL as the lists
they were built from: any text stays one element, integers and instants keep their values."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from duetime.core.pgarrays import bytea_array, int_array, ms_timestamp_array, text_array
from tests.conftest import Services

# PostgreSQL text holds any character but NUL (psycopg refuses it in a parameter either way)
texts = st.text(st.characters(exclude_characters="\x00", codec="utf-8"))
ids = st.uuids().map(str)
pg_bigints = st.integers(-(2**63), 2**63 - 1)
# the instants a datetime can hold, to the millisecond
epoch_ms = st.integers(-62_135_596_800_000 + 86_400_000, 253_402_300_799_000 - 86_400_000)
HYPOTHESIS = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def pg(services: Services) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(services.admin_database_url, autocommit=True) as conn:
        yield conn


def read_back(pg: psycopg.Connection[tuple[object, ...]], query: str, literal: str) -> object:
    row = pg.execute(query, (literal,)).fetchone()
    assert row is not None
    return row[0]


@HYPOTHESIS
@given(st.lists(st.one_of(st.none(), texts), max_size=20))
def test_any_text_is_one_element(
    pg: psycopg.Connection[tuple[object, ...]], values: list[str | None]
) -> None:
    assert read_back(pg, "SELECT %s::text[]", text_array(values)) == values


def test_the_texts_the_array_syntax_gives_meaning_to(
    pg: psycopg.Connection[tuple[object, ...]],
) -> None:
    values = ["NULL", "null", "", " ", "a,b", "{a}", '"', "\\", '\\"', "}", "{", "a b\t\n"]
    assert read_back(pg, "SELECT %s::text[]", text_array(values)) == values
    # a hostile id cannot add an element: it is refused as a uuid, whole
    with pytest.raises(psycopg.errors.InvalidTextRepresentation):
        read_back(pg, "SELECT %s::uuid[]", text_array([f"{uuid.uuid4()},{uuid.uuid4()}"]))


@HYPOTHESIS
@given(st.lists(ids, max_size=20))
def test_uuids(pg: psycopg.Connection[tuple[object, ...]], values: list[str]) -> None:
    got = read_back(pg, "SELECT %s::uuid[]", text_array(values))
    assert [str(v) for v in got] == values  # type: ignore[attr-defined]


@HYPOTHESIS
@given(st.lists(st.one_of(st.none(), pg_bigints), max_size=20))
def test_bigints(pg: psycopg.Connection[tuple[object, ...]], values: list[int | None]) -> None:
    assert read_back(pg, "SELECT %s::bigint[]", int_array(values)) == values


def test_a_bool_is_not_an_integer() -> None:
    with pytest.raises(TypeError, match="must be an int, not bool"):
        int_array([1, True])


@HYPOTHESIS
@given(st.lists(st.one_of(st.none(), epoch_ms), max_size=20))
def test_instants_are_those_psycopg_would_have_written(
    pg: psycopg.Connection[tuple[object, ...]], values: list[int | None]
) -> None:
    expected = [None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC) for ms in values]
    assert read_back(pg, "SELECT %s::timestamptz[]", ms_timestamp_array(values)) == expected
    assert read_back(pg, "SELECT %s::timestamptz[]", expected) == expected  # type: ignore[arg-type]


@HYPOTHESIS
@given(st.lists(st.one_of(st.none(), st.binary(max_size=64)), max_size=20))
def test_byte_strings(
    pg: psycopg.Connection[tuple[object, ...]], values: list[bytes | None]
) -> None:
    assert read_back(pg, "SELECT %s::bytea[]", bytea_array(values)) == values
