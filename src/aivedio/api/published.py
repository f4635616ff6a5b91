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

from aivedio.pipeline.media.text_tracks import decode_tracks
from aivedio.store.database import Pool
from aivedio.store.objects.keys import revision_prefix
from aivedio.store.playback_reads import published_variants, released_storage_revision

SERVABLE_STATES = ("PLAYABLE", "ENRICHED")


async def is_servable(pool: Pool, tenant_id: int, asset_id: uuid.UUID, revision: int) -> bool:
    """The one servability rule is ``servable_prefix``'s; this only asks it."""
    return await servable_prefix(pool, tenant_id, asset_id, revision) is not None


async def servable_prefix(
    pool: Pool, tenant_id: int, asset_id: uuid.UUID, revision: int
) -> str | None:
    """The object-key prefix (with its trailing slash) holding the released revision's files,
    or None when the revision is not servable."""
    storage = await released_storage_revision(pool, tenant_id, asset_id, revision, SERVABLE_STATES)
    return None if storage is None else revision_prefix(tenant_id, asset_id, storage) + "/"


async def published_files(
    pool: Pool, tenant_id: int, asset_id: uuid.UUID, revision: int
) -> dict[str, dict[str, Any]]:
    """The revision's published outputs: variant type → its primary file's path under the
    revision's storage prefix, and what else is known (size, width, height, its C2PA
    signing, the text tracks an ``hls`` output names)."""
    rows = await published_variants(pool, asset_id, revision)
    storage = rows[0]["storage_revision"] if rows else revision
    prefix = revision_prefix(tenant_id, asset_id, storage) + "/"
    return {
        row["variant_type"]: {
            "path": row["object_key"].removeprefix(prefix),
            "mime_type": row["mime_type"],
            "size_bytes": row["size_bytes"],
            "width": row["width"],
            "height": row["height"],
            "c2pa": (row["extra"] or {}).get("c2pa"),
            "tracks": decode_tracks(row["extra"]),
        }
        for row in rows
        if row["object_key"].startswith(prefix)
    }
