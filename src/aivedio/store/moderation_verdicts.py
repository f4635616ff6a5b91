"""Moderation verdicts: what the moderation stage reads of a revision and how a verdict is
stored with it. Every call runs inside ``map_db_errors``."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import asyncpg

from aivedio.store.database import Connection, Pool, map_db_errors


async def load_for_moderation(
    pool: Pool, asset_id: uuid.UUID, revision: int
) -> asyncpg.Record | None:
    """The revision's state and verdict, its asset's state, tenant and media summary, the
    provider's safety labels and the playback output's object key (None until it is done)."""
    with map_db_errors("reading the revision to moderate"):
        return await pool.fetchrow(
            "SELECT r.status, r.moderation_verdict, r.moderation_reasons,"
            " a.status AS asset_status, a.tenant_id,"
            " a.probe->'media' AS media, o.safety_labels,"
            " (SELECT object_key FROM asset_variants v WHERE v.asset_id = r.asset_id"
            "   AND v.revision = r.revision AND v.variant_type = 'playback'"
            "   AND v.status = 'SUCCEEDED') AS playback_key"
            " FROM asset_revisions r JOIN assets a ON a.id = r.asset_id"
            " LEFT JOIN provider_outputs o ON o.id = a.source_provider_output_id"
            " WHERE r.asset_id = $1 AND r.revision = $2",
            asset_id,
            revision,
        )


async def store_verdict(
    conn: Connection,
    asset_id: uuid.UUID,
    revision: int,
    decision: str,
    version: str,
    reasons: list[str],
    moderation_status: str,
) -> Any:
    """The verdict with a BUILDING revision not allowed or rejected yet, and the asset's
    moderation status, in one statement; None when the revision took no verdict."""
    with map_db_errors("recording a moderation verdict"):
        return await conn.fetchval(
            "WITH verdict AS (UPDATE asset_revisions SET moderation_verdict = $3,"
            "  moderation_version = $4, moderation_reasons = $5, moderated_at = now(),"
            "  version = version + 1, updated_at = now()"
            "  WHERE asset_id = $1 AND revision = $2 AND status = 'BUILDING'"
            "  AND moderation_verdict IS DISTINCT FROM 'allow'"
            "  AND moderation_verdict IS DISTINCT FROM 'reject' RETURNING 1)"
            " UPDATE assets SET moderation_status = $6, updated_at = now()"
            " WHERE id = $1 AND EXISTS (SELECT 1 FROM verdict) RETURNING 1",
            asset_id,
            revision,
            decision,
            version,
            reasons,
            moderation_status,
        )


async def asset_state(conn: Connection, asset_id: uuid.UUID) -> Any:
    with map_db_errors("recording a moderation verdict"):
        return await conn.fetchval("SELECT status FROM assets WHERE id = $1", asset_id)


async def retain_source_until(conn: Connection, asset_id: uuid.UUID, until: datetime) -> None:
    """A rejected asset's source is kept until ``until`` (appeal and audit)."""
    with map_db_errors("recording a moderation verdict"):
        await conn.execute(
            "UPDATE assets SET source_retain_until = $2 WHERE id = $1", asset_id, until
        )
