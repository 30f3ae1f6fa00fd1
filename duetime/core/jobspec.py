"""Job validation: the API body of a job → the ``JobDefinition`` event, or a clear error.

The SDK, the REST API and the CLI all call :func:`build_job`, so a bad cron, an unknown time
zone, an unknown target type or an oversized payload is refused the same way everywhere,
before anything reaches Kafka. Errors are :class:`ValidationError` (422) naming the field, or
:class:`PayloadTooLarge` (413).
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
import sys
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from . import keys
from .calendars import calendar_to_dict, parse_calendar
from .errors import PayloadTooLarge, ValidationError
from .inputs import (
    RESERVED_PREFIX,
    check_headers,
    check_json_value,
    check_labels,
    check_number,
    check_text,
    check_topic,
    reserved_prefixes,
)
from .models import Misfire, Overlap, Priority, TargetType
from .records import HttpTarget, JobDefinition, OneTimeSchedule, PythonTarget, Target
from .records import Schedule as ScheduleRecord
from .redact import redact_url
from .retry import RetryPolicy
from .schedule import Cron, OneTime, Schedule, parse_schedule, schedule_to_dict
from .topics import DEFAULT_QUEUE, check_queue

DEFAULT_MAX_PAYLOAD_BYTES = 256 * 1024
MAX_DEFINITION_BYTES = 900_000
"""A whole job (payload, labels, target and the rest) must fit in this: the scheduler keeps
the definition inside the job's state record, and the producers' record limit is 1,000,000
bytes. Measured as the field values' JSON (strings as their bytes): a little above Avro."""
_SIZED_FIELDS = ("payload_json", "labels", "target", "depends_on", "dag_key", "schedule")
MAX_TIMEOUT_S = 7 * 24 * 3600.0
MAX_START_WITHIN_S = 7 * 24 * 3600.0
"""``start_within_s`` above a week is refused: work that may start a week late has no window."""
# The patterns are ASCII (no \w, which is Unicode in Python and ASCII in JSON Schema) and
# published as they are in the OpenAPI document (producers/api/schemas.py), so the document
# says exactly what the server accepts.
TOPIC_PATTERN = r"^[A-Za-z0-9._-]{1,249}$"
TASK_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]{0,199}$"
"""A registered task's name (``@duetime.task("send-invoice")``)."""
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
CALLABLE_REF_PATTERN = (
    rf"^({_IDENT}(?:\.{_IDENT})*):([A-Za-z][A-Za-z0-9_]*(?:\.[A-Za-z][A-Za-z0-9_]*)*)$"
)
"""``package.module:function``; no attribute on the path may be private or dunder."""
_TOPIC_RE = re.compile(TOPIC_PATTERN)
_TASK_NAME_RE = re.compile(TASK_NAME_PATTERN)
_CALLABLE_REF_RE = re.compile(CALLABLE_REF_PATTERN)
_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
_KEYS = frozenset(
    {
        "job_id",
        "name",
        "schedule",
        "priority",
        "target",
        "payload",
        "retry",
        "timeout_s",
        "misfire",
        "overlap",
        "labels",
        "dag_id",
        "dag_key",
        "depends_on",
        "start_within_s",
        "queue",
        "concurrency",
        "rate_limit",
        "fairness",
    }
)
CONTENT_FIELDS = (
    "name",
    "schedule",
    "priority",
    "target",
    "payload_json",
    "retry",
    "timeout_s",
    "misfire",
    "overlap",
    "dag_id",
    "dag_key",
    "depends_on",
    "labels",
    "start_within_s",
    "queue",
    "concurrency",
    "rate_limit",
    "fairness",
)
"""The fields that make a definition; two definitions equal on these are the same job."""


def _ms(value: datetime) -> int:
    return int(value.timestamp() * 1000)


def _choice(body: Mapping[str, Any], key: str, enum: Any, default: str) -> str:
    value = body.get(key, default)
    try:
        return str(enum(value).value)
    except ValueError:
        allowed = ", ".join(e.value for e in enum)
        raise ValidationError(f"{key} {value!r} is not one of {allowed}", field=key) from None


