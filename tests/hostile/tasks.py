"""Python tasks for the hostile suite: they look like ordinary registered tasks in an allowed
module (``tests``), but end in ways a careless worker would not survive.

A worker must turn each into a failed attempt and stay up: ``SystemExit`` and
``KeyboardInterrupt`` are ``BaseException``, not ``Exception``, so a plain ``except
Exception`` around the call lets them end the worker's thread or its event loop.
"""

from __future__ import annotations

from typing import Any


def raise_system_exit(ctx: Any) -> None:
    raise SystemExit(3)


def raise_keyboard_interrupt(ctx: Any) -> None:
    raise KeyboardInterrupt


async def async_system_exit(ctx: Any) -> None:
    raise SystemExit(4)


async def async_keyboard_interrupt(ctx: Any) -> None:
    raise KeyboardInterrupt


def ok(ctx: Any) -> dict[str, bool]:
    return {"ok": True}
