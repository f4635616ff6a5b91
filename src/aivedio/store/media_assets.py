"""The asset row as the media jobs read and write it (table ``assets``).

The media jobs decide on more than the row: how often its source crashed a media job (the
poison rule), its generation task's provider status (a cancel), the provider's safety labels
of its output (what moderation is told), the provider it came from (whether provenance is
required) and the number its next revision takes.
``ASSET_COLUMNS`` reads them with the row, so none costs a round trip of its own. Status
changes go through ``store.records.transition``; what is here sets no status.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import asyncpg

from aivedio.store.database import Connection, Pool, map_db_errors
from aivedio.store.together import Part

# The asset's columns and what the media jobs decide on, from ``assets a``.
ASSET_COLUMNS = (
    "a.*, (SELECT count(*) FROM media_crashes c WHERE c.asset_id = a.id) AS media_crashes,"
    " (SELECT g.provider_status FROM provider_outputs o"
    "  JOIN generation_tasks g ON g.id = o.generation_task_id"
    "  WHERE o.id = a.source_provider_output_id) AS task_status,"
    " (SELECT o.safety_labels FROM provider_outputs o"
    "  WHERE o.id = a.source_provider_output_id) AS safety_labels,"
    " (SELECT o.provider FROM provider_outputs o"
    "  WHERE o.id = a.source_provider_output_id) AS source_provider,"
    " (SELECT o.captions FROM provider_outputs o"
    "  WHERE o.id = a.source_provider_output_id) AS provider_captions,"
    " (SELECT coalesce(max(r.revision), 0) + 1 FROM asset_revisions r"
    "  WHERE r.asset_id = a.id) AS next_revision,"
    " (SELECT t.name FROM tenants t WHERE t.id = a.tenant_id) AS tenant_name"
)
ASSET_ROW = f"SELECT {ASSET_COLUMNS} FROM assets a WHERE a.id = $1"
ASSET_AND_REVISION = (
    f"SELECT {ASSET_COLUMNS}, (SELECT to_jsonb(r) FROM asset_revisions r"
    "  WHERE r.asset_id = a.id AND r.revision = $2) AS revision_row,"
    " m.status AS mine_status, m.deferred_at AS mine_deferred_at"
    " FROM assets a LEFT JOIN asset_variants m ON m.asset_id = a.id"
    " AND m.revision = $2 AND m.variant_type = $3 WHERE a.id = $1"
)
PROVIDER_CHARGE = (
    "SELECT a.tenant_id, o.provider, o.provider_task_id FROM assets a"
    " JOIN provider_outputs o ON o.id = a.source_provider_output_id WHERE a.id = $1"
)
TENANT = "SELECT tenant_id FROM assets WHERE id = $1"
STILL_PROBING = "SELECT 1 FROM assets WHERE id = $1 AND status = 'PROBING'"
STATE = "SELECT status, tenant_id, source_provider_output_id FROM assets WHERE id = $1"
LOCK_STATE = "SELECT status, last_error_class FROM assets WHERE id = $1 FOR UPDATE"
SET_ERROR = (
    "UPDATE assets SET last_error_class = $2, last_error_detail = $3,"
    " updated_at = now() WHERE id = $1"
)
REFRESH_PROBE = "UPDATE assets SET probe = $2, updated_at = now() WHERE id = $1 RETURNING 1"


@asynccontextmanager
async def connection(
    pool: Pool, doing: str, *, transaction: bool = False
) -> AsyncIterator[Connection]:
    """A pooled connection (in a transaction with ``transaction``) whose driver errors,
    in taking it, in its block or at the commit, are a ``DatabaseError`` naming ``doing``."""
    with map_db_errors(doing):
        async with pool.acquire() as conn:
            if transaction:
                async with conn.transaction():
                    yield conn
            else:
                yield conn


def still_probing_part(asset_id: uuid.UUID) -> Part:
    """For ``write_fenced``: one row while the asset is still PROBING (no delivery of its
    probe has recorded its revision yet)."""
    return Part(STILL_PROBING, (asset_id,))


async def asset_row(pool: Pool, asset_id: uuid.UUID) -> asyncpg.Record | None:
    """The asset row with ``media_crashes``, ``task_status`` (None for an upload),
    ``next_revision`` and ``tenant_name`` (``ASSET_COLUMNS``); None when there is no such
    asset."""
    with map_db_errors("loading the asset"):
        row: asyncpg.Record | None = await pool.fetchrow(ASSET_ROW, asset_id)
    return row


async def asset_and_revision(
    pool: Pool, asset_id: uuid.UUID, revision: int, output: str
) -> asyncpg.Record | None:
    """``asset_row`` with ``revision_row`` (the revision as JSON, None when there is none),
    ``mine_status`` and ``mine_deferred_at`` (``output``'s variant), in one round trip."""
    with map_db_errors("loading the asset and its revision"):
        row: asyncpg.Record | None = await pool.fetchrow(
            ASSET_AND_REVISION, asset_id, revision, output
        )
    return row


async def provider_charge(conn: Connection, asset_id: uuid.UUID) -> asyncpg.Record | None:
    """The tenant, provider and provider task the asset's source was charged by (None for
    an upload)."""
    with map_db_errors("loading the provider charge"):
        row: asyncpg.Record | None = await conn.fetchrow(PROVIDER_CHARGE, asset_id)
    return row


async def tenant_of(conn: Connection, asset_id: uuid.UUID) -> Any:
    with map_db_errors("loading the asset's tenant"):
        return await conn.fetchval(TENANT, asset_id)


async def state(conn: Connection, asset_id: uuid.UUID) -> asyncpg.Record | None:
    """The asset's status, tenant and source provider output."""
    with map_db_errors("loading the asset's state"):
        row: asyncpg.Record | None = await conn.fetchrow(STATE, asset_id)
    return row


async def lock_state(conn: Connection, asset_id: uuid.UUID) -> asyncpg.Record | None:
    """The asset's status and last error class, its row locked for the transaction."""
    with map_db_errors("locking the asset"):
        row: asyncpg.Record | None = await conn.fetchrow(LOCK_STATE, asset_id)
    return row


async def set_error(
    conn: Connection, asset_id: uuid.UUID, error_class: Any, error_detail: Any
) -> None:
    """Record why the asset's remaining work will not come, its status unchanged."""
    with map_db_errors("recording the asset's error"):
        await conn.execute(SET_ERROR, asset_id, error_class, error_detail)


def refresh_probe_part(asset_id: uuid.UUID, probe: Mapping[str, Any]) -> Part:
    """For ``write_together``: the asset's probe result refreshed, its status unchanged."""
    return Part(REFRESH_PROBE, (asset_id, probe))