def parse_uuid(value: Any, field: str) -> str:
    try:
        return str(uuid.UUID(str(value)))
    except ValueError:
        raise ValidationError(f"{field} {value!r} is not a UUID", field=field) from None


def _target(raw: Any, prefixes: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise ValidationError("target must be an object with a 'type'", field="target")
    kind = raw.get("type")
    try:
        target_type = TargetType(str(kind))
    except ValueError:
        raise ValidationError(
            f"unknown target type {kind!r}; use http, python or kafka", field="target.type"
        ) from None
    allowed = {
        TargetType.HTTP: {"type", "url", "method", "headers"},
        TargetType.PYTHON: {"type", "ref"},
        TargetType.KAFKA: {"type", "topic"},
    }[target_type]
    for key in raw:
        if key not in allowed:
            raise ValidationError(
                f"unknown field {key!r} for a {target_type.value} target", field=f"target.{key}"
            )
    if target_type is TargetType.HTTP:
        url = raw.get("url")
        if not isinstance(url, str) or not re.match(r"^https?://[^\s/]+", url) or len(url) > 2048:
            raise ValidationError(
                "target.url must be an http:// or https:// URL", field="target.url"
            )
        method = str(raw.get("method", "POST")).upper()
        if method not in _METHODS:
            raise ValidationError(
                f"target.method {method!r} is not one of {', '.join(_METHODS)}",
                field="target.method",
            )
        if re.search(r"[\x00-\x20\x7f]", url):
            raise ValidationError(
                "target.url contains whitespace or a control character", field="target.url"
            )
        _check_url_host(url)
        headers = check_headers(raw.get("headers") or {})
        return {"url": url, "method": method, "headers": headers}
    if target_type is TargetType.PYTHON:
        return {"ref": _python_ref(raw.get("ref"))}
    topic = raw.get("topic")
    if not isinstance(topic, str) or not _TOPIC_RE.match(topic):
        raise ValidationError(
            "target.topic must be a Kafka topic name (letters, digits, '.', '_', '-')",
            field="target.topic",
        )
    check_topic(topic, prefixes=prefixes)
    return {"topic": topic}


_METADATA_HOSTS = frozenset({"metadata.google.internal", "metadata", "instance-data"})


def _check_url_host(url: str) -> None:
    """Refuse early what no worker may ever call: a URL that does not parse, and cloud
    metadata endpoints (link-local addresses, their well-known names). Workers check every
    resolved address again against their operator's egress policy; this is the early 422."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port
    except ValueError as exc:
        raise ValidationError(f"target.url does not parse: {exc}", field="target.url") from None
    if not host or (port is not None and not 0 < port < 65536):
        raise ValidationError("target.url needs a host (and a valid port)", field="target.url")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if (address is not None and (address.is_link_local or address.is_unspecified)) or (
        host.lower().rstrip(".") in _METADATA_HOSTS
    ):
        raise ValidationError(
            f"target.url {redact_url(url)!r} is a link-local or cloud metadata address: "
            "never allowed",
            field="target.url",
        )


def _python_ref(ref: Any) -> str:
    """A registered task name, or ``module:function`` outside the standard library with no
    private or dunder part. Workers check their operator's allow-list again before importing
    anything (``DUETIME_WORKER_PYTHON_MODULES``); this refuses early what no worker may run."""
    if not isinstance(ref, str):
        raise ValidationError("target.ref must be a string", field="target.ref")
    if ":" not in ref:
        if not _TASK_NAME_RE.match(ref):
            raise ValidationError(
                "target.ref must be 'package.module:function' or a registered task name "
                "(letters, digits, '_', '.', '-')",
                field="target.ref",
            )
        return ref
    match = _CALLABLE_REF_RE.match(ref)
    if match is None or len(ref) > 400:
        raise ValidationError(
            "target.ref must be 'package.module:function' with no private ('_') attribute",
            field="target.ref",
        )
    module = match.group(1)
    if any(part.startswith("__") for part in module.split(".")):
        raise ValidationError(f"target.ref names a dunder module ({module!r})", field="target.ref")
    if module.split(".")[0] in sys.stdlib_module_names:
        raise ValidationError(
            f"target.ref {ref!r} is in the standard library ({module.split('.')[0]!r}): only "
            "tasks of modules a worker's operator allowed can run",
            field="target.ref",
        )
    return ref


def target_to_api(target: Target) -> dict[str, Any]:
    kind = {HttpTarget: TargetType.HTTP, PythonTarget: TargetType.PYTHON}.get(
        type(target), TargetType.KAFKA
    )
    return {"type": kind.value, **target.to_avro()}


def schedule_to_avro(schedule: Schedule | None) -> dict[str, Any] | None:
    if schedule is None:
        return None
    if isinstance(schedule, OneTime):
        return {"at_ms": _ms(schedule.at)}
    assert isinstance(schedule, Cron)
    return {
        "cron": schedule.expr,
        "timezone": schedule.timezone,
        "start_at_ms": None if schedule.start_at is None else _ms(schedule.start_at),
        "end_at_ms": None if schedule.end_at is None else _ms(schedule.end_at),
        "jitter_s": schedule.jitter_s or None,
        "calendar": None if schedule.calendar is None else calendar_to_dict(schedule.calendar),
    }


def schedule_of(raw: ScheduleRecord | None) -> Schedule | None:
    """The computable schedule (``duetime.core.schedule``) of a schedule record."""
    if raw is None:
        return None
    if isinstance(raw, OneTimeSchedule):
        return OneTime(_dt(raw.at_ms))
    return Cron(
        raw.cron,
        raw.timezone or "UTC",
        None if raw.start_at_ms is None else _dt(raw.start_at_ms),
        None if raw.end_at_ms is None else _dt(raw.end_at_ms),
        raw.jitter_s or 0.0,
        None if raw.calendar is None else parse_calendar(raw.calendar.to_avro()),
    )


def _dt(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def schedule_to_api(raw: ScheduleRecord | None) -> dict[str, Any] | None:
    schedule = schedule_of(raw)
    return None if schedule is None else schedule_to_dict(schedule)


def build_job(
    body: Mapping[str, Any],
    *,
    now_ms: int,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    revision: int | None = None,
    topic_prefix: str = RESERVED_PREFIX,
    internal: bool = False,
) -> JobDefinition:
    """Validate a job body and return its ``JobDefinition`` record.

    ``topic_prefix``: the deployment's, reserved like ``duetime.`` (labels, Kafka target
    topics). ``internal``: the SDK building a DAG's trigger job, the one caller that may set
    a reserved label.
    """
    _check_keys(body)
    prefixes = reserved_prefixes(topic_prefix)
    # checked in this order, so a body with several faults is told about the same one first
    name = check_text(body.get("name"), "name", max_chars=200)
    job_id = _optional_uuid(body.get("job_id"), "job_id") or str(uuid.uuid4())
    schedule = _schedule(body.get("schedule"))
    payload_json = _payload_json(body.get("payload"), max_payload_bytes)
    retry = RetryPolicy.from_dict(body.get("retry"))
    timeout_s = check_number(
        body.get("timeout_s", 300), "timeout_s", lo=0, hi=MAX_TIMEOUT_S, lo_open=True
    )
    start_within_s = start_within(body.get("start_within_s"))
    labels = _labels(body.get("labels"), prefixes, internal=internal)
    depends_on = _depends_on(body.get("depends_on"))
    dag_key = _dag_key(body.get("dag_key"))
    definition = {
        "job_id": job_id,
        "name": name,
        "revision": now_ms * 1000 if revision is None else revision,
        "created_at_ms": now_ms,
        "updated_at_ms": now_ms,
        "schedule": schedule,
        "priority": _choice(body, "priority", Priority, Priority.NORMAL.value),
        "target": _target(body.get("target"), prefixes),
        "payload_json": payload_json,
        "retry": retry.to_dict(),
        "timeout_s": float(timeout_s),
        "misfire": _choice(body, "misfire", Misfire, Misfire.RUN_ONCE.value),
        "overlap": _choice(body, "overlap", Overlap, Overlap.SKIP.value),
        "dag_id": _optional_uuid(body.get("dag_id"), "dag_id", empty_is_none=False),
        "dag_key": dag_key,
        "depends_on": depends_on,
        "labels": labels,
        "start_within_s": start_within_s,
        "queue": queue_of(body.get("queue", DEFAULT_QUEUE)),
        "concurrency": concurrency_of(body.get("concurrency"), body.get("payload")),
        "rate_limit": rate_limit_of(body.get("rate_limit"), body.get("payload")),
        "fairness": fairness_of(body.get("fairness"), body.get("payload")),
    }
    if start_within_s is not None and (definition["dag_id"] or depends_on):
        # the DAG resolver knows no expired node yet: the run would wait for it forever
        raise ValidationError(
            "start_within_s is not supported for DAG members", field="start_within_s"
        )
    _check_size(definition)
    return JobDefinition.from_avro(definition)


def _limit_error(name: str, exc: keys.KeyTemplateError) -> ValidationError:
    """The 422 of a limit, naming its sub-field when the message starts with one."""
    message = str(exc)
    sub = message.split(" ", 1)[0]
    if sub in ("key", "limit", "per_s", "burst", "weight"):
        return ValidationError(f"{name}.{message}", field=f"{name}.{sub}")
    return ValidationError(f"{name} {message}", field=name)


def _keyed(
    name: str, raw: Any, payload: Any, check: Callable[[Any, Any], tuple[Any, ...]], *fields: str
) -> dict[str, Any] | None:
    """A keyed option (a limit, fairness): null, or its ``fields`` as ``check`` returns them
    (the key template first, resolved against the payload); a 422 naming the sub-field."""
    if raw is None:
        return None
    try:
        values = check(raw, payload)
    except keys.KeyTemplateError as exc:
        raise _limit_error(name, exc) from None
    return dict(zip(fields, values, strict=True))


def concurrency_of(raw: Any, payload: Any) -> dict[str, Any] | None:
    """``concurrency``: null or ``{"key": template, "limit": 1..100000}``; the key template
    must resolve against the job's payload (``duetime.core.keys``)."""
    return _keyed("concurrency", raw, payload, keys.check_concurrency, "key", "limit")


