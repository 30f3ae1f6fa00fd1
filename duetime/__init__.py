"""duetime: a distributed job scheduler on Apache Kafka and PostgreSQL.

``from duetime import JobClient`` gives the SDK that publishes job events to Kafka;
``@duetime.task("name")`` registers a Python target on a :class:`TaskRegistry`. Both are
imported lazily, so ``import duetime`` stays cheap and does nothing but define names.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "JobClient": ("duetime.producers.sdk", "JobClient"),
    "task": ("duetime.consumers.tasks", "task"),
    "TaskRegistry": ("duetime.consumers.tasks", "TaskRegistry"),
    "ExecutionContext": ("duetime.consumers.tasks", "ExecutionContext"),
    "RetryLater": ("duetime.core.errors", "RetryLater"),
    "FailPermanently": ("duetime.core.errors", "FailPermanently"),
}

__all__ = [
    "ExecutionContext",
    "FailPermanently",
    "JobClient",
    "RetryLater",
    "TaskRegistry",
    "__version__",
    "task",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'duetime' has no attribute {name!r}")
