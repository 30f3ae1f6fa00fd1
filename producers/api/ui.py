"""The web dashboard: static files (plain ES modules, no build step) served at ``/ui``.

The dashboard reads and writes only through the public ``/v1`` routes, with the bearer token
the operator types in (kept in the browser's sessionStorage). Its files ship inside the
package (``producers/api/ui/``), so nothing is fetched from elsewhere at run time; the
Content-Security-Policy below forbids it anyway, and forbids inline scripts, so a job name
that holds markup can never run.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

UI_DIR = Path(__file__).resolve().parent / "ui"

HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # a new release's files are picked up at once; they are small
    "Cache-Control": "no-cache",
}


class DashboardFiles(StaticFiles):
    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(HEADERS)
        return response


def install(app: FastAPI) -> None:
    """Serve the dashboard at /ui (and send / there)."""
    app.mount("/ui", DashboardFiles(directory=UI_DIR, html=True), name="ui")

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse("/ui/")
