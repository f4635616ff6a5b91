"""Tenants: every record belongs to one."""

from __future__ import annotations

from aivedio.errors import ConfigError, NotFoundError
from aivedio.store.database import Connection, map_db_errors


def _check_name(name: str) -> None:
    if not name or len(name) > 200 or not name.isprintable() or name != name.strip():
        raise ConfigError(f"tenant name {name!r}: 1-200 printable characters, no outer spaces")


async def create_tenant(conn: Connection, name: str) -> tuple[int, bool]:
    """Create a tenant; return (id, created). Creating an existing name returns its id."""
    _check_name(name)
    with map_db_errors("creating a tenant"):
        tenant_id = await conn.fetchval(
            "INSERT INTO tenants (name) VALUES ($1) ON CONFLICT (name) DO NOTHING RETURNING id",
            name,
        )
        if tenant_id is not None:
            return int(tenant_id), True
        existing = await conn.fetchval("SELECT id FROM tenants WHERE name = $1", name)
    return int(existing), False


async def tenant_id_by_name(conn: Connection, name: str) -> int:
    with map_db_errors("looking up a tenant"):
        tenant_id = await conn.fetchval("SELECT id FROM tenants WHERE name = $1", name)
    return found_tenant(name, tenant_id)


def found_tenant(name: str, tenant_id: object) -> int:
    """The id a lookup of tenant ``name`` found, or the operator's error for a missing one."""
    if tenant_id is None:
        raise NotFoundError(f"unknown tenant {name!r}; create it with `aivedio tenants create`")
    return int(str(tenant_id))