def rate_limit_of(raw: Any, payload: Any) -> dict[str, Any] | None:
    """``rate_limit``: null or ``{"key": template, "per_s": > 0, "burst": 1..100000}``."""
    return _keyed("rate_limit", raw, payload, keys.check_rate_limit, "key", "per_s", "burst")


def fairness_of(raw: Any, payload: Any) -> dict[str, Any] | None:
    """``fairness``: null or ``{"key": template, "weight"?: 1..100 (default 1)}``; the key
    template must resolve against the job's payload (the scheduler resolves it at fire time)."""
    return _keyed("fairness", raw, payload, keys.check_fairness, "key", "weight")


def queue_of(raw: Any) -> str:
    """``queue``: a queue name (``duetime.core.topics.check_queue``), refused naming the field.
    Whether the queue exists is the caller's check (it needs the cluster's metadata)."""
    try:
        return check_queue(raw)
    except ValueError as exc:
        raise ValidationError(str(exc), field="queue") from None


def start_within(raw: Any) -> float | None:
    """``start_within_s``: null (no limit) or seconds in (0, a week]; 0, a negative, NaN,
    infinity or a string is refused naming the field."""
    if raw is None:
        return None
    return float(check_number(raw, "start_within_s", lo=0, hi=MAX_START_WITHIN_S, lo_open=True))


