"""W3C trace context through duetime, with OpenTelemetry spans when an exporter is configured.

Role: carry a ``traceparent`` from the request that created a job to every execution of it and
into what the execution calls. The creating REST request's ``traceparent`` header (or the
SDK's argument, or its caller's ambient OpenTelemetry context) travels as a header of the job's
definition record; the scheduler keeps it in the definition it stores (``JobDefinition.
traceparent``: it survives restores and failovers) and puts it on every execution request it
emits; the worker hands it to HTTP targets (a ``traceparent`` request header) and puts it on
the results it publishes.

Spans: with OpenTelemetry configured (``configure``: the ``otel`` extra installed and an
exporter named by the standard ``OTEL_*`` variables, or a tracer provider installed by the
host program or a test through ``install``), the scheduler records a ``duetime.fire`` span per
execution request and the worker ``duetime.claim``, ``duetime.run`` and ``duetime.report``;
each carries ``job_id``, ``execution_id`` and ``attempt``, and the context handed on is the
span's own, so a trace reads create → fire → claim / run / report → the target's own spans.

Guarantees:

- Without OpenTelemetry (not installed, or no exporter) nothing is recorded: a hot path does
  one header lookup and hands the value on unchanged (``span`` returns a pass-through).
- A header is hostile input: :func:`parse` accepts only a well-formed ``traceparent`` (version
  ``00``, or a later version's first four fields; lowercase hex; trace and parent ids not all
  zero; at most ``MAX_HEADER_BYTES``) and returns ``None`` for anything else. A bad header is
  ignored, never an error, never logged with its content.
- No tracing failure reaches the work: creating or ending a span that raises is logged once
  and the work goes on untraced.

One process-wide tracer, as OpenTelemetry's own provider is process-wide: ``configure`` (a
role's ``main``) or ``install`` (tests) sets it, explicitly; importing this module does
nothing.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeAlias, TypeVar

from .config import Env
from .records import AvroRecord, ExecutionRequest, JobDefinition, SchedulerState

if TYPE_CHECKING:  # the otel extra is optional: imported only where it is used
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer

log = logging.getLogger("duetime.tracing")

HEADER = "traceparent"
MAX_HEADER_BYTES = 512
"""A longer header is ignored unread (version 00 is 55 characters; later versions may append
fields, never megabytes)."""

_TRACEPARENT_RE = re.compile(
    r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[\x21-\x7e]*)?"
)
_ZERO_TRACE = "0" * 32
_ZERO_PARENT = "0" * 16

_tracer: Tracer | None = None
_provider: Any = None
_propagator: Any = None
_failed_once = False

_current: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "duetime_traceparent", default=None
)


def parse(value: str | bytes | None) -> str | None:
    """The ``traceparent`` in ``value`` as version 00 (``00-<trace>-<parent>-<flags>``), or
    None when it is missing, too long or malformed (W3C Trace Context, level 1 rules)."""
    if value is None or len(value) > MAX_HEADER_BYTES:
        return None
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    match = _TRACEPARENT_RE.fullmatch(value.strip(" \t"))
    if match is None:
        return None
    version, trace_id, parent_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None  # ff is forbidden; version 00 has exactly four fields
    if trace_id == _ZERO_TRACE or parent_id == _ZERO_PARENT:
        return None
    return f"00-{trace_id}-{parent_id}-{flags}"


KafkaHeaders: TypeAlias = Mapping[str, Any] | Iterable[tuple[str, Any]] | None
"""A record's headers as confluent-kafka gives them (a list of pairs; a dict in its stubs)."""


def from_headers(headers: KafkaHeaders) -> str | None:
    """The valid ``traceparent`` among Kafka record headers (the first one decides)."""
    if not headers:
        return None
    if isinstance(headers, Mapping):
        return parse(headers.get(HEADER))
    for name, value in headers:
        if name == HEADER:
            return parse(value)
    return None


def from_mapping(headers: Mapping[str, str]) -> str | None:
    """The valid ``traceparent`` of an HTTP request's headers (a case-insensitive mapping)."""
    return parse(headers.get(HEADER))


def kafka_headers(traceparent: str | None) -> list[tuple[str, bytes]] | None:
    """Record headers carrying ``traceparent`` (None when there is none)."""
    return None if traceparent is None else [(HEADER, traceparent.encode("ascii"))]


def trace_id(traceparent: str) -> str:
    """The trace id of a parsed ``traceparent``."""
    return traceparent.split("-")[1]


def enabled() -> bool:
    """Whether spans are recorded in this process."""
    return _tracer is not None


def current() -> str | None:
    """The ``traceparent`` the work running in this context hands on (an HTTP target's
    request carries it): the innermost :func:`span`'s, or None."""
    return _current.get()


