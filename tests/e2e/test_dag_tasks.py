"""Python tasks the DAG end-to-end tests give to real workers (no tests here)."""

from __future__ import annotations

from typing import Any

from duetime.core.errors import FailPermanently, RetryLater


def ok(ctx: Any) -> dict[str, Any]:
    return {"key": ctx.dag_key, "attempt": ctx.attempt}


def fail_once(ctx: Any) -> dict[str, Any]:
    if ctx.attempt == 1:
        raise RetryLater("the first attempt fails", delay_s=0.2)
    return ok(ctx)


def fail(ctx: Any) -> None:
    raise FailPermanently(f"{ctx.dag_key} never works")
