"""The registry of ``DUETIME_*`` variables: every name duetime's own code reads, from its source.

Role: one answer to "does duetime know this variable?", for the files that name variables
without being code: README.md's Configuration table, the Helm chart and the Kubernetes
manifests (``tests/unit/test_deploy.py`` checks both against it). A name counts when it is a
string constant given to a call (``env.integer("DUETIME_X", ...)``, ``env.text(...)``) or bound
to a module-level name (``FILE_VARIABLE = "DUETIME_KAFKA_PROPERTIES_FILE"``); a family of
variables (``DUETIME_KAFKA_<PROPERTY>``, ``DUETIME_SECRET_<NAME>``) is a module-level constant
ending in ``_``. Reading the source rather than importing each role's settings finds every
reader, the CLI client's and the local stack's included, without importing the server
dependencies.

``python -m duetime.infra.tools.envvars`` prints the registry.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path

_NAME_RE = re.compile(r"^DUETIME_[A-Z0-9]+(?:_[A-Z0-9]+)*$")
_FAMILY_RE = re.compile(r"^DUETIME_[A-Z0-9]+(?:_[A-Z0-9]+)*_$")
# the folders of the package's source (duetime/<role> are symlinks to the role folders)
_SOURCES = ("duetime", "schedulers", "consumers", "producers", "infra", "schemas")
_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Registry:
    variables: frozenset[str]
    """Variables read by name."""
    families: frozenset[str]
    """Prefixes of variable families (``DUETIME_KAFKA_``): any name below one is read."""

    def knows(self, name: str) -> bool:
        """Whether duetime reads ``name``: by name, or as a member of a family."""
        return name in self.variables or any(
            name.startswith(family) and len(name) > len(family) for family in self.families
        )

    def family_of(self, name: str) -> str | None:
        """The family ``name`` belongs to when duetime does not read it by name."""
        if name in self.variables:
            return None
        return next((f for f in sorted(self.families) if name.startswith(f)), None)


def _constants(tree: ast.Module) -> tuple[set[str], set[str]]:
    names: set[str] = set()
    families: set[str] = set()

    def note(node: ast.expr) -> None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _NAME_RE.match(node.value):
                names.add(node.value)
            elif _FAMILY_RE.match(node.value):
                families.add(node.value)

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for arg in node.args:
                note(arg)
    for stmt in tree.body:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            note(stmt.value)
    return names, families


def _source_files(root: Path) -> list[Path]:
    files: list[Path] = []
    for folder in _SOURCES:
        base = root / folder
        for path in sorted(base.rglob("*.py")):
            relative = path.relative_to(root)
            # duetime/<role> is a symlink to the role's own folder, read once as itself
            if folder == "duetime" and relative.parts[1] in _SOURCES:
                continue
            files.append(path)
    return files


@functools.lru_cache(maxsize=4)
def registry(root: Path = _ROOT) -> Registry:
    """Every ``DUETIME_*`` variable and family the source under ``root`` reads."""
    names: set[str] = set()
    families: set[str] = set()
    for path in _source_files(root):
        found, found_families = _constants(ast.parse(path.read_text(encoding="utf-8")))
        names |= found
        families |= found_families
    return Registry(frozenset(names), frozenset(families))


def main() -> int:
    known = registry()
    for name in sorted(known.variables):
        print(name)
    for family in sorted(known.families):
        print(f"{family}<NAME>")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
