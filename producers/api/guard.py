"""The API's edge against browsers turned against it: DNS rebinding and cross-site requests.

A plain ASGI middleware, in front of every route:

- **Host** must be one the API answers for (``ApiSettings.hosts``): a page of a foreign site
  whose name was re-pointed at 127.0.0.1 (DNS rebinding) sends its own name, and is refused
  with 421 before any route runs. ``/healthz`` and ``/readyz`` are exempt: orchestrators probe
  them by address, and they tell nothing.
- **Origin** of a state-changing request (POST, PUT, PATCH, DELETE) or of a CORS preflight,
  when a browser sent one, must be the API's own (an allowed host) or one of
  ``DUETIME_API_ALLOWED_ORIGINS``: 403 otherwise. Browsers send Origin on every
  cross-origin write, so a form or ``fetch`` from another site is refused even where it
  would need no CORS preflight.
- **Content-Type** of a state-changing request that carries a body must be
  ``application/json`` (an optional ``charset=utf-8``): 415 otherwise, so a ``text/plain``
  or form body is never read as JSON.

Refusals have the API's error body and are written before the body is read.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from .settings import ApiSettings

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
HOST_EXEMPT = frozenset({"/healthz", "/readyz"})
_DEFAULT_PORTS = {"http": 80, "https": 443}


def json_media_type(value: str | None) -> bool:
    """``application/json``, optionally with ``charset=utf-8`` (JSON is UTF-8: RFC 8259)."""
    if value is None:
        return False
    media, _, params = value.partition(";")
    if media.strip().lower() != "application/json":
        return False
    for param in params.split(";"):
        if not param.strip():
            continue
        key, _, val = param.partition("=")
        if key.strip().lower() != "charset" or val.strip().strip('"').lower() not in (
            "utf-8",
            "utf8",
        ):
            return False
    return True


class HostRules:
    """Which Host values and Origins are accepted, precomputed from the settings."""

    def __init__(self, settings: ApiSettings) -> None:
        hosts = settings.hosts()
        self.any_host = "*" in hosts
        self.exact = frozenset(h for h in hosts if _has_port(h))
        self.any_port = frozenset(h for h in hosts if h != "*" and not _has_port(h))
        self.exact_names = frozenset(_name(h) for h in self.exact)
        self.origins = frozenset(settings.allowed_origins)
        self.listed = ", ".join(hosts)

    def host_ok(self, host: str) -> bool:
        host = host.strip().lower()
        if self.any_host:
            return True
        if not host:
            return False
        if not _has_port(host):
            # no port (a browser on port 80, an HTTP/1.0-minded tool): the name decides. A
            # rebound page sends its own name; a foreign port's page sends its port
            return host in self.any_port or host in self.exact_names
        return host in self.exact or _name(host) in self.any_port

    def origin_ok(self, origin: str) -> bool:
        origin = origin.strip().lower()
        if origin in self.origins:
            return True
        try:
            parts = urlsplit(origin)
            port = parts.port
        except ValueError:
            return False
        if parts.scheme not in _DEFAULT_PORTS or not parts.hostname or parts.path:
            return False  # "null" (sandboxed frames, file:) and anything odd
        name = parts.netloc.rpartition("@")[2]
        if port is None:
            name = f"{name}:{_DEFAULT_PORTS[parts.scheme]}"
        return self.host_ok(name)


def _has_port(host: str) -> bool:
    return host.rpartition(":")[2].isdigit() and (not host.startswith("[") or "]:" in host)


def _name(host: str) -> str:
    return host.rpartition(":")[0] if _has_port(host) else host


class Guard:
    def __init__(self, app: ASGIApp, settings: ApiSettings) -> None:
        self.app = app
        self.rules = HostRules(settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            status, code, message, details = refusal
            await _answer(send, status, code, message, details)
            return
        await self.app(scope, receive, send)

    def _refusal(
        self, scope: Scope, headers: dict[str, str]
    ) -> tuple[int, str, str, dict[str, Any]] | None:
        host = headers.get("host", "")
        if scope["path"] not in HOST_EXEMPT and not self.rules.host_ok(host):
            return (
                421,
                "misdirected_request",
                f"this API does not answer for host {host[:100]!r}; it answers for "
                f"{self.rules.listed} (DUETIME_API_ALLOWED_HOSTS)",
                {"header": "Host", "variable": "DUETIME_API_ALLOWED_HOSTS"},
            )
        origin = headers.get("origin")
        preflight = scope["method"] == "OPTIONS" and "access-control-request-method" in headers
        if scope["method"] not in STATE_CHANGING and not preflight:
            return None
        if origin is not None and not self.rules.origin_ok(origin):
            return (
                403,
                "forbidden_origin",
                f"requests from origin {origin[:100]!r} may not change anything here "
                "(DUETIME_API_ALLOWED_ORIGINS)",
                {"header": "Origin", "variable": "DUETIME_API_ALLOWED_ORIGINS"},
            )
        has_body = headers.get("content-length", "0").strip() not in ("0", "") or (
            "transfer-encoding" in headers
        )
        if has_body and not json_media_type(headers.get("content-type")):
            return unsupported_media_type(headers.get("content-type"))
        return None


def unsupported_media_type(given: str | None) -> tuple[int, str, str, dict[str, Any]]:
    what = "no Content-Type" if given is None else f"Content-Type {given[:100]!r}"
    return (
        415,
        "unsupported_media_type",
        f"request bodies must be application/json; got {what}",
        {"header": "Content-Type", "expected": "application/json"},
    )


def _headers(scope: Scope) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in scope["headers"]:
        name = key.decode("latin-1").lower()
        if name not in out:  # the first of repeated headers decides
            out[name] = value.decode("latin-1")
    return out


async def _answer(
    send: Send, status: int, code: str, message: str, details: dict[str, Any]
) -> None:
    body = json.dumps(
        {"error": {"code": code, "message": message, "details": details}}, ensure_ascii=True
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
