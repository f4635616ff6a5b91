"""The statements of a track revision: a published revision copied with one more text
track (``pipeline/track_revision.py``).

What is read first (the asset, its current revision, that revision's ``hls`` output and
whether anything of it still renders) and the parts written under the release's lock: the
new revision, a copy of the base's (its storage revision is the base's, as an
enrichment's is), the copies of its published outputs but ``hls``, and the new ``hls``
output that names the tracks. Every call runs inside ``map_db_errors``.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import asyncpg

from aivedio.store.database import Pool, map_db_errors
from aivedio.store.publishing import COPY_OUTPUTS, COPY_REVISION, after
from aivedio.store.together import Part

BASE = """
SELECT a.id, a.tenant_id, a.status, a.current_revision, a.delete_version, a.cancel_version,
       a.duration_us,
       r.status AS revision_status, r.published_outputs,
       coalesce(r.enriches, r.revision) AS storage_revision,
       r.delete_version_at_start, r.cancel_version_at_start,
       (SELECT max(m.revision) FROM asset_revisions m WHERE m.asset_id = a.id) AS max_revision,
       (SELECT count(*) FROM asset_variants p WHERE p.asset_id = a.id
          AND p.revision = a.current_revision AND p.status = 'PENDING') AS pending,
       (SELECT count(*) FROM asset_revisions b WHERE b.asset_id = a.id
          AND b.revision > a.current_revision AND b.status = 'BUILDING') AS building,
       h.object_key AS hls_key, h.size_bytes AS hls_size, h.extra AS hls_extra,
       h.width AS hls_width, h.height AS hls_height, h.codec AS hls_codec,
       h.bitrate AS hls_bitrate
  FROM assets a
  LEFT JOIN asset_revisions r ON r.asset_id = a.id AND r.revision = a.current_revision
  LEFT JOIN asset_variants h ON h.asset_id = a.id AND h.revision = a.current_revision
   AND h.variant_type = 'hls' AND h.status = 'SUCCEEDED'
 WHERE a.id = $1 AND a.tenant_id = $2
"""


async def base(pool: Pool, tenant_id: int, asset_id: uuid.UUID) -> asyncpg.Record | None:
    """The tenant's asset with its current revision and that revision's ``hls`` output
    (``BASE``); None for no such asset of the tenant."""
    with map_db_errors("reading the revision a track is added to"):
        row = await pool.fetchrow(BASE, asset_id, tenant_id)
    return row


INSERT_HLS = (
    "INSERT INTO asset_variants (id, asset_id, revision, variant_type, object_key,"
    " mime_type, size_bytes, checksum_alg, checksum, width, height, bitrate, codec,"
    " status, extra) SELECT gen_random_uuid(), $1::uuid, $2::int, 'hls', $3::text,"
    " 'application/vnd.apple.mpegurl', $4::bigint, 'sha256', $5::text, $6::int, $7::int,"
    " $8::bigint, $9::text, 'SUCCEEDED', $10::jsonb WHERE {when} RETURNING 1"
)


def copy_parts(
    asset_id: uuid.UUID,
    new_revision: int,
    base_revision: int,
    storage_revision: int,
    outputs: list[str],
    hls: dict[str, Any],
    published_at: datetime,
    *,
    after_part: str,
) -> dict[str, Part]:
    """The track revision, published at ``published_at`` with ``outputs`` (``ready``), the
    base's published outputs but ``hls`` (``outputs``) and the new ``hls`` output (``hls``:
    its key, size, sha256, width, height, bitrate, codec and extra), written once
    ``after_part`` returned a row."""
    when = after(after_part)
    copied = [name for name in outputs if name != "hls"]  # the track revision's hls is new
    return {
        "ready": Part(
            COPY_REVISION.format(when=f" AND {when}"),
            (asset_id, new_revision, base_revision, storage_revision, published_at, outputs),
        ),
        "outputs": Part(
            COPY_OUTPUTS.format(when=f" AND {when}"),
            (asset_id, new_revision, base_revision, copied),
        ),
        "hls": Part(
            INSERT_HLS.format(when=when),
            (
                asset_id,
                new_revision,
                hls["object_key"],
                hls["size_bytes"],
                hls["sha256"],
                hls["width"],
                hls["height"],
                hls["bitrate"],
                hls["codec"],
                hls["extra"],
            ),
        ),
    }
