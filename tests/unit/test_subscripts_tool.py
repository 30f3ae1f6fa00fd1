"""The subscript counter behind the README's figure and the gate in ./run test."""

from __future__ import annotations

from pathlib import Path

from duetime.infra.tools import subscripts


def test_counts_string_key_subscripts_in_every_position(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        'a = r["x"]\nr["y"] = 1\ndel r["z"]\nb = r[0]\nc = r[k]\nd = r.get("w")\n'
    )
    assert subscripts.subscripts(source) == [(1, "x"), (2, "y"), (3, "z")]


def test_the_repository_is_under_its_cap() -> None:
    assert subscripts.main(["--total", "--max", "100"]) == 0
