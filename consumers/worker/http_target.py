"""HTTP targets: one shared aiohttp session, an egress policy on every connection, bounded and
redacted reports.

Why aiohttp (not httpx): measured against a local asyncio sink (``bench/http_clients.py``,
``bench/results/http-clients.json``), httpx's pool collapses under concurrency while aiohttp
keeps its throughput, and a worker runs up to ``DUETIME_WORKER_CONCURRENCY`` calls at once.

What a target receives is API.md's request (see ``targets.py``). What the worker guarantees:

- **Egress policy** (:class:`~.policy.EgressPolicy`), checked where the address is known: an
  IP-literal host before anything is sent (aiohttp does not pass literals through its
  resolver); every resolved address in :class:`GuardedResolver` (denied ones are dropped, so a
  name that resolves to a public and a private address connects to the public one only, and
  DNS rebinding cannot swap the address after the check: the connection goes to what was
  checked); and once more in the connector's socket factory, on every connect. A denied target
  is a permanent failure (reason ``egress_denied``) naming the redacted URL and the rule.
- **No redirects**: a 3xx is a failure like any non-2xx (following it could reach a denied
  host, or repeat a POST somewhere else).
- **Headers**: the job's headers are checked again (no framing or routing header, no line
  break); ``${secret:NAME}`` references are filled from the worker's secrets, never logged.
  No cookie jar: one job's target never sees another's cookies.
- **Reports, not bodies**: a failing answer is summarised as ``METHOD url answered 503 Service
  Unavailable (content-type text/html, 1234 bytes)``: its body, which may echo secrets, is
  never stored. URLs are redacted (``user:password@`` and query values masked).
- One ``ClientSession``/``TCPConnector`` per worker (``limit`` = the worker's concurrency,
  keep-alive), a per-request timeout of the job's ``timeout_s``; a cancelled call aborts its
  connection (the ``async with`` closes an unfinished response).
"""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import json
import logging
import re
import socket
from collections.abc import Mapping
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from multidict import CIMultiDict
from yarl import URL

from duetime.core.clock import SYSTEM_CLOCK, Clock
from duetime.core.records import ExecutionRequest
from duetime.core.redact import redact_url

from .policy import EgressPolicy, MissingSecret, header_refusal, parse_ip, substitute_secrets
from .results import Outcome, failure, success

log = logging.getLogger("duetime.worker.http")

METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"})
_NO_BODY = frozenset({"GET", "HEAD"})
_DRAIN_BYTES = 64 * 1024
"""Read at most this much of an answer (so its connection can be reused); a longer body is
dropped with its connection."""
_PRINTABLE_RE = re.compile(r"[^\x20-\x7e]")
MAX_RETRY_AFTER_S = 7 * 24 * 3600.0
_REMEMBERED_HOSTS = 1024
"""IP-literal hosts whose egress answer a caller keeps (forgotten all at once beyond it)."""


class EgressDenied(OSError):
    """A connection the egress policy refuses (an OSError: aiohttp wraps resolver and socket
    errors of that kind in its connector errors, keeping this one as their cause)."""

    def __init__(self, host: str, rule: str) -> None:
        super().__init__(f"{host}: {rule}")
        self.host = host
        self.rule = rule


class GuardedResolver(AbstractResolver):
    """aiohttp's resolver, with every address the policy denies dropped from its answers."""

    def __init__(self, policy: EgressPolicy, inner: AbstractResolver | None = None) -> None:
        self.policy = policy
        self._inner = inner if inner is not None else DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        answers = await self._inner.resolve(host, port, family)
        allowed: list[ResolveResult] = []
        refusal = "no address"
        for answer in answers:
            ip = parse_ip(str(answer["host"]))
            why = "not an IP address" if ip is None else self.policy.refusal(ip)
            if why is None:
                allowed.append(answer)
            else:
                refusal = f"resolves to {ip}, {why}"
        if not allowed:
            raise EgressDenied(host, refusal)
        return allowed

    async def close(self) -> None:
        await self._inner.close()


def guarded_socket_factory(policy: EgressPolicy) -> Any:
    """The connector's socket factory: refuses to open a socket to a denied address (the last
    check, on every connect, whatever path the address took)."""

    def factory(addr_info: tuple[Any, ...]) -> socket.socket:
        family, type_, proto, _, address = addr_info
        ip = parse_ip(str(address[0]))
        why = "not an IP address" if ip is None else policy.refusal(ip)
        if why is not None:
            raise EgressDenied(str(address[0]), why)
        return socket.socket(family=family, type=type_, proto=proto)

    return factory


