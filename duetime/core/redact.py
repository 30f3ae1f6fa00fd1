"""Secrets never reach logs, errors, dead letters, API reads or the dashboard.

Pure functions, used at every edge that shows something a user wrote or a target answered:

- :func:`redact_url`: a URL's ``user:password@`` and every query value become ``***``;
- :func:`is_secret_header` / :func:`redact_headers`: header values whose names look secret
  (``authorization``, ``cookie``, anything with ``token``, ``key``, ``secret``, ``password``,
  ``auth`` or ``session`` in it) are masked;
- :func:`redact_text`: every URL inside free text (an exception message, a log line) is
  redacted, and ``Bearer``/``Basic`` credentials are masked;
- :func:`escape_control`: newlines and other control characters in user data are escaped,
  so one log line stays one line.

A header value that references a worker-side secret (``${secret:NAME}``, see
:data:`SECRET_REF_RE`) is shown as it is: the reference is not the secret.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

MASK = "***"

_SECRET_NAME_RE = re.compile(
    r"authorization|cookie|token|key|secret|password|passwd|auth|session|credential|signature",
    re.IGNORECASE,
)
SECRET_REF_RE = re.compile(r"\$\{secret:([A-Za-z_][A-Za-z0-9_]{0,63})\}")
"""``${secret:NAME}`` in an HTTP target's header value: the worker substitutes the value of
its environment variable ``DUETIME_SECRET_<NAME>``; the job itself never holds the secret."""
_URL_RE = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]{1,15}://[^\s'\"<>]+")
_CREDENTIAL_RE = re.compile(r"\b(Bearer|Basic|Token)\s+[^\s'\",;]{4,}", re.IGNORECASE)
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\n]")


def is_secret_header(name: str) -> bool:
    """Whether a header's value must never be shown (by its name alone)."""
    return bool(_SECRET_NAME_RE.search(name))


def mask_value(value: str) -> str:
    """A secret header's value as it may be shown: a reference (alone, or after an auth
    scheme such as ``Bearer``) stays, since it names the secret without holding it; anything
    else is masked."""
    if SECRET_REF_RE.search(value):
        rest = SECRET_REF_RE.sub("", value).strip().lower()
        if rest in ("", "bearer", "basic", "token"):
            return value
    return MASK


def redact_headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """The headers with every secret-looking value masked."""
    return {
        name: mask_value(value) if is_secret_header(name) else value
        for name, value in (headers or {}).items()
    }


def redact_url(url: str) -> str:
    """``https://user:pw@host/p?api_key=x&a=1`` → ``https://***@host/p?api_key=***&a=***``."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
    except ValueError:
        return _redact_url_fallback(url)
    if "@" in netloc:
        netloc = MASK + "@" + netloc.rpartition("@")[2]
    query = parts.query
    if query:
        query = "&".join(
            (item.partition("=")[0] + "=" + MASK) if "=" in item else MASK
            for item in query.split("&")
        )
    fragment = MASK if parts.fragment else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, fragment))


def _redact_url_fallback(url: str) -> str:
    head, _, _ = url.partition("?")
    scheme, sep, rest = head.partition("://")
    if "@" in rest.split("/", 1)[0]:
        rest = MASK + "@" + rest.partition("@")[2]
    return f"{scheme}{sep}{rest}" + ("?" + MASK if "?" in url else "")


def redact_text(text: str) -> str:
    """Free text with every URL redacted and bearer/basic credentials masked."""
    text = _URL_RE.sub(lambda m: redact_url(m.group(0)), text)
    return _CREDENTIAL_RE.sub(lambda m: f"{m.group(1)} {MASK}", text)


def escape_control(text: str) -> str:
    """``\\n`` and other control characters escaped: a log line stays one line."""
    return _CONTROL_RE.sub(lambda m: repr(m.group(0))[1:-1], text)
