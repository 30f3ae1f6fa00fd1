"""The domain's records, typed: one slotted dataclass per Avro record in ``schemas/``.

Role: everything past the codec edge works on these, never on ``dict[str, Any]``, so that mypy
catches a misspelled field and a status is always a :class:`Status`, never a bare string.
The codec decodes bytes into them (:meth:`Codec.load`) and encodes them back
(:meth:`Codec.dump`); ``from_avro`` / ``to_avro`` convert from and to the plain form fastavro
reads and writes.

Guarantees:

* Each class has exactly its Avro record's fields, in the schema's order, with the schema's
  defaults (keyword-only, so a default may precede a required field as in the schema);
  ``tests/unit/test_records.py`` checks every class against ``schemas/*.avsc``, so
  ``cls.from_avro(decoded).to_avro()`` gives back what was decoded.
* Enum fields hold the enum (``Status``, ``Priority``, ...): they are ``str`` subclasses, so
  the Avro writer takes them as they are.
* A union of records (a job's ``target`` or ``schedule``) decodes to the class whose own
  required field the value carries, and encodes in fastavro's ``(name, record)`` form, so the
  writer does not have to guess the branch.
* Events that travel (requests, results, commands, DAG run events, dead letters, definitions)
  are frozen: a consumer cannot change what it was sent; use :func:`dataclasses.replace`.
  The scheduler's own state (``SchedulerState``, ``InflightExecution``) is mutable: the
  transform edits it in place and the partition owner writes it in its transaction.

The conversion is generic (derived once per class from its annotations) rather than written
out per field: a field added to a schema and to its class needs no converter code.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from enum import Enum
from typing import Any, ClassVar, Self, TypeAlias, Union, cast

from .models import (
    ControlKind,
    DagRunEventKind,
    DagRunStatus,
    ErrorReason,
    Misfire,
    Overlap,
    Priority,
    ResultStatus,
    Status,
    Trigger,
)

__all__ = [
    "AttemptError",
    "AvroRecord",
    "Backfill",
    "CalendarSpec",
    "ConcurrencyLimit",
    "ControlCommand",
    "CronSchedule",
    "DagDefinition",
    "DagNode",
    "DagRunEvent",
    "DeadLetter",
    "ErrorInfo",
    "ExecutionRequest",
    "ExecutionResult",
    "Fairness",
    "HttpTarget",
    "InflightExecution",
    "JobDefinition",
    "KafkaTarget",
    "OneTimeSchedule",
    "PythonTarget",
    "RateLimit",
    "RetrySpec",
    "Schedule",
    "SchedulerState",
    "Target",
]


class AvroRecord:
    """Base of the records: the Avro name and the generic conversion."""

    __slots__ = ()
    AVRO_NAME: ClassVar[str]
    EVENT_TYPE: ClassVar[str | None] = None
    """The codec's event type when this record is a topic's value (``"execution"``, ...)."""

    @classmethod
    def from_avro(cls, data: Mapping[str, Any]) -> Self:
        """The record from the plain form (fastavro's output); missing fields take their
        defaults, unknown keys are refused (TypeError naming them)."""
        return cast(Self, _compiled(cls)[0](data))

    def to_avro(self) -> dict[str, Any]:
        """The plain form, ready for fastavro's writer."""
        return cast(dict[str, Any], _compiled(type(self))[1](self))


# --- nested records ----------------------------------------------------------------------


@dataclass(slots=True, frozen=True, kw_only=True)
class HttpTarget(AvroRecord):
    AVRO_NAME: ClassVar[str] = "duetime.HttpTarget"
    url: str
    method: str = "POST"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True, frozen=True, kw_only=True)
class PythonTarget(AvroRecord):
    AVRO_NAME: ClassVar[str] = "duetime.PythonTarget"
    ref: str


@dataclass(slots=True, frozen=True, kw_only=True)
class KafkaTarget(AvroRecord):
    AVRO_NAME: ClassVar[str] = "duetime.KafkaTarget"
    topic: str


Target: TypeAlias = HttpTarget | PythonTarget | KafkaTarget


@dataclass(slots=True, frozen=True, kw_only=True)
class OneTimeSchedule(AvroRecord):
    AVRO_NAME: ClassVar[str] = "duetime.OneTimeSchedule"
    at_ms: int


