"""What playback may open: the released revisions of servable assets and their published
variants. Read on every gateway request; ``api/published.py`` holds the rule around them."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import asyncpg

from aivedio.store.database import Pool, map_db_errors

# A released revision's storage revision (the one whose prefix holds its files: an
# enrichment's files live under the revision it enriches), for an asset in a servable state.
STORAGE_REVISION_SQL = (
    "SELECT coalesce(v.enriches, v.revision) FROM assets a"
    " JOIN releases r ON r.asset_id = a.id"
    " JOIN asset_revisions v ON v.asset_id = r.asset_id AND v.revision = r.revision"
    " WHERE a.id = $1 AND a.tenant_id = $2 AND r.revision = $3"
    " AND a.status = ANY($4::text[])"
)
PUBLISHED_VARIANTS_SQL = (
    "SELECT v.variant_type, v.object_key, v.mime_type, v.size_bytes, v.width, v.height,"
    " v.extra, v.checksum AS sha256, coalesce(r.enriches, r.revision) AS storage_revision"
    " FROM asset_variants v JOIN asset_revisions r USING (asset_id, revision)"
    " WHERE v.asset_id = $1 AND v.revision = $2 AND v.status = 'SUCCEEDED'"
    " AND v.variant_type = ANY(coalesce(r.published_outputs, ARRAY[]::text[]))"
)


async def released_storage_revision(
    pool: Pool, tenant_id: int, asset_id: uuid.UUID, revision: int, states: Sequence[str]
) -> int | None:
    """The storage revision of the tenant's released ``revision``, when the asset is in one
    of ``states``; None otherwise."""
    with map_db_errors("checking playback"):
        storage = await pool.fetchval(
            STORAGE_REVISION_SQL, asset_id, tenant_id, revision, list(states)
        )
    return None if storage is None else int(storage)


async def published_variants(
    pool: Pool, asset_id: uuid.UUID, revision: int
) -> list[asyncpg.Record]:
    """The revision's succeeded variants among its published outputs, each with the
    revision's ``storage_revision``."""
    with map_db_errors("reading published outputs"):
        return await pool.fetch(PUBLISHED_VARIANTS_SQL, asset_id, revision)
