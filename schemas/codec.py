"""Avro encoding and decoding of every duetime event: the one place bytes meet records.

Role: turn event records (typed records of :mod:`duetime.core.records`, or plain dicts shaped
by ``schemas/*.avsc`` for tests and tools) into Kafka values and back.

Guarantees:

- Every schema is read and parsed once, when a :class:`Codec` is built; importing this module
  reads nothing. The hot path is one ``schemaless_writer`` / ``schemaless_reader`` call.
- A scheduler state embeds its job's definition, which changes far more rarely than the state
  (every fire and every result rewrites the state): the encoded bytes of a definition, as read
  from the jobs topic, as read back in a state or as last written, are kept while the
  definition object lives (by object: a definition record is frozen; a weak reference drops
  the bytes with the object) and spliced into the state's bytes instead of encoding it
  again. Avro writes a record as its fields one after another, so the bytes are identical to
  a whole encoding (a test compares them).
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

The package's other modules: :mod:`~duetime.schemas.files` (reading the schema files),
:mod:`~duetime.schemas.compatibility` (the version rules), :mod:`~duetime.schemas.registry`
(the schema-registry client) and :mod:`~duetime.schemas.cli`
(``python -m duetime.schemas check|freeze``, see ``schemas/README.md``). Their public names
are importable from here too, as they always were.
"""

from __future__ import annotations

import io
import re
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import fastavro
import httpx
from fastavro.validation import validate

from duetime.core.errors import DecodeError, ValidationError
from duetime.core.records import AvroRecord, JobDefinition, SchedulerState, to_avro_without
from duetime.schemas.cli import main
from duetime.schemas.compatibility import compatibility_errors, history_errors
from duetime.schemas.files import (
    EVENT_TYPES,
    HISTORY_DIRNAME,
    NAMESPACE,
    SCHEMA_DIR,
    TOPIC_EVENT_TYPES,
    Schema,
    bundle_schema,
    describe,
    load_history,
    load_named_types,
    topic_event_type,
)
from duetime.schemas.registry import RegistryClient, UnknownSchemaId

__all__ = [
    "CONFLUENT_MAGIC",
    "EVENT_TYPES",
    "HISTORY_DIRNAME",
    "MAGIC",
    "NAMESPACE",
    "SCHEMA_DIR",
    "TOPIC_EVENT_TYPES",
    "Codec",
    "Projection",
    "Schema",
    "bundle_schema",
    "compatibility_errors",
    "history_errors",
    "load_history",
    "load_named_types",
    "main",
    "topic_event_type",
]

R = TypeVar("R", bound=AvroRecord)

MAGIC = 0xD7
"""First byte of a value framed without a registry (then a 2-byte schema version)."""
CONFLUENT_MAGIC = 0x00
"""First byte of a value in the Confluent wire format (then a 4-byte schema id)."""


@dataclass(frozen=True)
class _Splice:
    """A record written as three parts: the fields before one nested record (``head``), that
    record's own bytes (``part``, kept per object) and the fields after it (``tail``)."""

    head: dict[str, Any]
    part: dict[str, Any]
    tail: dict[str, Any]
    head_fields: tuple[str, ...]
    field: str
    tail_fields: tuple[str, ...]


