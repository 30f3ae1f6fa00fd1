"""Limit keys: the template language of ``concurrency.key`` / ``rate_limit.key``, the limits'
validation, and the token bucket's arithmetic (issue 18, items 1 and 2).

A key template is literal text with placeholders naming a field of the job's payload:
``"tenant-{payload.tenant}"``, ``"{payload.account.id}/{payload.region}"``. That is the
whole language, on purpose:

- a placeholder is ``{payload}`` or ``{payload.<segment>(.<segment>)*}``; a segment is
  ``[A-Za-z0-9_-]{1,64}``: an object member, or a list index when the value is a list;
- ``{{`` and ``}}`` stand for literal braces; any other brace is an error;
- a placeholder resolves to a string, a number or a boolean (``true``/``false``, as JSON
  writes them); an object, a list, null, or a missing field is an error naming the path.

No ``str.format`` (whose ``{0.__class__}`` reaches attributes), no eval, no conversion or
format specs: a template can only read payload values. Errors are
:class:`KeyTemplateError` (a ``ValueError``) with a message naming what is wrong; the API
turns them into 422 naming the field, the worker into a failed attempt that is not retried.

Everything here is pure: no clock, no I/O. :func:`take_token` is the arithmetic the worker's
claim runs in PostgreSQL (``infra/migrations/0009_limits.sql``), written once here so that
its properties are tested (tests/unit/test_keys.py).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MAX_BURST",
    "MAX_KEY_CHARS",
    "MAX_LIMIT",
    "MAX_PER_S",
    "KeyTemplateError",
    "Template",
    "check_concurrency",
    "check_fairness",
    "check_rate_limit",
    "parse_template",
    "resolve_key",
    "take_token",
]

MAX_TEMPLATE_CHARS = 200
MAX_KEY_CHARS = 200
"""A resolved key longer than this is refused (it is stored in every lease that holds it)."""
MAX_PLACEHOLDERS = 8
MAX_DEPTH = 8
MAX_LIMIT = 100_000
MAX_BURST = 100_000
MAX_PER_S = 100_000.0
MAX_WEIGHT = 100
"""A fairness weight's ceiling: a key's in-flight cap is weight x the scheduler's cap, so this
bounds one key's share of the execution topics (and keeps the worker's stride exact)."""
_SEGMENT = re.compile(r"[A-Za-z0-9_-]{1,64}")
_TOKEN = re.compile(r"\{\{|\}\}|\{[^{}]*\}|[{}]|[^{}]+")


class KeyTemplateError(ValueError):
    """A key template that cannot be parsed, or that does not resolve against a payload."""


@dataclass(frozen=True, slots=True)
class Template:
    """A parsed key template: literal strings and payload paths (tuples of segments)."""

    parts: tuple[str | tuple[str, ...], ...]

    @property
    def paths(self) -> tuple[tuple[str, ...], ...]:
        return tuple(p for p in self.parts if isinstance(p, tuple))


def parse_template(template: Any) -> Template:
    """Parse ``template``; :class:`KeyTemplateError` says what is wrong with it."""
    if not isinstance(template, str):
        raise KeyTemplateError("must be a string")
    if not template:
        raise KeyTemplateError("must not be empty")
    if len(template) > MAX_TEMPLATE_CHARS:
        raise KeyTemplateError(f"is longer than {MAX_TEMPLATE_CHARS} characters")
    if "\x00" in template:
        raise KeyTemplateError("must not contain NUL characters")
    parts: list[str | tuple[str, ...]] = []
    for match in _TOKEN.finditer(template):
        token = match.group()
        if token in ("{{", "}}"):
            parts.append(token[0])
        elif token in ("{", "}"):
            raise KeyTemplateError(
                f"has an unmatched {token!r} at position {match.start()} "
                "(write {{ or }} for a literal brace)"
            )
        elif token.startswith("{"):
            parts.append(_path(token[1:-1]))
        else:
            parts.append(token)
    paths = [p for p in parts if isinstance(p, tuple)]
    if len(paths) > MAX_PLACEHOLDERS:
        raise KeyTemplateError(f"has more than {MAX_PLACEHOLDERS} placeholders")
    # adjacent literals (a brace escape beside text) are joined: one string per run of text
    merged: list[str | tuple[str, ...]] = []
    for part in parts:
        if isinstance(part, str) and merged and isinstance(merged[-1], str):
            merged[-1] += part
        else:
            merged.append(part)
    return Template(tuple(merged))


def _path(inner: str) -> tuple[str, ...]:
    segments = inner.split(".")
    if segments[0] != "payload":
        raise KeyTemplateError(
            f"placeholder {{{inner}}} must name a payload field: {{payload}} or {{payload.field}}"
        )
    rest = segments[1:]
    if len(rest) > MAX_DEPTH:
        raise KeyTemplateError(f"placeholder {{{inner}}} is deeper than {MAX_DEPTH} fields")
    for segment in rest:
        if not _SEGMENT.fullmatch(segment):
            raise KeyTemplateError(
                f"placeholder {{{inner}}} has an invalid field name {segment!r} "
                "(letters, digits, _ and -, at most 64)"
            )
    return tuple(rest)


def resolve_key(template: Template, payload: Any) -> str:
    """The key ``template`` gives for ``payload`` (the decoded JSON); :class:`KeyTemplateError`
    names the placeholder that does not resolve."""
    out: list[str] = []
    for part in template.parts:
        out.append(part if isinstance(part, str) else _scalar(part, _lookup(part, payload)))
    key = "".join(out)
    if len(key) > MAX_KEY_CHARS:
        raise KeyTemplateError(f"resolves to a key longer than {MAX_KEY_CHARS} characters")
    if "\x00" in key:  # PostgreSQL text cannot hold it
        raise KeyTemplateError("resolves to a key with a NUL character")
    return key


def _name(path: tuple[str, ...]) -> str:
    return "{" + ".".join(("payload", *path)) + "}"


def _lookup(path: tuple[str, ...], payload: Any) -> Any:
    value = payload
    for depth, segment in enumerate(path):
        if isinstance(value, Mapping) and segment in value:
            value = value[segment]
        elif isinstance(value, list) and segment.isdigit() and int(segment) < len(value):
            value = value[int(segment)]
        else:
            where = ".".join(("payload", *path[:depth])) or "payload"
            raise KeyTemplateError(f"placeholder {_name(path)}: {where} has no field {segment!r}")
    return value


def _scalar(path: tuple[str, ...], value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)):
        return json.dumps(value)
    kind = "null" if value is None else type(value).__name__
    raise KeyTemplateError(
        f"placeholder {_name(path)} is {kind}, not a string, a number or a boolean"
    )


def _number(raw: Any, name: str, lo: float, hi: float, *, integer: bool) -> float:
    ok_type = isinstance(raw, int) if integer else isinstance(raw, int | float)
    if isinstance(raw, bool) or not ok_type:
        raise KeyTemplateError(f"{name} must be {'an integer' if integer else 'a number'}")
    if not (math.isfinite(raw) and lo <= raw <= hi) or (not integer and raw <= 0):
        bound = f"in [{lo:g}, {hi:g}]" if integer else f"> 0 and <= {hi:g}"
        raise KeyTemplateError(f"{name} {raw!r} must be {bound}")
    return float(raw)


def _fields(raw: Any, allowed: tuple[str, ...]) -> list[Any]:
    """The values of exactly the fields ``allowed``, in that order."""
    if not isinstance(raw, Mapping):
        raise KeyTemplateError(f"must be an object with {', '.join(allowed)}")
    unknown = sorted(str(k) for k in raw if k not in allowed)
    if unknown:
        raise KeyTemplateError(f"has unknown field(s): {', '.join(unknown)}")
    missing = [k for k in allowed if k not in raw]
    if missing:
        raise KeyTemplateError(f"misses {', '.join(missing)}")
    return [raw.get(k) for k in allowed]


def check_concurrency(raw: Any, payload: Any) -> tuple[str, int]:
    """``{"key": template, "limit": N}`` → (template, N), checked against ``payload``.

    :class:`KeyTemplateError` messages start with the sub-field (``key ...``, ``limit ...``)
    or describe the object, so that the caller can prefix the field's name."""
    key, limit = _fields(raw, ("key", "limit"))
    template = _checked_template(key, payload)
    return template, int(_number(limit, "limit", 1, MAX_LIMIT, integer=True))


