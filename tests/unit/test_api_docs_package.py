"""The API docs' Swagger UI files are package data, and the /docs page loads nothing from
elsewhere (pure: no server)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
API = ROOT / "producers" / "api"


def test_every_docs_file_is_package_data_and_the_docs_page_loads_nothing_from_elsewhere() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["duetime.producers.api"]
    shipped = {p for pattern in patterns for p in API.glob(pattern) if p.is_file()}
    on_disk = {p for p in (API / "swagger").rglob("*") if p.is_file()}
    assert {p.name for p in on_disk} >= {"swagger-ui-bundle.js", "swagger-ui.css", "init.js"}
    assert on_disk - shipped == set(), "not in package data: " + ", ".join(
        sorted(str(p.relative_to(API)) for p in on_disk - shipped)
    )
    from duetime.producers.api.docs import PAGE

    assert "http://" not in PAGE and "https://" not in PAGE and "<script>" not in PAGE
    assert "sourceMappingURL" not in (API / "swagger" / "swagger-ui.css").read_text()