def _schedule(raw: Any) -> dict[str, Any] | None:
    return None if raw is None else schedule_to_avro(parse_schedule(raw))


def _check_keys(body: Any) -> None:
    if not isinstance(body, Mapping):
        raise ValidationError("a job must be a JSON object", field="")
    for directive in ("unique", "debounce"):
        if directive in body:  # the REST route takes them out before it builds the job
            raise ValidationError(
                f"{directive} is applied by the REST API's POST /v1/jobs (one job a call), "
                "which holds each key's row in PostgreSQL; the Kafka-direct JobClient, the "
                "batch route and updates cannot apply it: create this job through POST /v1/jobs "
                "(duetime jobs create)",
                field=directive,
            )
    unknown = sorted(k for k in body if k not in _KEYS)
    if unknown:
        raise ValidationError(f"unknown job field(s): {', '.join(unknown)}", field=unknown[0])


def _optional_uuid(value: Any, field: str, *, empty_is_none: bool = True) -> str | None:
    """A UUID field that may be left out: ``null`` (and, with ``empty_is_none``, any falsy
    value, as ``job_id`` always took it) means none given."""
    if value is None or (empty_is_none and not value):
        return None
    return parse_uuid(value, field)


def _payload_json(payload: Any, max_payload_bytes: int) -> str:
    check_json_value(payload, "payload")
    try:
        payload_json = json.dumps(
            payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError) as exc:  # e.g. an int of more digits than str() allows
        raise ValidationError(f"payload is not JSON: {exc}", field="payload") from None
    size = len(payload_json.encode())
    if size > max_payload_bytes:
        raise PayloadTooLarge(
            f"payload is {size} bytes, over the limit of {max_payload_bytes}",
            details={"field": "payload", "size_bytes": size, "limit_bytes": max_payload_bytes},
        )
    return payload_json