@dataclass(slots=True, frozen=True, kw_only=True)
class CalendarSpec(AvroRecord):
    """A calendar's rules as a job carries them (``duetime.core.calendars`` computes)."""

    AVRO_NAME: ClassVar[str] = "duetime.Calendar"
    name: str
    timezone: str
    exclude: list[str] = field(default_factory=list)
    exclude_weekdays: list[str] = field(default_factory=list)


@dataclass(slots=True, frozen=True, kw_only=True)
class CronSchedule(AvroRecord):
    AVRO_NAME: ClassVar[str] = "duetime.CronSchedule"
    cron: str
    timezone: str
    start_at_ms: int | None = None
    end_at_ms: int | None = None
    jitter_s: float | None = None
    calendar: CalendarSpec | None = None


Schedule: TypeAlias = OneTimeSchedule | CronSchedule


@dataclass(slots=True, frozen=True, kw_only=True)
class RetrySpec(AvroRecord):
    """A job's retry policy as written (``duetime.core.retry.RetryPolicy`` computes with it)."""

    AVRO_NAME: ClassVar[str] = "duetime.RetryPolicy"
    max_retries: int = 3
    base_delay_s: float = 10.0
    max_delay_s: float = 3600.0
    jitter: bool = True
    non_retryable_http_statuses: list[int] = field(default_factory=list)
    non_retryable_errors: list[str] = field(default_factory=list)
    respect_retry_after: bool = True


@dataclass(slots=True, frozen=True, kw_only=True)
class ConcurrencyLimit(AvroRecord):
    """A job's concurrency limit per key (``duetime.core.keys`` resolves the key template)."""

    AVRO_NAME: ClassVar[str] = "duetime.ConcurrencyLimit"
    key: str
    limit: int


@dataclass(slots=True, frozen=True, kw_only=True)
class RateLimit(AvroRecord):
    """A job's rate limit per key: a token bucket of ``burst`` refilled at ``per_s``."""

    AVRO_NAME: ClassVar[str] = "duetime.RateLimit"
    key: str
    per_s: float
    burst: int


@dataclass(slots=True, frozen=True, kw_only=True)
class Fairness(AvroRecord):
    """A job's fairness key template and weight (the scheduler resolves the key at fire time)."""

    AVRO_NAME: ClassVar[str] = "duetime.Fairness"
    key: str
    weight: int = 1


@dataclass(slots=True, frozen=True, kw_only=True)
class ErrorInfo(AvroRecord):
    AVRO_NAME: ClassVar[str] = "duetime.ErrorInfo"
    type: str
    message: str
    retryable: bool
    reason: ErrorReason
    http_status: int | None = None
    traceback: str | None = None
    exception_types: list[str] = field(default_factory=list)


@dataclass(slots=True, frozen=True, kw_only=True)
class AttemptError(AvroRecord):
    AVRO_NAME: ClassVar[str] = "duetime.AttemptError"
    attempt: int
    at_ms: int
    error: ErrorInfo
    worker_id: str | None = None


@dataclass(slots=True, frozen=True, kw_only=True)
class DagNode(AvroRecord):
    AVRO_NAME: ClassVar[str] = "duetime.DagNode"
    key: str
    job_id: str
    depends_on: list[str] = field(default_factory=list)


# --- topic values ------------------------------------------------------------------------


# weakref_slot: the scheduler's codec keeps a definition's encoded bytes as long as the
# definition lives (schemas/codec.py)
@dataclass(slots=True, frozen=True, kw_only=True, weakref_slot=True)
class JobDefinition(AvroRecord):
    AVRO_NAME: ClassVar[str] = "duetime.JobDefinition"
    EVENT_TYPE: ClassVar[str | None] = "job"
    job_id: str
    name: str
    revision: int
    created_at_ms: int
    updated_at_ms: int
    schedule: Schedule | None = None
    priority: Priority = Priority.NORMAL
    target: Target
    payload_json: str = "null"
    retry: RetrySpec = field(default_factory=RetrySpec)
    timeout_s: float = 300.0
    misfire: Misfire = Misfire.RUN_ONCE
    overlap: Overlap = Overlap.SKIP
    dag_id: str | None = None
    dag_key: str | None = None
    depends_on: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    start_within_s: float | None = None
    queue: str = "default"
    concurrency: ConcurrencyLimit | None = None
    rate_limit: RateLimit | None = None
    traceparent: str | None = None
    fairness: Fairness | None = None


