"""Read-only asset queries for the API and the operator's commands.

A query that takes a tenant answers a missing asset and another tenant's asset alike (None),
so ids cannot be probed across tenants. Each function names its action the way the caller's
error reads ("reading the asset: …") and returns the driver's rows as they are.
"""

from __future__ import annotations

import uuid
from typing import NamedTuple

import asyncpg

from aivedio.store.database import Pool, map_db_errors

TENANT_ASSET_SQL = (
    "SELECT a.*, o.generation_task_id, aivedio_passthrough(a.id) AS passthrough FROM assets a"
    " LEFT JOIN provider_outputs o ON o.id = a.source_provider_output_id"
    " WHERE a.id = $1 AND a.tenant_id = $2"
)
OWNED_SQL = "SELECT 1 FROM assets WHERE id = $1 AND tenant_id = $2"
TENANT_STATE_SQL = "SELECT status, current_revision FROM assets WHERE id = $1 AND tenant_id = $2"
STATUS_SQL = "SELECT status FROM assets WHERE id = $1"
OWNER_SQL = "SELECT tenant_id FROM assets WHERE id = $1"
TENANT_AND_STATUS_SQL = "SELECT tenant_id, status FROM assets WHERE id = $1"
LIST_SQL = (
    "SELECT id, tenant_id, source_type, status, current_revision, width, height,"
    " duration_us, video_codec, last_error_class, last_error_detail, created_at"
    " FROM assets WHERE ($1::text IS NULL OR status = $1)"
    " ORDER BY created_at DESC LIMIT $2"
)
DETAIL_SQL = (
    "SELECT id, tenant_id, source_type, status, current_revision,"
    " source_object_key, source_size_bytes, source_sha256, width, height,"
    " duration_us, video_codec, audio_codec, moderation_status,"
    " last_error_class, last_error_detail, probe->'reasons' AS reasons,"
    " created_at, updated_at FROM assets WHERE id = $1"
)
REVISIONS_SQL = (
    "SELECT revision, pipeline_version, status, required_outputs,"
    " optional_outputs, plan->>'mode' AS mode, created_at, published_at"
    " FROM asset_revisions WHERE asset_id = $1 ORDER BY revision"
)
VARIANTS_SQL = (
    "SELECT revision, variant_type, status, object_key, mime_type, size_bytes,"
    " checksum, width, height, codec, bitrate, extra->>'error' AS error,"
    " extra->'total_bytes' AS total_bytes, deferred_at FROM asset_variants"
    " WHERE asset_id = $1 ORDER BY revision, variant_type"
)
CRASHES_SQL = (
    "SELECT job_id, kind, cause, detail, created_at FROM media_crashes"
    " WHERE asset_id = $1 ORDER BY created_at, job_id"
)
IN_REVIEW_SQL = (
    "SELECT r.revision, a.tenant_id FROM asset_revisions r JOIN assets a"
    " ON a.id = r.asset_id WHERE r.asset_id = $1 AND r.status = 'BUILDING'"
    " AND r.moderation_verdict = 'review' ORDER BY r.revision DESC LIMIT 1"
)


class AssetDetail(NamedTuple):
    """An asset in full, as ``aivedio assets show`` prints it."""

    asset: asyncpg.Record
    revisions: list[asyncpg.Record]
    variants: list[asyncpg.Record]
    crashes: list[asyncpg.Record]


async def tenant_asset(pool: Pool, tenant_id: int, asset_id: uuid.UUID) -> asyncpg.Record | None:
    """The tenant's asset row with the generation task it came from (if any)."""
    with map_db_errors("reading the asset"):
        return await pool.fetchrow(TENANT_ASSET_SQL, asset_id, tenant_id)


async def passthrough(pool: Pool, asset_id: uuid.UUID) -> str | None:
    """The client's passthrough of the video or the task the asset came from."""
    with map_db_errors("reading the passthrough"):
        found: str | None = await pool.fetchval("SELECT aivedio_passthrough($1)", asset_id)
    return found


async def tenant_owns_asset(pool: Pool, tenant_id: int, asset_id: uuid.UUID) -> bool:
    with map_db_errors("reading the asset"):
        owned = await pool.fetchval(OWNED_SQL, asset_id, tenant_id)
    return bool(owned)


async def tenant_asset_state(
    pool: Pool, tenant_id: int, asset_id: uuid.UUID
) -> asyncpg.Record | None:
    """The tenant's asset's ``status`` and ``current_revision``."""
    with map_db_errors("reading the asset"):
        return await pool.fetchrow(TENANT_STATE_SQL, asset_id, tenant_id)


async def asset_state(pool: Pool, asset_id: uuid.UUID) -> str | None:
    """The asset's status, whoever owns it; None when there is no asset (yet)."""
    with map_db_errors("reading the asset"):
        state = await pool.fetchval(STATUS_SQL, asset_id)
    return None if state is None else str(state)


async def asset_owner(pool: Pool, asset_id: uuid.UUID) -> int | None:
    """The tenant the asset belongs to; None when there is no such asset."""
    with map_db_errors("reading the asset"):
        owner = await pool.fetchval(OWNER_SQL, asset_id)
    return None if owner is None else int(owner)


async def asset_tenant_and_status(pool: Pool, asset_id: uuid.UUID) -> asyncpg.Record | None:
    """The asset's ``tenant_id`` and ``status``."""
    with map_db_errors("enqueuing the reprocess"):
        return await pool.fetchrow(TENANT_AND_STATUS_SQL, asset_id)


async def list_assets(pool: Pool, status: str | None, limit: int) -> list[asyncpg.Record]:
    """Assets newest first, of one status or all."""
    with map_db_errors("listing assets"):
        return await pool.fetch(LIST_SQL, status, limit)


async def asset_detail(pool: Pool, asset_id: uuid.UUID) -> AssetDetail | None:
    """The asset, its revisions, its variants and its media crashes; None when there is no
    such asset (then nothing else is read)."""
    with map_db_errors("reading the asset"):
        asset = await pool.fetchrow(DETAIL_SQL, asset_id)
        if asset is None:
            return None
        revisions = await pool.fetch(REVISIONS_SQL, asset_id)
        variants = await pool.fetch(VARIANTS_SQL, asset_id)
        crashes = await pool.fetch(CRASHES_SQL, asset_id)
    return AssetDetail(asset, revisions, variants, crashes)


async def revision_in_review(pool: Pool, asset_id: uuid.UUID) -> asyncpg.Record | None:
    """The newest revision still building whose moderation waits in review: its
    ``revision`` and the asset's ``tenant_id``."""
    with map_db_errors("recording the verdict"):
        return await pool.fetchrow(IN_REVIEW_SQL, asset_id)
