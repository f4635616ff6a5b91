"""Ordered SQL migrations, each applied once in its own transaction.

Files named ``NNNN_name.sql`` beside this module are applied in order. Two processes running
``aivedio migrate`` at once serialise on a transaction-level advisory lock, and each re-reads
``schema_migrations`` after taking it, so neither applies a file twice.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources

from aivedio.errors import DatabaseError
from aivedio.store.database import Connection

# An arbitrary constant that names "the migration lock" among advisory locks.
MIGRATION_LOCK_ID = 0x41_49_56_45_44_49_4F  # "AIVEDIO"

CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    checksum    text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
)
"""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def available() -> list[Migration]:
    """Every migration shipped with the package, in order."""
    found: list[Migration] = []
    for entry in resources.files("aivedio.store").joinpath("sql", "migrations").iterdir():
        name = entry.name
        if not name.endswith(".sql"):
            continue
        version = int(name.split("_", 1)[0])
        found.append(Migration(version, name.removesuffix(".sql"), entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise DatabaseError("two migrations share a version number")
    return found


async def applied_versions(conn: Connection) -> dict[int, str]:
    exists = await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL")
    if not exists:
        return {}
    rows = await conn.fetch("SELECT version, checksum FROM schema_migrations")
    return {row["version"]: row["checksum"] for row in rows}


async def pending(conn: Connection) -> list[Migration]:
    done = await applied_versions(conn)
    return [m for m in available() if m.version not in done]


async def migrate(conn: Connection) -> list[Migration]:
    """Apply what is pending; return what this call applied. Safe to run concurrently."""
    await _create_table(conn)
    applied: list[Migration] = []
    for migration in available():
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK_ID)
            done = await applied_versions(conn)
            if migration.version in done:
                if done[migration.version] != migration.checksum:
                    raise DatabaseError(
                        f"migration {migration.name} was applied with different contents; "
                        "migrations are immutable once released"
                    )
                continue
            await conn.execute(migration.sql)
            await conn.execute(
                "INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
                migration.version,
                migration.name,
                migration.checksum,
            )
            applied.append(migration)
    return applied


async def _create_table(conn: Connection) -> None:
    # CREATE TABLE IF NOT EXISTS can still race on the catalog; take the lock for it too.
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK_ID)
        await conn.execute(CREATE_TABLE)