@dataclass(slots=True, frozen=True, kw_only=True)
class DagDefinition(AvroRecord):
    AVRO_NAME: ClassVar[str] = "duetime.DagDefinition"
    EVENT_TYPE: ClassVar[str | None] = "dag"
    dag_id: str
    name: str
    revision: int
    created_at_ms: int
    schedule: Schedule | None = None
    overlap: Overlap = Overlap.SKIP
    nodes: list[DagNode]


@dataclass(slots=True, frozen=True, kw_only=True)
class ExecutionRequest(AvroRecord):
    AVRO_NAME: ClassVar[str] = "duetime.ExecutionRequest"
    EVENT_TYPE: ClassVar[str | None] = "execution"
    execution_id: str
    job_id: str
    name: str
    attempt: int
    scheduled_at_ms: int
    due_at_ms: int
    emitted_at_ms: int
    priority: Priority
    target: Target
    payload_json: str
    timeout_s: float
    trigger: Trigger
    dag_id: str | None = None
    dag_run_id: str | None = None
    dag_key: str | None = None
    start_within_s: float | None = None
    queue: str = "default"
    concurrency: ConcurrencyLimit | None = None
    rate_limit: RateLimit | None = None
    fairness_key: str | None = None
    fairness_weight: int = 1


@dataclass(slots=True, frozen=True, kw_only=True)
class ExecutionResult(AvroRecord):
    AVRO_NAME: ClassVar[str] = "duetime.ExecutionResult"
    EVENT_TYPE: ClassVar[str | None] = "result"
    execution_id: str
    job_id: str
    attempt: int
    status: ResultStatus
    worker_id: str
    lease_token: int
    scheduled_at_ms: int
    started_at_ms: int | None = None
    finished_at_ms: int | None = None
    error: ErrorInfo | None = None
    retry_after_s: float | None = None
    output_json: str | None = None
    priority: Priority
    dag_id: str | None = None
    dag_run_id: str | None = None
    dag_key: str | None = None


@dataclass(slots=True, frozen=True, kw_only=True)
class ControlCommand(AvroRecord):
    AVRO_NAME: ClassVar[str] = "duetime.ControlCommand"
    EVENT_TYPE: ClassVar[str | None] = "control"
    command_id: str
    job_id: str
    kind: ControlKind
    issued_at_ms: int
    dag_id: str | None = None
    dag_run_id: str | None = None
    execution_id: str | None = None
    reason: str | None = None
    requested_by: str | None = None
    backfill_from_ms: int | None = None
    backfill_to_ms: int | None = None


@dataclass(slots=True, frozen=True, kw_only=True)
class DagRunEvent(AvroRecord):
    AVRO_NAME: ClassVar[str] = "duetime.DagRunEvent"
    EVENT_TYPE: ClassVar[str | None] = "dag_run"
    dag_id: str
    dag_run_id: str
    kind: DagRunEventKind
    at_ms: int
    status: DagRunStatus | None = None
    node_key: str | None = None
    node_status: Status | None = None
    node_statuses: dict[str, Status] = field(default_factory=dict)
    nodes: list[DagNode] = field(default_factory=list)
    trigger_job_id: str | None = None
    request_id: str | None = None


@dataclass(slots=True, frozen=True, kw_only=True)
class DeadLetter(AvroRecord):
    AVRO_NAME: ClassVar[str] = "duetime.DeadLetter"
    EVENT_TYPE: ClassVar[str | None] = "dead_letter"
    execution_id: str
    job_id: str
    name: str
    dead_at_ms: int
    attempts: int
    errors: list[AttemptError]
    request: ExecutionRequest
    dag_id: str | None = None
    dag_run_id: str | None = None


# --- the scheduler's state (mutable: the transform edits it in place) --------------------


@dataclass(slots=True, kw_only=True)
class InflightExecution(AvroRecord):
    """One execution of a job that is queued, running, or failed and waiting for its retry."""

    AVRO_NAME: ClassVar[str] = "duetime.InflightExecution"
    execution_id: str
    attempt: int
    scheduled_at_ms: int
    due_at_ms: int
    status: Status
    errors: list[AttemptError] = field(default_factory=list)
    trigger: Trigger = Trigger.SCHEDULE
    lease_token: int = 0
    series_start: int = 1
    dag_run_id: str | None = None
    rescues: int = 0
    deadline_ms: int | None = None
    queue: str = "default"
    snoozes: int = 0
    fairness_key: str | None = None
    held: bool = False


