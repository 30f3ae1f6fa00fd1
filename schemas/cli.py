"""``python -m duetime.schemas check|freeze [SCHEMA_DIR]``: keep the published versions honest.

- ``check`` reports gaps or incompatibilities between published versions, and every event
  whose current schema is not its highest published version (exit 1 if there is any).
- ``freeze`` publishes each such event whose change is compatible as the next version
  (``history/<Name>.v<N+1>.avsc``); it writes nothing for an incompatible one (exit 1).

See ``schemas/README.md`` for the version rules.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from duetime.schemas.compatibility import compatibility_errors, history_errors
from duetime.schemas.files import (
    EVENT_TYPES,
    HISTORY_DIRNAME,
    SCHEMA_DIR,
    bundle_schema,
    load_history,
    load_named_types,
)

USAGE = "usage: python -m duetime.schemas check|freeze [SCHEMA_DIR]"


@dataclass(frozen=True, slots=True)
class Unrecorded:
    """An event whose current schema is not its highest published version."""

    name: str
    version: int
    """The version it would be published as."""
    bundle: dict[str, Any]
    errors: list[str]
    """Why records of the latest published version might not decode with it."""


def unrecorded(schema_dir: Path) -> Iterator[Unrecorded]:
    """Every event whose current schema is not its highest published version."""
    named_types = load_named_types(schema_dir)
    history = load_history(schema_dir)
    for name in EVENT_TYPES.values():
        bundle = bundle_schema(name, named_types)
        versions = history.get(name, {})
        latest = max(versions, default=0)
        if latest and versions[latest] == bundle:
            continue
        errors = compatibility_errors(versions[latest], bundle) if latest else []
        yield Unrecorded(name, latest + 1, bundle, errors)


def main(argv: list[str] | None = None, out: Callable[[str], None] = print) -> int:
    """``check``: report unrecorded or incompatible changes (exit 1 if any).
    ``freeze``: publish each compatible unrecorded change as the next version."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2) or args[0] not in ("check", "freeze"):
        out(USAGE)
        return 2
    schema_dir = Path(args[1]) if len(args) == 2 else SCHEMA_DIR
    status = 0
    for problem in history_errors(schema_dir):
        out(problem)
        status = 1
    for change in unrecorded(schema_dir):
        if not _settle(change, schema_dir, freeze=args[0] == "freeze", out=out):
            status = 1
    return status


def _settle(
    change: Unrecorded, schema_dir: Path, *, freeze: bool, out: Callable[[str], None]
) -> bool:
    """Report (or, with ``freeze``, publish) one unrecorded change; False when it is a problem."""
    short = change.name.rpartition(".")[2]
    for error in change.errors:
        out(f"{short} v{change.version - 1}→current: incompatible: {error}")
    if change.errors:
        return False
    if not freeze:
        out(f"{short}: current schema is not recorded; run freeze to publish v{change.version}")
        return False
    target = schema_dir / HISTORY_DIRNAME / f"{short}.v{change.version}.avsc"
    target.parent.mkdir(exist_ok=True)
    # written aside then renamed: an interrupted freeze never leaves half a published version
    partial = target.with_name(target.name + ".partial")
    partial.write_text(json.dumps(change.bundle, indent=2, ensure_ascii=False) + "\n", "utf-8")
    os.replace(partial, target)
    out(f"published {target}")
    return True
