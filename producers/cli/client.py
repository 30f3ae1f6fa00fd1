"""The CLI's HTTP side: one httpx client, API errors turned into readable messages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from duetime.core.config import Env
from duetime.core.errors import DuetimeError
from duetime.core.redact import escape_control


class ApiCallError(DuetimeError):
    """The API answered with an error, or could not be reached."""

    code = "api"

    def __init__(self, message: str, *, status: int | None = None, body: Any = None) -> None:
        super().__init__(message, details={"status": status})
        self.status = status
        self.body = body


@dataclass(frozen=True)
class CliSettings:
    api_url: str = "http://127.0.0.1:8080"
    token: str | None = None
    timeout_s: float = 30.0

    @classmethod
    def from_env(cls, env: Env) -> CliSettings:
        return cls(
            api_url=env.text("DUETIME_API_URL", cls.api_url).rstrip("/"),
            token=env.opt_str("DUETIME_API_TOKEN"),
            timeout_s=env.number("DUETIME_API_TIMEOUT_S", cls.timeout_s, 0.1, 3600),
        )


class Api:
    def __init__(self, settings: CliSettings) -> None:
        self.settings = settings
        headers = {"User-Agent": "duetime-cli"}
        if settings.token:
            headers["Authorization"] = f"Bearer {settings.token}"
        self.http = httpx.Client(
            base_url=settings.api_url, headers=headers, timeout=settings.timeout_s
        )

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            r = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ApiCallError(
                f"cannot reach the API at {self.settings.api_url} ({exc}); "
                "is `duetime api` running? (DUETIME_API_URL sets where)"
            ) from None
        try:
            body = r.json()
        except ValueError:
            body = None
        if r.status_code >= 400:
            error = (body or {}).get("error") if isinstance(body, dict) else None
            if isinstance(error, dict):
                detail = error.get("details") or {}
                where = f" (field {detail['field']})" if detail.get("field") else ""
                message = f"{error.get('code')}: {error.get('message')}{where}"
            else:
                message = f"HTTP {r.status_code}: {r.text[:200]}"
            message = escape_control(message)  # printed on a terminal: no escapes get through
            raise ApiCallError(message, status=r.status_code, body=body)
        return body

    def get(self, path: str, **params: Any) -> Any:
        return self.call("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: Any = None) -> Any:
        return self.call("POST", path, json=body)

    def pages(self, path: str, limit: int | None, **params: Any) -> list[dict[str, Any]]:
        """Follow next_cursor until ``limit`` items (None: all)."""
        items: list[dict[str, Any]] = []
        cursor = None
        while True:
            page_size = 500 if limit is None else min(500, limit - len(items))
            page = self.get(path, limit=page_size, cursor=cursor, **params)
            items += page["items"]
            cursor = page.get("next_cursor")
            if not cursor or (limit is not None and len(items) >= limit):
                return items

    def close(self) -> None:
        self.http.close()
