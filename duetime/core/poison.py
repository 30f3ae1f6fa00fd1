"""What every role writes when it parks a record it cannot use on the poison topic.

A parked record keeps its original key, value and headers, and gains headers naming where it
came from and why it was refused, so an operator can inspect it, fix the cause and re-publish
the bytes. Readers of the poison topic (and tests) rely on these names.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .redact import redact_text

SOURCE_TOPIC = "duetime-source-topic"
SOURCE_PARTITION = "duetime-source-partition"
SOURCE_OFFSET = "duetime-source-offset"
ERROR = "duetime-error"
ROLE = "duetime-role"

MAX_ERROR_BYTES = 1000
VALUE_DROPPED = "duetime-value-dropped"

TOPIC_MAX_BYTES = 2 * 1024 * 1024
"""The poison topic's ``max.message.bytes``: twice the broker's default, so a copy of any record
an input topic accepted (at most ~1 MiB unless an operator raised it) fits with its headers."""
PRODUCER_MAX_BYTES = TOPIC_MAX_BYTES + 64 * 1024
"""``message.max.bytes`` of the producers that park records (librdkafka refuses larger ones
before sending; its default, 1,000,000, is below what an input topic accepts)."""
MAX_VALUE_BYTES = TOPIC_MAX_BYTES - 64 * 1024
"""A value larger than this cannot be copied (an input topic configured above the default):
the copy goes without it, its size in a header, rather than blocking the partition forever."""


def poison_value(value: bytes | None) -> tuple[bytes | None, list[tuple[str, bytes]]]:
    """The value to park and the extra headers it needs."""
    if value is None or len(value) <= MAX_VALUE_BYTES:
        return value, []
    return None, [(VALUE_DROPPED, f"{len(value)} bytes, over {MAX_VALUE_BYTES}".encode())]


def poison_headers(
    original: Mapping[str, Any] | Iterable[tuple[str, Any]] | None,
    *,
    topic: str,
    partition: int,
    offset: int,
    error: str,
    role: str,
) -> list[tuple[str, bytes]]:
    """The record's own headers followed by the context of its refusal."""
    items = original.items() if isinstance(original, Mapping) else (original or [])
    headers: list[tuple[str, bytes]] = [
        (str(k), bytes(v) if isinstance(v, bytes | bytearray) else str(v or "").encode())
        for k, v in items
    ]
    headers += [
        (SOURCE_TOPIC, topic.encode()),
        (SOURCE_PARTITION, str(partition).encode()),
        (SOURCE_OFFSET, str(offset).encode()),
        (ERROR, error.encode()[:MAX_ERROR_BYTES]),
        (ROLE, role.encode()),
    ]
    return headers


@dataclass(frozen=True, slots=True)
class Parked:
    """A record ready for the poison topic: send it with the role's own producer, to the same
    partition number it came from (the poison topic has as many partitions as the inputs)."""

    key: bytes | str | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    partition: int
    reason: str


def park_record(
    *,
    topic: str,
    partition: int,
    offset: int,
    key: bytes | str | None,
    value: bytes | None,
    headers: Mapping[str, Any] | Iterable[tuple[str, Any]] | None,
    error: str,
    role: str,
    logger: logging.Logger,
) -> Parked:
    """The one recipe of every role for a record it cannot use: redact and log the reason
    (one structured warning naming where the record came from), copy the value (or say in a
    header why it could not be copied) and the headers, and add the refusal's context.

    The caller sends :class:`Parked` with its producer (a transaction, an async send, ...) and
    counts it in its own metric."""
    reason = redact_text(error)
    logger.warning(
        "bad record sent to the poison topic: %s",
        reason,
        extra={"topic": topic, "partition": partition, "offset": offset},
    )
    copy, dropped = poison_value(value)
    return Parked(
        key=key,
        value=copy,
        headers=[
            *dropped,
            *poison_headers(
                headers, topic=topic, partition=partition, offset=offset, error=reason, role=role
            ),
        ],
        partition=partition,
        reason=reason,
    )