def new_session(policy: EgressPolicy, concurrency: int) -> aiohttp.ClientSession:
    """The worker's one HTTP session (call on its event loop)."""
    connector = aiohttp.TCPConnector(
        limit=concurrency,  # one connection per slot at most: the slots bound the calls
        resolver=GuardedResolver(policy),
        socket_factory=guarded_socket_factory(policy),
        keepalive_timeout=30.0,
    )
    return aiohttp.ClientSession(
        connector=connector,
        cookie_jar=aiohttp.DummyCookieJar(),  # jobs must not share cookies
        trust_env=False,  # no proxy from the environment: the policy judges the real peer
        auto_decompress=False,  # we never read bodies: no decompression bombs either
        raise_for_status=False,
    )


class HttpCaller:
    """Runs HTTP targets through one session, under one egress policy and the worker's secrets."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        policy: EgressPolicy,
        secrets: Mapping[str, str],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.session = session
        self.policy = policy
        self._secrets = secrets
        self.clock = clock  # an HTTP-date Retry-After counts from now
        self._literal_rules: dict[str, str | None] = {}
        """The policy's answer per IP-literal host (it depends on the host and the fixed
        policy only; the policy's network checks cost ~10 % of a call to a local sink)."""
        self._successes: dict[int, Outcome] = {}
        """The outcome of each 2xx status (immutable: one per status, not one per call)."""

    async def call(
        self,
        *,
        url: str,
        method: str,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout_s: float,
    ) -> Outcome:
        shown = redact_url(url)
        refused = self._refusal(url, shown, method, headers)
        if refused is not None:
            return refused
        try:
            sent = CIMultiDict(substitute_secrets(headers, self._secrets))
        except MissingSecret as exc:
            return failure("MissingSecret", str(exc), retryable=False)
        try:
            async with self.session.request(
                method,
                url,
                data=body,
                headers=sent,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as response:
                size = await _drain(response)
                status = response.status
                if 200 <= status < 300:
                    outcome = self._successes.get(status)
                    if outcome is None:
                        outcome = self._successes[status] = success({"http_status": status})
                    return outcome
                return failure(
                    "HttpStatus",
                    f"{method} {shown} answered {summary(response, size)}",
                    retryable=True,
                    reason="http_status",
                    http_status=status,
                    retry_after_s=retry_after_s(
                        response.headers.get("Retry-After"), self.clock.now_ms()
                    ),
                )
        except TimeoutError:
            return failure(
                "Timeout",
                f"{method} {shown}: no answer within {timeout_s:g} s",
                retryable=True,
                reason="timeout",
            )
        except aiohttp.InvalidURL as exc:  # e.g. a non-canonical IPv4 ("127.1"): never valid
            return failure(
                "InvalidTarget",
                f"{shown} is not a valid URL: {_client_error_text(exc)}",
                retryable=False,
            )
        except aiohttp.ClientError as exc:
            denied = _egress_cause(exc)
            if denied is not None:
                return egress_failure(shown, denied.rule)
            return failure(
                type(exc).__name__,
                f"{method} {shown} failed: {self._scrub(_client_error_text(exc))}",
                retryable=True,
            )
        except ValueError as exc:  # aiohttp refusing the request as built (e.g. credentials
            # both in the URL and in an Authorization header): it will not change on retry
            return failure(
                "InvalidTarget",
                f"{method} {shown} cannot be sent: {self._scrub(_clean(str(exc), 300))}",
                retryable=False,
            )

    def _scrub(self, text: str) -> str:
        """``text`` without any of the worker's secret values (an error message about a
        header could quote it)."""
        for value in self._secrets.values():
            if len(value) >= 4:
                text = text.replace(value, "***")
        return text

    def _refusal(
        self, url: str, shown: str, method: str, headers: Mapping[str, str]
    ) -> Outcome | None:
        """A target this worker will not call as written (permanent failures)."""
        if method not in METHODS:
            return failure(
                "InvalidTarget",
                f"method {method[:20]!r} is not one of {', '.join(sorted(METHODS))}",
                retryable=False,
            )
        try:
            parsed = URL(url)
        except (ValueError, TypeError) as exc:
            return failure("InvalidTarget", f"{shown} is not a URL ({exc})", retryable=False)
        if parsed.scheme not in ("http", "https") or not parsed.host:
            return failure(
                "InvalidTarget",
                f"{shown} is not an http:// or https:// URL with a host",
                retryable=False,
            )
        rule = self._literal_rule(parsed.host)
        if rule is not None:
            return egress_failure(shown, rule)
        for name, value in headers.items():
            why = header_refusal(name, value)
            if why is not None:
                return failure("InvalidTarget", why, retryable=False)
        return None

    def _literal_rule(self, host: str) -> str | None:
        """The rule denying an IP-literal ``host`` (aiohttp connects to literals without
        asking the resolver); None: allowed, or not a literal (the resolver judges names)."""
        try:
            return self._literal_rules[host]
        except KeyError:
            pass
        ip = parse_ip(host)
        rule = None if ip is None else self.policy.refusal(ip)
        if len(self._literal_rules) >= _REMEMBERED_HOSTS:  # hostile hosts stay bounded
            self._literal_rules.clear()
        self._literal_rules[host] = rule
        return rule


def egress_failure(shown_url: str, rule: str) -> Outcome:
    return failure(
        "EgressDenied",
        f"egress to {shown_url} denied: {rule}",
        retryable=False,
        reason="egress_denied",
    )


def _egress_cause(exc: BaseException) -> EgressDenied | None:
    """The :class:`EgressDenied` behind an aiohttp error, if any (its chain, or ``os_error``)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, EgressDenied):
            return current
        todo += [current.__cause__, current.__context__, getattr(current, "os_error", None)]
        todo += [e for e in getattr(current, "exceptions", ()) if isinstance(e, BaseException)]
    return None


def _client_error_text(exc: aiohttp.ClientError) -> str:
    # aiohttp's messages name host and port, never the userinfo or the query; bounded anyway
    return _clean(str(exc) or type(exc).__name__, 300)


async def _drain(response: aiohttp.ClientResponse) -> int | None:
    """Read (and drop) a small answer so its connection can be reused; return its size in
    bytes, or None when it is larger than we read (then the connection is closed)."""
    length = response.content_length
    if length is not None and length > _DRAIN_BYTES:
        return length  # not read: leaving the block closes the connection
    read = 0
    while read <= _DRAIN_BYTES:
        chunk = await response.content.read(_DRAIN_BYTES + 1 - read)
        if not chunk:
            return read
        read += len(chunk)
    return length


def summary(response: aiohttp.ClientResponse, size: int | None) -> str:
    """``503 Service Unavailable (content-type text/html, 1234 bytes)``: no body, bounded."""
    reason = _clean(response.reason or "", 60)
    content_type = _clean(response.headers.get("Content-Type", "none"), 80)
    length = f"{size} bytes" if size is not None else f"over {_DRAIN_BYTES} bytes"
    return f"{response.status} {reason}".rstrip() + f" (content-type {content_type}, {length})"


def _clean(text: str, limit: int) -> str:
    return _PRINTABLE_RE.sub("?", text)[:limit]


def retry_after_s(value: str | None, now_ms: int) -> float | None:
    """A ``Retry-After`` answer as seconds from ``now_ms``: delay-seconds (``120``; a decimal
    is tolerated) or an HTTP date (``Wed, 21 Oct 2026 07:28:00 GMT``; a past date is 0).
    Capped at ``MAX_RETRY_AFTER_S`` (the scheduler caps it again at the job's
    ``retry.max_delay_s``); None when absent or not one of those forms (the backoff then
    applies). Pure: the target's header is hostile input, so anything odd is None, never an
    error."""
    if value is None:
        return None
    text = value.strip()
    if not text or len(text) > 64:
        return None
    seconds = (
        float(text) if _DELAY_SECONDS_RE.match(text) else _seconds_until_http_date(text, now_ms)
    )
    if seconds is None:
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


_DELAY_SECONDS_RE = re.compile(r"^[0-9]{1,12}(\.[0-9]{1,6})?$")


def _seconds_until_http_date(text: str, now_ms: int) -> float | None:
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; "-0000" parses naive
        when = when.replace(tzinfo=datetime.UTC)
    try:
        return when.timestamp() - now_ms / 1000.0
    except (OverflowError, ValueError, OSError):
        return None


def request_body(request: ExecutionRequest, payload: Any, scheduled_at: str) -> bytes:
    return json.dumps(
        {
            "job_id": request.job_id,
            "execution_id": request.execution_id,
            "attempt": request.attempt,
            "scheduled_at": scheduled_at,
            "payload": payload,
        }
    ).encode()


async def close_session(session: aiohttp.ClientSession) -> None:
    await session.close()
    await asyncio.sleep(0)  # let the connector's transports close
