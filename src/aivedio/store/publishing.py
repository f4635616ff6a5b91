"""Publishing: the statements that make a revision the one an asset serves.

What the publish stage reads (the gates, the asset with its revision and outputs) and the
parts of the one statement that releases a revision (``write_together``): the lock of the
task and the asset, the checks against the locked row (``require``: each raises its own
SQLSTATE, below, and undoes the whole statement), an enrichment's copy of a revision, the
pointer's move, the release row and the task's link. Every call runs inside
``map_db_errors``.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import asyncpg

from aivedio.store.database import Pool, map_db_errors
from aivedio.store.together import Part, require

# The codes of the release's own checks (``require``, migration 0015).
GONE = "AVP01"  # deleted or cancelled since the revision started
MOVED = "AVP02"  # the current revision is not the one replaced
STALE = "AVP03"  # the revision (or the one replaced) moved on
SHIFTED = "AVP04"  # the asset's state moved on
NOT_CURRENT = "AVE01"  # an enrichment's base is not the current revision any more
DELETED = "AVE02"
CANCELLED = "AVE03"
REBUILDING = "AVE04"


def after(part: str) -> str:
    """A condition of a part: the part called ``part`` returned a row."""
    return f"EXISTS (SELECT 1 FROM {part})"


# -- reads ------------------------------------------------------------------------------------


async def gates(pool: Pool, asset_id: uuid.UUID, revision: int) -> asyncpg.Record | None:
    """The revision's state and verdict, its asset's tenant, and whether its required set is
    SUCCEEDED (``complete``)."""
    with map_db_errors("reading the publish gates"):
        return await pool.fetchrow(
            "SELECT r.moderation_verdict, r.status, a.tenant_id, r.required_outputs <@"
            " coalesce((SELECT array_agg(variant_type) FROM asset_variants v"
            "  WHERE v.asset_id = r.asset_id AND v.revision = r.revision"
            "  AND v.status = 'SUCCEEDED'), ARRAY[]::text[]) AS complete"
            " FROM asset_revisions r JOIN assets a ON a.id = r.asset_id"
            " WHERE r.asset_id = $1 AND r.revision = $2",
            asset_id,
            revision,
        )


def gates_of(loaded: asyncpg.Record) -> dict[str, Any] | None:
    """``gates`` from a ``load`` of the revision (None when it has no such revision)."""
    revision = loaded["revision_row"]
    if revision is None:
        return None
    done = {v["variant_type"] for v in loaded["variant_rows"] if v["status"] == "SUCCEEDED"}
    return {
        "moderation_verdict": revision["moderation_verdict"],
        "status": revision["status"],
        "tenant_id": loaded["tenant_id"],
        "complete": set(revision["required_outputs"]) <= done,
    }


async def revision_status(pool: Pool, asset_id: uuid.UUID, revision: int) -> Any:
    with map_db_errors("reading a revision"):
        return await pool.fetchval(
            "SELECT status FROM asset_revisions WHERE asset_id = $1 AND revision = $2",
            asset_id,
            revision,
        )


async def pending_outputs(pool: Pool, asset_id: uuid.UUID, revision: int) -> Any:
    """How many of the revision's outputs are still rendering."""
    with map_db_errors("reading a revision's outputs"):
        return await pool.fetchval(
            "SELECT count(*) FROM asset_variants WHERE asset_id = $1 AND revision = $2"
            " AND status = 'PENDING'",
            asset_id,
            revision,
        )


# The asset, with its revision (and the newest revision that could be published instead, a
# rebuild's) and the revision's outputs.
LOAD = """
SELECT a.*,
       (SELECT to_jsonb(r) || jsonb_build_object('newest_candidate',
                (SELECT max(n.revision) FROM asset_revisions n
                  WHERE n.asset_id = r.asset_id AND n.status IN ('BUILDING', 'READY')
                    AND n.enriches IS NULL))
          FROM asset_revisions r WHERE r.asset_id = a.id AND r.revision = $2) AS revision_row,
       (SELECT max(m.revision) FROM asset_revisions m WHERE m.asset_id = a.id) AS max_revision,
       (SELECT coalesce(jsonb_agg(to_jsonb(v) ORDER BY v.variant_type), '[]'::jsonb)
          FROM asset_variants v WHERE v.asset_id = a.id AND v.revision = $2) AS variant_rows
  FROM assets a WHERE a.id = $1
"""


