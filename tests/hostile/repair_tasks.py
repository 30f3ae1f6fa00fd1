"""A Python task for the DAG repair end-to-end test (tests/hostile/test_runtime_inputs.py):
it fails for good until a flag file exists, as a downstream service that is down until an
operator fixes it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from duetime.core.errors import FailPermanently


def fail_until_flag(ctx: Any) -> dict[str, Any]:
    flag = Path(str(ctx.payload["flag"]))
    if not flag.exists():
        raise FailPermanently(f"{ctx.dag_key}: not fixed yet ({flag.name} missing)")
    return {"key": ctx.dag_key, "fixed": True}


def ok(ctx: Any) -> dict[str, Any]:
    return {"key": ctx.dag_key}