def _labels(raw: Any, prefixes: tuple[str, ...], *, internal: bool) -> dict[str, str]:
    labels = raw or {}
    check_labels(labels, prefixes=prefixes, allow_reserved=internal)
    return dict(labels)


def _depends_on(raw: Any) -> list[str]:
    depends_on = raw or []
    if not isinstance(depends_on, list) or not all(isinstance(d, str) for d in depends_on):
        raise ValidationError("depends_on must be a list of job keys", field="depends_on")
    for key in depends_on:
        check_text(key, "depends_on", max_chars=200)
    return list(depends_on)


def _dag_key(raw: Any) -> str | None:
    return None if raw is None else check_text(raw, "dag_key", max_chars=200)


def json_size(value: Any) -> int:
    """A definition field's size, close to its Avro size: a string counts as its UTF-8 bytes,
    anything else as its compact JSON. None and plain numbers (half the fields of a job) are
    counted without calling json.dumps: the same figures, for a fifth of a create's build."""
    if isinstance(value, str):
        return len(value.encode())
    if value is None:
        return 4  # null
    if type(value) is int or (type(value) is float and math.isfinite(value)):
        return len(repr(value))  # json.dumps writes both with their repr
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def _check_size(definition: Mapping[str, Any]) -> None:
    """Refuse a job too large to travel as one record, naming its largest part."""
    total = sum(json_size(v) for v in definition.values())
    if total <= MAX_DEFINITION_BYTES:
        return
    largest = max(_SIZED_FIELDS, key=lambda f: json_size(definition.get(f)))
    field = "payload" if largest == "payload_json" else largest
    raise PayloadTooLarge(
        f"the job is {total} bytes, over the limit of {MAX_DEFINITION_BYTES}; its largest "
        f"part is {field} ({json_size(definition.get(largest))} bytes)",
        details={"field": field, "size_bytes": total, "limit_bytes": MAX_DEFINITION_BYTES},
    )


def same_job(a: JobDefinition, b: JobDefinition) -> bool:
    """Two definitions describe the same job (a re-create is then a no-op)."""
    return all(getattr(a, f) == getattr(b, f) for f in CONTENT_FIELDS)


def job_to_api(definition: JobDefinition) -> dict[str, Any]:
    """The API's view of a definition record."""
    return {
        "job_id": definition.job_id,
        "name": definition.name,
        "schedule": schedule_to_api(definition.schedule),
        "priority": definition.priority.value,
        "target": target_to_api(definition.target),
        "payload": json.loads(definition.payload_json),
        "retry": definition.retry.to_avro(),
        "timeout_s": definition.timeout_s,
        "misfire": definition.misfire.value,
        "overlap": definition.overlap.value,
        "labels": dict(definition.labels),
        "dag_id": definition.dag_id,
        "dag_key": definition.dag_key,
        "depends_on": list(definition.depends_on),
        "start_within_s": definition.start_within_s,
        "queue": definition.queue,
        "concurrency": None if definition.concurrency is None else definition.concurrency.to_avro(),
        "rate_limit": None if definition.rate_limit is None else definition.rate_limit.to_avro(),
        "fairness": None if definition.fairness is None else definition.fairness.to_avro(),
    }