async def load(pool: Pool, asset_id: uuid.UUID, revision: int) -> asyncpg.Record | None:
    """The asset (``LOAD``); its ``revision_row`` and ``variant_rows`` as JSON objects."""
    with map_db_errors("loading the asset to publish"):
        return await pool.fetchrow(LOAD, asset_id, revision)


# -- the release statement --------------------------------------------------------------------

LOCK_TASK_THEN_ASSET = """
WITH task AS MATERIALIZED (
    SELECT 1 FROM generation_tasks WHERE id = (SELECT o.generation_task_id
      FROM assets a JOIN provider_outputs o ON o.id = a.source_provider_output_id
     WHERE a.id = $1) FOR UPDATE)
SELECT status, version, current_revision, delete_version, cancel_version
  FROM assets WHERE id = $1 AND (SELECT count(*) FROM task) >= 0 FOR UPDATE
"""

# A new revision ($2) copied from revision $3, its ``enriches`` $4 (an enrichment's base, or
# the revision whose storage a track revision shares), inserted READY: published at $5 with
# the outputs $6, by the release statement it is a part of (it names the part ``ready``, as
# the publish of a BUILDING revision names its transition). COPY_OUTPUTS copies the outputs
# named in its $4. ``{when}``: " AND " a condition on earlier parts, or nothing. The one copy
# of both statements (store/track_revisions.py uses them too).
COPY_REVISION = (
    "INSERT INTO asset_revisions (asset_id, revision, pipeline_version, status,"
    " required_outputs, optional_outputs, plan, moderation_verdict,"
    " moderation_version, moderation_reasons, delete_version_at_start,"
    " cancel_version_at_start, enriches, published_at, published_outputs)"
    " SELECT asset_id, $2, pipeline_version, 'READY', required_outputs,"
    " optional_outputs, plan, moderation_verdict, moderation_version,"
    " moderation_reasons, delete_version_at_start, cancel_version_at_start, $4,"
    " $5::timestamptz, $6::text[]"
    " FROM asset_revisions WHERE asset_id = $1 AND revision = $3{when} RETURNING 1"
)

COPY_OUTPUTS = (
    "INSERT INTO asset_variants (id, asset_id, revision, variant_type, object_key,"
    " mime_type, size_bytes, checksum_alg, checksum, width, height, bitrate, codec,"
    " status, extra) SELECT gen_random_uuid(), asset_id, $2, variant_type,"
    " object_key, mime_type, size_bytes, checksum_alg, checksum, width, height,"
    " bitrate, codec, 'SUCCEEDED', extra FROM asset_variants"
    " WHERE asset_id = $1 AND revision = $3 AND variant_type = ANY($4::text[]){when}"
    " RETURNING 1"
)

RECORD_RELEASE = (
    "INSERT INTO releases (asset_id, revision, previous_revision, outputs)"
    " VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING RETURNING 1"
)

LINK_TASK = (
    "UPDATE generation_tasks SET output_asset_id = $1, updated_at = now()"
    " WHERE id = (SELECT generation_task_id FROM provider_outputs o JOIN assets a"
    "   ON a.source_provider_output_id = o.id WHERE a.id = $1)"
    " AND output_asset_id IS NULL RETURNING 1"
)


def lock_part(asset_id: uuid.UUID) -> Part:
    """The generation task, then the asset, locked (as a cancel locks them: no deadlock
    with it); answers the asset's state, version, pointer and versions."""
    return Part(LOCK_TASK_THEN_ASSET, (asset_id,))


def release_part(
    asset_id: uuid.UUID, revision: int, previous: int | None, outputs: list[str]
) -> Part:
    return Part(RECORD_RELEASE, (asset_id, revision, previous, outputs))


