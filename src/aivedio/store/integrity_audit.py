"""The integrity audit's reads: a sample of published revisions, their outputs' records,
and whether a revision was already alerted. The queries run under ``map_db_errors``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import asyncpg

from aivedio.store.database import Connection, Pool, map_db_errors

# Current READY revisions of published assets, from a random id on, wrapping around.
AUDIT_SAMPLE = """
(SELECT a.id, a.tenant_id, a.current_revision AS revision, a.source_object_key,
        a.source_size_bytes, r.published_outputs
 FROM assets a JOIN asset_revisions r ON r.asset_id = a.id AND r.revision = a.current_revision
 WHERE a.status IN ('PLAYABLE', 'ENRICHED') AND r.status = 'READY' AND a.id >= $1
 ORDER BY a.id LIMIT $2)
UNION ALL
(SELECT a.id, a.tenant_id, a.current_revision, a.source_object_key, a.source_size_bytes,
        r.published_outputs
 FROM assets a JOIN asset_revisions r ON r.asset_id = a.id AND r.revision = a.current_revision
 WHERE a.status IN ('PLAYABLE', 'ENRICHED') AND r.status = 'READY' AND a.id < $1
 ORDER BY a.id LIMIT $2)
"""
AUDIT_VARIANTS = """
SELECT v.asset_id, v.variant_type, v.object_key, v.size_bytes, v.checksum, v.extra->'files' AS files
FROM asset_variants v JOIN unnest($1::uuid[], $2::int[]) AS s(asset_id, revision)
  ON v.asset_id = s.asset_id AND v.revision = s.revision
"""
ALERTED = """
SELECT coalesce(payload->>'rebuild_job_id', '') FROM outbox_events
WHERE aggregate_id = $1 AND event_type = $2 AND payload->>'revision' = $3 LIMIT 1
"""
CURRENT_REVISION_FOR_UPDATE = "SELECT current_revision FROM assets WHERE id = $1 FOR UPDATE"


async def audit_sample(pool: Pool, start: uuid.UUID, size: int) -> list[asyncpg.Record]:
    """Up to ``size`` published revisions from ``start`` on, then up to ``size`` before it."""
    with map_db_errors("sweeping integrity"):
        return list(await pool.fetch(AUDIT_SAMPLE, start, size))


async def audit_variants(
    pool: Pool, asset_ids: Sequence[uuid.UUID], revisions: Sequence[int]
) -> list[asyncpg.Record]:
    """The output records of each (asset, revision) pair."""
    with map_db_errors("sweeping integrity"):
        return await pool.fetch(AUDIT_VARIANTS, asset_ids, revisions)


async def lock_current_revision(conn: Connection, asset_id: uuid.UUID) -> Any:
    """The asset's current revision, its row locked until the transaction ends."""
    with map_db_errors("locking the asset of an integrity failure"):
        return await conn.fetchval(CURRENT_REVISION_FOR_UPDATE, asset_id)


async def alerted_rebuild(
    conn: Connection, asset_id: uuid.UUID, event_type: str, revision: int
) -> str | None:
    """None when the revision was never alerted; else its rebuild job id ('' for none)."""
    with map_db_errors("reading an earlier integrity alert"):
        found = await conn.fetchval(ALERTED, asset_id, event_type, str(revision))
    return None if found is None else str(found)
