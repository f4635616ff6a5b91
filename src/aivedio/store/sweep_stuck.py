"""The sweeper's reads and writes for assets with no live job left to move them: assets
stuck probing or building, rebuilds of published assets whose jobs are gone, published
revisions whose optional outputs never finished, and the job a stage key once made.

The queries run under ``map_db_errors`` named for the ``stuck_assets`` scan.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import asyncpg

from aivedio.states import Entity
from aivedio.store.database import Connection, Pool, map_db_errors
from aivedio.store.records import check_transition
from aivedio.store.sweep_stalled import REPORT_LIMIT

ACTION = "sweeping stuck_assets"

STUCK_ASSETS = f"""
SELECT a.id, a.tenant_id, a.status, a.updated_at FROM assets a
WHERE a.status IN ('QUARANTINED', 'PROBING', 'PROCESSING') AND a.updated_at < $1
  AND a.moderation_status IS DISTINCT FROM 'REVIEW'
  AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.payload->>'asset_id' = a.id::text)
ORDER BY a.updated_at LIMIT {REPORT_LIMIT}
"""
# Published, and rebuilding (reprocess) into a newer revision whose jobs are all gone.
STUCK_REBUILDS = f"""
SELECT a.id, a.tenant_id, a.status FROM assets a
WHERE a.status IN ('PLAYABLE', 'ENRICHED')
  AND EXISTS (SELECT 1 FROM asset_revisions r WHERE r.asset_id = a.id AND r.status = 'BUILDING'
              AND r.enriches IS NULL AND r.updated_at < $1)
  AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.payload->>'asset_id' = a.id::text)
LIMIT {REPORT_LIMIT}
"""
# Published, with optional outputs that will never finish (their render jobs are gone).
STUCK_ENRICHMENT = f"""
SELECT a.id, a.tenant_id, r.revision FROM assets a
JOIN asset_revisions r ON r.asset_id = a.id AND r.revision = a.current_revision
WHERE a.status = 'PLAYABLE' AND r.status = 'READY' AND r.published_at < $1
  AND EXISTS (SELECT 1 FROM asset_variants v WHERE v.asset_id = r.asset_id
              AND v.revision = r.revision AND v.status = 'PENDING')
  AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.payload->>'asset_id' = a.id::text)
LIMIT {REPORT_LIMIT}
"""
LATEST_REVISION = """
SELECT revision, status, required_outputs, moderation_verdict FROM asset_revisions
WHERE asset_id = $1 AND enriches IS NULL ORDER BY revision DESC LIMIT 1
"""
VARIANT_STATES = (
    "SELECT variant_type, status FROM asset_variants WHERE asset_id = $1 AND revision = $2"
)
# Variants have no version column; the PENDING guard makes this a CAS (as in media_stage).
# A set-based PENDING -> FAILED, checked against the transition table before it runs.
FAIL_PENDING_VARIANTS = """
UPDATE asset_variants SET status = 'FAILED', extra = $3
WHERE asset_id = $1 AND revision = $2 AND status = 'PENDING' RETURNING variant_type
"""
JOB_FOR_KEY = """
SELECT k.job_id, coalesce(j.status, h.status) AS status,
       coalesce(j.last_error_class, h.last_error_class) AS error_class
FROM job_keys k LEFT JOIN jobs j ON j.id = k.job_id LEFT JOIN job_history h ON h.id = k.job_id
WHERE k.idempotency_key = $1
"""


async def stuck_assets(pool: Pool, cutoff: datetime) -> list[asyncpg.Record]:
    """Unpublished assets unchanged since before ``cutoff`` with no job (a moderator's
    review is not stuck), then published assets whose rebuild has no job left."""
    with map_db_errors(ACTION):
        return [
            *await pool.fetch(STUCK_ASSETS, cutoff),
            *await pool.fetch(STUCK_REBUILDS, cutoff),
        ]


async def stuck_enrichment(pool: Pool, cutoff: datetime) -> list[asyncpg.Record]:
    """Current revisions published before ``cutoff`` with PENDING outputs and no job."""
    with map_db_errors(ACTION):
        return await pool.fetch(STUCK_ENRICHMENT, cutoff)


async def latest_revision(pool: Pool, asset_id: uuid.UUID) -> asyncpg.Record | None:
    """The asset's newest revision that is not an enrichment, or None."""
    with map_db_errors(ACTION):
        return await pool.fetchrow(LATEST_REVISION, asset_id)


async def variant_states(pool: Pool, asset_id: uuid.UUID, revision: int) -> list[asyncpg.Record]:
    """(variant_type, status) of every output of the revision."""
    with map_db_errors(ACTION):
        return await pool.fetch(VARIANT_STATES, asset_id, revision)


async def fail_pending_variants(
    pool: Pool, asset_id: uuid.UUID, revision: int, extra: dict[str, Any]
) -> list[str]:
    """Every PENDING output of the revision FAILED, ``extra`` recorded; the types moved."""
    check_transition(Entity.VARIANT, "PENDING", "FAILED")
    with map_db_errors(ACTION):
        rows = await pool.fetch(FAIL_PENDING_VARIANTS, asset_id, revision, extra)
    return [r["variant_type"] for r in rows]


async def job_for_key(conn: Connection, idempotency_key: str) -> asyncpg.Record | None:
    """The job (live or in history) that ``idempotency_key`` made: job_id, status and
    error_class; None when the key was never used."""
    with map_db_errors(ACTION):
        return await conn.fetchrow(JOB_FOR_KEY, idempotency_key)
