"""The crashes of media jobs over a source (table ``media_crashes``): one row per attempt
in which a sandboxed ffmpeg/ffprobe died of a crash signal (and one per media job whose
worker died holding its lease, written by the queue's reap). The poison rule counts them.
"""

from __future__ import annotations

import uuid

import asyncpg

from aivedio.store.database import Pool, map_db_errors

RECORD = (
    "INSERT INTO media_crashes (job_id, lease_token, asset_id, kind, cause, detail)"
    " VALUES ($1, $2, $3, $4, 'decoder_crashed', $5) ON CONFLICT DO NOTHING"
)
OF_ASSET = (
    "SELECT job_id, kind, cause FROM media_crashes WHERE asset_id = $1 ORDER BY created_at, job_id"
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
