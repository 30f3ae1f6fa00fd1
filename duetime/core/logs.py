"""Structured logs: one JSON object per line (``DUETIME_LOG_FORMAT=json``) or readable lines.

Fixed field names, so a log pipeline can index them: ``job_id``, ``execution_id``, ``attempt``,
``topic``, ``partition``, ``offset`` (pass them with ``extra={...}``), plus ``ts``, ``level``,
``logger``, ``msg`` and, for errors, ``exc``.

Log lines carry user data (job names, URLs, error messages), so every message goes through
:func:`~duetime.core.redact.redact_text` (URL credentials and query values, bearer tokens)
and, in text form, newlines and control characters are escaped and a traceback's lines are
indented: no user value can start a line of its own and pass for a log record.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from .redact import escape_control, redact_text

FIELDS = (
    "role",
    "job_id",
    "execution_id",
    "attempt",
    "topic",
    "partition",
    "offset",
    "dag_id",
    "dag_run_id",
    "worker_id",
    "lateness_ms",
    "count",
    "error",
)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact_text(record.getMessage()),
        }
        for name in FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                out[name] = redact_text(value) if isinstance(value, str) else value
        if record.exc_info:
            out["exc"] = redact_text(self.formatException(record.exc_info))
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-5s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape_control(redact_text(record.message))
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        text = redact_text(super().formatException(ei))
        return "\n".join("  " + escape_control(line) for line in text.splitlines())

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = " ".join(
            f"{name}={escape_control(redact_text(str(record.__dict__[name])))}"
            for name in FIELDS
            if record.__dict__.get(name) is not None
        )
        if fields:
            first, nl, rest = line.partition("\n")
            line = f"{first} [{fields}]{nl}{rest}"
        return line


def setup_logging(fmt: str = "text", level: str = "INFO", role: str | None = None) -> None:
    """Configure the root logger once, for a role's process."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    if role is not None:
        handler.addFilter(_RoleFilter(role))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())  # "debug" and "DEBUG" alike
    for noisy in ("kafka", "aiokafka", "faust", "mode", "httpx", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    # except what says where a consumer group stands (joins, assignments, the tables'
    # recovery): a few lines a rebalance, and what an operator reads when a resolver's
    # partitions seem to go nowhere
    for rebalances in ("aiokafka.consumer.group_coordinator", "faust.tables.recovery"):
        logging.getLogger(rebalances).setLevel(root.level)


class _RoleFilter(logging.Filter):
    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "role"):
            record.role = self.role
        return True