def check_rate_limit(raw: Any, payload: Any) -> tuple[str, float, int]:
    """``{"key": template, "per_s": R, "burst": B}`` → (template, R, B), checked."""
    key, per_s, burst = _fields(raw, ("key", "per_s", "burst"))
    template = _checked_template(key, payload)
    rate = _number(per_s, "per_s", 0, MAX_PER_S, integer=False)
    return template, rate, int(_number(burst, "burst", 1, MAX_BURST, integer=True))


def check_fairness(raw: Any, payload: Any) -> tuple[str, int]:
    """``{"key": template, "weight"?: 1..MAX_WEIGHT}`` → (template, weight; default 1)."""
    if isinstance(raw, Mapping) and "weight" not in raw:
        raw = {**raw, "weight": 1}
    key, weight = _fields(raw, ("key", "weight"))
    template = _checked_template(key, payload)
    return template, int(_number(weight, "weight", 1, MAX_WEIGHT, integer=True))


def _checked_template(raw: Any, payload: Any) -> str:
    try:
        resolve_key(parse_template(raw), payload)
    except KeyTemplateError as exc:
        raise KeyTemplateError(f"key {exc}") from None
    return str(raw)


def take_token(
    tokens: float, elapsed_s: float, per_s: float, burst: int
) -> tuple[bool, float, float]:
    """One start against a token bucket: (allowed, tokens left, seconds until a token).

    ``tokens`` is what the bucket held ``elapsed_s`` ago (a negative elapsed time, from a
    clock stepping back, counts as 0). The bucket refills at ``per_s`` up to ``burst``; a
    start takes one whole token. When refused, the bucket keeps its refill and the answer
    says how long until the next token, so the caller waits exactly that long.
    """
    available = min(float(burst), tokens + max(0.0, elapsed_s) * per_s)
    if available >= 1.0:
        return True, available - 1.0, 0.0
    return False, available, (1.0 - available) / per_s
