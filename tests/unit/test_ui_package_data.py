"""Every file of the web dashboard is listed in pyproject.toml's package data, so a
non-editable ``pip install`` ships it (a file missed here is a 404 in production only)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
API = ROOT / "producers" / "api"


def test_every_dashboard_file_is_package_data() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["duetime.producers.api"]
    shipped = {p for pattern in patterns for p in API.glob(pattern) if p.is_file()}
    on_disk = {p for p in (API / "ui").rglob("*") if p.is_file()}
    assert on_disk, "no dashboard files found"
    assert on_disk - shipped == set(), "not in package data: " + ", ".join(
        sorted(str(p.relative_to(API)) for p in on_disk - shipped)
    )


def test_the_dashboard_loads_nothing_from_elsewhere() -> None:
    for path in (API / "ui").rglob("*"):
        if path.suffix in (".html", ".js", ".css"):
            text = path.read_text()
            assert "http://" not in text.replace("http://www.w3.org/2000/svg", ""), path
            assert "https://" not in text, path
            assert "innerHTML" not in text and "insertAdjacentHTML" not in text, path
