"""Avro encoding and decoding of every duetime event: the one place bytes meet records.

Role: turn event records (plain dicts shaped by ``schemas/*.avsc``) into Kafka values and back.

Guarantees:

- Every schema is read and parsed once, when a :class:`Codec` is built; importing this module
  reads nothing. The hot path is one ``schemaless_writer`` / ``schemaless_reader`` call.
- Each value says which schema wrote it. Without a registry the frame is
  ``0xD7 | version (2 bytes, big-endian) | Avro binary``; the version is the event's version
  in ``schemas/history/<Name>.v<N>.avsc`` (self-contained schemas, never edited once
  published). With a schema registry it is the Confluent wire format
  ``0x00 | schema id (4 bytes, big-endian) | Avro binary``. Decoding resolves the writer's
  schema to the current (reader) schema, so records written by any published version decode.
- The current ``.avsc`` files must equal the highest published version of each event: a
  :class:`Codec` refuses to start otherwise, so nobody ships an unrecorded schema change.
- Bytes that do not decode raise :class:`~duetime.core.errors.DecodeError` naming the topic,
  partition, offset and what was wrong; records that do not encode raise
  :class:`~duetime.core.errors.ValidationError` naming the event type and the field.
  No pickle, no ``eval``: only Avro.

``python -m duetime.schemas.codec check`` reports unrecorded or incompatible schema changes;
``python -m duetime.schemas.codec freeze`` records a compatible change as a new version
(see ``schemas/README.md``).
"""

from __future__ import annotations

import io
import itertools
import json
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

import fastavro
import httpx
from fastavro.validation import validate

from duetime.core.errors import (
    DecodeError,
    PermanentError,
    RetryableError,
    ValidationError,
)
from duetime.core.records import AvroRecord

R = TypeVar("R", bound=AvroRecord)

MAGIC = 0xD7
"""First byte of a value framed without a registry (then a 2-byte schema version)."""
CONFLUENT_MAGIC = 0x00
"""First byte of a value in the Confluent wire format (then a 4-byte schema id)."""
NAMESPACE = "duetime"
SCHEMA_DIR = Path(__file__).resolve().parent
HISTORY_DIRNAME = "history"

EVENT_TYPES: Mapping[str, str] = MappingProxyType(
    {
        "job": "duetime.JobDefinition",
        "control": "duetime.ControlCommand",
        "execution": "duetime.ExecutionRequest",
        "result": "duetime.ExecutionResult",
        "state": "duetime.SchedulerState",
        "dead_letter": "duetime.DeadLetter",
        "dag": "duetime.DagDefinition",
        "dag_run": "duetime.DagRunEvent",
    }
)
"""Short event type → full Avro name of its value schema."""

TOPIC_EVENT_TYPES: Mapping[str, str] = MappingProxyType(
    {
        "jobs": "job",
        "control": "control",
        "exec.critical": "execution",
        "exec.high": "execution",
        "exec.normal": "execution",
        "exec.low": "execution",
        "results": "result",
        "state": "state",
        "dlq": "dead_letter",
        "dags": "dag",
        "dag_runs": "dag_run",
    }
)
"""Topic suffix (the name after the configurable prefix) → event type of its values."""

_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_NAMED = frozenset({"record", "error", "enum", "fixed"})
# Avro's promotions: a writer type on the left may be read as any reader type on the right.
_PROMOTIONS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "int": frozenset({"long", "float", "double"}),
        "long": frozenset({"float", "double"}),
        "float": frozenset({"double"}),
        "string": frozenset({"bytes"}),
        "bytes": frozenset({"string"}),
    }
)
_HISTORY_FILE = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)\.v(?P<version>[1-9][0-9]*)\.avsc$")
_MAX_VERSION = 0xFFFF

Schema = Any  # an Avro schema in its JSON form: a name, a list (union) or a dict


def topic_event_type(topic_suffix: str) -> str:
    """The event type carried by a topic, from its suffix (``"exec.high"`` → ``"execution"``)."""
    try:
        return TOPIC_EVENT_TYPES[topic_suffix]
    except KeyError:
        known = ", ".join(sorted(TOPIC_EVENT_TYPES))
        raise ValueError(f"unknown topic suffix {topic_suffix!r}; known: {known}") from None


# --------------------------------------------------------------------------- schema files


def _fullname(schema: Mapping[str, Any], namespace: str | None) -> str:
    name = str(schema["name"])
    if "." in name:
        return name
    ns = schema.get("namespace", namespace)
    return f"{ns}.{name}" if ns else name


