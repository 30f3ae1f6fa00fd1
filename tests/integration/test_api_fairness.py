"""Fairness keys through the API against the real broker and database (issue 18, item 4):
REST create, GET, PATCH keeping the field and checking a new payload against its template, and
the 422s naming the sub-field. What fairness does to executions: test_fairness.py."""

from __future__ import annotations

from tests.integration import test_api
from tests.integration.test_api import assert_error, job_body
from tests.integration.test_api_support import RunningApi

api = test_api.api  # the REST tests' in-process API (its fixture, re-exported)

FAR = {"at": "2099-01-01T00:00:00Z"}
FAIR = {"payload": {"tenant": "acme"}, "fairness": {"key": "tenant-{payload.tenant}"}}


def test_rest_create_get_and_patch_keep_the_fairness_key(api: RunningApi) -> None:
    with api.client() as c:
        created = c.post("/v1/jobs", json=job_body(schedule=FAR, **FAIR))
        assert created.status_code == 201, created.text
        job_id = created.json()["job_id"]
        shown = c.get(f"/v1/jobs/{job_id}").json()
        assert shown["fairness"] == {"key": "tenant-{payload.tenant}", "weight": 1}
        patched = c.patch(f"/v1/jobs/{job_id}", json={"name": "renamed"})
        assert patched.status_code == 200, patched.text
        assert patched.json()["fairness"] == {"key": "tenant-{payload.tenant}", "weight": 1}
        # a new payload is checked against the template again
        error = assert_error(c.patch(f"/v1/jobs/{job_id}", json={"payload": {"x": 1}}), 422)
        assert error["details"]["field"] == "fairness.key", error
        weighted = {"key": "tenant-{payload.tenant}", "weight": 5}
        patched = c.patch(f"/v1/jobs/{job_id}", json={"fairness": weighted})
        assert patched.status_code == 200, patched.text
        assert c.get(f"/v1/jobs/{job_id}").json()["fairness"] == weighted
        patched = c.patch(f"/v1/jobs/{job_id}", json={"fairness": None})
        assert patched.status_code == 200, patched.text
        assert patched.json()["fairness"] is None


def test_a_bad_fairness_is_422_naming_the_field(api: RunningApi) -> None:
    with api.client() as c:
        for fairness, field in (
            ({"key": "k", "weight": 0}, "fairness.weight"),
            ({"key": "k", "weight": 101}, "fairness.weight"),
            ({"key": "{payload.nope}"}, "fairness.key"),
            ({"key": "k", "tenant": "x"}, "fairness"),
            ("acme", "fairness"),
        ):
            body = job_body(schedule=FAR, fairness=fairness)
            error = assert_error(c.post("/v1/jobs", json=body), 422)
            assert error["details"]["field"] == field, (fairness, error)
