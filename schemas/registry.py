"""A client for the two calls of the Confluent schema-registry REST API the codec needs.

Role: register an event's current schema under a subject (``<topic>-value``) and fetch a
writer schema by id, caching both ways so that each is asked once per process.

Guarantees: a network failure or a 5xx is a :class:`~duetime.core.errors.RetryableError`;
another 4xx is a :class:`~duetime.core.errors.PermanentError` with the registry's answer;
an id the registry does not know raises :class:`UnknownSchemaId` (the codec turns it into a
``DecodeError`` naming the record's place).
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from duetime.core.errors import PermanentError, RetryableError


class UnknownSchemaId(Exception):
    """The registry answered 404 for a schema id."""


class RegistryClient:
    """Register and fetch schemas, with caches both ways (thread-safe enough: a race at worst
    repeats an idempotent call)."""

    _CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"

    def __init__(self, url: str, client: httpx.Client | None, timeout_s: float) -> None:
        self._url = url.rstrip("/")
        self._owns_client = client is None
        self._client = client if client is not None else httpx.Client(timeout=timeout_s)
        self._ids: dict[tuple[str, str], int] = {}
        self._schemas: dict[int, dict[str, Any]] = {}

    def close(self) -> None:
        """Release the HTTP connections (only when this client opened them)."""
        if self._owns_client:
            self._client.close()

    def register(self, subject: str, name: str, schema: dict[str, Any]) -> int:
        """The id of ``schema`` (full name ``name``, the cache key) under ``subject``,
        registering it once."""
        key = (subject, name)
        schema_id = self._ids.get(key)
        if schema_id is None:
            body = {"schema": json.dumps(schema, separators=(",", ":"))}
            answer = self._call("POST", f"/subjects/{subject}/versions", body)
            schema_id = _int_field(answer, "id", "POST")
            self._ids[key] = schema_id
            self._schemas[schema_id] = schema
        return schema_id

    def schema(self, schema_id: int) -> dict[str, Any]:
        """The schema registered as ``schema_id`` (JSON form). Raises UnknownSchemaId."""
        schema = self._schemas.get(schema_id)
        if schema is None:
            answer = self._call("GET", f"/schemas/ids/{schema_id}", None)
            text = answer.get("schema")
            try:
                parsed = json.loads(text) if isinstance(text, str) else None
            except ValueError:
                parsed = None
            if not isinstance(parsed, dict):
                raise PermanentError(f"schema registry GET schema id {schema_id}: not a schema")
            schema = parsed
            self._schemas[schema_id] = schema
        return schema

    def _call(self, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        try:
            response = self._client.request(
                method,
                self._url + path,
                json=body,
                headers={"Content-Type": self._CONTENT_TYPE, "Accept": self._CONTENT_TYPE},
            )
        except httpx.HTTPError as exc:
            raise RetryableError(f"schema registry {method} {path} failed: {exc}") from exc
        if response.status_code == 404 and method == "GET":
            raise UnknownSchemaId(path)
        if response.status_code >= 500:
            raise RetryableError(f"schema registry {method} {path}: HTTP {response.status_code}")
        if response.status_code >= 400:
            raise PermanentError(
                f"schema registry {method} {path}: HTTP {response.status_code} {response.text}"
            )
        try:
            answer = response.json()
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise PermanentError(f"schema registry {method} {path}: the answer is not an object")
        return answer


def _int_field(answer: dict[str, Any], key: str, method: str) -> int:
    value = answer.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise PermanentError(f"schema registry {method}: answer has no integer {key!r}")
    return value