@dataclass(slots=True, kw_only=True)
class Backfill(AvroRecord):
    """A backfill in progress, in its job's scheduler state (edited in place)."""

    AVRO_NAME: ClassVar[str] = "duetime.Backfill"
    backfill_id: str
    after_ms: int
    to_ms: int
    emitted: int = 0
    skipped: int = 0


@dataclass(slots=True, kw_only=True)
class SchedulerState(AvroRecord):
    """A job as its scheduler knows it: the changelog's value, keyed by job id."""

    AVRO_NAME: ClassVar[str] = "duetime.SchedulerState"
    EVENT_TYPE: ClassVar[str | None] = "state"
    job_id: str
    definition: JobDefinition
    status: Status
    next_run_at_ms: int | None = None
    last_scheduled_at_ms: int | None = None
    paused_at_ms: int | None = None
    inflight: list[InflightExecution] = field(default_factory=list)
    queued_occurrence_ms: int | None = None
    fired_count: int = 0
    updated_at_ms: int
    dag_runs: dict[str, Status] = field(default_factory=dict)
    backfills: list[Backfill] = field(default_factory=list)


RECORDS: tuple[type[AvroRecord], ...] = (
    HttpTarget,
    PythonTarget,
    KafkaTarget,
    OneTimeSchedule,
    CalendarSpec,
    CronSchedule,
    RetrySpec,
    ConcurrencyLimit,
    RateLimit,
    Fairness,
    ErrorInfo,
    AttemptError,
    DagNode,
    JobDefinition,
    DagDefinition,
    ExecutionRequest,
    ExecutionResult,
    ControlCommand,
    DagRunEvent,
    DeadLetter,
    InflightExecution,
    Backfill,
    SchedulerState,
)
"""Every record class (the schema check in the tests walks this)."""

BY_EVENT_TYPE: Mapping[str, type[AvroRecord]] = types.MappingProxyType(
    {cls.EVENT_TYPE: cls for cls in RECORDS if cls.EVENT_TYPE is not None}
)
"""The codec's event type → the record class of that topic value."""


# --- the generic conversion --------------------------------------------------------------

_Convert = Callable[[Any], Any]
_PLANS: dict[type, tuple[tuple[str, _Convert | None, _Convert | None], ...]] = {}


_COMPILED: dict[type, tuple[_Convert, _Convert]] = {}


def _compiled(cls: type) -> tuple[_Convert, _Convert]:
    """(from_avro, to_avro) of ``cls``, generated once from its plan.

    Why generated: these run for every record a role reads or writes (the scheduler decodes
    a state per fire), and a straight-line constructor call is about twice as fast as a loop
    over the fields. The generated code only ever names the dataclass's own fields, so it
    cannot misspell one. A value that is not exactly the plain form (a missing field, an
    unknown key) takes the general path, which applies defaults and refuses unknown keys.
    """
    pair = _COMPILED.get(cls)
    if pair is not None:
        return pair
    plan = _plan_of(cls)
    scope: dict[str, Any] = {"_cls": cls, "_general": lambda d: _general_from_avro(cls, d)}
    args, items = [], []
    for i, (name, decode, encode) in enumerate(plan):
        if isinstance(decode, type) and issubclass(decode, Enum):
            # a dict lookup instead of the enum's call; an unknown symbol raises KeyError and
            # so takes the general path, whose call raises the ValueError naming it
            decode = decode._value2member_map_.__getitem__
        scope[f"_d{i}"] = decode
        value = f"d[{name!r}]" if decode is None else f"_d{i}(d[{name!r}])"
        args.append(f"{name}={value}")
        items.append(_to_avro_item(i, name, encode, scope))
    source = (
        "def from_avro(d):\n"
        f"    if len(d) != {len(plan)}:\n"
        "        return _general(d)\n"
        "    try:\n"
        f"        return _cls({', '.join(args)})\n"
        "    except KeyError:\n"
        "        return _general(d)\n"
        "def to_avro(r):\n"
        f"    return {{{', '.join(items)}}}\n"
    )
    exec(compile(source, f"<records: {cls.__name__}>", "exec"), scope)
    pair = (scope["from_avro"], scope["to_avro"])
    _COMPILED[cls] = pair
    return pair


def _to_avro_item(i: int, name: str, encode: _Convert | None, scope: dict[str, Any]) -> str:
    """The generated ``to_avro``'s entry for field ``name`` (its encoder put in ``scope``)."""
    scope[f"_e{i}"] = encode
    attribute = f"r.{name}" if encode is None else f"_e{i}(r.{name})"
    return f"{name!r}: {attribute}"


