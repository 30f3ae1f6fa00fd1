"""Schema compatibility: may data written with one schema be read with another?

Role: the rules that ``python -m duetime.schemas check|freeze`` and the tests apply between
the published versions of an event (``schemas/history/``) and its current schema.

Guarantees: pure functions of the schemas they are given (JSON form, self-contained); an
empty list means compatible, otherwise each message names the field path and the rule.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from duetime.schemas.files import (
    NAMED,
    PRIMITIVES,
    SCHEMA_DIR,
    Schema,
    describe,
    fullname,
    load_history,
)

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


def compatibility_errors(writer: Schema, reader: Schema) -> list[str]:
    """Why data written with ``writer`` (self-contained) might not be read with ``reader``.

    Avro's resolution rules, plus one stricter rule of ours: a record field may not disappear
    (keep it and say "deprecated" in its doc), because consumers still running the old
    schema read it. An empty list means compatible.
    """
    checker = _Checker(_index_names(writer), _index_names(reader))
    return checker.check(writer, reader, describe(_deref(reader, checker.r_names)))


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


def _deref(schema: Schema, names: Mapping[str, Any]) -> Schema:
    """A schema with name references and ``{"type": <primitive or name>}`` wrappers resolved."""
    while True:
        if isinstance(schema, str) and schema not in PRIMITIVES:
            schema = names[schema]
        elif isinstance(schema, dict) and schema["type"] not in (*NAMED, "array", "map"):
            schema = schema["type"]
        else:
            return schema


def _kind(schema: Schema) -> str:
    if isinstance(schema, str):
        return schema
    if isinstance(schema, list):
        return "union"
    return str(schema["type"])


def _same_name(w: Mapping[str, Any], r: Mapping[str, Any]) -> bool:
    """The reader's type is the writer's, by full name or one of the reader's aliases."""
    w_name, r_name = fullname(w, None), fullname(r, None)
    namespace = r_name.rpartition(".")[0]
    aliases = {a if "." in a else f"{namespace}.{a}" for a in r.get("aliases", [])}
    return w_name == r_name or w_name in aliases


def _could_match(w: Schema, r: Schema) -> bool:
    """Avro's "schemas match" test, without looking inside records."""
    wk, rk = _kind(w), _kind(r)
    if wk in NAMED or rk in NAMED:
        return wk == rk and _same_name(w, r)
    return wk == rk or rk in _PROMOTIONS.get(wk, frozenset())


def _index_names(schema: Schema) -> dict[str, Any]:
    """Every named type defined inside a self-contained schema, by full name."""
    names: dict[str, Any] = {}

    def walk(s: Schema, namespace: str | None) -> None:
        if isinstance(s, list):
            for branch in s:
                walk(branch, namespace)
        elif isinstance(s, dict):
            kind = s["type"]
            if kind in NAMED:
                name = fullname(s, namespace)
                names[name] = s
                for f in s.get("fields", []):
                    walk(f["type"], name.rpartition(".")[0] or None)
            elif kind in ("array", "map"):
                walk(s["items" if kind == "array" else "values"], namespace)
            elif not isinstance(kind, str):
                walk(kind, namespace)

    walk(schema, None)
    return names


class _Checker:
    """One comparison of a writer schema with a reader schema (recursive types visited once)."""

    def __init__(self, w_names: Mapping[str, Any], r_names: Mapping[str, Any]) -> None:
        self.w_names = w_names
        self.r_names = r_names
        self._seen: set[tuple[str, str]] = set()

    def check(self, w: Schema, r: Schema, path: str) -> list[str]:
        w, r = _deref(w, self.w_names), _deref(r, self.r_names)
        if _kind(w) == "union":
            return [e for i, branch in enumerate(w) for e in self.check(branch, r, f"{path}<{i}>")]
        if _kind(r) == "union":
            return self._into_union(w, r, path)
        if not _could_match(w, r):
            return [f"{path}: writer type {describe(w)} cannot be read as {describe(r)}"]
        return self._same_kind(w, r, path)

    def _into_union(self, w: Schema, r: list[Schema], path: str) -> list[str]:
        """A non-union writer read as a union: the first reader branch that matches."""
        for branch in (_deref(b, self.r_names) for b in r):
            if _could_match(w, branch):
                return self.check(w, branch, path)
        return [f"{path}: writer type {describe(w)} matches no branch of the reader union"]

    def _same_kind(self, w: Schema, r: Schema, path: str) -> list[str]:
        """Two schemas of one kind (already known to match at the top): look inside."""
        kind = _kind(w)
        if kind == "record":
            return self._record(w, r, path)
        if kind == "enum":
            missing = [s for s in w["symbols"] if s not in r["symbols"]]
            if missing and "default" not in r:
                return [f"{path}: enum symbols {missing} removed (reader has no default)"]
            return []
        if kind == "fixed" and w.get("size") != r.get("size"):
            return [f"{path}: fixed size changed from {w.get('size')} to {r.get('size')}"]
        if kind == "array":
            return self.check(w["items"], r["items"], f"{path}[]")
        if kind == "map":
            return self.check(w["values"], r["values"], f"{path}{{}}")
        return []

    def _record(self, w: Mapping[str, Any], r: Mapping[str, Any], path: str) -> list[str]:
        key = (fullname(w, None), fullname(r, None))
        if key in self._seen:
            return []
        self._seen.add(key)
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
                found.extend(self.check(wf["type"], rf["type"], where))
        found.extend(
            f"{path}.{name}: field removed (keep it, or rename it with an alias)"
            for name in w_fields
            if name not in used
        )
        return found
