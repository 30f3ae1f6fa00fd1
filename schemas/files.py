"""The schema files: which event each topic carries, and the ``.avsc`` files read from disk.

Role: read ``schemas/*.avsc`` (the current named types, one per file) and
``schemas/history/<Name>.v<N>.avsc`` (every published version, self-contained), and bundle a
current event schema into the self-contained form that is published and registered.

Guarantees: pure functions of the folder they are given; importing this module reads
nothing. A file that breaks the layout (two types in one file, a file name that is not the
type's name, a history version that does not fit the frame) raises ``ValueError`` naming it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

NAMESPACE = "duetime"
SCHEMA_DIR = Path(__file__).resolve().parent
HISTORY_DIRNAME = "history"
MAX_VERSION = 0xFFFF
"""The highest version a registry-less frame can carry (2 bytes)."""

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

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
NAMED = frozenset({"record", "error", "enum", "fixed"})
_HISTORY_FILE = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)\.v(?P<version>[1-9][0-9]*)\.avsc$")

Schema = Any  # an Avro schema in its JSON form: a name, a list (union) or a dict


def topic_event_type(topic_suffix: str) -> str:
    """The event type carried by a topic, from its suffix (``"exec.high"`` → ``"execution"``)."""
    try:
        return TOPIC_EVENT_TYPES[topic_suffix]
    except KeyError:
        known = ", ".join(sorted(TOPIC_EVENT_TYPES))
        raise ValueError(f"unknown topic suffix {topic_suffix!r}; known: {known}") from None


def fullname(schema: Mapping[str, Any], namespace: str | None) -> str:
    """The full name of a named type, its own namespace winning over the enclosing one."""
    name = str(schema["name"])
    if "." in name:
        return name
    ns = schema.get("namespace", namespace)
    return f"{ns}.{name}" if ns else name


def describe(schema: Schema) -> str:
    """A short name for a schema in messages: the type's name, or its kind."""
    if isinstance(schema, dict) and schema.get("type") in NAMED:
        return str(schema["name"])
    if isinstance(schema, dict):
        return str(schema.get("type"))
    return str(schema)


def load_named_types(schema_dir: Path = SCHEMA_DIR) -> dict[str, dict[str, Any]]:
    """Every named type of ``schema_dir/*.avsc``, by full name (one type per file)."""
    types: dict[str, dict[str, Any]] = {}
    for path in sorted(schema_dir.glob("*.avsc")):
        schema = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(schema, dict) or schema.get("type") not in NAMED:
            raise ValueError(f"{path}: a schema file must hold one named type")
        name = fullname(schema, None)
        if name.rsplit(".", 1)[-1] != path.stem:
            raise ValueError(f"{path}: file name must be the type's name ({name})")
        types[name] = schema
    return types


def bundle_schema(name: str, named_types: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """A self-contained copy of ``name``: each referenced named type is defined inline at
    its first use (dependency order) and referenced by full name afterwards. This is the form
    published in ``history/`` and registered with a schema registry."""
    if name not in named_types:
        raise ValueError(f"unknown schema {name!r}")
    bundled: dict[str, Any] = _Bundler(named_types).walk(
        named_types[name], None, name.rpartition(".")[2]
    )
    return bundled


class _Bundler:
    """One bundling walk: remembers which named types are already defined inline."""

    def __init__(self, named_types: Mapping[str, Mapping[str, Any]]) -> None:
        self._named_types = named_types
        self._defined: set[str] = set()

    def walk(self, schema: Schema, namespace: str | None, path: str) -> Schema:
        if isinstance(schema, str):
            return self._reference(schema, namespace, path)
        if isinstance(schema, list):
            return [self.walk(branch, namespace, path) for branch in schema]
        kind = schema["type"]
        if kind in NAMED:
            return self._named(schema, namespace, path)
        if kind == "array":
            return {**schema, "items": self.walk(schema["items"], namespace, f"{path}[]")}
        if kind == "map":
            return {**schema, "values": self.walk(schema["values"], namespace, f"{path}{{}}")}
        if isinstance(kind, str) and kind in PRIMITIVES:
            return dict(schema)
        return self.walk(kind, namespace, path)

    def _reference(self, schema: str, namespace: str | None, path: str) -> Schema:
        if schema in PRIMITIVES:
            return schema
        ref = schema if "." in schema or not namespace else f"{namespace}.{schema}"
        if ref in self._defined:
            return ref
        if ref not in self._named_types:
            raise ValueError(f"{path}: unknown type {schema!r}")
        return self.walk(self._named_types[ref], namespace, path)

    def _named(self, schema: Mapping[str, Any], namespace: str | None, path: str) -> Schema:
        name = fullname(schema, namespace)
        self._defined.add(name)
        out = dict(schema)
        if schema["type"] in ("record", "error"):
            inner_ns = name.rpartition(".")[0] or None
            out["fields"] = [
                {**f, "type": self.walk(f["type"], inner_ns, f"{path}.{f['name']}")}
                for f in schema["fields"]
            ]
        return out


def load_history(schema_dir: Path = SCHEMA_DIR) -> dict[str, dict[int, dict[str, Any]]]:
    """Every published version: ``{full name: {version: self-contained schema}}``."""
    history: dict[str, dict[int, dict[str, Any]]] = {}
    folder = schema_dir / HISTORY_DIRNAME
    for path in sorted(folder.glob("*.avsc")) if folder.is_dir() else []:
        match = _HISTORY_FILE.match(path.name)
        if match is None:
            raise ValueError(f"{path}: history files are named <Name>.v<N>.avsc")
        version = int(match["version"])
        if version > MAX_VERSION:
            raise ValueError(f"{path}: version above {MAX_VERSION} does not fit the frame")
        schema = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(schema, dict) or schema.get("type") not in NAMED:
            raise ValueError(f"{path}: a history file must hold one named type")
        name = fullname(schema, None)
        if name.rsplit(".", 1)[-1] != match["name"]:
            raise ValueError(f"{path}: holds {name}, not {match['name']}")
        history.setdefault(name, {})[version] = schema
    return history