def link_task_part(asset_id: uuid.UUID) -> Part:
    """The generation task linked to the asset made from its output (once)."""
    return Part(LINK_TASK, (asset_id,))


def move_pointer_part(
    asset_id: uuid.UUID, revision: int, previous: int | None, *, when: str | None
) -> Part:
    """The asset's pointer from ``previous`` to ``revision``, its state unchanged, when
    ``when`` (a condition on earlier parts) holds."""
    return Part(
        "UPDATE assets SET current_revision = $2, updated_at = now()"
        " WHERE id = $1 AND current_revision IS NOT DISTINCT FROM $3"
        f" AND {when or 'true'} RETURNING 1",
        (asset_id, revision, previous),
    )


def copy_parts(
    asset_id: uuid.UUID,
    new_revision: int,
    base: int,
    outputs: list[str],
    published_at: datetime,
    *,
    after_part: str,
) -> dict[str, Part]:
    """An enrichment's new revision, a copy of ``base`` published at ``published_at`` with
    ``outputs`` (``ready``), and the copies of ``outputs`` (``outputs``), written once the
    part called ``after_part`` returned a row."""
    checked = f" AND {after(after_part)}"
    return {
        "ready": Part(
            COPY_REVISION.format(when=checked),
            (asset_id, new_revision, base, base, published_at, outputs),
        ),
        "outputs": Part(COPY_OUTPUTS.format(when=checked), (asset_id, new_revision, base, outputs)),
    }


# -- the checks under the lock (each reads the ``lock`` part) ---------------------------------


def versions_check(delete_version: int, cancel_version: int) -> Part:
    """Not deleted nor cancelled since the revision started (GONE)."""
    return require(
        "(SELECT delete_version = $1 AND cancel_version = $2 FROM lock)",
        GONE,
        "deleted or cancelled while publishing",
        (delete_version, cancel_version),
    )


def pointer_check(previous: int | None) -> Part:
    """The current revision is still the one the publish replaces (MOVED)."""
    return require(
        "(SELECT current_revision IS NOT DISTINCT FROM $1::int FROM lock)",
        MOVED,
        "the current revision moved",
        (previous,),
    )


def won_check(*, with_previous: bool) -> Part:
    """The ``ready`` part (and ``previous``, when there is one) won its compare-and-set
    (STALE)."""
    won = "(SELECT count(*) FROM ready) = 1"
    if with_previous:
        won += " AND (SELECT count(*) FROM previous) = 1"
    return require(won, STALE, "the revision moved under the publish")


def switched_check() -> Part:
    """The ``asset`` part moved the asset (SHIFTED)."""
    return require(
        "(SELECT count(*) FROM asset) = 1",
        SHIFTED,
        "the asset moved under the publish; will look again",
    )


def current_check(base: int) -> Part:
    """An enrichment's base is the current revision of a published asset (NOT_CURRENT)."""
    return require(
        "(SELECT current_revision = $1 AND status IN ('PLAYABLE', 'ENRICHED') FROM lock)",
        NOT_CURRENT,
        "not the current revision",
        (base,),
    )


def not_deleted_check(delete_version: int) -> Part:
    return require("(SELECT delete_version = $1 FROM lock)", DELETED, "deleted", (delete_version,))


def not_cancelled_check(cancel_version: int) -> Part:
    return require(
        "(SELECT cancel_version = $1 FROM lock)", CANCELLED, "cancelled", (cancel_version,)
    )


def no_rebuild_check(asset_id: uuid.UUID, base: int) -> Part:
    """No rebuild (a BUILDING revision past ``base`` that enriches nothing) is under way
    (REBUILDING)."""
    return require(
        "NOT EXISTS (SELECT 1 FROM asset_revisions WHERE asset_id = $1"
        " AND revision > $2 AND status = 'BUILDING' AND enriches IS NULL)",
        REBUILDING,
        "a rebuild is under way",
        (asset_id, base),
    )
