"""What a playback token may open: the published revisions of live assets, per tenant.

Checked on every gateway request, not only when a token is issued: ``DELETE`` closes
playback at once (the asset is DELETED and nothing under it is served any more, whatever
tokens are out), and a revision that was never released is never served.
"""

from __future__ import annotations

import uuid
from typing import Any

from aivedio.store.database import Pool, map_db_errors
from aivedio.store.keys import revision_prefix

SERVABLE_STATES = ("PLAYABLE", "ENRICHED")


async def is_servable(pool: Pool, tenant_id: int, asset_id: uuid.UUID, revision: int) -> bool:
    with map_db_errors("checking playback"):
        return bool(
            await pool.fetchval(
                "SELECT 1 FROM assets a JOIN releases r ON r.asset_id = a.id"
                " WHERE a.id = $1 AND a.tenant_id = $2 AND r.revision = $3"
                " AND a.status = ANY($4::text[])",
                asset_id,
                tenant_id,
                revision,
                list(SERVABLE_STATES),
            )
        )


async def published_files(
    pool: Pool, tenant_id: int, asset_id: uuid.UUID, revision: int
) -> dict[str, dict[str, Any]]:
    """The revision's published outputs: variant type → its primary file's path under the
    revision prefix, and what else is known (size, width, height, extra)."""
    prefix = revision_prefix(tenant_id, asset_id, revision) + "/"
    with map_db_errors("reading published outputs"):
        rows = await pool.fetch(
            "SELECT v.variant_type, v.object_key, v.mime_type, v.size_bytes, v.width, v.height,"
            " v.extra FROM asset_variants v JOIN asset_revisions r USING (asset_id, revision)"
            " WHERE v.asset_id = $1 AND v.revision = $2 AND v.status = 'SUCCEEDED'"
            " AND v.variant_type = ANY(coalesce(r.published_outputs, ARRAY[]::text[]))",
            asset_id,
            revision,
        )
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
