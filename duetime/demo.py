"""Python targets used by ``duetime dev``'s demo workload (run by the dev stack's workers)."""

from __future__ import annotations

import logging
from typing import Any

from duetime.core.errors import FailPermanently

log = logging.getLogger("duetime.demo")


def hello(ctx: Any) -> dict[str, Any]:
    """A no-op that says which execution it is."""
    log.info("hello from %s attempt %s", ctx.execution_id, ctx.attempt)
    return {"hello": ctx.job_id}


def always_fails(ctx: Any) -> None:
    """Fails every attempt with a retryable error, so its job ends in the dead-letter queue."""
    raise RuntimeError(f"demo failure {ctx.attempt} of {ctx.execution_id}")


def refuse(ctx: Any) -> None:
    """Fails for good at once (no retries): a typed exception steers the outcome."""
    raise FailPermanently("the demo refuses this one")
