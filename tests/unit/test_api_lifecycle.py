"""A job's lifecycle apart from its last run's outcome, and its place in a DAG (issue 16):
pure functions of a projection row's columns, and the API's job view built from a row."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from duetime.core.models import Status
from duetime.producers.api.convert import job_out
from duetime.producers.api.lifecycle import LIFECYCLES, dag_out, dag_role, lifecycle
from duetime.producers.api.schemas import JobOut
from duetime.producers.sdk import DAG_LABEL
from tests.unit.test_api_edge import _execution, _job_row

CRON = {"cron": "0 3 * * *", "timezone": "UTC"}
AT = {"at": "2026-12-01T00:00:00Z"}
NEXT = datetime(2026, 12, 3, tzinfo=UTC)
schedules = st.sampled_from([None, CRON, AT])
nexts = st.sampled_from([None, NEXT])


def test_a_cron_job_whose_manual_trigger_failed_stays_active() -> None:
    # the case of the issue: the occurrence is dead or failing, the job is not
    for status in (Status.DEAD, Status.FAILED):
        assert (
            lifecycle(status, deleted=False, schedule=CRON, next_run_at=NEXT, dag_member=False)
            == "active"
        )


@given(st.sampled_from(list(Status)), schedules, nexts, st.booleans(), st.booleans())
def test_lifecycle_is_total_and_follows_its_rules(
    status: Status, schedule: Any, nxt: Any, deleted: bool, member: bool
) -> None:
    got = lifecycle(status, deleted=deleted, schedule=schedule, next_run_at=nxt, dag_member=member)
    assert got in LIFECYCLES
    if deleted:
        assert got == "deleted"
    elif status in (Status.CANCELLED, Status.PAUSED):
        assert got == status.value
    elif nxt is not None or member or schedule is None:
        assert got == "active"  # something will fire, or it may be triggered or released
    else:
        # nothing scheduled: completed once the last occurrence has ended
        ended = status in (
            Status.SUCCESS,
            Status.DEAD,
            Status.EXPIRED,
            Status.SKIPPED,
            Status.PENDING,
        )
        assert got == ("completed" if ended else "active")


@given(st.sampled_from(list(Status)), schedules, nexts, st.booleans())
def test_the_outcome_of_a_run_never_pauses_cancels_or_deletes(
    status: Status, schedule: Any, nxt: Any, member: bool
) -> None:
    if status in (Status.CANCELLED, Status.PAUSED):
        return
    got = lifecycle(status, deleted=False, schedule=schedule, next_run_at=nxt, dag_member=member)
    assert got in ("active", "completed")


def test_dag_members_and_trigger_jobs_are_told_apart() -> None:
    assert dag_role(None, None) is None
    assert dag_role(None, {"team": "ops"}) is None
    assert dag_role("d1", {}) == ("member", "d1")
    assert dag_role(None, {DAG_LABEL: "d2"}) == ("trigger", "d2")
    member = dag_out("d1", "extract", {}, "r1")
    assert member == {"dag_id": "d1", "role": "member", "key": "extract", "dag_run_id": "r1"}
    trigger = dag_out(None, None, {DAG_LABEL: "d2"}, None)
    assert trigger == {"dag_id": "d2", "role": "trigger", "key": None, "dag_run_id": None}
    assert dag_out(None, None, {"team": "x"}, "r") is None


def test_the_job_view_shows_lifecycle_outcome_and_dag_apart_from_status() -> None:
    dead_run = {**_execution(None), "dag_id": "d1", "dag_run_id": "r1", "scheduled_at": NEXT}
    row = _job_row(
        created_at=NEXT,
        updated_at=NEXT,
        status="dead",
        schedule=CRON,
        next_run_at=NEXT,
        last_execution=dead_run,
        dag_id="2b0c1e57-5f33-4f0e-9d6a-0d1c5a3e9b11",
        dag_key="extract",
    )
    job = JobOut.model_validate(job_out(row)).model_dump()  # the published schema holds it
    assert (job["status"], job["lifecycle"], job["last_outcome"]) == ("dead", "active", "dead")
    assert job["dag"] == {
        "dag_id": "2b0c1e57-5f33-4f0e-9d6a-0d1c5a3e9b11",
        "role": "member",
        "key": "extract",
        "dag_run_id": "r1",
    }
    trigger = job_out(_job_row(labels={DAG_LABEL: "d9"}, schedule=None))
    assert (trigger["lifecycle"], trigger["last_outcome"]) == ("active", None)
    assert trigger["dag"] == {"dag_id": "d9", "role": "trigger", "key": None, "dag_run_id": None}
    done = job_out(_job_row(status="success", schedule=AT, last_execution=_execution(None)))
    assert (done["lifecycle"], done["last_outcome"]) == ("completed", "dead")
    assert job_out(_job_row(deleted=True))["lifecycle"] == "deleted"
