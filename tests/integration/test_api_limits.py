"""Limits per key through the API against the real broker and database (issue 18, items 1
and 2): REST create, GET, the idempotent re-create, PATCH keeping the limits and checking a
new payload against their templates. What the limits do to executions: test_limits_leases.py,
tests/hostile/test_limits.py and tests/faults/test_limits.py."""

from __future__ import annotations

from tests.integration import test_api
from tests.integration.test_api import assert_error, job_body
from tests.integration.test_api_support import RunningApi

api = test_api.api  # the REST tests' in-process API (its fixture, re-exported)

FAR = {"at": "2099-01-01T00:00:00Z"}
LIMITS = {
    "payload": {"tenant": "acme"},
    "concurrency": {"key": "tenant-{payload.tenant}", "limit": 2},
    "rate_limit": {"key": "api", "per_s": 2.5, "burst": 4},
}


def test_rest_create_get_and_patch_keep_the_limits(api: RunningApi) -> None:
    with api.client() as c:
        created = c.post("/v1/jobs", json=job_body(schedule=FAR, **LIMITS))
        assert created.status_code == 201, created.text
        job_id = created.json()["job_id"]
        shown = c.get(f"/v1/jobs/{job_id}").json()
        assert shown["concurrency"] == LIMITS["concurrency"]
        assert shown["rate_limit"] == LIMITS["rate_limit"]
        # idempotent: the same body again is no conflict, another limit is
        again = c.post("/v1/jobs", json=job_body(schedule=FAR, job_id=job_id, **LIMITS))
        assert again.status_code in (200, 201), again.text
        other = {**LIMITS, "concurrency": {"key": "tenant-{payload.tenant}", "limit": 3}}
        assert_error(c.post("/v1/jobs", json=job_body(schedule=FAR, job_id=job_id, **other)), 409)
        # an update of another field keeps them (the row carries them)
        patched = c.patch(f"/v1/jobs/{job_id}", json={"name": "renamed"})
        assert patched.status_code == 200, patched.text
        assert patched.json()["concurrency"] == LIMITS["concurrency"]
        assert patched.json()["rate_limit"] == LIMITS["rate_limit"]
        # a new payload is checked against the templates again
        error = assert_error(c.patch(f"/v1/jobs/{job_id}", json={"payload": {"x": 1}}), 422)
        assert error["details"]["field"] == "concurrency.key", error
        # and a limit can be changed or removed
        patched = c.patch(f"/v1/jobs/{job_id}", json={"concurrency": None})
        assert patched.status_code == 200, patched.text
        assert patched.json()["concurrency"] is None
        assert patched.json()["rate_limit"] == LIMITS["rate_limit"]


def test_bad_limits_are_422_naming_the_field(api: RunningApi) -> None:
    with api.client() as c:
        for extra, field in (
            ({"concurrency": {"key": "k", "limit": 0}}, "concurrency.limit"),
            ({"rate_limit": {"key": "k", "per_s": 0, "burst": 1}}, "rate_limit.per_s"),
            ({"rate_limit": {"key": "{payload.nope}", "per_s": 1, "burst": 1}}, "rate_limit.key"),
        ):
            error = assert_error(c.post("/v1/jobs", json=job_body(schedule=FAR, **extra)), 422)
            assert error["details"]["field"] == field, error
