"""How deeply a JSON text nests, measured on its bytes before any parser sees it.

``json.loads`` recurses once per level, and so do the encoders that answer later reads: a
body of 900 nested arrays is parsed, stored, and then breaks every read of it. The scan
below costs a few passes of C-speed byte operations, whatever the body holds:

1. strings are blanked out (a bracket inside a string does not nest);
2. every byte but brackets is deleted, and ``[``/``{`` and ``]``/``}`` become ``(`` and ``)``;
3. each pass of ``replace(b"()", b"")`` deletes the innermost pairs, so the number of passes
   until nothing is left is the nesting depth. The scan stops as soon as the limit is
   passed, or when a pass changes nothing (unbalanced brackets: malformed JSON, which the
   parser then reports).
"""

from __future__ import annotations

import re

_STRING_RE = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS = bytes.maketrans(b"[]{}", b"()()")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def exceeds_depth(raw: bytes, limit: int) -> bool:
    """Whether the JSON text ``raw`` nests arrays and objects more than ``limit`` deep
    (``[]`` is depth 1). Malformed input is never reported too deep unless its brackets
    outside strings are."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False  # not enough brackets to nest that deep: the common case, one pass
    brackets = _STRING_RE.sub(b'""', raw).translate(_BRACKETS, _NOT_BRACKETS)
    for _ in range(limit):
        if not brackets:
            return False
        shorter = brackets.replace(b"()", b"")
        if len(shorter) == len(brackets):
            return False  # unbalanced: not JSON; the parser says so
        brackets = shorter
    return b"()" in brackets


def nesting_depth(value: object) -> int:
    """The nesting depth of a decoded JSON value (iterative: any depth is safe to measure)."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            items: list[object] = list(item.values())
        elif isinstance(item, list):
            items = item
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        stack.extend((child, depth) for child in items)
    return deepest
