"""Python tasks whose outcome the dashboard's end-to-end test reads back (issue 14.5): one
raises through nested calls with markup and a credential in its message, one returns a value
with markup in it. No tests here."""

from __future__ import annotations

from typing import Any

SECRET = "ui-secret-7c1e0b"


def _innermost(url: str) -> None:
    raise ValueError(f"<img src=x onerror=alert(3)> cannot reach {url}")


def raises(ctx: Any) -> None:
    _innermost(f"https://svc:{SECRET}@api.example.com/report")


def returns(ctx: Any) -> dict[str, Any]:
    return {"html": "<b>bold</b>", "attempt": ctx.attempt}
