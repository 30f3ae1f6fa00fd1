"""Checks every edge applies to what a caller sends, before any arithmetic or storage.

Pure functions that raise :class:`ValidationError` naming the field. They exist because a
hostile value must fail as a 4xx, never as an ``OverflowError`` (a 400-digit integer reaching
``float()``), a database ``DataError`` (a NUL in a string PostgreSQL stores) or a
``RecursionError`` (a payload nested a thousand levels deep).

Reserved namespaces: labels, HTTP header names and Kafka topic names under ``duetime.`` (or
the deployment's topic prefix) belong to duetime itself. A label ``duetime.dag`` marks a DAG's
trigger job; a caller who could set it would make the scheduler treat any job as a DAG.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from .errors import ValidationError

RESERVED_PREFIX = "duetime."
DEFAULT_MAX_JSON_DEPTH = 64
"""Nesting depth of a job's payload (objects and arrays); the API applies the same limit to
whole request bodies (``DUETIME_API_MAX_JSON_DEPTH``)."""

_UUID_TEXT_RE = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_NUL_RE = re.compile(r"\x00")
_HEADER_NAME_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}$")
_BAD_VALUE_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
FRAMING_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "upgrade",
        "te",
        "trailer",
        "keep-alive",
        "expect",
        "proxy-authorization",
        "proxy-connection",
    }
)
"""Headers a job may not set on an HTTP target: they decide how the request is framed or
routed (a user ``Host`` would win over the URL; ``Transfer-Encoding`` beside our
``Content-Length`` makes request smuggling possible), so only the worker's client sets them."""
_OWN_HEADER_PREFIXES = ("x-duetime-", "duetime-")


MAX_TIME_MS = 253_402_300_799_000
"""9999-12-31T23:59:59Z, the end of datetime's range: no time duetime writes is later."""


def is_uuid_text(value: object) -> bool:
    """``value`` is a UUID in the hyphenated 36-character form (either case): the form every
    producer of ours writes and PostgreSQL takes. A compiled match: 0.7 us against 1.5 for
    ``uuid.UUID``, paid by every record a scheduler or a worker checks."""
    return isinstance(value, str) and _UUID_TEXT_RE.fullmatch(value) is not None


def check_number(
    value: Any,
    field: str,
    *,
    lo: float,
    hi: float,
    lo_open: bool = False,
    integer: bool = False,
) -> float:
    """A JSON number in ``[lo, hi]`` (``(lo, hi]`` when ``lo_open``), compared before any
    conversion: a huge integer is refused, not overflowed."""
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(f"{field} must be {kind}", field=field)
    if integer and not isinstance(value, int):
        raise ValidationError(f"{field} must be {kind}", field=field)
    if isinstance(value, float) and value != value:  # NaN compares false with everything
        raise ValidationError(f"{field} must be {kind}, not NaN", field=field)
    low_ok = value > lo if lo_open else value >= lo
    if not (low_ok and value <= hi):
        if isinstance(value, int) and value.bit_length() > 128:  # str() may refuse it
            shown = f"an integer of {value.bit_length()} bits"
        else:
            shown = str(value)[:40]
        bracket = "(" if lo_open else "["
        raise ValidationError(
            f"{field} must be in {bracket}{lo:g}, {hi:g}] (got {shown})", field=field
        )
    return value


def check_text(
    value: Any,
    field: str,
    *,
    max_chars: int | None,
    allow_empty: bool = False,
    control: bool = False,
) -> str:
    """A string PostgreSQL can store and a log line can show: no NUL ever; no other control
    characters unless ``control`` (e.g. a free-text message); at most ``max_chars``."""
    if not isinstance(value, str):
        raise ValidationError(f"{field} must be a string", field=field)
    if not allow_empty and not value.strip():
        raise ValidationError(f"{field} must not be empty", field=field)
    if max_chars is not None and len(value) > max_chars:
        raise ValidationError(
            f"{field} is {len(value)} characters, over the limit of {max_chars}", field=field
        )
    if (_NUL_RE if control else _CONTROL_RE).search(value):
        raise ValidationError(f"{field} contains a control character (e.g. NUL)", field=field)
    _check_surrogates(value, field)
    return value


def _check_surrogates(value: str, field: str) -> None:
    try:
        value.encode()
    except UnicodeEncodeError:
        message = f"{field} is not valid Unicode (a lone surrogate)"
        raise ValidationError(message, field=field) from None


