"""The pure rules of changing and deleting a job (``duetime.producers.updates``) and the SDK's
building of the next revision: merge, refusals, revisions, If-Match parsing."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duetime.core.clock import ManualClock
from duetime.core.errors import Conflict, ValidationError
from duetime.core.models import Status
from duetime.core.records import JobDefinition
from duetime.producers import updates
from duetime.producers.api.errors import PreconditionFailed
from duetime.producers.api.jobs import _revision_of
from duetime.producers.sdk import JobClient

JOB_ID = "3f2a9d4e-7b18-4c61-8e9c-0b5e7a522f3c"
CURRENT: dict[str, Any] = {
    "job_id": JOB_ID,
    "name": "nightly",
    "schedule": {"cron": "0 2 * * *", "timezone": "UTC"},
    "priority": "normal",
    "target": {"type": "python", "ref": "m:f"},
    "payload": {"a": 1},
    "retry": None,
    "timeout_s": 300.0,
    "misfire": "run_once",
    "overlap": "skip",
    "labels": {"team": "a"},
    "dag_id": None,
    "dag_key": None,
    "depends_on": [],
}
CREATED = datetime(2026, 1, 1, tzinfo=UTC)
CREATED_MS = int(CREATED.timestamp() * 1000)

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=5,
)
changes = st.dictionaries(st.sampled_from(sorted(updates.UPDATABLE)), values, min_size=1)


@given(changes)
def test_merged_replaces_exactly_the_fields_given_and_keeps_the_rest(
    change: dict[str, Any],
) -> None:
    body = updates.merged(CURRENT, change)
    for key, value in CURRENT.items():
        if key in ("dag_id", "dag_key", "depends_on"):
            assert key not in body  # a DAG's fields are never re-sent by an update
        else:
            assert body[key] == change.get(key, value)
    assert set(change) <= set(body)


@given(st.sampled_from(["job_id", "dag_id", "dag_key", "depends_on"]), values)
def test_a_fixed_field_is_refused_by_name(key: str, value: Any) -> None:
    with pytest.raises(ValidationError) as err:
        updates.merged(CURRENT, {"priority": "high", key: value})
    assert err.value.field == key


@given(st.text(min_size=1).filter(lambda k: k not in updates.UPDATABLE | {"job_id"}))
def test_an_unknown_field_is_refused_by_name(key: str) -> None:
    with pytest.raises(ValidationError) as err:
        updates.merged(CURRENT, {key: 1})
    assert err.value.field in (key, "dag_id", "dag_key", "depends_on")


@pytest.mark.parametrize("change", [{}, [], "x", None, 3])
def test_an_empty_or_non_object_update_is_refused(change: Any) -> None:
    with pytest.raises(ValidationError):
        updates.merged(CURRENT, change)


@given(st.integers(0, 2**62), st.integers(0, 2**40))
def test_the_next_revision_is_always_higher(current: int, now_ms: int) -> None:
    assert updates.next_revision(current, now_ms) > current


@pytest.mark.parametrize(
    ("body", "status", "action"),
    [
        ({**CURRENT, "labels": {updates.DELETED_LABEL: "true"}}, Status.PENDING, "update"),
        ({**CURRENT, "labels": {updates.DELETED_LABEL: "true"}}, Status.CANCELLED, "delete"),
        ({**CURRENT, "dag_id": JOB_ID}, Status.PENDING, "update"),
        ({**CURRENT, "labels": {updates.DAG_LABEL: JOB_ID}}, Status.PENDING, "delete"),
        (CURRENT, Status.CANCELLED, "update"),
    ],
)
def test_deleted_cancelled_and_dag_jobs_are_refused(
    body: dict[str, Any], status: Status, action: str
) -> None:
    with pytest.raises(Conflict):
        updates.check_changeable(JOB_ID, body, status, action)


def test_a_cancelled_job_may_still_be_deleted() -> None:
    updates.check_changeable(JOB_ID, CURRENT, Status.CANCELLED, "delete")


def test_a_revision_precondition() -> None:
    updates.check_revision(JOB_ID, 5, None)
    updates.check_revision(JOB_ID, 5, 5)
    with pytest.raises(PreconditionFailed):
        updates.check_revision(JOB_ID, 5, 4, PreconditionFailed)


@pytest.mark.parametrize(
    ("header", "revision"), [(None, None), ("*", None), ('"12"', 12), ("12", 12), ('W/"7"', 7)]
)
def test_if_match_is_a_revision(header: str | None, revision: int | None) -> None:
    assert _revision_of(header) == revision


@given(st.text(max_size=40).filter(lambda t: not t.strip().removeprefix("W/").strip('"').isdigit()))
def test_if_match_that_is_no_revision_is_refused_by_name(header: str) -> None:
    if header.strip() == "*":
        return
    with pytest.raises(ValidationError) as err:
        _revision_of(header)
    assert err.value.field == "If-Match"


@pytest.fixture
def client() -> Iterator[JobClient]:
    # nothing is sent: build_update and build_deleted only validate and build
    c = JobClient(bootstrap_servers="127.0.0.1:1", clock=ManualClock(CREATED_MS + 60_000))
    yield c
    c.close()  # nothing queued: returns at once


def test_the_next_revision_is_validated_as_a_create_and_keeps_its_creation(
    client: JobClient,
) -> None:
    built = client.build_update(CURRENT, {"priority": "high"}, revision=10, created_at=CREATED)
    assert isinstance(built, JobDefinition)
    assert built.job_id == JOB_ID and built.priority.value == "high" and built.revision > 10
    assert built.created_at_ms == CREATED_MS and built.updated_at_ms == CREATED_MS + 60_000
    assert built.name == "nightly" and dict(built.labels) == {"team": "a"}
    with pytest.raises(ValidationError) as err:
        client.build_update(CURRENT, {"timeout_s": 0}, revision=10, created_at=CREATED)
    assert err.value.field == "timeout_s"
    with pytest.raises(ValidationError) as err:
        client.build_update(
            CURRENT, {"labels": {updates.DELETED_LABEL: "x"}}, revision=10, created_at=CREATED
        )
    assert (err.value.field or "").startswith("labels")


def test_the_deleted_revision_carries_the_reserved_label(client: JobClient) -> None:
    built = client.build_deleted(CURRENT, revision=10, created_at=CREATED)
    assert built.labels[updates.DELETED_LABEL] == "true" and built.labels["team"] == "a"
    assert built.revision > 10 and built.name == "nightly"
