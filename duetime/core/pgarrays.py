"""PostgreSQL array parameters as literals (``'{"a","b"}'``), for ``%s::uuid[]``-style casts.

psycopg adapts a Python list element by element (it finds the element type by scanning the
list, then calls a dumper per element): 3-5 us an element for strings and ints, 12 us or more
for datetimes, measured on the 2-core box; the projector's batched statements and the
worker's lease claims pass a few arrays per job. A literal built by ``str.join`` costs a
fraction of that and is sent as one text parameter, which the statement's cast parses.

Every text element is quoted, with its backslashes and double quotes escaped (PostgreSQL's
array input syntax), so any string stays one element: a hostile id with a comma or a brace in
it cannot add elements and shift the other arrays of an ``unnest``. ``None`` is ``NULL``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import cast

from .projection import dt


def _quoted(value: str) -> str:
    if "\\" in value or '"' in value:
        value = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{value}"'


def text_array(values: Iterable[str | None]) -> str:
    """The literal of text elements, for a parameter cast to ``text[]``, ``uuid[]`` (or any
    type whose input reads its text form)."""
    return "{" + ",".join("NULL" if v is None else _quoted(v) for v in values) + "}"


def int_array(values: Iterable[int | None]) -> str:
    """The literal of integers, for ``int[]`` and ``bigint[]`` (``bool`` refused: it is an int
    whose text form PostgreSQL does not read as one)."""
    return "{" + ",".join("NULL" if v is None else _int_text(v) for v in values) + "}"


def _int_text(value: int) -> str:
    if type(value) is not int:
        raise TypeError(f"an integer array element must be an int, not {type(value).__name__}")
    return str(value)


def ms_timestamp_array(values: Iterable[int | None]) -> str:
    """The literal of epoch milliseconds as ``timestamptz[]`` elements: the instants of
    ``projection.dt``, which the projector's COPY rows hold (lookups by them must match)."""
    return "{" + ",".join("NULL" if ms is None else f'"{_instant(ms)}"' for ms in values) + "}"


def _instant(ms: int) -> str:
    return cast(datetime, dt(ms)).isoformat()  # dt answers None for None only


def bytea_array(values: Iterable[bytes | None]) -> str:
    """The literal of byte strings, for ``bytea[]`` (each in bytea's hex form)."""
    return "{" + ",".join("NULL" if v is None else f'"\\\\x{v.hex()}"' for v in values) + "}"
