"""Python targets for the oversized-results scenario (imported by workers by reference)."""

from __future__ import annotations

from typing import Any

BIG_BYTES = 2 * 1024 * 1024


def ok(ctx: Any) -> dict[str, Any]:
    return {"ok": True}


def big_output(ctx: Any) -> dict[str, Any]:
    return {"blob": "x" * BIG_BYTES}


def big_error(ctx: Any) -> None:
    raise RuntimeError("y" * BIG_BYTES)