_WITHOUT: dict[tuple[type, str], _Convert] = {}


def to_avro_without(record: AvroRecord, skip: str) -> dict[str, Any]:
    """The plain form of ``record`` without its field ``skip``: for a writer that has that
    field's bytes already (the scheduler's codec splices a state's definition in from kept
    bytes; converting the definition too was a quarter of encoding a state)."""
    cls = type(record)
    convert = _WITHOUT.get((cls, skip))
    if convert is None:
        plan = _plan_of(cls)
        if skip not in {name for name, _, _ in plan}:
            raise ValueError(f"{cls.__name__} has no field {skip!r}")
        scope: dict[str, Any] = {}
        items = [
            _to_avro_item(i, name, encode, scope)
            for i, (name, _, encode) in enumerate(plan)
            if name != skip
        ]
        source = f"def to_avro(r):\n    return {{{', '.join(items)}}}\n"
        exec(compile(source, f"<records: {cls.__name__} without {skip}>", "exec"), scope)
        convert = _WITHOUT[(cls, skip)] = scope["to_avro"]
    return cast(dict[str, Any], convert(record))


def _general_from_avro(cls: type, data: Mapping[str, Any]) -> Any:
    kwargs = dict(data)
    for name, decode, _ in _plan_of(cls):
        if decode is not None and name in kwargs:
            kwargs[name] = decode(kwargs[name])
    return cls(**kwargs)


def _plan_of(cls: type) -> tuple[tuple[str, _Convert | None, _Convert | None], ...]:
    """(field, decode, encode) per field of ``cls``; None where the value passes as it is."""
    plan = _PLANS.get(cls)
    if plan is None:
        hints = typing.get_type_hints(cls)
        plan = tuple((f.name, *_converters(hints[f.name], f.name)) for f in fields(cls))
        _PLANS[cls] = plan
    return plan


def _converters(hint: Any, name: str) -> tuple[_Convert | None, _Convert | None]:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        present = [a for a in args if a is not type(None)]
        optional = len(present) < len(args)
        if len(present) == 1:
            decode, encode = _converters(present[0], name)
        elif all(isinstance(a, type) and issubclass(a, AvroRecord) for a in present):
            decode, encode = _record_union(present, name)
        else:
            raise TypeError(f"{name}: unsupported union {hint}")
        if optional:
            return _or_none(decode), _or_none(encode)
        return decode, encode
    if origin is list:
        inner_decode, inner_encode = _converters(args[0], name)
        if inner_decode is None or inner_encode is None:
            return None, None
        d, e = inner_decode, inner_encode
        return (lambda v: [d(x) for x in v]), (lambda v: [e(x) for x in v])
    if origin is dict:
        inner_decode, _ = _converters(args[1], name)
        if inner_decode is None:
            return None, None
        d = inner_decode
        return (lambda v: {k: d(x) for k, x in v.items()}), None
    if isinstance(hint, type) and issubclass(hint, AvroRecord):
        record = hint
        return record.from_avro, record.to_avro
    if isinstance(hint, type) and issubclass(hint, Enum):
        return hint, None  # a StrEnum member is a str: the writer takes it as it is
    if hint in (str, int, float, bool):
        return None, None
    raise TypeError(f"{name}: unsupported field type {hint}")


def _or_none(convert: _Convert | None) -> _Convert | None:
    if convert is None:
        return None
    c = convert
    return lambda v: None if v is None else c(v)


def _record_union(classes: list[Any], name: str) -> tuple[_Convert, _Convert]:
    """Decode by the field only one branch requires; encode as ``(avro name, record)``."""
    by_field: dict[str, type[AvroRecord]] = {}
    for cls in classes:
        others = {f.name for other in classes if other is not cls for f in fields(other)}
        required = [
            f.name
            for f in fields(cls)
            if f.name not in others and f.default is MISSING and f.default_factory is MISSING
        ]
        if not required:
            raise TypeError(f"{name}: union branch {cls.__name__} has no field of its own")
        by_field[required[0]] = cls

    def decode(value: Any) -> Any:
        if isinstance(value, AvroRecord):
            return value
        for key, cls in by_field.items():
            if key in value:
                return cls.from_avro(value)
        raise ValueError(f"{name}: {sorted(value)} matches none of {sorted(by_field)}")

    def encode(value: Any) -> Any:
        return (value.AVRO_NAME, value.to_avro())

    return decode, encode
