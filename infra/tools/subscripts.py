"""Count string-key subscripts (``x["key"]``) in the roles and the core.

Why: the domain travels as typed records (``duetime.core.records``); a string-key subscript is
a place where mypy cannot catch a misspelled key. Issue 17 caps them at 100 in the roles and
core; this script is how they are counted, so the figure in the README can be re-checked.

Counted: every ``ast.Subscript`` whose index is a string literal, in load, store or delete
position, in the role packages, ``duetime/core``, ``schemas`` and ``infra`` (tests and bench
are not counted). ``--list`` prints each one with its place.

Usage: ``python -m infra.tools.subscripts [--list] [--total] [--max N]``
(exit 1 when above ``--max``).
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("duetime/core", "producers", "schedulers", "consumers", "schemas", "infra")
SKIP_PARTS = frozenset({"__pycache__", "tools"})


def subscripts(path: Path) -> list[tuple[int, str]]:
    """(line, key) of each string-literal subscript in one file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
        ):
            found.append((node.lineno, node.slice.value))
    return sorted(found)


def files(root: Path = ROOT) -> list[Path]:
    out: list[Path] = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if not SKIP_PARTS.intersection(path.relative_to(root).parts):
                out.append(path)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print every subscript")
    parser.add_argument("--max", type=int, default=None, help="fail when the total is above")
    parser.add_argument("--total", action="store_true", help="print only the total")
    args = parser.parse_args(argv)
    per_file: Counter[str] = Counter()
    for path in files():
        rel = str(path.relative_to(ROOT))
        for line, key in subscripts(path):
            per_file[rel] += 1
            if args.list:
                print(f"{rel}:{line}: [{key!r}]")
    total = sum(per_file.values())
    if not args.total:
        for rel, count in per_file.most_common():
            print(f"{count:5d}  {rel}")
    print(f"{total:5d}  total string-key subscripts in the roles and core")
    if args.max is not None and total > args.max:
        print(f"above the cap of {args.max}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
