"""The garbage collector's reads: the roots of a batch of listed object keys.

``assets/`` keys are judged against every revision and variant of their assets (the rule
itself is ``pipeline.upkeep.gc.GcRoots``); ``quarantine/`` keys against the live sources,
outputs and uploads that still need them. The queries run under ``map_db_errors`` named
for their scan.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import asyncpg

from aivedio.store.database import Pool, map_db_errors

UUID_PATTERN = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"

# Every revision and variant of the assets named by a batch of listed keys: the GC roots.
GC_REFERENCES = """
SELECT a.id AS asset_id, a.tenant_id, a.status AS asset_status, r.revision,
       r.status AS revision_status, v.object_key, v.status AS variant_status,
       (SELECT coalesce(array_agg(f->>'path'), '{}') FROM jsonb_array_elements(
          CASE WHEN jsonb_typeof(v.extra->'files') = 'array' THEN v.extra->'files'
          ELSE '[]'::jsonb END) AS f) AS paths
FROM assets a
LEFT JOIN asset_revisions r ON r.asset_id = a.id
LEFT JOIN asset_variants v ON v.asset_id = r.asset_id AND v.revision = r.revision
WHERE a.id = ANY($1::uuid[])
"""
# The quarantine keys of a batch that something still needs: a live asset's source (a
# REJECTED one only until its retention ends), or an output that may still be fetched.
QUARANTINE_REFERENCES = rf"""
WITH c AS (
    SELECT k, CASE WHEN split_part(k, '/', 3) ~ '^{UUID_PATTERN}$'
                   THEN split_part(k, '/', 3)::uuid END AS output_id
    FROM unnest($1::text[]) AS k
)
SELECT c.k FROM c
WHERE EXISTS (SELECT 1 FROM assets a WHERE a.source_object_key = c.k
              AND (a.source_retain_until > $2
                   OR (a.status <> 'DELETED'
                       AND NOT (a.status = 'REJECTED' AND a.source_retain_until IS NOT NULL))))
   OR EXISTS (SELECT 1 FROM provider_outputs o WHERE o.id = c.output_id
              AND o.fetch_status <> ALL($3::text[]))
   OR EXISTS (SELECT 1 FROM jobs j WHERE j.kind = 'fetch'
              AND j.payload->>'provider_output_id' = c.output_id::text)
   OR EXISTS (SELECT 1 FROM upload_sessions s WHERE s.id = c.output_id
              AND s.status = 'AWAITING_UPLOAD')
"""


async def asset_references(pool: Pool, asset_ids: Sequence[str]) -> list[asyncpg.Record]:
    """A row per (asset, revision, variant) of these assets: what their keys are judged by."""
    with map_db_errors("sweeping orphan_objects"):
        return await pool.fetch(GC_REFERENCES, asset_ids)


async def quarantine_references(
    pool: Pool, names: Sequence[str], now: datetime, terminal_states: Sequence[str]
) -> set[str]:
    """The quarantine keys of ``names`` that something still needs at ``now``; an output
    in one of ``terminal_states`` will not be fetched again."""
    with map_db_errors("sweeping quarantine_orphans"):
        rows = await pool.fetch(QUARANTINE_REFERENCES, names, now, terminal_states)
    return {r["k"] for r in rows}
