"""The API's documented shapes: pydantic models of the answers (FastAPI validates every
answer against them, and /openapi.json publishes them) and the JSON schema of request bodies.

Request bodies are *not* parsed by pydantic: the SDK's ``build_job`` is the one validation
(same errors over REST and in Python); the schemas below only document it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from duetime.core.calendars import CALENDAR_NAME_PATTERN, MAX_EXCLUDES
from duetime.core.jobspec import CALLABLE_REF_PATTERN, TASK_NAME_PATTERN, TOPIC_PATTERN
from duetime.core.keys import MAX_BURST, MAX_LIMIT, MAX_PER_S, MAX_TEMPLATE_CHARS, MAX_WEIGHT
from duetime.core.retry import MAX_DELAY_LIMIT_S, MAX_RETRIES_LIMIT, MIN_BASE_DELAY_S
from duetime.core.retry_rules import MAX_ERROR_NAME_CHARS, MAX_NON_RETRYABLE
from duetime.core.schedule import MAX_JITTER_S
from duetime.core.topics import DEFAULT_QUEUE, QUEUE_PATTERN

Status = Literal[
    "pending",
    "queued",
    "running",
    "success",
    "failed",
    "dead",
    "blocked",
    "skipped",
    "paused",
    "cancelled",
    "expired",
]
Priority = Literal["critical", "high", "normal", "low"]


class ErrorInfo(BaseModel):
    code: str
    message: str
    details: dict[str, Any]


class ErrorBody(BaseModel):
    error: ErrorInfo


class AttemptOut(BaseModel):
    model_config = ConfigDict(extra="allow")
    attempt: int
    status: str
    due_at: str | None = None
    queued_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    worker_id: str | None = None
    error: dict[str, Any] | None = None
    trigger: str | None = None
    dead_at: str | None = None


class ExecutionOut(BaseModel):
    execution_id: str
    job_id: str
    name: str
    status: str
    attempt: int
    trigger: str | None
    priority: str
    queue: str = Field("default", description="the queue it was emitted to")
    scheduled_at: datetime
    queued_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    worker_id: str | None
    error: dict[str, Any] | None
    lateness_ms: float | None
    dag_id: str | None
    dag_run_id: str | None
    attempts: list[AttemptOut]
    output: Any = Field(
        None,
        description="the latest attempt's return value (a Python task's, JSON; an HTTP "
        "target's is its http_status); null when there is none or it is not shown",
    )
    output_omitted: str | None = Field(
        None,
        description="why an existing output is not shown: over 1 KiB in a list (GET "
        "/v1/executions/{execution_id} shows up to the worker's 64 KiB cap), not strict JSON "
        "(NaN, Infinity) or nested too deep",
    )


class ExecutionDetailOut(ExecutionOut):
    traceback: str | None = Field(
        None,
        description="the latest attempt's traceback when a Python task raised: frames and "
        "exception lines only (no local values), secrets redacted, at most 8 KiB with the "
        "innermost frames kept",
    )


class JobDagOut(BaseModel):
    dag_id: str
    role: Literal["member", "trigger"] = Field(
        description="member: one of its jobs; trigger: the job that starts its runs"
    )
    key: str | None = Field(description="a member's key in the DAG")
    dag_run_id: str | None = Field(description="the DAG run of a member's latest execution")


class JobOut(BaseModel):
    job_id: str
    name: str
    status: Status
    next_run_at: datetime | None
    schedule: dict[str, Any] | None
    priority: Priority
    target: dict[str, Any]
    payload: Any = None
    payload_omitted: str | None = Field(
        None, description="why the payload is not shown (nested deeper than the API renders)"
    )
    retry: dict[str, Any]
    timeout_s: float
    start_within_s: float | None = Field(
        None, description="start window, seconds after the due time (null: no limit)"
    )
    queue: str = Field("default", description="the queue whose workers run the job")
    concurrency: dict[str, Any] | None = Field(
        None, description="concurrency limit per key ({key, limit}; null: none)"
    )
    rate_limit: dict[str, Any] | None = Field(
        None, description="rate limit per key ({key, per_s, burst}; null: none)"
    )
    fairness: dict[str, Any] | None = Field(
        None, description="fairness key and weight ({key, weight}; null: none)"
    )
    misfire: str
    overlap: str
    labels: dict[str, str]
    dag_id: str | None
    dag_key: str | None
    depends_on: list[str]
    created_at: datetime
    updated_at: datetime
    revision: int = Field(description="the definition's revision (If-Match of PATCH)")
    deleted: bool = Field(False, description="deleted (DELETE): hidden from lists")
    last_execution: ExecutionOut | None = None
    lifecycle: Literal["active", "paused", "cancelled", "completed", "deleted"] = Field(
        "active",
        description="what the job is, apart from how its last run ended: active (it fires, "
        "or may be triggered), paused, cancelled, completed (nothing more will fire), deleted",
    )
    last_outcome: str | None = Field(
        None, description="the status of its latest execution (null before the first)"
    )
    dag: JobDagOut | None = Field(
        None, description="the DAG it belongs to: a member, or the DAG's trigger job"
    )


class JobCreatedOut(BaseModel):
    job_id: str
    status: Status
    next_run_at: datetime | None
    deduplicated: bool = Field(
        False, description="unique: the key's window holds this (first) job; nothing was created"
    )
    replaced_job_id: str | None = Field(
        None, description="debounce: the pending job of the key this create cancelled"
    )


class JobPage(BaseModel):
    items: list[JobOut]
    next_cursor: str | None


class NextRunsOut(BaseModel):
    job_id: str
    next_runs: list[datetime]


class ExecutionPage(BaseModel):
    items: list[ExecutionOut]
    next_cursor: str | None


class CommandOut(BaseModel):
    job_id: str
    command: str
    command_id: str
    status: Status = Field(description="the job's projected status when the command was sent")


class DeadLetterOut(BaseModel):
    execution_id: str
    job_id: str
    name: str
    dead_at: datetime
    attempts: int
    errors: list[dict[str, Any]]
    dag_run_id: str | None
    replayed_at: datetime | None


class DeadLetterPage(BaseModel):
    items: list[DeadLetterOut]
    next_cursor: str | None


class ReplayOut(BaseModel):
    replayed: int
    execution_ids: list[str]
    skipped: list[dict[str, Any]] = Field(
        default_factory=list, description="dead letters not replayed, with the reason"
    )


class ReplayedExecutionOut(BaseModel):
    execution_id: str
    job_id: str
    status: str


class ReplayProgressOut(BaseModel):
    requested: int = Field(description="dead letters asked about")
    replayed: int = Field(description="of them, marked replayed")
    started: int = Field(description="replay executions that exist (emitted by a scheduler)")
    succeeded: int
    dead: int = Field(description="replays that died again")
    other: int = Field(description="replays that ended skipped or cancelled")
    in_progress: int = Field(description="replayed, not finished yet (including not started)")
    executions: list[ReplayedExecutionOut] = Field(
        description="the replay executions, oldest first (a replay is a new execution of the "
        "same job, trigger 'replay')"
    )


class DagNodeOut(BaseModel):
    key: str
    job_id: str
    depends_on: list[str]
    status: str | None = None


class DagOut(BaseModel):
    dag_id: str
    name: str
    schedule: dict[str, Any] | None
    overlap: str
    nodes: list[DagNodeOut]
    created_at: datetime
    updated_at: datetime


class DagCreatedOut(BaseModel):
    dag_id: str
    job_ids: dict[str, str]
    next_run_at: datetime | None


class DagRunOut(BaseModel):
    dag_run_id: str
    dag_id: str
    status: str
    started_at: datetime
    finished_at: datetime | None
    node_statuses: dict[str, str]


class DagRunPage(BaseModel):
    items: list[DagRunOut]
    next_cursor: str | None


class DagTriggeredOut(BaseModel):
    dag_id: str
    dag_run_id: str


class DagSummaryOut(BaseModel):
    dag_id: str
    name: str
    schedule: dict[str, Any] | None
    overlap: str
    node_count: int
    created_at: datetime
    last_run: DagRunOut | None = None


class DagPage(BaseModel):
    items: list[DagSummaryOut]
    next_cursor: str | None


class OverviewOut(BaseModel):
    jobs_total: int
    jobs_by_status: dict[str, int]
    dlq_depth: int = Field(description="dead letters not replayed")
    dlq_total: int
    at: datetime


class ExecutionBucketOut(BaseModel):
    start: datetime
    outcomes: dict[str, int] = Field(description="executions finished in the bucket, by status")
    started: int = Field(description="executions scheduled in the bucket that have started")
    lateness_p50_ms: float | None
    lateness_p99_ms: float | None


class ExecutionStatsOut(BaseModel):
    window_s: int
    bucket_s: int
    queue: str | None = Field(None, description="the queue asked for (null: every queue)")
    at: datetime
    buckets: list[ExecutionBucketOut]


class PriorityLagOut(BaseModel):
    priority: Priority
    topic: str
    end_offset: int
    committed_offset: int
    lag: int = Field(description="requests not consumed yet (transaction markers not counted)")
    exact: bool = Field(
        True, description="false: a partition's gap was too large to read; lag counts offsets"
    )
    committed: bool = Field(
        False, description="whether the group committed any partition of this topic"
    )


class QueueLagOut(BaseModel):
    queue: str
    partitions: int
    lag: int = Field(description="the sum over the queue's priorities")
    priorities: list[PriorityLagOut]


class ConsumerLagOut(BaseModel):
    group: str
    at: datetime
    priorities: list[PriorityLagOut] = Field(description="the default queue's, per priority")
    queues: list[QueueLagOut] = Field(
        default_factory=list, description="every queue (default first), per priority"
    )


class Health(BaseModel):
    status: str
    checks: dict[str, str] = Field(default_factory=dict)


# --- request bodies (documentation of what build_job accepts) --------------------------------

_LIMIT_KEY_SCHEMA: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_TEMPLATE_CHARS,
    "description": "literal text with {payload.field} placeholders (e.g. tenant-{payload.tenant}); "
    "{{ and }} are literal braces; a field the payload lacks is a 422",
}

_TS = {"type": "string", "format": "date-time"}
CALENDAR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "Calendar",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": CALENDAR_NAME_PATTERN},
        "timezone": {"type": "string", "example": "Europe/Berlin", "default": "UTC"},
        "exclude": {
            "type": "array",
            "maxItems": MAX_EXCLUDES,
            "items": {"type": "string", "example": "2026-12-24..2026-12-31"},
            "description": "dates (YYYY-MM-DD) and inclusive ranges (YYYY-MM-DD..YYYY-MM-DD)",
        },
        "exclude_weekdays": {
            "type": "array",
            "items": {"enum": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]},
        },
    },
    "additionalProperties": False,
}
SCHEDULE_SCHEMA: dict[str, Any] = {
    "oneOf": [
        {
            "type": "object",
            "title": "OneTime",
            "required": ["at"],
            "properties": {"at": _TS},
            "additionalProperties": False,
        },
        {
            "type": "object",
            "title": "Cron",
            "required": ["cron"],
            "properties": {
                "cron": {
                    "type": "string",
                    "description": "5 fields, or 6 with seconds first",
                    "example": "0 2 * * *",
                },
                "timezone": {"type": "string", "example": "Europe/Berlin"},
                "start_at": _TS,
                "end_at": _TS,
                "jitter_s": {
                    "type": "number",
                    "minimum": 0,
                    "maximum": MAX_JITTER_S,
                    "description": "each occurrence fires up to this late: a fixed offset per "
                    "occurrence (a hash of job id and occurrence), shown by next_runs",
                },
                "calendar": {
                    "anyOf": [
                        {"type": "string", "pattern": CALENDAR_NAME_PATTERN},
                        CALENDAR_SCHEMA,
                    ],
                    "description": "a calendar's name (/v1/calendars; its rules are copied into "
                    "the job) or its rules: occurrences on excluded dates are skipped",
                },
            },
            "additionalProperties": False,
        },
    ]
}
TARGET_SCHEMA: dict[str, Any] = {
    "oneOf": [
        {
            "type": "object",
            "title": "HttpTarget",
            "required": ["type", "url"],
            "properties": {
                "type": {"const": "http"},
                "url": {"type": "string", "format": "uri", "example": "http://127.0.0.1:9000/h"},
                "method": {"enum": ["GET", "POST", "PUT", "PATCH", "DELETE"]},
                "headers": {
                    "type": ["object", "null"],
                    "additionalProperties": {"type": "string"},
                },
            },
            "additionalProperties": False,
        },
        {
            "type": "object",
            "title": "PythonTarget",
            "required": ["type", "ref"],
            "properties": {
                "type": {"const": "python"},
                "ref": {
                    "type": "string",
                    "maxLength": 400,
                    "pattern": f"{TASK_NAME_PATTERN}|{CALLABLE_REF_PATTERN}",
                    "example": "package.module:function",
                },
            },
            "additionalProperties": False,
        },
        {
            "type": "object",
            "title": "KafkaTarget",
            "required": ["type", "topic"],
            "properties": {
                "type": {"const": "kafka"},
                "topic": {"type": "string", "pattern": TOPIC_PATTERN},
            },
            "additionalProperties": False,
        },
    ]
}
_JOB_PROPERTIES: dict[str, Any] = {
    "job_id": {
        "type": ["string", "null"],
        "format": "uuid",
        "description": "client-chosen: creating the same id twice is idempotent",
    },
    "name": {"type": "string", "minLength": 1, "maxLength": 200},
    "schedule": {"anyOf": [SCHEDULE_SCHEMA, {"type": "null"}], "description": "null: manual"},
    "priority": {"enum": ["critical", "high", "normal", "low"], "default": "normal"},
    "target": TARGET_SCHEMA,
    "payload": {"description": "any JSON, at most DUETIME_MAX_PAYLOAD_BYTES encoded"},
    "retry": {
        "type": ["object", "null"],
        "properties": {
            "max_retries": {"type": "integer", "minimum": 0, "maximum": MAX_RETRIES_LIMIT},
            "base_delay_s": {
                "type": "number",
                "minimum": MIN_BASE_DELAY_S,
                "maximum": MAX_DELAY_LIMIT_S,
            },
            "max_delay_s": {
                "type": "number",
                "minimum": MIN_BASE_DELAY_S,
                "maximum": MAX_DELAY_LIMIT_S,
            },
            "jitter": {"type": "boolean"},
            "non_retryable_http_statuses": {
                "type": "array",
                "items": {"type": "integer", "minimum": 300, "maximum": 599},
                "maxItems": MAX_NON_RETRYABLE,
                "description": "statuses that send the execution to the DLQ at once",
            },
            "non_retryable_errors": {
                "type": "array",
                "items": {"type": "string", "maxLength": MAX_ERROR_NAME_CHARS},
                "maxItems": MAX_NON_RETRYABLE,
                "description": "exception types (ValueError, pkg.mod:Cls) that are not retried",
            },
            "respect_retry_after": {
                "type": "boolean",
                "description": "an HTTP target's Retry-After sets the delay (<= max_delay_s)",
            },
        },
        "additionalProperties": False,
    },
    "timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 604800},
    "start_within_s": {
        "type": ["number", "null"],
        "exclusiveMinimum": 0,
        "maximum": 604800,
        "description": "an execution not started by its due time + this many seconds ends "
        "expired without running; null: no limit",
    },
    "queue": {
        "type": "string",
        "pattern": "^" + QUEUE_PATTERN + "$",
        "default": DEFAULT_QUEUE,
        "description": "the queue whose workers run the job (it must exist: "
        "`duetime queues create NAME`; else 422 naming `queue`)",
    },
    "concurrency": {
        "type": ["object", "null"],
        "required": ["key", "limit"],
        "properties": {
            "key": _LIMIT_KEY_SCHEMA,
            "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT},
        },
        "additionalProperties": False,
        "description": "at most `limit` executions with the same key run at once, across all "
        "workers and queues; the others wait queued (limit 1: one after the other)",
    },
    "rate_limit": {
        "type": ["object", "null"],
        "required": ["key", "per_s", "burst"],
        "properties": {
            "key": _LIMIT_KEY_SCHEMA,
            "per_s": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_PER_S},
            "burst": {"type": "integer", "minimum": 1, "maximum": MAX_BURST},
        },
        "additionalProperties": False,
        "description": "a token bucket per key shared by all workers: executions over the "
        "rate wait rather than fail",
    },
    "fairness": {
        "type": ["object", "null"],
        "required": ["key"],
        "properties": {
            "key": _LIMIT_KEY_SCHEMA,
            "weight": {"type": "integer", "minimum": 1, "maximum": MAX_WEIGHT, "default": 1},
        },
        "additionalProperties": False,
        "description": "a fairness key (a tenant): within a priority, keys are served "
        "round-robin (weighted), so one key's backlog delays another key's executions by "
        "a few executions at most",
    },
    "misfire": {"enum": ["skip", "run_once", "run_all"], "default": "run_once"},
    "overlap": {"enum": ["skip", "allow", "queue_one"], "default": "skip"},
    "labels": {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
}
JOB_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "JobSpec",
    "required": ["name", "target"],
    "properties": _JOB_PROPERTIES,
    "additionalProperties": False,
}
_KEY_WINDOW_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["key", "window_s"],
    "properties": {
        "key": _LIMIT_KEY_SCHEMA,
        "window_s": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_DELAY_LIMIT_S},
    },
    "additionalProperties": False,
}
CREATE_JOB_SCHEMA: dict[str, Any] = {
    **JOB_SCHEMA,
    "properties": {
        **_JOB_PROPERTIES,
        "unique": {
            **_KEY_WINDOW_SCHEMA,
            "description": "a create with this key inside the window returns the first job "
            "(200, deduplicated: true) and creates nothing",
        },
        "debounce": {
            **_KEY_WINDOW_SCHEMA,
            "description": "one-time jobs: the last create inside the window wins; it runs at "
            "the window's end and the job it replaces is cancelled (replaced_job_id)",
        },
    },
}
"""``POST /v1/jobs``'s body: a job, plus unique or debounce (applied only when creating)."""
JOB_UPDATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "JobUpdate",
    "description": "the fields to change, each replacing the current one as a whole",
    "minProperties": 1,
    "properties": {
        k: v
        for k, v in _JOB_PROPERTIES.items()
        if k not in ("job_id", "dag_id", "dag_key", "depends_on")
    },
    "additionalProperties": False,
}
DAG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "DagSpec",
    "required": ["name", "jobs"],
    "properties": {
        "dag_id": {"type": ["string", "null"], "format": "uuid"},
        "name": {"type": "string", "minLength": 1, "maxLength": 200},
        "schedule": {"anyOf": [SCHEDULE_SCHEMA, {"type": "null"}]},
        "overlap": {"enum": ["skip", "allow", "queue_one"]},
        "jobs": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["key", "name", "target"],
                "properties": {
                    "key": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,200}$"},
                    "depends_on": {"type": ["array", "null"], "items": {"type": "string"}},
                    **{k: v for k, v in _JOB_PROPERTIES.items() if k != "schedule"},
                },
                "additionalProperties": False,
            },
        },
    },
    "additionalProperties": False,
}
DLQ_FILTER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "DlqFilter",
    "properties": {
        "job_id": {"type": ["string", "null"], "format": "uuid"},
        "name": {"type": ["string", "null"]},
        "since": {
            "type": ["string", "null"],
            "format": "date-time",
            "description": "dead at or after",
        },
        "until": {"type": ["string", "null"], "format": "date-time", "description": "dead before"},
        "include_replayed": {"type": "boolean", "default": False},
        "limit": {"type": "integer", "minimum": 1, "maximum": 10000, "default": 1000},
    },
    "additionalProperties": False,
}


