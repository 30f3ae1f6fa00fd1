"""``render.lines``: a traceback printed by ``duetime executions get``, one output line per
line of the text, each indented and inert (no control character, C1 control, bidi override
or line separator reaches the terminal), nothing cut."""

from __future__ import annotations

import io
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.producers.cli import render

_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f\u0080-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


@given(st.lists(st.text(), min_size=1, max_size=8))
@settings(max_examples=200)
def test_each_line_is_one_indented_inert_line(lines: list[str]) -> None:
    out = io.StringIO()
    render.lines("\n".join(lines), out)
    printed = out.getvalue().split("\n")
    assert printed[-1] == ""  # ends with a line break
    assert len(printed) - 1 == sum(1 + line.count("\n") for line in lines)
    for line in printed[:-1]:
        assert line == "" or line.startswith("  ")
        assert not _UNSAFE.search(line), line  # a tab may stay: it moves nothing


def test_a_traceback_keeps_its_shape() -> None:
    out = io.StringIO()
    render.lines('Traceback:\n  File "t.py", line 1, in f\nValueError: \x1b[2J<b>', out)
    assert out.getvalue() == (
        '  Traceback:\n    File "t.py", line 1, in f\n  ValueError: \\x1b[2J<b>\n'
    )
