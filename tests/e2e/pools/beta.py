"""Pool beta's task: returns the pool's name, which the test reads back from the result."""

from __future__ import annotations

from typing import Any


def run(ctx: Any) -> dict[str, str]:
    return {"pool": "beta", "execution_id": str(ctx.execution_id)}
