"""A revision's outputs as rows (table ``asset_variants``): one per output, PENDING until
its files are uploaded and verified (SUCCEEDED) or it can no longer be made (FAILED).

Every status change here is checked against the table in ``aivedio.states``
(``check_transition``) before its statement runs: these move many rows at once, each a
compare-and-set on ``status = 'PENDING'``, which ``store.records.transition`` (one row)
cannot express.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import asyncpg
import msgspec

from aivedio.states import Entity
from aivedio.store.database import Connection, Pool, map_db_errors
from aivedio.store.records import check_transition
from aivedio.store.together import Part

MADE_ONE = (
    "SELECT object_key, size_bytes, checksum AS sha256 FROM asset_variants WHERE asset_id = $1"
    " AND revision = $2 AND variant_type = $3 AND status = 'SUCCEEDED'"
)
# Outputs made and verified before their revision existed (the probe job's fast path):
# inserted SUCCEEDED with the columns ``SUCCEED`` would set.
INSERT_MADE = (
    "INSERT INTO asset_variants (id, asset_id, revision, variant_type, object_key,"
    " mime_type, size_bytes, checksum_alg, checksum, status, width, height, codec, bitrate,"
    " extra, completed_at) SELECT gen_random_uuid(), $1, $2, u.variant_type, u.object_key,"
    " u.mime_type, u.size_bytes, 'sha256', u.checksum, 'SUCCEEDED', u.width, u.height,"
    " u.codec, u.bitrate, u.extra, now()"
    " FROM unnest($3::text[], $4::text[], $5::text[], $6::bigint[], $7::text[],"
    "  $8::int[], $9::int[], $10::text[], $11::bigint[], $12::jsonb[])"
    "  AS u(variant_type, object_key, mime_type, size_bytes, checksum, width, height,"
    "  codec, bitrate, extra) WHERE {when} RETURNING 1"
)
INSERT_PENDING = (
    "INSERT INTO asset_variants (id, asset_id, revision, variant_type, object_key,"
    " mime_type, size_bytes, checksum_alg, checksum, status) SELECT"
    " gen_random_uuid(), $1, $2, o.variant_type, o.object_key, o.mime_type, 0,"
    " 'sha256', '', 'PENDING' FROM unnest($3::text[], $4::text[], $5::text[])"
    " AS o(variant_type, object_key, mime_type) WHERE {when} RETURNING 1"
)
PENDING = (
    "SELECT variant_type FROM asset_variants WHERE asset_id = $1 AND revision = $2"
    " AND status = 'PENDING'"
)
PENDING_AMONG = (
    "SELECT variant_type FROM asset_variants WHERE asset_id = $1"
    " AND revision = $2 AND status = 'PENDING' AND variant_type = ANY($3::text[])"
)
PENDING_WITH_OVERDUE = (
    "SELECT variant_type, deferred_at IS NOT NULL AND deferred_at < now()"
    " - make_interval(secs => $3) AS overdue FROM asset_variants WHERE asset_id = $1"
    " AND revision = $2 AND status = 'PENDING'"
)
DEFER = (
    "UPDATE asset_variants SET deferred_at = now() WHERE asset_id = $1"
    " AND revision = $2 AND variant_type = ANY($3::text[]) AND status = 'PENDING'"
    " AND deferred_at IS NULL RETURNING variant_type"
)
FAIL_ONE = (
    "UPDATE asset_variants SET status = 'FAILED', extra = $4, completed_at = now()"
    " WHERE asset_id = $1 AND revision = $2 AND variant_type = $3"
    " AND status = 'PENDING'"
)
FAIL_REVISION = (
    "UPDATE asset_variants SET status = 'FAILED', extra = $3, completed_at = now()"
    " WHERE asset_id = $1 AND revision = $2 AND status = 'PENDING'"
    " RETURNING variant_type"
)
FAIL_ASSET = (
    "UPDATE asset_variants SET status = 'FAILED', extra = $2, completed_at = now()"
    " WHERE asset_id = $1 AND status = 'PENDING' RETURNING revision, variant_type"
)
SUCCEED = (
    "UPDATE asset_variants v SET status = 'SUCCEEDED', object_key = u.object_key,"
    " mime_type = u.mime_type, size_bytes = u.size_bytes, checksum = u.checksum,"
    " width = u.width, height = u.height, codec = u.codec, bitrate = u.bitrate,"
    " extra = u.extra, completed_at = $13"
    " FROM unnest($3::text[], $4::text[], $5::text[], $6::bigint[], $7::text[],"
    "  $8::int[], $9::int[], $10::text[], $11::bigint[], $12::jsonb[])"
    "  AS u(variant_type, object_key, mime_type, size_bytes, checksum, width, height,"
    "  codec, bitrate, extra)"
    " WHERE v.asset_id = $1 AND v.revision = $2 AND v.variant_type = u.variant_type"
    " AND v.status = 'PENDING' RETURNING v.variant_type"
)


def insert_pending_part(
    asset_id: uuid.UUID,
    revision: int,
    outputs: Sequence[str],
    object_keys: Sequence[str],
    mime_types: Sequence[str],
    *,
    when: str,
) -> Part:
    """For ``write_together``: one PENDING variant per output, written when ``when`` holds."""
    return Part(
        INSERT_PENDING.format(when=when),
        (asset_id, revision, list(outputs), list(object_keys), list(mime_types)),
    )


def insert_made_part(
    asset_id: uuid.UUID, revision: int, columns: Sequence[Sequence[Any]], *, when: str
) -> Part:
    """For ``write_together``: outputs already made, uploaded and verified, as SUCCEEDED
    variants of a revision the same statement starts. ``columns``: as ``succeed``'s. The
    row never was PENDING; what it records is that move's."""
    check_transition(Entity.VARIANT, "PENDING", "SUCCEEDED")
    return Part(INSERT_MADE.format(when=when), (asset_id, revision, *columns))