def load_named_types(schema_dir: Path = SCHEMA_DIR) -> dict[str, dict[str, Any]]:
    """Every named type of ``schema_dir/*.avsc``, by full name (one type per file)."""
    types: dict[str, dict[str, Any]] = {}
    for path in sorted(schema_dir.glob("*.avsc")):
        schema = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(schema, dict) or schema.get("type") not in _NAMED:
            raise ValueError(f"{path}: a schema file must hold one named type")
        fullname = _fullname(schema, None)
        if fullname.rsplit(".", 1)[-1] != path.stem:
            raise ValueError(f"{path}: file name must be the type's name ({fullname})")
        types[fullname] = schema
    return types


def bundle_schema(fullname: str, named_types: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """A self-contained copy of ``fullname``: each referenced named type is defined inline at
    its first use (dependency order) and referenced by full name afterwards. This is the form
    published in ``history/`` and registered with a schema registry."""
    defined: set[str] = set()

    def walk(schema: Schema, namespace: str | None, path: str) -> Schema:
        if isinstance(schema, str):
            if schema in _PRIMITIVES:
                return schema
            ref = schema if "." in schema or not namespace else f"{namespace}.{schema}"
            if ref in defined:
                return ref
            if ref not in named_types:
                raise ValueError(f"{path}: unknown type {schema!r}")
            return walk(named_types[ref], namespace, path)
        if isinstance(schema, list):
            return [walk(branch, namespace, path) for branch in schema]
        kind = schema["type"]
        if kind in _NAMED:
            name = _fullname(schema, namespace)
            defined.add(name)
            out = dict(schema)
            if kind in ("record", "error"):
                inner_ns = name.rpartition(".")[0] or None
                out["fields"] = [
                    {**f, "type": walk(f["type"], inner_ns, f"{path}.{f['name']}")}
                    for f in schema["fields"]
                ]
            return out
        if kind == "array":
            return {**schema, "items": walk(schema["items"], namespace, f"{path}[]")}
        if kind == "map":
            return {**schema, "values": walk(schema["values"], namespace, f"{path}{{}}")}
        if isinstance(kind, str) and kind in _PRIMITIVES:
            return dict(schema)
        return walk(kind, namespace, path)

    if fullname not in named_types:
        raise ValueError(f"unknown schema {fullname!r}")
    result: dict[str, Any] = walk(named_types[fullname], None, fullname.rpartition(".")[2])
    return result


def load_history(schema_dir: Path = SCHEMA_DIR) -> dict[str, dict[int, dict[str, Any]]]:
    """Every published version: ``{full name: {version: self-contained schema}}``."""
    history: dict[str, dict[int, dict[str, Any]]] = {}
    folder = schema_dir / HISTORY_DIRNAME
    for path in sorted(folder.glob("*.avsc")) if folder.is_dir() else []:
        match = _HISTORY_FILE.match(path.name)
        if match is None:
            raise ValueError(f"{path}: history files are named <Name>.v<N>.avsc")
        version = int(match["version"])
        if version > _MAX_VERSION:
            raise ValueError(f"{path}: version above {_MAX_VERSION} does not fit the frame")
        schema = json.loads(path.read_text(encoding="utf-8"))
        fullname = _fullname(schema, None)
        if fullname.rsplit(".", 1)[-1] != match["name"]:
            raise ValueError(f"{path}: holds {fullname}, not {match['name']}")
        history.setdefault(fullname, {})[version] = schema
    return history


# --------------------------------------------------------------------------- compatibility


def compatibility_errors(writer: Schema, reader: Schema) -> list[str]:
    """Why data written with ``writer`` (self-contained) might not be read with ``reader``.

    Avro's resolution rules, plus one stricter rule of ours: a record field may not disappear
    (keep it and say "deprecated" in its doc), because consumers still running the old
    schema read it. An empty list means compatible.
    """
    w_names = _index_names(writer)
    r_names = _index_names(reader)
    errors: list[str] = []
    seen: set[tuple[str, str]] = set()

    def deref(schema: Schema, names: Mapping[str, Any]) -> Schema:
        while True:
            if isinstance(schema, str) and schema not in _PRIMITIVES:
                schema = names[schema]
            elif isinstance(schema, dict) and schema["type"] not in (*_NAMED, "array", "map"):
                schema = schema["type"]
            else:
                return schema

    def kind(schema: Schema) -> str:
        if isinstance(schema, str):
            return schema
        if isinstance(schema, list):
            return "union"
        return str(schema["type"])

    def same_name(w: dict[str, Any], r: dict[str, Any]) -> bool:
        w_name, r_name = _fullname(w, None), _fullname(r, None)
        namespace = r_name.rpartition(".")[0]
        aliases = {a if "." in a else f"{namespace}.{a}" for a in r.get("aliases", [])}
        return w_name == r_name or w_name in aliases

    def could_match(w: Schema, r: Schema) -> bool:
        wk, rk = kind(w), kind(r)
        if wk in _NAMED or rk in _NAMED:
            return wk == rk and same_name(w, r)
        return wk == rk or rk in _PROMOTIONS.get(wk, frozenset())

    def check(w: Schema, r: Schema, path: str) -> list[str]:
        w, r = deref(w, w_names), deref(r, r_names)
        wk, rk = kind(w), kind(r)
        if wk == "union":
            return [e for i, branch in enumerate(w) for e in check(branch, r, f"{path}<{i}>")]
        if rk == "union":
            branches = [deref(b, r_names) for b in r]
            for branch in branches:
                if could_match(w, branch):
                    return check(w, branch, path)
            return [f"{path}: writer type {_describe(w)} matches no branch of the reader union"]
        if not could_match(w, r):
            return [f"{path}: writer type {_describe(w)} cannot be read as {_describe(r)}"]
        if wk == "record":
            key = (_fullname(w, None), _fullname(r, None))
            if key in seen:
                return []
            seen.add(key)
            return check_record(w, r, path)
        if wk == "enum":
            missing = [s for s in w["symbols"] if s not in r["symbols"]]
            if missing and "default" not in r:
                return [f"{path}: enum symbols {missing} removed (reader has no default)"]
            return []
        if wk == "fixed" and w.get("size") != r.get("size"):
            return [f"{path}: fixed size changed from {w.get('size')} to {r.get('size')}"]
        if wk == "array":
            return check(w["items"], r["items"], f"{path}[]")
        if wk == "map":
            return check(w["values"], r["values"], f"{path}{{}}")
        return []

    def check_record(w: dict[str, Any], r: dict[str, Any], path: str) -> list[str]:
        found: list[str] = []
        w_fields = {f["name"]: f for f in w["fields"]}
        used: set[str] = set()
        for rf in r["fields"]:
            names = [rf["name"], *rf.get("aliases", [])]
            wf = next((w_fields[n] for n in names if n in w_fields), None)
            where = f"{path}.{rf['name']}"
            if wf is None:
                if "default" not in rf:
                    found.append(f"{where}: new field without a default")
            else:
                used.add(wf["name"])
                found.extend(check(wf["type"], rf["type"], where))
        found.extend(
            f"{path}.{name}: field removed (keep it, or rename it with an alias)"
            for name in w_fields
            if name not in used
        )
        return found

    errors.extend(check(writer, reader, _describe(deref(reader, r_names))))
    return errors


def _index_names(schema: Schema) -> dict[str, Any]:
    names: dict[str, Any] = {}

    def walk(s: Schema, namespace: str | None) -> None:
        if isinstance(s, list):
            for branch in s:
                walk(branch, namespace)
        elif isinstance(s, dict):
            kind = s["type"]
            if kind in _NAMED:
                name = _fullname(s, namespace)
                names[name] = s
                for f in s.get("fields", []):
                    walk(f["type"], name.rpartition(".")[0] or None)
            elif kind == "array":
                walk(s["items"], namespace)
            elif kind == "map":
                walk(s["values"], namespace)
            elif not isinstance(kind, str):
                walk(kind, namespace)

    walk(schema, None)
    return names


def _describe(schema: Schema) -> str:
    if isinstance(schema, dict) and schema.get("type") in _NAMED:
        return str(schema["name"])
    if isinstance(schema, dict):
        return str(schema.get("type"))
    return str(schema)


# --------------------------------------------------------------------------- the codec


@dataclass
class _Event:
    """Everything the codec needs about one event type, parsed once."""

    short: str
    name: str
    version: int
    bundle: dict[str, Any]
    reader: dict[str, Any]
    header: bytes
    writers: dict[int, dict[str, Any]] = field(default_factory=dict)


def _parse(schema: Mapping[str, Any]) -> dict[str, Any]:
    parsed = fastavro.parse_schema(dict(schema), named_schemas={})
    assert isinstance(parsed, dict)  # a record schema parses to a dict
    return parsed


class Codec:
    """Encode and decode duetime events; build one per process and share it (thread-safe).

    ``schema_dir`` defaults to the installed ``duetime/schemas`` folder. With
    ``registry_url`` values are written in the Confluent wire format and their schemas
    registered under the subject ``<topic>-value``; values in the registry-less frame still
    decode, so a deployment can switch without draining topics.
    """

    def __init__(
        self,
        *,
        schema_dir: Path | str | None = None,
        registry_url: str | None = None,
        http_client: httpx.Client | None = None,
        registry_timeout_s: float = 5.0,
    ) -> None:
        directory = Path(schema_dir) if schema_dir is not None else SCHEMA_DIR
        named_types = load_named_types(directory)
        history = load_history(directory)
        self._events: dict[str, _Event] = {}
        for short, name in EVENT_TYPES.items():
            self._events[short] = self._load_event(short, name, named_types, history)
        self._registry: _Registry | None = None
        if registry_url is not None:
            self._registry = _Registry(registry_url, http_client, registry_timeout_s)

    @staticmethod
    def _load_event(
        short: str,
        name: str,
        named_types: Mapping[str, Mapping[str, Any]],
        history: Mapping[str, Mapping[int, dict[str, Any]]],
    ) -> _Event:
        bundle = bundle_schema(name, named_types)
        versions = history.get(name)
        if not versions:
            raise RuntimeError(f"{name}: no published version in {HISTORY_DIRNAME}/")
        version = max(versions)
        if versions[version] != bundle:
            raise RuntimeError(
                f"{name}: the current schema differs from published version {version}; "
                "record the change with `python -m duetime.schemas.codec freeze`"
            )
        reader = _parse(bundle)
        event = _Event(short, name, version, bundle, reader, bytes([MAGIC]) + version.to_bytes(2))
        for number, schema in versions.items():
            event.writers[number] = reader if number == version else _parse(schema)
        return event

    def close(self) -> None:
        """Release the registry's HTTP connections (when this codec opened them)."""
        if self._registry is not None:
            self._registry.close()

    def __enter__(self) -> Codec:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- introspection

    def version(self, event_type: str) -> int:
        """The schema version this codec writes for ``event_type``."""
        return self._event(event_type).version

    def schema(self, event_type: str) -> dict[str, Any]:
        """The current self-contained schema of ``event_type`` (JSON form, do not mutate)."""
        return self._event(event_type).bundle

    def _event(self, event_type: str) -> _Event:
        try:
            return self._events[event_type]
        except KeyError:
            known = ", ".join(EVENT_TYPES)
            raise ValueError(f"unknown event type {event_type!r}; known: {known}") from None

    # -- encode

    def encode(
        self, event_type: str, record: Mapping[str, Any], *, topic: str | None = None
    ) -> bytes:
        """The framed Avro bytes of ``record``. Fields with defaults may be omitted; unknown
        fields are refused. ``topic`` (the full topic name) is required with a registry."""
        event = self._event(event_type)
        buffer = io.BytesIO()
        if self._registry is None:
            buffer.write(event.header)
        else:
            if topic is None:
                raise ValueError("encode() needs topic= when a schema registry is used")
            schema_id = self._registry.register(f"{topic}-value", event)
            buffer.write(bytes([CONFLUENT_MAGIC]) + schema_id.to_bytes(4))
        try:
            fastavro.schemaless_writer(buffer, event.reader, record, strict_allow_default=True)
        except Exception as exc:  # fastavro raises ValueError, TypeError, KeyError, ...
            raise _invalid_record(event, record, exc) from exc
        return buffer.getvalue()

    # -- decode

    def decode(
        self,
        event_type: str,
        data: bytes,
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> dict[str, Any]:
        """The record in ``data``, resolved to the current schema of ``event_type``.

        Raises :class:`DecodeError` (naming topic, partition and offset) for anything that
        is not a value this event type's published schemas wrote.
        """
        event = self._event(event_type)

        def fail(problem: str) -> DecodeError:
            return DecodeError(
                f"undecodable {event.short} value: {problem}",
                topic=topic,
                partition=partition,
                offset=offset,
            )

        if not data:
            raise fail("empty value (a tombstone must be handled before decoding)")
        magic = data[0]
        reader: dict[str, Any] | None
        if magic == MAGIC:
            if len(data) < 3:
                raise fail("truncated header")
            version = int.from_bytes(data[1:3])
            writer = event.writers.get(version)
            if writer is None:
                known = ", ".join(str(v) for v in sorted(event.writers))
                raise fail(f"unknown {event.name} schema version {version} (known: {known})")
            reader = None if writer is event.reader else event.reader
            start, label = 3, f"version {version}"
        elif magic == CONFLUENT_MAGIC:
            if self._registry is None:
                raise fail("schema-registry framed value but no registry is configured")
            if len(data) < 5:
                raise fail("truncated header")
            schema_id = int.from_bytes(data[1:5])
            try:
                writer = self._registry.writer(schema_id, event)
            except _UnknownSchemaId:
                raise fail(f"unknown schema id {schema_id} in the registry") from None
            reader = None if writer is event.reader else event.reader
            start, label = 5, f"schema id {schema_id}"
        else:
            raise fail(f"bad magic byte 0x{magic:02x} (expected 0x{MAGIC:02x} or 0x00)")
        stream = io.BytesIO(data)
        stream.seek(start)
        try:
            record = fastavro.schemaless_reader(stream, writer, reader)
        except Exception as exc:  # garbage can fail anywhere: EOF, bad index, bad UTF-8, ...
            raise fail(f"{label}: {type(exc).__name__}: {exc}") from exc
        if stream.tell() != len(data):
            raise fail(f"{label}: {len(data) - stream.tell()} trailing bytes after the record")
        if not isinstance(record, dict):  # every event schema is a record
            raise fail(f"{label}: not a record")
        return record


    # -- typed records (duetime.core.records): what the roles use past this edge

    def load(
        self,
        cls: type[R],
        data: bytes,
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> R:
        """The typed record in ``data`` (``cls`` names the event type: ``ExecutionRequest``,
        ``SchedulerState``, ...). Raises :class:`DecodeError` like :meth:`decode`, also for
        a value whose content no record can hold (an enum symbol this build does not know)."""
        event_type = cls.EVENT_TYPE
        if event_type is None:
            raise ValueError(f"{cls.__name__} is not a topic value")
        plain = self.decode(event_type, data, topic=topic, partition=partition, offset=offset)
        try:
            return cls.from_avro(plain)
        except (TypeError, ValueError) as exc:
            raise DecodeError(
                f"undecodable {event_type} value: {type(exc).__name__}: {exc}",
                topic=topic,
                partition=partition,
                offset=offset,
            ) from exc

    def dump(self, record: AvroRecord, *, topic: str | None = None) -> bytes:
        """The framed Avro bytes of a typed record (see :meth:`encode`)."""
        event_type = record.EVENT_TYPE
        if event_type is None:
            raise ValueError(f"{type(record).__name__} is not a topic value")
        return self.encode(event_type, record.to_avro(), topic=topic)


def _invalid_record(event: _Event, record: object, exc: Exception) -> ValidationError:
    """A clear error for a record that does not fit its schema (error path only: slow)."""
    path: str | None = None
    problem = str(exc)
    if isinstance(record, Mapping):
        try:
            validate(dict(record), event.reader, raise_errors=True)
        except fastavro.validation.ValidationError as invalid:
            first = invalid.errors[0] if invalid.errors else None
            if first is not None:
                path = str(first.field)
                shown = "missing" if first.datum is None else f"{first.datum!r:.80}"
                problem = f"{shown}, expected {_describe(first.schema)}"
        except Exception:
            pass  # validation is best effort: keep fastavro's own message
    else:
        problem = f"expected a mapping, got {type(record).__name__}"
    if path is None:
        unknown = re.search(r"more fields than the schema specifies: (.+)$", problem)
        named = re.search(r"[Ff]ield (\w+)", problem)
        if unknown:
            path, problem = unknown[1].strip(), "unknown field (not in the schema)"
        elif named:
            path = named[1]
    field_name = path.removeprefix(event.name + ".").removeprefix(NAMESPACE + ".") if path else None
    where = f" field {field_name}" if field_name else ""
    return ValidationError(f"invalid {event.short} record{where}: {problem}", field=field_name)


# --------------------------------------------------------------------------- registry


class _UnknownSchemaId(Exception):
    pass


class _Registry:
    """The two calls of the Confluent schema-registry REST API we need, with caches both ways."""

    _CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"

    def __init__(self, url: str, client: httpx.Client | None, timeout_s: float) -> None:
        self._url = url.rstrip("/")
        self._owns_client = client is None
        self._client = client if client is not None else httpx.Client(timeout=timeout_s)
        self._ids: dict[tuple[str, str], int] = {}
        self._writers: dict[tuple[int, str], dict[str, Any]] = {}
        self._schemas: dict[int, dict[str, Any]] = {}

    def close(self) -> None:
        if self._owns_client:
            self._client.close()

    def register(self, subject: str, event: _Event) -> int:
        """The id of ``event``'s current schema under ``subject`` (registering it once)."""
        key = (subject, event.name)
        schema_id = self._ids.get(key)
        if schema_id is None:
            body = {"schema": json.dumps(event.bundle, separators=(",", ":"))}
            answer = self._call("POST", f"/subjects/{subject}/versions", body)
            schema_id = int(answer["id"])
            self._ids[key] = schema_id
            self._schemas[schema_id] = event.bundle
        return schema_id

    def writer(self, schema_id: int, event: _Event) -> dict[str, Any]:
        """The parsed writer schema of ``schema_id`` (the reader itself when identical)."""
        key = (schema_id, event.name)
        parsed = self._writers.get(key)
        if parsed is None:
            schema = self._schemas.get(schema_id)
            if schema is None:
                answer = self._call("GET", f"/schemas/ids/{schema_id}", None)
                schema = json.loads(answer["schema"])
                self._schemas[schema_id] = schema
            parsed = event.reader if schema == event.bundle else _parse(schema)
            self._writers[key] = parsed
        return parsed

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
            raise _UnknownSchemaId(path)
        if response.status_code >= 500:
            raise RetryableError(f"schema registry {method} {path}: HTTP {response.status_code}")
        if response.status_code >= 400:
            raise PermanentError(
                f"schema registry {method} {path}: HTTP {response.status_code} {response.text}"
            )
        answer: dict[str, Any] = response.json()
        return answer


# --------------------------------------------------------------------------- maintenance CLI


def _unrecorded(schema_dir: Path) -> Iterator[tuple[str, int, dict[str, Any], list[str]]]:
    """Events whose current schema is not the highest published version:
    (name, next version, current bundle, compatibility errors against the latest)."""
    named_types = load_named_types(schema_dir)
    history = load_history(schema_dir)
    for name in EVENT_TYPES.values():
        bundle = bundle_schema(name, named_types)
        versions = history.get(name, {})
        latest = max(versions, default=0)
        if latest and versions[latest] == bundle:
            continue
        errors = compatibility_errors(versions[latest], bundle) if latest else []
        yield name, latest + 1, bundle, errors


def history_errors(schema_dir: Path = SCHEMA_DIR) -> list[str]:
    """Incompatibilities between consecutive published versions of every event."""
    errors: list[str] = []
    for name, versions in sorted(load_history(schema_dir).items()):
        numbers = sorted(versions)
        if numbers != list(range(1, len(numbers) + 1)):
            errors.append(f"{name}: versions {numbers} are not 1..N without gaps")
        for old, new in itertools.pairwise(numbers):
            errors.extend(
                f"{name} v{old}→v{new}: {e}"
                for e in compatibility_errors(versions[old], versions[new])
            )
    return errors


def main(argv: list[str] | None = None, out: Callable[[str], None] = print) -> int:
    """``check``: report unrecorded or incompatible changes (exit 1 if any).
    ``freeze``: publish each compatible unrecorded change as the next version."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2) or args[0] not in ("check", "freeze"):
        out("usage: python -m duetime.schemas.codec check|freeze [SCHEMA_DIR]")
        return 2
    schema_dir = Path(args[1]) if len(args) == 2 else SCHEMA_DIR
    status = 0
    for problem in history_errors(schema_dir):
        out(problem)
        status = 1
    for name, version, bundle, errors in _unrecorded(schema_dir):
        short = name.rpartition(".")[2]
        for error in errors:
            out(f"{short} v{version - 1}→current: incompatible: {error}")
        if errors:
            status = 1
        elif args[0] == "freeze":
            target = schema_dir / HISTORY_DIRNAME / f"{short}.v{version}.avsc"
            target.parent.mkdir(exist_ok=True)
            target.write_text(json.dumps(bundle, indent=2, ensure_ascii=False) + "\n", "utf-8")
            out(f"published {target}")
        else:
            out(f"{short}: current schema is not recorded; run freeze to publish v{version}")
            status = 1
    return status


if __name__ == "__main__":
    raise SystemExit(main())
