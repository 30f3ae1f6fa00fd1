"""One execution as the SDK reads it from the PostgreSQL projection (``JobClient.get_execution``).

Exactly what ``GET /v1/executions/{id}`` answers, built by the same code (the API's typed row,
``convert.execution_detail`` and its response model): status, attempts with their errors, the
latest attempt's output and traceback, redacted as the API redacts them, JSON columns decoded
with the API's depth-checked decoder. One shape for one read, whichever client asks.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import set_json_loads

from duetime.core.errors import NotFound
from duetime.producers.api import convert
from duetime.producers.api.rows import ExecutionRow
from duetime.producers.api.schemas import ExecutionDetailOut
from duetime.producers.api.store import json_loads

ExecutionView = ExecutionDetailOut
"""What :meth:`JobClient.get_execution` returns (a pydantic model: read fields as attributes,
``.model_dump(mode="json")`` gives the REST answer)."""

_SELECT = "SELECT * FROM executions WHERE execution_id = %s ORDER BY scheduled_at LIMIT 1"


def read_execution(conn: psycopg.Connection[Any], execution_id: str) -> ExecutionView:
    """The execution ``execution_id`` (a canonical UUID); :class:`NotFound` if the projection
    does not hold it."""
    set_json_loads(json_loads, conn)  # a stored value nested too deep is not decoded
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(_SELECT, (execution_id,)).fetchone()
    if row is None:
        raise NotFound(f"no execution {execution_id}", details={"execution_id": execution_id})
    return ExecutionView.model_validate(convert.execution_detail(ExecutionRow.from_row(row)))
