"""The published /openapi.json, completed with what the edge (``guard``) may answer and with
links between operations.

FastAPI documents each route's own responses; the Guard answers before any route runs, so
its statuses are added here to every operation it can refuse: 421 (a Host this API does not
answer for), and on writes 403 (a foreign Origin) and 415 (a body that is not JSON). The
links (``POST /v1/jobs`` → ``GET /v1/jobs/{job_id}``, ...) say where an answer's ids lead,
for readers and for stateful test tools.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from .guard import HOST_EXEMPT, STATE_CHANGING

_ERROR_REF = {"$ref": "#/components/schemas/ErrorBody"}
EDGE_ERRORS: dict[str, str] = {
    "421": "the Host header names a host this API does not answer for (DUETIME_API_ALLOWED_HOSTS)",
    "403": "a browser's Origin that may not change anything here (DUETIME_API_ALLOWED_ORIGINS)",
    "415": "a request body that is not application/json",
    "400": "malformed JSON, a JSON body nested deeper than DUETIME_API_MAX_JSON_DEPTH, or a bad "
    "query parameter (a control character, a value out of range)",
}

# where an answer's ids lead: (operationId of the source, its status) → links
_JOB_ID = {"job_id": "$response.body#/job_id"}
_DAG_ID = {"dag_id": "$response.body#/dag_id"}


def _links() -> dict[tuple[str, str], dict[str, dict[str, Any]]]:
    job = {
        "GetJob": ("get_job_v1_jobs__job_id__get", _JOB_ID),
        "JobExecutions": ("list_executions_v1_jobs__job_id__executions_get", _JOB_ID),
        "JobNextRuns": ("next_runs_v1_jobs__job_id__next_runs_get", _JOB_ID),
        "PauseJob": ("pause_job_v1_jobs__job_id__pause_post", _JOB_ID),
        "ResumeJob": ("resume_job_v1_jobs__job_id__resume_post", _JOB_ID),
        "TriggerJob": ("trigger_job_v1_jobs__job_id__trigger_post", _JOB_ID),
        "CancelJob": ("cancel_job_v1_jobs__job_id__cancel_post", _JOB_ID),
        "UpdateJob": ("update_job_v1_jobs__job_id__patch", _JOB_ID),
        "DeleteJob": ("delete_job_v1_jobs__job_id__delete", _JOB_ID),
    }
    dag = {
        "GetDag": ("get_dag_v1_dags__dag_id__get", _DAG_ID),
        "DagRuns": ("list_runs_v1_dags__dag_id__runs_get", _DAG_ID),
        "TriggerDag": ("trigger_dag_v1_dags__dag_id__trigger_post", _DAG_ID),
    }

    def build(table: dict[str, tuple[str, dict[str, str]]]) -> dict[str, dict[str, Any]]:
        return {
            name: {"operationId": op, "parameters": params} for name, (op, params) in table.items()
        }

    return {
        ("create_job_v1_jobs_post", "201"): build(job),
        ("create_job_v1_jobs_post", "200"): build(job),
        ("create_dag_v1_dags_post", "201"): build(dag),
        ("create_dag_v1_dags_post", "200"): build(dag),
    }


def complete(schema: dict[str, Any]) -> dict[str, Any]:
    """Add the edge's error statuses and the links to a generated OpenAPI document."""
    links = _links()
    known_ops = {
        op.get("operationId") for item in schema.get("paths", {}).values() for op in item.values()
    }
    for path, item in schema.get("paths", {}).items():
        for method, op in item.items():
            responses = op.setdefault("responses", {})
            wanted: list[str] = []
            if path not in HOST_EXEMPT:
                wanted.append("421")
            if method.upper() in STATE_CHANGING:
                wanted += ["403", "415", "400"]
            for status in wanted:
                responses.setdefault(
                    status,
                    {
                        "description": EDGE_ERRORS[status],
                        "content": {"application/json": {"schema": _ERROR_REF}},
                    },
                )
            for status, response in responses.items():
                found = links.get((op.get("operationId", ""), status))
                if found:
                    response["links"] = {
                        name: link
                        for name, link in found.items()
                        if link["operationId"] in known_ops
                    }
    return schema


def install(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = complete(
                get_openapi(
                    title=app.title,
                    version=app.version,
                    description=app.description,
                    routes=app.routes,
                )
            )
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend it
