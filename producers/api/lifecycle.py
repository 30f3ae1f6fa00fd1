"""A job's lifecycle, its last run's outcome and its place in a DAG, as the API shows them.

Why this exists: a job's ``status`` is the scheduler's status of the job's *current
occurrence* (``duetime.core.states``): a cron job whose one manual trigger failed reads
``dead`` until its next occurrence fires, although nothing about the job itself changed. The
API keeps ``status`` as it is (clients filter on it) and adds two fields that say the two
things apart:

* ``lifecycle`` — what the job is: ``active`` (it will fire, or may be triggered),
  ``paused``, ``cancelled``, ``completed`` (nothing more will fire: a one-time job that ran, a
  cron past its ``end_at``), ``deleted``;
* ``last_outcome`` — the status of its latest execution (null before the first).

Pure functions of a projection row's columns: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from duetime.core.models import Status
from duetime.producers.updates import DAG_LABEL  # not the SDK: it imports this module

Lifecycle = Literal["active", "paused", "cancelled", "completed", "deleted"]
LIFECYCLES: tuple[Lifecycle, ...] = ("active", "paused", "cancelled", "completed", "deleted")
DagRole = Literal["member", "trigger"]

# an occurrence still going (or a DAG member waiting for its upstreams): more is to come
_IN_FLIGHT = frozenset({Status.QUEUED, Status.RUNNING, Status.FAILED, Status.BLOCKED})


def lifecycle(
    status: Status,
    *,
    deleted: bool,
    schedule: Mapping[str, Any] | None,
    next_run_at: object | None,
    dag_member: bool,
) -> Lifecycle:
    """What the job is, whatever its last run ended in."""
    if deleted:
        return "deleted"
    if status is Status.CANCELLED:
        return "cancelled"
    if status is Status.PAUSED:
        return "paused"
    # a DAG member runs with every run of its DAG, a manual job whenever it is triggered
    if dag_member or schedule is None or next_run_at is not None or status in _IN_FLIGHT:
        return "active"
    return "completed"


def dag_role(dag_id: str | None, labels: Mapping[str, str] | None) -> tuple[DagRole, str] | None:
    """("member" | "trigger", dag_id) of a job that belongs to a DAG, else None."""
    if dag_id:
        return "member", dag_id
    owner = (labels or {}).get(DAG_LABEL)
    return ("trigger", owner) if owner else None


def dag_out(
    dag_id: str | None,
    dag_key: str | None,
    labels: Mapping[str, str] | None,
    last_dag_run_id: str | None,
) -> dict[str, Any] | None:
    """The job's ``dag`` field: its DAG, its role there, its key, and the DAG run of its
    latest execution (a member's; a trigger job runs no execution of its own)."""
    role = dag_role(dag_id, labels)
    if role is None:
        return None
    run = last_dag_run_id if role[0] == "member" else None
    return {"dag_id": role[1], "role": role[0], "key": dag_key, "dag_run_id": run}
