"""Finding a tenant the way an operator names it: by name, or by id."""

from __future__ import annotations

from aivedio.store.database import Connection, map_db_errors

BY_NAME_SQL = "SELECT id FROM tenants WHERE name = $1"
BY_ID_SQL = "SELECT id FROM tenants WHERE id = $1"


async def tenant_id_by_name_or_id(conn: Connection, name_or_id: str) -> int | None:
    """By name first (a name may be all digits), then by id; None when neither is a tenant."""
    with map_db_errors("looking up a tenant"):
        found = await conn.fetchval(BY_NAME_SQL, name_or_id)
        if found is None and name_or_id.isdigit():
            found = await conn.fetchval(BY_ID_SQL, int(name_or_id))
    return None if found is None else int(found)