async def made_one(
    pool: Pool, asset_id: uuid.UUID, revision: int, variant_type: str
) -> asyncpg.Record | None:
    """One output of the revision if it SUCCEEDED: ``object_key``, ``size_bytes``, ``sha256``
    (the columns ``media_objects.download_piece`` checks a download against)."""
    with map_db_errors("loading an output"):
        row: asyncpg.Record | None = await pool.fetchrow(MADE_ONE, asset_id, revision, variant_type)
    return row


async def pending(pool: Pool, asset_id: uuid.UUID, revision: int) -> list[str]:
    """The revision's outputs still PENDING."""
    with map_db_errors("loading the pending outputs"):
        rows = await pool.fetch(PENDING, asset_id, revision)
    return [row["variant_type"] for row in rows]


async def pending_among(
    db: Pool | Connection, asset_id: uuid.UUID, revision: int, outputs: Sequence[str]
) -> list[str]:
    """Which of ``outputs`` are still PENDING."""
    with map_db_errors("loading the pending outputs"):
        rows = await db.fetch(PENDING_AMONG, asset_id, revision, list(outputs))
    return [row["variant_type"] for row in rows]


async def pending_with_overdue(
    pool: Pool, asset_id: uuid.UUID, revision: int, defer_max_seconds: float
) -> list[asyncpg.Record]:
    """The PENDING outputs (``variant_type``), each with ``overdue``: deferred for longer
    than ``defer_max_seconds``."""
    with map_db_errors("loading the pending outputs"):
        return list(await pool.fetch(PENDING_WITH_OVERDUE, asset_id, revision, defer_max_seconds))


async def defer(
    pool: Pool, asset_id: uuid.UUID, revision: int, outputs: Sequence[str]
) -> list[str]:
    """Mark PENDING outputs deferred; returns those marked now (not marked before)."""
    with map_db_errors("deferring outputs"):
        rows = await pool.fetch(DEFER, asset_id, revision, list(outputs))
    return [row["variant_type"] for row in rows]


async def fail_one(
    pool: Pool, asset_id: uuid.UUID, revision: int, output: str, extra: dict[str, Any]
) -> None:
    """``output`` FAILED, if still PENDING."""
    check_transition(Entity.VARIANT, "PENDING", "FAILED")
    with map_db_errors("failing an output"):
        async with pool.acquire() as conn:
            await conn.execute(FAIL_ONE, asset_id, revision, output, extra)


async def fail_revision(
    pool: Pool, asset_id: uuid.UUID, revision: int, extra: dict[str, Any]
) -> list[str]:
    """Every output of the revision still PENDING FAILED; returns them."""
    check_transition(Entity.VARIANT, "PENDING", "FAILED")
    with map_db_errors("failing the pending outputs"):
        async with pool.acquire() as conn:
            rows = await conn.fetch(FAIL_REVISION, asset_id, revision, extra)
    return [row["variant_type"] for row in rows]


async def fail_asset(
    conn: Connection, asset_id: uuid.UUID, extra: dict[str, Any]
) -> list[asyncpg.Record]:
    """Every output of every revision of the asset still PENDING FAILED; returns them
    (``revision``, ``variant_type``)."""
    check_transition(Entity.VARIANT, "PENDING", "FAILED")
    with map_db_errors("failing the asset's pending outputs"):
        return list(await conn.fetch(FAIL_ASSET, asset_id, extra))


def succeed_parts(
    asset_id: uuid.UUID, revision: int, columns: Sequence[Sequence[Any]]
) -> dict[str, Part]:
    """``succeed`` as parts of a caller's statement: ``recorded`` moves the rows,
    ``recorded_types`` answers the variant types moved (``moved``)."""
    check_transition(Entity.VARIANT, "PENDING", "SUCCEEDED")
    return {
        "recorded": Part(SUCCEED, (asset_id, revision, *columns, datetime.now(UTC))),
        "recorded_types": Part(
            "SELECT json_agg(variant_type)::text AS types FROM recorded", (), value="types"
        ),
    }


def moved(got: Mapping[str, Any]) -> list[str]:
    """The variant types ``succeed_parts`` moved, from the statement's answers."""
    text = got.get("recorded_types")
    return [str(name) for name in msgspec.json.decode(text)] if text else []


async def succeed(
    pool: Pool,
    asset_id: uuid.UUID,
    revision: int,
    columns: Sequence[Sequence[Any]],
    completed_at: datetime,
) -> set[str]:
    """Move PENDING variants to SUCCEEDED in one statement (a CAS per row); returns the
    variant types moved. ``columns``: one list per column of ``SUCCEED``'s ``u`` (variant
    type, object key, MIME type, size, checksum, width, height, codec, bitrate, extra)."""
    check_transition(Entity.VARIANT, "PENDING", "SUCCEEDED")
    with map_db_errors("recording outputs"):
        moved = await pool.fetch(SUCCEED, asset_id, revision, *columns, completed_at)
    return {row["variant_type"] for row in moved}