def _splice(bundle: Mapping[str, Any], field_name: str, part_bundle: Any) -> _Splice | None:
    """The three parsed schemas of ``bundle`` split at ``field_name``, or None when that field
    is not the nested record ``part_bundle`` defined inline (then states encode whole)."""
    fields: list[Mapping[str, Any]] = list(bundle.get("fields", []))
    names = [f.get("name") for f in fields]
    wanted = {"name": field_name, "type": part_bundle}
    i = next((n for n, f in enumerate(fields) if wanted.items() <= f.items()), None)
    if i is None:
        return None
    named: dict[str, Any] = {}

    def record(name: str, part: list[Any]) -> dict[str, Any]:
        # each part is parsed in order with the same named types, so that a type defined
        # inline in an earlier part is a known reference in a later one
        parsed = fastavro.parse_schema(
            {"type": "record", "name": name, "fields": part}, named_schemas=named
        )
        assert isinstance(parsed, dict)
        return parsed

    head = record("duetime._SpliceHead", fields[:i])
    part = fastavro.parse_schema(dict(part_bundle), named_schemas=named)
    assert isinstance(part, dict)
    tail = record("duetime._SpliceTail", fields[i + 1 :])
    return _Splice(
        head, part, tail, tuple(map(str, names[:i])), field_name, tuple(map(str, names[i + 1 :]))
    )


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
    decode, so a deployment can switch without draining topics. ``keep_definitions`` (the
    scheduler): splice kept definitions' bytes into the states it writes (module docstring).
    """

    def __init__(
        self,
        *,
        schema_dir: Path | str | None = None,
        registry_url: str | None = None,
        http_client: httpx.Client | None = None,
        registry_timeout_s: float = 5.0,
        keep_definitions: bool = False,
    ) -> None:
        directory = Path(schema_dir) if schema_dir is not None else SCHEMA_DIR
        named_types = load_named_types(directory)
        history = load_history(directory)
        self._events: dict[str, _Event] = {}
        for short, name in EVENT_TYPES.items():
            self._events[short] = self._load_event(short, name, named_types, history)
        self._registry: RegistryClient | None = None
        if registry_url is not None:
            self._registry = RegistryClient(registry_url, http_client, registry_timeout_s)
        # parsed writer schemas by (registry schema id, event name): parsed once per process
        self._registry_writers: dict[tuple[int, str], dict[str, Any]] = {}
        # only the scheduler writes states: other roles keep no definitions' bytes
        self._state_splice = (
            _splice(self._event("state").bundle, "definition", self._event("job").bundle)
            if keep_definitions
            else None
        )
        # id(definition) -> (a weak reference to it, its Avro bytes), for as long as the
        # definition lives: a state kept decoded, or being fired, holds its definition. A
        # count bound evicted the definitions of the states kept for a burst's fires (8,192
        # kept, a 100,000-job burst) and made those fires encode them again. An entry goes
        # when its object is freed, before its id can be reused; single dict operations
        # (atomic under the GIL: roles dump from several threads)
        self._parts: dict[int, tuple[weakref.ref[object], bytes]] = {}

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
                "record the change with `python -m duetime.schemas freeze`"
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
        buffer.write(self._header(event, topic))
        try:
            fastavro.schemaless_writer(buffer, event.reader, record, strict_allow_default=True)
        except Exception as exc:  # fastavro raises ValueError, TypeError, KeyError, ...
            raise _invalid_record(event, record, exc) from exc
        return buffer.getvalue()

    def _header(self, event: _Event, topic: str | None) -> bytes:
        """The frame before the Avro body: our own, or the registry's schema id."""
        if self._registry is None:
            return event.header
        if topic is None:
            raise ValueError("encode() needs topic= when a schema registry is used")
        schema_id = self._registry.register(f"{topic}-value", event.name, event.bundle)
        return bytes([CONFLUENT_MAGIC]) + schema_id.to_bytes(4)

    # -- decode

    def decode(
        self,
        event_type: str,
        data: bytes,
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
        reader: Projection | None = None,
    ) -> dict[str, Any]:
        """The record in ``data``, resolved to the current schema of ``event_type`` (or to
        ``reader``, a :meth:`projection` of it: only its fields are built).

        Raises :class:`DecodeError` (naming topic, partition and offset) for anything that
        is not a value this event type's published schemas wrote.
        """
        event = self._event(event_type)
        if reader is not None and reader.event_type != event_type:
            raise ValueError(f"a projection of {reader.event_type} cannot read {event_type}")

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
        if magic == MAGIC:
            if len(data) < 3:
                raise fail("truncated header")
            version = int.from_bytes(data[1:3])
            writer = event.writers.get(version)
            if writer is None:
                known = ", ".join(str(v) for v in sorted(event.writers))
                raise fail(f"unknown {event.name} schema version {version} (known: {known})")
            start, label = 3, f"version {version}"
        elif magic == CONFLUENT_MAGIC:
            writer, label = self._registry_frame(event, data, fail)
            start = 5
        else:
            raise fail(f"bad magic byte 0x{magic:02x} (expected 0x{MAGIC:02x} or 0x00)")
        # no reader schema when the writer's is the current one: nothing to resolve
        resolve = reader.schema if reader is not None else None
        if resolve is None and writer is not event.reader:
            resolve = event.reader
        stream = io.BytesIO(data)
        stream.seek(start)
        try:
            record = fastavro.schemaless_reader(stream, writer, resolve)
        except Exception as exc:  # garbage can fail anywhere: EOF, bad index, bad UTF-8, ...
            raise fail(f"{label}: {type(exc).__name__}: {exc}") from exc
        if stream.tell() != len(data):
            raise fail(f"{label}: {len(data) - stream.tell()} trailing bytes after the record")
        if not isinstance(record, dict):  # every event schema is a record
            raise fail(f"{label}: not a record")
        return record

    def _registry_frame(
        self, event: _Event, data: bytes, fail: Callable[[str], DecodeError]
    ) -> tuple[dict[str, Any], str]:
        """The parsed writer schema of a Confluent-framed value, and how to name it."""
        if self._registry is None:
            raise fail("schema-registry framed value but no registry is configured")
        if len(data) < 5:
            raise fail("truncated header")
        schema_id = int.from_bytes(data[1:5])
        key = (schema_id, event.name)
        parsed = self._registry_writers.get(key)
        if parsed is None:
            try:
                schema = self._registry.schema(schema_id)
            except UnknownSchemaId:
                raise fail(f"unknown schema id {schema_id} in the registry") from None
            try:
                parsed = event.reader if schema == event.bundle else _parse(schema)
            except Exception as exc:  # fastavro raises SchemaParseException, KeyError, ...
                raise fail(f"schema id {schema_id} in the registry is not usable: {exc}") from exc
            self._registry_writers[key] = parsed
        return parsed, f"schema id {schema_id}"

    def projection(self, event_type: str, keep: Mapping[str, Any]) -> Projection:
        """A reader of ``event_type`` that builds only the fields ``keep`` names: field name →
        None (the whole field) or, for a nested record, a mapping of its fields to keep. The
        other fields are skipped over, never built (the projector reads a scheduler state
        without its job's definition). Every published version resolves to it, as to the
        whole schema. A name that is no field raises ValueError."""
        event = self._event(event_type)
        named: dict[str, Any] = {}
        fastavro.parse_schema(dict(event.bundle), named_schemas=named)  # every named type
        rebuilt: set[str] = set()
        projected = _project_record(event.bundle, keep, rebuilt)
        others = {name: t for name, t in named.items() if name not in rebuilt}
        parsed = fastavro.parse_schema(projected, named_schemas=others)
        assert isinstance(parsed, dict)  # a record schema parses to a dict
        return Projection(event_type, parsed)

    # -- typed records (duetime.core.records): what the roles use past this edge

    def load(
        self,
        cls: type[R],
        data: bytes,
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
        reader: Projection | None = None,
    ) -> R:
        """The typed record in ``data`` (``cls`` names the event type: ``ExecutionRequest``,
        ``SchedulerState``, ...). Raises :class:`DecodeError` like :meth:`decode`, also for
        a value whose content no record can hold (an enum symbol this build does not know).
        ``reader``: a :meth:`projection` whose fields are ``cls``'s (a partial record)."""
        event_type = cls.EVENT_TYPE
        if event_type is None:
            raise ValueError(f"{cls.__name__} is not a topic value")
        plain: dict[str, Any] | None = None
        span: tuple[int, int] | None = None
        if cls is SchedulerState and reader is None and self._state_splice is not None:
            spliced = self._decode_spliced(data, self._state_splice)
            if spliced is not None:
                plain, span = spliced
        if plain is None:
            plain = self.decode(
                event_type, data, topic=topic, partition=partition, offset=offset, reader=reader
            )
        try:
            record = cls.from_avro(plain)
        except (TypeError, ValueError) as exc:
            raise DecodeError(
                f"undecodable {event_type} value: {type(exc).__name__}: {exc}",
                topic=topic,
                partition=partition,
                offset=offset,
            ) from exc
        if self._state_splice is not None:
            if cls is JobDefinition:
                self._remember_definition(record, data)
            elif span is not None:
                self._keep_part(getattr(record, self._state_splice.field), data[slice(*span)])
        return record

    def _decode_spliced(
        self, data: bytes, splice: _Splice
    ) -> tuple[dict[str, Any], tuple[int, int]] | None:
        """A state written with the current schema, decoded in the splice's three parts: the
        plain form and where its definition's bytes lie in ``data``, kept by ``load`` for the
        next time the state is written (a fire of a state read from the store then encodes
        no definition). None for any other frame, or anything wrong: the whole decoding
        then says what."""
        event = self._event("state")
        if data[:3] != event.header:
            return None
        stream = io.BytesIO(data)
        stream.seek(3)
        try:
            plain = fastavro.schemaless_reader(stream, splice.head, None)
            start = stream.tell()
            part = fastavro.schemaless_reader(stream, splice.part, None)
            end = stream.tell()
            tail = fastavro.schemaless_reader(stream, splice.tail, None)
        except Exception:  # garbage can fail anywhere: the whole decoding names it
            return None
        if stream.tell() != len(data):
            return None
        assert isinstance(plain, dict) and isinstance(tail, dict)  # record schemas
        plain[splice.field] = part
        plain.update(tail)
        return plain, (start, end)

    def _remember_definition(self, definition: object, data: bytes) -> None:
        """Keep a definition's Avro body (``data`` past its frame) when the current schema
        wrote it: those are the bytes a state embeds."""
        event = self._event("job")
        if data[0] == MAGIC and data[1:3] == event.header[1:3]:
            self._keep_part(definition, data[3:])
        # a registry frame: the schema id says nothing cheap about the version; not kept

    def dump(self, record: AvroRecord, *, topic: str | None = None) -> bytes:
        """The framed Avro bytes of a typed record (see :meth:`encode`)."""
        event_type = record.EVENT_TYPE
        if event_type is None:
            raise ValueError(f"{type(record).__name__} is not a topic value")
        if type(record) is SchedulerState and self._state_splice is not None:
            spliced = self._dump_spliced(record, self._state_splice, topic)
            if spliced is not None:
                return spliced
        return self.encode(event_type, record.to_avro(), topic=topic)

    def _dump_spliced(
        self, record: SchedulerState, splice: _Splice, topic: str | None
    ) -> bytes | None:
        """The state's bytes with its definition's kept bytes spliced in; None when a part
        does not encode (the caller's whole encoding then raises the error naming it)."""
        definition = record.definition
        try:
            kept = self._parts.get(id(definition))
            if kept is not None and kept[0]() is definition:
                part = kept[1]
                plain = to_avro_without(record, splice.field)  # the definition is in ``part``
            else:
                plain = record.to_avro()
                buffer = io.BytesIO()
                fastavro.schemaless_writer(buffer, splice.part, plain[splice.field])
                part = buffer.getvalue()
                self._keep_part(definition, part)
            buffer = io.BytesIO()
            buffer.write(self._header(self._event("state"), topic))
            fastavro.schemaless_writer(
                buffer, splice.head, {f: plain[f] for f in splice.head_fields}
            )
            buffer.write(part)
            fastavro.schemaless_writer(
                buffer, splice.tail, {f: plain[f] for f in splice.tail_fields}
            )
        except Exception:  # fastavro raises ValueError, TypeError, KeyError, ...
            return None
        return buffer.getvalue()

    def _keep_part(self, definition: object, part: bytes) -> None:
        key, parts = id(definition), self._parts

        def forget(ref: weakref.ref[object]) -> None:
            entry = parts.get(key)
            if entry is not None and entry[0] is ref:  # not a later object's, same id
                parts.pop(key, None)

        parts[key] = (weakref.ref(definition, forget), part)


