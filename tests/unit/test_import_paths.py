"""The role folders are importable under two names (``consumers.worker`` from the repository
root, ``duetime.consumers.worker`` installed); importing both in one process loads every
module twice, and the second copy's Prometheus metrics collide with the first's
("Duplicated timeseries"). Everything imports the roles through ``duetime.``."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROLES = ("producers", "schedulers", "consumers", "schemas", "infra")
TREES = ("tests", "bench", "duetime/core", *ROLES)


def _bare_role_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [
            f"{path.relative_to(ROOT)}:{node.lineno}: {n}"
            for n in names
            if n.split(".")[0] in ROLES
        ]
    return found


def test_no_module_imports_a_role_by_its_bare_folder_name() -> None:
    offenders = [
        line
        for tree in TREES
        for path in sorted((ROOT / tree).rglob("*.py"))
        if "__pycache__" not in path.parts
        for line in _bare_role_imports(path)
    ]
    assert offenders == [], "import through duetime.<role> instead:\n" + "\n".join(offenders)