def json_depth(value: Any, limit: int) -> int:
    """Nesting depth of a decoded JSON value, counting stops once past ``limit``
    (iterative: a deep value cannot exhaust the stack here)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Iterable[Any] = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((child, depth) for child in children)
    return deepest


def check_json_value(value: Any, field: str, *, max_depth: int = DEFAULT_MAX_JSON_DEPTH) -> None:
    """A payload a JSON store can hold: bounded depth, no NUL in any string (PostgreSQL's
    jsonb refuses ``\\u0000``), no lone surrogates."""
    if json_depth(value, max_depth) > max_depth:
        raise ValidationError(
            f"{field} is nested deeper than {max_depth} levels",
            field=field,
            details={"max_depth": max_depth},
        )
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                raise ValidationError(f"{field} contains a NUL character", field=field)
            _check_surrogates(item, field)
        elif isinstance(item, Mapping):
            for key in item:
                if not isinstance(key, str):
                    raise ValidationError(f"{field} has a non-string object key", field=field)
                stack.append(key)
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif isinstance(item, float) and (item != item or item in (float("inf"), float("-inf"))):
            raise ValidationError(f"{field} contains NaN or Infinity (not JSON)", field=field)
        elif item is not None and not isinstance(item, bool | int | float):
            raise ValidationError(
                f"{field} holds a {type(item).__name__}, which JSON cannot hold", field=field
            )


def reserved_prefixes(topic_prefix: str) -> tuple[str, ...]:
    """The name prefixes callers may not use: ``duetime.`` and the deployment's topic prefix."""
    return tuple(sorted({RESERVED_PREFIX, topic_prefix} - {""}))


def check_labels(labels: Any, *, prefixes: tuple[str, ...], allow_reserved: bool = False) -> None:
    if not isinstance(labels, Mapping):
        raise ValidationError("labels must map strings to strings", field="labels")
    for key, value in labels.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ValidationError("labels must map strings to strings", field="labels")
        # no count or length limit of their own: the whole job's size limit bounds them (413)
        check_text(key, f"labels.{key[:40]}", max_chars=None)
        check_text(value, f"labels.{key[:40]}", max_chars=None, allow_empty=True)
        if not allow_reserved and key.lower().startswith(prefixes):
            raise ValidationError(
                f"label {key!r} is in a reserved namespace ({', '.join(prefixes)}): "
                "duetime sets those itself",
                field="labels",
                details={"label": key},
            )


def header_refusal(name: str, value: str) -> str | None:
    """None when a job may send this header; otherwise why not (never naming the value).
    The rule of both the edge (at creation) and the worker (on every attempt)."""
    if not isinstance(name, str) or not _HEADER_NAME_RE.match(name):
        return f"header name {str(name)[:60]!r} is not a valid HTTP token"
    lowered = name.lower()
    if lowered in FRAMING_HEADERS or lowered.startswith("proxy-"):
        return f"header {name!r} frames or routes the request: only the worker's client sets it"
    if not isinstance(value, str) or _BAD_VALUE_RE.search(value):
        return f"the value of header {name!r} contains a line break or control character"
    return None


def check_headers(headers: Any) -> dict[str, str]:
    """An HTTP target's own headers: valid names and values, nothing that frames or routes the
    request, nothing in duetime's own namespace."""
    if not isinstance(headers, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise ValidationError("target.headers must map strings to strings", field="target.headers")
    for name, value in headers.items():
        why = header_refusal(name, value)
        if why is None and name.lower().startswith((*_OWN_HEADER_PREFIXES, "idempotency-key")):
            why = f"header {name!r} is in duetime's reserved namespace (the worker sets it)"
        if why is not None:
            raise ValidationError(why, field="target.headers", details={"header": name[:60]})
    return dict(headers)


def check_topic(topic: str, *, prefixes: tuple[str, ...]) -> None:
    """A Kafka target's topic may not be duetime's own nor Kafka's internal ones."""
    if topic.startswith("__") or topic.lower().startswith(prefixes):
        raise ValidationError(
            f"target.topic {topic!r} is reserved (duetime's own topics under "
            f"{', '.join(prefixes)}, or Kafka's internal '__' topics)",
            field="target.topic",
        )
