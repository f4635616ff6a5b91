"""What a playback token may open: the published revisions of live assets, per tenant.

Checked on every gateway request, not only when a token is issued: ``DELETE`` closes
playback at once (the asset is DELETED and nothing under it is served any more, whatever
tokens are out), and a revision that was never released is never served.

An enrichment revision n+1 references revision n's immutable objects (``pipeline/publish.py``):
its files live under n's prefix, its *storage revision*. Paths are relative to that prefix,
so a token for n+1 opens the same files its playlists name.
"""

from __future__ import annotations

import uuid
from typing import Any

from aivedio.store.database import Pool, map_db_errors
from aivedio.store.objects.keys import revision_prefix

SERVABLE_STATES = ("PLAYABLE", "ENRICHED")


async def is_servable(pool: Pool, tenant_id: int, asset_id: uuid.UUID, revision: int) -> bool:
    """The one servability rule is ``servable_prefix``'s; this only asks it."""
    return await servable_prefix(pool, tenant_id, asset_id, revision) is not None


async def servable_prefix(
    pool: Pool, tenant_id: int, asset_id: uuid.UUID, revision: int
) -> str | None:
    """The object-key prefix (with its trailing slash) holding the released revision's files,
    or None when the revision is not servable."""
    with map_db_errors("checking playback"):
        storage = await pool.fetchval(
            "SELECT coalesce(v.enriches, v.revision) FROM assets a"
            " JOIN releases r ON r.asset_id = a.id"
            " JOIN asset_revisions v ON v.asset_id = r.asset_id AND v.revision = r.revision"
            " WHERE a.id = $1 AND a.tenant_id = $2 AND r.revision = $3"
            " AND a.status = ANY($4::text[])",
            asset_id,
            tenant_id,
            revision,
            list(SERVABLE_STATES),
        )
    return None if storage is None else revision_prefix(tenant_id, asset_id, int(storage)) + "/"


async def published_files(
    pool: Pool, tenant_id: int, asset_id: uuid.UUID, revision: int
) -> dict[str, dict[str, Any]]:
    """The revision's published outputs: variant type → its primary file's path under the
    revision's storage prefix, and what else is known (size, width, height, extra)."""
    with map_db_errors("reading published outputs"):
        rows = await pool.fetch(
            "SELECT v.variant_type, v.object_key, v.mime_type, v.size_bytes, v.width, v.height,"
            " v.extra, coalesce(r.enriches, r.revision) AS storage_revision"
            " FROM asset_variants v JOIN asset_revisions r USING (asset_id, revision)"
            " WHERE v.asset_id = $1 AND v.revision = $2 AND v.status = 'SUCCEEDED'"
            " AND v.variant_type = ANY(coalesce(r.published_outputs, ARRAY[]::text[]))",
            asset_id,
            revision,
        )
    storage = rows[0]["storage_revision"] if rows else revision
    prefix = revision_prefix(tenant_id, asset_id, storage) + "/"
    return {
        row["variant_type"]: {
            "path": row["object_key"].removeprefix(prefix),
            "mime_type": row["mime_type"],
            "size_bytes": row["size_bytes"],
            "width": row["width"],
            "height": row["height"],
        }
        for row in rows
        if row["object_key"].startswith(prefix)
    }
