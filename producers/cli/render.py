"""Output: aligned tables for people, JSON for scripts, a progress bar on a terminal."""

from __future__ import annotations

import json
import re
import shutil
import sys
import textwrap
from collections.abc import Sequence
from datetime import datetime
from typing import Any, TextIO

from duetime.core.redact import escape_control

MAX_CELL = 48
# C1 controls (some terminals read U+009B as CSI), bidi overrides (text shown reversed) and
# the Unicode line and paragraph separators (a line break to many readers of the output)
_C1_AND_BIDI = re.compile("[\u0080-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def as_json(value: Any, out: TextIO | None = None) -> None:
    out = out or sys.stdout  # looked up per call: tests and callers may swap sys.stdout
    out.write(json.dumps(value, indent=2, ensure_ascii=False, default=str) + "\n")


def _escaped(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group(0)):04x}"


def cell(value: Any) -> str:
    """A table cell: one line, cut at ``MAX_CELL`` characters (``…`` marks the cut)."""
    text = full_text(value)
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def full_text(value: Any) -> str:
    """The whole value on one line, escaped like a cell but never cut."""
    if value is None:
        return "-"
    if isinstance(value, dict | list):
        # JSON escapes C0 controls itself; C1 controls and bidi overrides pass through it
        text = _C1_AND_BIDI.sub(
            _escaped, json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        )
    else:
        # user data (a job's name, an error text) may hold terminal escapes or newlines:
        # shown escaped, a cell stays one cell and cannot repaint or retitle the terminal
        text = _C1_AND_BIDI.sub(_escaped, escape_control(str(value)))
    if isinstance(value, str) and len(text) >= 20 and text[4:5] == "-" and "T" in text:
        try:  # timestamps: shorter, still exact to the millisecond
            parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
            text = parsed.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"
        except ValueError:
            pass
    return text


def table(
    rows: Sequence[dict[str, Any]], columns: Sequence[str], out: TextIO | None = None
) -> None:
    out = out or sys.stdout
    if not rows:
        out.write("(none)\n")
        return
    cells = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    out.write("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    out.write("\n")
    for row in cells:
        out.write("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() + "\n")


def record(
    value: dict[str, Any],
    out: TextIO | None = None,
    skip: Sequence[str] = (),
    columns: int | None = None,
) -> None:
    """One object as ``key  value`` lines, each value whole: a long one (an error, a target,
    a retry policy) wraps onto lines indented past the keys, so nothing is cut and no value
    can start a line that reads as a key of its own."""
    out = out or sys.stdout
    keys = [k for k in value if k not in skip]
    width = max((len(k) for k in keys), default=0)
    total = columns if columns is not None else shutil.get_terminal_size((100, 24)).columns
    room = max(20, total - width - 2)  # a narrow terminal still gets readable chunks
    indent = " " * (width + 2)
    for k in keys:
        lines = textwrap.wrap(
            full_text(value[k]), room, break_on_hyphens=False, drop_whitespace=False
        ) or [""]
        out.write(f"{k.ljust(width)}  {lines[0]}".rstrip() + "\n")
        for line in lines[1:]:
            if line.strip():  # a chunk of trailing whitespace alone would be a blank line
                out.write(f"{indent}{line}".rstrip() + "\n")


def lines(text: str, out: TextIO | None = None, indent: str = "  ") -> None:
    """A multi-line text (a traceback) as its lines, each indented and escaped like a value:
    its line breaks are kept, and nothing in it can move the cursor or start a line that reads
    as ours."""
    out = out or sys.stdout
    for line in text.split("\n"):
        shown = _C1_AND_BIDI.sub(_escaped, escape_control(line))
        out.write(f"{indent}{shown}".rstrip() + "\n")


class Progress:
    """``[#####-----] 50/100 what`` redrawn in place on a terminal; one line per step otherwise."""

    def __init__(self, what: str, total: int | None, out: TextIO | None = None) -> None:
        self.what, self.total, self.out = what, total, out or sys.stderr
        self.done = 0
        self.tty = self.out.isatty()

    def advance(self, n: int) -> None:
        self.done += n
        if self.total:
            # the total was counted before the work: what arrived since (a replay that died
            # again) grows it rather than drawing 3/2
            self.total = max(self.total, self.done)
            filled = int(30 * min(1.0, self.done / self.total))
            line = f"[{'#' * filled}{'-' * (30 - filled)}] {self.done}/{self.total} {self.what}"
        else:
            line = f"{self.done} {self.what}"
        if self.tty:
            self.out.write("\r" + line)
        else:
            self.out.write(line + "\n")
        self.out.flush()

    def finish(self) -> None:
        if self.tty:
            self.out.write("\n")
            self.out.flush()
