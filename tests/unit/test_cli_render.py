"""The CLI's tables show hostile user data inert: no terminal escape, newline, C1 control or
bidi override reaches the terminal as itself (pure: no server)."""

from __future__ import annotations

import io

from hypothesis import given
from hypothesis import strategies as st

from duetime.producers.cli import render

DANGEROUS = {chr(c) for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))} | {
    "\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069"
}  # fmt: skip
SAFE = {"\t"}  # a tab is shown as itself: harmless in a table


@given(st.text(alphabet=st.sampled_from([*sorted(DANGEROUS), "a", "[", "2", "J"]), max_size=30))
def test_no_control_character_reaches_the_terminal(name: str) -> None:
    out = io.StringIO()
    render.table([{"name": name, "status": name}], ("name", "status"), out=out)
    render.record({"name": name}, out=out)
    shown = out.getvalue()
    assert not (set(shown) & (DANGEROUS - SAFE - {"\n"})), repr(shown)
    assert shown.count("\n") == 3  # header + one row + one record line: no injected lines


def test_an_escape_is_shown_escaped() -> None:
    assert render.cell("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert render.cell("x\u202ey") == "x\\u202ey"
