"""Provider outputs: a finished generation's outputs, each fetched once into an asset.

Intake inserts an output (FETCH_PENDING, its URL encrypted and bound to its id) or finds it by
``(provider, provider_task_id, output_index, output_revision)`` and takes a newer URL; the
fetch stage reads it, refreshes its URL and, when its bytes are stored, makes its asset.
State changes go through ``store.records``; every other statement of the table is here, and
every call runs inside ``map_db_errors``.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import asyncpg

from aivedio.store.database import Connection, Pool, map_db_errors
from aivedio.store.together import Part

# What the fetch stage reads of an output (``pipeline.output_records.OutputRow``).
COLUMNS = (
    "id, tenant_id, generation_task_id, provider, provider_task_id, output_index, "
    "source_url_ciphertext, source_url_key_id, source_url_expires_at, expected_size_bytes, "
    "expected_checksum, content_type, fetch_status, version"
)


def after(part: str) -> str:
    """A condition of a ``write_together`` part: the part called ``part`` returned a row."""
    return f"EXISTS (SELECT 1 FROM {part})"


async def load(pool: Pool, output_id: uuid.UUID) -> asyncpg.Record | None:
    with map_db_errors("reading a provider output"):
        return await pool.fetchrow(
            f"SELECT {COLUMNS} FROM provider_outputs WHERE id = $1", output_id
        )


# -- intake -----------------------------------------------------------------------------------


def insert_part(
    output_id: uuid.UUID,
    tenant_id: int,
    task_id: uuid.UUID,
    provider: str,
    provider_task_id: str,
    output_index: int,
    output_revision: int,
    url_ciphertext: bytes,
    url_key_id: str,
    expires_at: datetime,
    size: int | None,
    sha256: str | None,
    content_type: str | None,
    when: str,
    *,
    captions: list[Any] | None = None,
) -> Part:
    """The output's insert (FETCH_PENDING), when ``when`` holds; answers the id, or None
    when the output's key exists. ``sha256``: the provider's checksum, lower case."""
    return Part(
        "INSERT INTO provider_outputs (id, tenant_id, generation_task_id, provider,"
        " provider_task_id, output_index, output_revision, source_url_ciphertext,"
        " source_url_key_id, source_url_expires_at, expected_size_bytes,"
        " expected_checksum_alg, expected_checksum, content_type, fetch_status, captions)"
        " SELECT $1::uuid, $2::bigint, $3::uuid, $4::text, $5::text, $6::smallint, $7::int,"
        " $8::bytea, $9::text, $10::timestamptz, $11::bigint, $12::text, $13::text,"
        f" $14::text, 'FETCH_PENDING', $15::jsonb WHERE {when} ON CONFLICT DO NOTHING"
        " RETURNING id",
        (
            output_id,
            tenant_id,
            task_id,
            provider,
            provider_task_id,
            output_index,
            output_revision,
            url_ciphertext,
            url_key_id,
            expires_at,
            size,
            "sha256" if sha256 else None,
            sha256,
            content_type,
            captions,
        ),
        value="id",
    )


async def lock_by_key(
    conn: Connection, provider: str, provider_task_id: str, output_index: int, output_revision: int
) -> asyncpg.Record | None:
    """An output found by its key, locked: its id, state, version and stored URL."""
    with map_db_errors("recording the provider output"):
        return await conn.fetchrow(
            "SELECT id, fetch_status, version, source_url_expires_at, source_url_ciphertext,"
            " source_url_key_id FROM provider_outputs"
            " WHERE provider = $1 AND provider_task_id = $2 AND output_index = $3"
            " AND output_revision = $4 FOR UPDATE",
            provider,
            provider_task_id,
            output_index,
            output_revision,
        )


async def take_newer_url(
    conn: Connection,
    output_id: uuid.UUID,
    url_ciphertext: bytes,
    url_key_id: str,
    expires_at: datetime,
    version: int,
) -> None:
    """A newer descriptor's URL for an output at ``version`` (its identity kept)."""
    with map_db_errors("refreshing the provider output's URL"):
        await conn.execute(
            "UPDATE provider_outputs SET source_url_ciphertext = $2, source_url_key_id = $3,"
            " source_url_expires_at = $4, descriptor_version = descriptor_version + 1,"
            " version = version + 1, updated_at = now() WHERE id = $1 AND version = $5",
            output_id,
            url_ciphertext,
            url_key_id,
            expires_at,
            version,
        )


# -- the fetch stage --------------------------------------------------------------------------


async def bump_descriptor_version(conn: Connection, output_id: uuid.UUID) -> None:
    """The output's URL was refreshed: its descriptor is one newer."""
    with map_db_errors("refreshing the provider output's URL"):
        await conn.execute(
            "UPDATE provider_outputs SET descriptor_version = descriptor_version + 1 WHERE id = $1",
            output_id,
        )


def share_task_part(generation_task_id: uuid.UUID) -> Part:
    """The output's task locked FOR SHARE: serialises with a cancel (it locks the task)."""
    return Part("SELECT 1 FROM generation_tasks WHERE id = $1 FOR SHARE", (generation_task_id,))


def stored_asset_part(
    asset_id: uuid.UUID,
    tenant_id: int,
    output_id: uuid.UUID,
    object_key: str,
    size_bytes: int,
    sha256: str,
) -> Part:
    """The QUARANTINED asset of a stored output, made only when the part called ``stored``
    (the move to STORED) returned a row; answers its id (None: the output has one)."""
    return Part(
        "INSERT INTO assets (id, tenant_id, source_type,"
        " source_provider_output_id, status, source_object_key,"
        " source_size_bytes, source_sha256)"
        " SELECT $1::uuid, $2::bigint, 'PROVIDER_OUTPUT', $3::uuid,"
        " 'QUARANTINED', $4::text, $5::bigint, $6::text"
        " WHERE EXISTS (SELECT 1 FROM stored)"
        " ON CONFLICT (source_provider_output_id) DO NOTHING RETURNING id",
        (asset_id, tenant_id, output_id, object_key, size_bytes, sha256),
        value="id",
    )


async def asset_of(conn: Any, output_id: uuid.UUID) -> Any:
    """The id of the asset made from the output (None: none yet). ``conn``: a connection
    or a pool."""
    with map_db_errors("reading the stored output's asset"):
        return await conn.fetchval(
            "SELECT id FROM assets WHERE source_provider_output_id = $1", output_id
        )
