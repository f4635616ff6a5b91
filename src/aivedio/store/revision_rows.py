"""An asset's revisions as the media jobs keep them (table ``asset_revisions``).

A revision is BUILDING from the probe that starts it until its required set is complete
(then publish makes it READY) or a required output fails. Status changes go through
``store.records.transition``; this module reads revisions, writes a new one and locks one.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import asyncpg

from aivedio.store.database import Connection, Pool, map_db_errors
from aivedio.store.together import Part

REVISION = "SELECT * FROM asset_revisions WHERE asset_id = $1 AND revision = $2"
BUILDING_REBUILD = (
    "SELECT revision FROM asset_revisions WHERE asset_id = $1 AND status = 'BUILDING'"
    " AND revision > coalesce($2, 0) AND enriches IS NULL"
)
NEXT_NUMBER = "SELECT coalesce(max(revision), 0) + 1 FROM asset_revisions WHERE asset_id = $1"
INSERT = (
    "INSERT INTO asset_revisions (asset_id, revision, pipeline_version, status,"
    " required_outputs, optional_outputs, plan, delete_version_at_start,"
    " cancel_version_at_start) SELECT $1::uuid, $2::int, $3::int, 'BUILDING',"
    " $4::text[], $5::text[], $6::jsonb, $7::bigint, $8::bigint"
    " WHERE {when} RETURNING 1"
)
# The fast path's revision: born with the moderator's decision in hand (the verdict the
# moderate job would store on it: ``moderation_verdicts.store_verdict``).
INSERT_DECIDED = (
    "INSERT INTO asset_revisions (asset_id, revision, pipeline_version, status,"
    " required_outputs, optional_outputs, plan, delete_version_at_start,"
    " cancel_version_at_start, moderation_verdict, moderation_version,"
    " moderation_reasons, moderated_at) SELECT $1::uuid, $2::int, $3::int, 'BUILDING',"
    " $4::text[], $5::text[], $6::jsonb, $7::bigint, $8::bigint, $9::text, $10::text,"
    " $11::jsonb, now() WHERE {when} RETURNING 1"
)
OUTPUTS_STATE = (
    "SELECT v.variant_type, v.status, r.required_outputs, r.status AS revision_status,"
    " r.moderation_verdict, a.tenant_id FROM asset_variants v"
    " JOIN asset_revisions r USING (asset_id, revision)"
    " JOIN assets a ON a.id = v.asset_id WHERE v.asset_id = $1 AND v.revision = $2"
)
BUILDING_COMPLETENESS = (
    "SELECT r.revision, r.required_outputs <@ coalesce((SELECT array_agg("
    "v.variant_type) FROM asset_variants v WHERE v.asset_id = r.asset_id AND"
    " v.revision = r.revision AND v.status = 'SUCCEEDED'), ARRAY[]::text[])"
    " AS complete FROM asset_revisions r WHERE r.asset_id = $1"
    " AND r.status = 'BUILDING'"
)
LOCK = "SELECT 1 FROM asset_revisions WHERE asset_id = $1 AND revision = $2 FOR UPDATE"


def wrote(part: str) -> str:
    """A ``when`` condition for a later part of ``write_together``: ``part`` wrote a row."""
    return f"EXISTS (SELECT 1 FROM {part})"


async def revision_row(pool: Pool, asset_id: uuid.UUID, revision: int) -> asyncpg.Record | None:
    """The revision's row (None when there is none)."""
    with map_db_errors("loading the revision"):
        row: asyncpg.Record | None = await pool.fetchrow(REVISION, asset_id, revision)
    return row


async def building_rebuild(
    pool: Pool, asset_id: uuid.UUID, current_revision: int | None
) -> int | None:
    """A rebuild of the asset still BUILDING past ``current_revision`` (not an enrichment)."""
    with map_db_errors("looking for a rebuild"):
        found: int | None = await pool.fetchval(BUILDING_REBUILD, asset_id, current_revision)
    return found


async def next_number(pool: Pool, asset_id: uuid.UUID) -> int:
    """The number the asset's next revision takes."""
    with map_db_errors("numbering the revision"):
        return int(await pool.fetchval(NEXT_NUMBER, asset_id))


def insert_part(
    asset_id: uuid.UUID,
    revision: int,
    pipeline_version: int,
    required: Sequence[str],
    optional: Sequence[str],
    plan: Any,
    delete_version: int,
    cancel_version: int,
    *,
    when: str,
    verdict: tuple[str, str, list[str]] | None = None,
) -> Part:
    """For ``write_together``: a new BUILDING revision, written only when ``when`` holds.
    ``verdict``: the moderator's decision in hand (decision, version, reasons), stored with
    it."""
    args: tuple[Any, ...] = (asset_id, revision, pipeline_version, required, optional, plan)
    args += (delete_version, cancel_version)
    if verdict is None:
        return Part(INSERT.format(when=when), args)
    return Part(INSERT_DECIDED.format(when=when), (*args, *verdict))


async def outputs_state(pool: Pool, asset_id: uuid.UUID, revision: int) -> list[asyncpg.Record]:
    """Each output of the revision with its status, and on every row the revision's required
    set, status and moderation verdict and the asset's tenant."""
    with map_db_errors("loading the revision's outputs"):
        return list(await pool.fetch(OUTPUTS_STATE, asset_id, revision))


async def building_completeness(conn: Connection, asset_id: uuid.UUID) -> list[asyncpg.Record]:
    """Each BUILDING revision of the asset and whether its required set is complete."""
    with map_db_errors("loading the building revisions"):
        return list(await conn.fetch(BUILDING_COMPLETENESS, asset_id))


async def lock(conn: Connection, asset_id: uuid.UUID, revision: int) -> None:
    """Lock the revision's row for the transaction."""
    with map_db_errors("locking the revision"):
        await conn.execute(LOCK, asset_id, revision)