@dataclass(frozen=True)
class Projection:
    """A parsed reader schema holding some fields of an event (``Codec.projection``)."""

    event_type: str
    schema: dict[str, Any] = field(repr=False)


def _full_name(schema: Mapping[str, Any]) -> str:
    name = str(schema.get("name", ""))
    return name if "." in name else f"{schema.get('namespace', NAMESPACE)}.{name}"


def _by_name(schema: Any) -> Any:
    """``schema`` with its inline named types replaced by their full names (the projection's
    named types are defined once, from the whole schema)."""
    if isinstance(schema, list):
        return [_by_name(s) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    if schema.get("type") in ("record", "enum", "fixed") and "name" in schema:
        return _full_name(schema)
    if schema.get("type") == "array":
        return {"type": "array", "items": _by_name(schema.get("items"))}
    if schema.get("type") == "map":
        return {"type": "map", "values": _by_name(schema.get("values"))}
    return dict(schema)


def _project_record(schema: Any, keep: Mapping[str, Any], rebuilt: set[str]) -> dict[str, Any]:
    """The record ``schema`` (inline, as in a bundle) with only the fields ``keep`` names."""
    if not isinstance(schema, Mapping) or schema.get("type") != "record":
        raise ValueError(f"only an inline record can be projected, not {schema!r:.80}")
    fields = {str(f.get("name")): f for f in schema.get("fields", [])}
    unknown = sorted(set(keep) - set(fields))
    if unknown:
        raise ValueError(f"{_full_name(schema)} has no field(s) {', '.join(unknown)}")
    out = []
    for name, wanted in keep.items():
        declared = fields[name]
        kind = (
            _project_record(declared.get("type"), wanted, rebuilt)
            if wanted
            else _by_name(declared.get("type"))
        )
        out.append(
            {"name": name, "type": kind, **{k: declared[k] for k in ("default",) if k in declared}}
        )
    full = _full_name(schema)
    rebuilt.add(full)
    return {"type": "record", "name": full, "fields": out}


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
                problem = f"{shown}, expected {describe(first.schema)}"
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


if __name__ == "__main__":  # the command's former name: keep it working (and not silently)
    raise SystemExit(main())