REPLAY_PROGRESS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "ReplayProgressQuery",
    "required": ["execution_ids"],
    "properties": {
        "execution_ids": {
            "type": "array",
            "minItems": 1,
            "maxItems": 10000,
            "items": {"type": "string", "format": "uuid"},
            "description": "dead letters whose replays to follow (from a replay's answer)",
        }
    },
    "additionalProperties": False,
}


def request_body(schema: dict[str, Any], required: bool = True) -> dict[str, Any]:
    """``openapi_extra`` documenting a JSON body that the route parses itself."""
    return {
        "requestBody": {
            "required": required,
            "content": {"application/json": {"schema": schema}},
        }
    }


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in (
        (400, "malformed JSON or a bad query parameter"),
        (401, "a bearer token is required (DUETIME_API_TOKENS is set)"),
        (403, "a browser's Origin that may not change anything here"),
        (404, "unknown id"),
        (
            409,
            "the job's status does not allow this change, or the id exists with another definition",
        ),
        (412, "If-Match names another revision than the job's current one"),
        (413, "payload or request body too large"),
        (415, "a request body that is not application/json"),
        (422, "well-formed but invalid (bad cron, unknown time zone, a DAG cycle, ...)"),
        (503, "Kafka or PostgreSQL did not answer"),
    )
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {c: ERRORS[c] for c in codes}
