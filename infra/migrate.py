"""``duetime db migrate``: apply the versioned SQL migrations in ``infra/migrations`` once each.

Each migration runs in its own transaction together with the row that records it, under a
transaction-scoped advisory lock so two migrators started at once apply each file once.
Applying again is a no-op; an applied file whose content changed is refused (checksum).
"""

from __future__ import annotations

import hashlib
import logging
from importlib import resources

import psycopg

log = logging.getLogger("duetime.infra.migrate")

_LOCK_ID = 0x64756574  # "duet": serialises concurrent migrators of one database


def migration_files() -> list[tuple[str, str]]:
    """(name, sql) of every migration, in version order."""
    folder = resources.files("duetime.infra").joinpath("migrations")
    files = sorted(
        (entry.name, entry.read_text(encoding="utf-8"))
        for entry in folder.iterdir()
        if entry.name.endswith(".sql")
    )
    return files


def migrate(database_url: str) -> list[str]:
    """Apply pending migrations; returns the names applied now."""
    applied_now: list[str] = []
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            """CREATE TABLE IF NOT EXISTS schema_migrations (
                   name text PRIMARY KEY,
                   checksum text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now())"""
        )
        for name, sql in migration_files():
            checksum = hashlib.sha256(sql.encode()).hexdigest()
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_ID,))
                row = conn.execute(
                    "SELECT checksum FROM schema_migrations WHERE name = %s", (name,)
                ).fetchone()
                if row is not None:
                    if row[0] != checksum:
                        raise RuntimeError(
                            f"migration {name} was changed after it was applied; "
                            "add a new migration file instead"
                        )
                    continue
                conn.execute(sql.encode())  # a trusted file of the package, not user input
                conn.execute(
                    "INSERT INTO schema_migrations (name, checksum) VALUES (%s, %s)",
                    (name, checksum),
                )
                applied_now.append(name)
                log.info("applied migration %s", name)
    return applied_now
