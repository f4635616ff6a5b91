"""The crashes of media jobs over a source (table ``media_crashes``): one row per attempt
in which a sandboxed ffmpeg/ffprobe died of a crash signal (and one per media job whose
worker died holding its lease, written by the queue's reap). The poison rule counts them,
a worker's death once however many of the source's jobs it held (``of_asset``).
"""

from __future__ import annotations

import uuid

import asyncpg

from aivedio.store.database import Pool, map_db_errors

RECORD = (
    "INSERT INTO media_crashes (job_id, lease_token, asset_id, kind, cause, detail)"
    " VALUES ($1, $2, $3, $4, 'decoder_crashed', $5) ON CONFLICT DO NOTHING"
)
# A worker that died holding several media jobs of one source (the probe job of the fast
# path and the render of its enrichment, say) is one death, not one per job: the reap's
# rows name the lease owner (host, pid and a token of its own: a restarted worker is another
# owner) in their detail, and the rows of one owner count once. Their leases need not expire
# together (a job claimed after the last heartbeat has a lease of its own), so neither the
# reap statement nor its time tells one death from two.
OF_ASSET = (
    "SELECT job_id, kind, cause FROM (SELECT DISTINCT ON (death) job_id, kind, cause,"
    " created_at FROM (SELECT *, CASE WHEN cause = 'lease_expired' THEN detail"
    " ELSE job_id::text || ':' || lease_token::text END AS death FROM media_crashes"
    " WHERE asset_id = $1) c ORDER BY death, created_at, job_id) d"
    " ORDER BY created_at, job_id"
)


async def record_decoder_crash(
    pool: Pool, job_id: int, lease_token: object, asset_id: uuid.UUID, kind: str, detail: str
) -> None:
    """This attempt of the job crashed a decoder (once per attempt: its lease token)."""
    with map_db_errors("recording a media crash"):
        await pool.execute(RECORD, job_id, lease_token, asset_id, kind, detail)


async def of_asset(pool: Pool, asset_id: uuid.UUID) -> list[asyncpg.Record]:
    """The asset's crashes (``job_id``, ``kind``, ``cause``), oldest first."""
    with map_db_errors("loading media crashes"):
        return list(await pool.fetch(OF_ASSET, asset_id))
