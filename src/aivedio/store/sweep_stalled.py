"""The sweeper's reads of work that stopped moving on the fetch side: fetches left FETCHING,
leases that expired, provider URLs about to expire, finished tasks with no output recorded,
watches whose poll job is gone, and the owners of multipart uploads still in use.

Each scan reads at most ``REPORT_LIMIT`` rows (the report keeps as many findings). The
queries run under ``map_db_errors`` named for their scan, as the sweeper names the scan.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import asyncpg

from aivedio.store.database import Pool, map_db_errors

REPORT_LIMIT = 500  # rows a scan reads, and findings the report keeps per scan

# A FETCHING output with no fetch job left alive (none, or only one whose lease expired:
# ``expired_job`` names it).
FETCHING_STALE = f"""
SELECT o.id, o.provider, o.updated_at,
       (SELECT j.id FROM jobs j WHERE j.kind = 'fetch' AND j.status = 'running'
          AND j.lease_until < $1 AND j.payload->>'provider_output_id' = o.id::text
        LIMIT 1) AS expired_job
FROM provider_outputs o
WHERE o.fetch_status = 'FETCHING'
  AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.kind = 'fetch'
                  AND j.payload->>'provider_output_id' = o.id::text
                  AND NOT (j.status = 'running' AND j.lease_until < $1))
ORDER BY o.updated_at LIMIT {REPORT_LIMIT}
"""
EXPIRED_LEASES = "SELECT id, kind, lane FROM jobs WHERE status = 'running' AND lease_until < $1"
NEAR_EXPIRY = f"""
SELECT id, provider, provider_task_id, fetch_status, source_url_expires_at
FROM provider_outputs
WHERE fetch_status NOT IN ('STORED', 'OUTPUT_LOST', 'INVALID_RESPONSE')
  AND source_url_expires_at < $1
ORDER BY source_url_expires_at LIMIT {REPORT_LIMIT}
"""
TASKS_WITHOUT_OUTPUT = f"""
SELECT g.id, g.provider, g.provider_task_id, g.updated_at FROM generation_tasks g
WHERE g.provider_status = 'PROVIDER_SUCCEEDED' AND g.updated_at < $1
  AND NOT EXISTS (SELECT 1 FROM provider_outputs o WHERE o.generation_task_id = g.id)
ORDER BY g.updated_at LIMIT {REPORT_LIMIT}
"""
# Watched, but the poll job is gone (it died: out of attempts, say), so nothing polls it.
ORPHANED_WATCHES = f"""
SELECT w.generation_task_id, w.provider, w.provider_task_id, w.round FROM task_watches w
WHERE w.status = 'WATCHING' AND w.updated_at < $1
  AND NOT EXISTS (SELECT 1 FROM jobs j
                  WHERE j.idempotency_key = 'poll:' || w.generation_task_id || ':r' || w.round)
ORDER BY w.updated_at LIMIT {REPORT_LIMIT}
"""
# $1 upload ids, $2 the owner segment of each upload's key (an output, video or asset id).
LIVE_UPLOAD_OWNERS = """
SELECT multipart_upload_id AS id FROM upload_sessions
 WHERE status = 'AWAITING_UPLOAD' AND multipart_upload_id = ANY($1::text[])
UNION
SELECT coalesce(payload->>'provider_output_id', payload->>'asset_id') FROM jobs
 WHERE coalesce(payload->>'provider_output_id', payload->>'asset_id') = ANY($2::text[])
"""


async def stale_fetches(pool: Pool, now: datetime) -> list[asyncpg.Record]:
    """Outputs FETCHING with no live fetch job as of ``now``."""
    with map_db_errors("sweeping fetching_stale"):
        return await pool.fetch(FETCHING_STALE, now)


async def expired_leases(pool: Pool, now: datetime) -> list[asyncpg.Record]:
    """Running jobs whose lease ended before ``now`` (what a reap would act on)."""
    with map_db_errors("sweeping fetching_stale"):
        return await pool.fetch(EXPIRED_LEASES, now)


async def outputs_near_expiry(pool: Pool, horizon: datetime) -> list[asyncpg.Record]:
    """Outputs not yet stored whose provider URL expires before ``horizon``."""
    with map_db_errors("sweeping near_expiry"):
        return await pool.fetch(NEAR_EXPIRY, horizon)


async def tasks_without_output(pool: Pool, settled: datetime) -> list[asyncpg.Record]:
    """Tasks PROVIDER_SUCCEEDED since before ``settled`` with no provider output."""
    with map_db_errors("sweeping tasks_without_output"):
        return await pool.fetch(TASKS_WITHOUT_OUTPUT, settled)


async def orphaned_watches(pool: Pool, settled: datetime) -> list[asyncpg.Record]:
    """WATCHING tasks, unchanged since before ``settled``, whose round's poll job is gone."""
    with map_db_errors("sweeping orphaned_watches"):
        return await pool.fetch(ORPHANED_WATCHES, settled)


async def live_upload_owners(
    pool: Pool, upload_ids: Sequence[str], owners: Sequence[str]
) -> set[str]:
    """Of these multipart upload ids and key owners, the ones still in use: an upload of a
    session awaiting its bytes, or an owner with a job."""
    with map_db_errors("sweeping stale_uploads"):
        rows = await pool.fetch(LIVE_UPLOAD_OWNERS, list(upload_ids), list(owners))
    return {r["id"] for r in rows}