class _Pass:
    """``span`` without a tracer: hands the parent on, records nothing."""

    __slots__ = ("_parent", "_token")

    def __init__(self, parent: str | None) -> None:
        self._parent = parent
        self._token: contextvars.Token[str | None] | None = None

    def __enter__(self) -> str | None:
        self._token = _current.set(self._parent)
        return self._parent

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _current.reset(self._token)


class _Span:
    """One recorded span; its context is what children and targets carry."""

    __slots__ = ("_attributes", "_name", "_parent", "_span", "_token")

    def __init__(self, name: str, parent: str | None, attributes: Mapping[str, Any]) -> None:
        self._name = name
        self._parent = parent
        self._attributes = attributes
        self._span: Any = None
        self._token: contextvars.Token[str | None] | None = None

    def __enter__(self) -> str | None:
        carried = self._parent
        try:
            self._span = _start(self._name, self._parent, self._attributes)
            if self._span is not None:
                carried = _traceparent_of(self._span) or self._parent
        except Exception as exc:  # tracing must never stop the work it watches
            _failed(exc)
        self._token = _current.set(carried)
        return carried

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, _: object
    ) -> None:
        if self._token is not None:
            _current.reset(self._token)
        if self._span is None:
            return
        try:
            if exc is not None and not isinstance(exc, GeneratorExit):
                self._span.record_exception(exc)
                self._span.set_status(_error_status(type(exc).__name__))
            self._span.end()
        except Exception as end_exc:
            _failed(end_exc)


def span(name: str, parent: str | None, **attributes: Any) -> _Pass | _Span:
    """A context manager around one step (``fire``, ``claim``, ``run``, ``report``) whose
    value is the ``traceparent`` to hand on: the new span's, or ``parent`` unchanged when no
    tracer is installed. Inside it, :func:`current` returns that value."""
    if _tracer is None:
        return _Pass(parent)
    return _Span(f"duetime.{name}", parent, attributes)


def emit(name: str, parent: str | None, **attributes: Any) -> str | None:
    """Record an instantaneous span (the scheduler's fire) and return the ``traceparent`` its
    output carries: the span's, or ``parent`` when nothing is recorded."""
    if _tracer is None:
        return parent
    with _Span(f"duetime.{name}", parent, attributes) as carried:
        return carried


def ambient() -> str | None:
    """The caller's current OpenTelemetry span as a ``traceparent`` (the SDK uses it when it is
    given none), or None without OpenTelemetry or without a valid current span."""
    propagate = _propagate_module()
    if propagate is None:
        return None
    carrier: dict[str, str] = {}
    try:
        propagate.inject(carrier)
    except Exception as exc:  # a misconfigured propagator: publish untraced
        _failed(exc)
        return None
    return parse(carrier.get(HEADER))


@functools.cache
def _propagate_module() -> Any:
    """``opentelemetry.propagate``, or None when OpenTelemetry is not installed (looked up
    once: a failed import searches the whole path every time)."""
    try:
        from opentelemetry import propagate
    except ImportError:
        return None
    return propagate


# --- the roles' points -----------------------------------------------------------------


def keep_trace(definition: JobDefinition, headers: KafkaHeaders) -> JobDefinition:
    """The scheduler's copy of a consumed definition: its ``traceparent`` field is the
    record's validated header, whatever the value said (only a header that passed
    :func:`parse` is ever handed on)."""
    traceparent = from_headers(headers)
    if traceparent == definition.traceparent:
        return definition
    return replace(definition, traceparent=traceparent)


def request_headers(
    state: SchedulerState | None, record: AvroRecord
) -> list[tuple[str, str | bytes | None]] | None:
    """The headers of one record the scheduler emits: an execution request carries its job's
    trace, continued by a ``fire`` span when spans are recorded; anything else none."""
    if not isinstance(record, ExecutionRequest) or state is None:
        return None
    stored = state.definition.traceparent
    if stored is None and _tracer is None:
        return None  # the common case: nothing to hand on, nothing recorded
    carried = emit(
        "fire",
        parse(stored),
        job_id=record.job_id,
        execution_id=record.execution_id,
        attempt=record.attempt,
        priority=str(record.priority.value),
        queue=record.queue,
        trigger=str(record.trigger.value),
    )
    return None if carried is None else [(HEADER, carried.encode("ascii"))]


class TracedItem(Protocol):
    """What the worker's steps take: a fetched request, its record, and its trace."""

    request: ExecutionRequest
    msg: Any
    trace: str | None


ItemT = TypeVar("ItemT", bound=TracedItem)
S = TypeVar("S")
P = ParamSpec("P")
R = TypeVar("R")
Step: TypeAlias = Callable[Concatenate[S, ItemT, P], Awaitable[R]]


