"""The pieces of a chunked revision (table ``media_pieces``): the split, the source's
chunks, each ``(chunk, rendition)`` encode and the audio, each moved PENDING → DONE once
(``states.Entity.PIECE``, through ``store.records.transition``).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import asyncpg

from aivedio.store.database import Connection, Pool, map_db_errors
from aivedio.store.together import Part

# The piece of the split itself: FAILED when the source could not be cut as planned.
SPLIT_PIECE = "split"

STATUS = "SELECT status FROM media_pieces WHERE asset_id = $1 AND revision = $2 AND piece = $3"
PIECE = "SELECT * FROM media_pieces WHERE asset_id = $1 AND revision = $2 AND piece = $3"
OF_REVISION = "SELECT * FROM media_pieces WHERE asset_id = $1 AND revision = $2"
INSERT_PENDING = (
    "INSERT INTO media_pieces (asset_id, revision, piece, status)"
    " SELECT $1::uuid, $2::int, p, 'PENDING' FROM unnest($3::text[]) AS t(p)"
    " WHERE {when} ON CONFLICT DO NOTHING RETURNING 1"
)
INSERT = (
    "INSERT INTO media_pieces (asset_id, revision, piece, status, object_key,"
    " size_bytes, sha256, frames) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
    " ON CONFLICT DO NOTHING"
)
UNFINISHED = (
    "SELECT count(*) FROM media_pieces WHERE asset_id = $1 AND revision = $2 AND status <> 'DONE'"
)
PENDING_AMONG = (
    "SELECT piece FROM media_pieces WHERE asset_id = $1 AND revision = $2"
    " AND status = 'PENDING' AND piece = ANY($3::text[])"
)


async def split_failed(pool: Pool, asset_id: uuid.UUID, revision: int) -> bool:
    """Whether this revision's split failed for good (its chunk outputs are then rendered
    by the single pass instead)."""
    with map_db_errors("loading the split's state"):
        status = await pool.fetchval(STATUS, asset_id, revision, SPLIT_PIECE)
    return bool(status == "FAILED")


async def piece_row(
    pool: Pool, asset_id: uuid.UUID, revision: int, piece: str
) -> asyncpg.Record | None:
    with map_db_errors("loading a piece"):
        row: asyncpg.Record | None = await pool.fetchrow(PIECE, asset_id, revision, piece)
    return row


async def of_revision(pool: Pool, asset_id: uuid.UUID, revision: int) -> list[asyncpg.Record]:
    """Every piece of the revision."""
    with map_db_errors("loading the pieces"):
        return list(await pool.fetch(OF_REVISION, asset_id, revision))


def insert_pending_part(
    asset_id: uuid.UUID, revision: int, pieces: Sequence[str], *, when: str
) -> Part:
    """For ``write_together``: PENDING pieces, written when ``when`` holds."""
    return Part(INSERT_PENDING.format(when=when), (asset_id, revision, list(pieces)))


async def insert(conn: Connection, rows: Sequence[tuple[Any, ...]]) -> None:
    """Pieces as rows of (asset, revision, piece, status, object key, size, sha256, frames);
    one recorded already is left as it is."""
    with map_db_errors("recording pieces"):
        await conn.executemany(INSERT, rows)


async def unfinished(conn: Connection, asset_id: uuid.UUID, revision: int) -> int:
    """How many of the revision's pieces are not DONE."""
    with map_db_errors("counting the pieces left"):
        return int(await conn.fetchval(UNFINISHED, asset_id, revision))


async def pending_among(
    pool: Pool, asset_id: uuid.UUID, revision: int, pieces: Sequence[str]
) -> list[str]:
    """Which of ``pieces`` are still PENDING."""
    with map_db_errors("loading the pending pieces"):
        rows = await pool.fetch(PENDING_AMONG, asset_id, revision, list(pieces))
    return [row["piece"] for row in rows]