def traced(
    step: str, *, first: bool = False
) -> Callable[[Step[S, ItemT, P, R]], Step[S, ItemT, P, R]]:
    """Run a worker step (``claim``, ``run``, ``report``: a coroutine method taking the item)
    in a span of the item's trace; inside it :func:`current` is what the step hands on (an
    HTTP target's header, a result's). The ``first`` step reads the request's header (the
    one lookup per execution); when the request had none and spans are recorded, the first
    step's span becomes the parent of the others, so one execution is one trace."""

    def wrap(method: Step[S, ItemT, P, R]) -> Step[S, ItemT, P, R]:
        @functools.wraps(method)
        async def run(self: S, item: ItemT, /, *args: P.args, **kwargs: P.kwargs) -> R:
            if first:
                item.trace = from_headers(item.msg.headers())
            if _tracer is None:
                if item.trace is None:  # the common case: nothing to hand on, nothing recorded
                    return await method(self, item, *args, **kwargs)
                with _Pass(item.trace):
                    return await method(self, item, *args, **kwargs)
            request = item.request
            with _Span(
                f"duetime.{step}",
                item.trace,
                {
                    "job_id": request.job_id,
                    "execution_id": request.execution_id,
                    "attempt": request.attempt,
                    "queue": request.queue,
                },
            ) as carried:
                if item.trace is None:
                    item.trace = carried
                return await method(self, item, *args, **kwargs)

        return run

    return wrap


# --- setup -------------------------------------------------------------------------------


def install(provider: TracerProvider | None) -> None:
    """Record spans with ``provider`` (None: stop recording). For tests and for programs that
    configure OpenTelemetry themselves before starting a role in-process."""
    global _tracer, _provider, _propagator, _failed_once
    _provider = provider
    _failed_once = False
    if provider is None:
        _tracer = None
        return
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _propagator = TraceContextTextMapPropagator()
    _tracer = provider.get_tracer("duetime")


def configure(role: str, env: Env | None = None) -> bool:
    """At a role's start: record spans when OpenTelemetry's SDK is installed and an exporter
    is configured by the standard variables (``OTEL_TRACES_EXPORTER``, or an
    ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`` with the default ``otlp``; ``OTEL_SDK_DISABLED``
    turns it off; ``OTEL_SERVICE_NAME`` defaults to ``duetime-<role>``). Returns whether it
    does. Without the ``otel`` extra, asking for an exporter is logged once and ignored."""
    env = env or Env()
    exporters = _exporters_wanted(env)
    if not exporters:
        return False
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning(
            "OTEL_* asks for trace export, but OpenTelemetry is not installed: "
            "pip install 'duetime[otel]'; running without spans"
        )
        return False
    service = env.text("OTEL_SERVICE_NAME", f"duetime-{role}")
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(_exporter(exporter)))
    install(provider)
    log.info("tracing: spans exported with %s as %s", ", ".join(exporters), service)
    return True


def shutdown() -> None:
    """Export what is buffered (a role's exit): bounded by the SDK's own export timeout."""
    provider = _provider
    install(None)
    if provider is not None and hasattr(provider, "shutdown"):
        try:
            provider.shutdown()
        except Exception as exc:
            log.warning("tracing: flushing spans at exit failed: %s", type(exc).__name__)


def _exporters_wanted(env: Env) -> list[str]:
    if env.flag("OTEL_SDK_DISABLED", False):
        return []
    named = env.items("OTEL_TRACES_EXPORTER")
    if named:
        chosen = [e.lower() for e in named if e.lower() != "none"]
    elif env.raw("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.raw("OTEL_EXPORTER_OTLP_ENDPOINT"):
        chosen = ["otlp"]
    else:
        chosen = []
    unknown = [e for e in chosen if e not in ("otlp", "console")]
    if unknown:
        from .errors import ConfigError

        raise ConfigError(
            f"OTEL_TRACES_EXPORTER names {', '.join(unknown)}: duetime supports otlp "
            "(over HTTP), console and none",
            details={"variable": "OTEL_TRACES_EXPORTER"},
        )
    return chosen


def _exporter(name: str) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    # endpoint, headers, timeout, certificates: the exporter reads the OTEL_EXPORTER_OTLP_*
    # variables itself
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


# --- OpenTelemetry calls (only reached with a tracer installed) ----------------------------


def _start(name: str, parent: str | None, attributes: Mapping[str, Any]) -> Any:
    if _tracer is None:  # uninstalled meanwhile (a role shutting down)
        return None
    context = _propagator.extract({HEADER: parent}) if parent is not None else None
    clean = {k: v for k, v in attributes.items() if isinstance(v, (str, int, float, bool))}
    return _tracer.start_span(name, context=context, attributes=clean)


def _traceparent_of(span: Any) -> str | None:
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def _error_status(description: str) -> Any:
    from opentelemetry.trace import Status, StatusCode

    return Status(StatusCode.ERROR, description)


def _failed(exc: Exception) -> None:
    global _failed_once
    if not _failed_once:
        _failed_once = True
        log.warning("tracing failed, the work goes on untraced: %s", type(exc).__name__)
