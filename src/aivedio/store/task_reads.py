"""Read-only generation task and provider output queries for the API and the operator's
commands: a tenant's task with its outputs, and the outputs listing of ``aivedio outputs``."""

from __future__ import annotations

import uuid

import asyncpg

from aivedio.store.database import Pool, map_db_errors

TENANT_TASK_SQL = "SELECT * FROM generation_tasks WHERE id = $1 AND tenant_id = $2"
TASK_OUTPUTS_SQL = (
    "SELECT o.id, o.output_index, o.fetch_status, o.last_error_class, a.id AS asset_id"
    " FROM provider_outputs o LEFT JOIN assets a ON a.source_provider_output_id = o.id"
    " WHERE o.generation_task_id = $1 AND o.tenant_id = $2"
    " ORDER BY o.output_index, o.output_revision"
)
OUTPUTS_LIST_SQL = (
    "SELECT o.id, o.provider, o.provider_task_id, o.output_index,"
    " o.fetch_status, o.last_error_class, o.last_error_detail,"
    " o.source_url_expires_at, a.id AS asset_id, a.status AS asset_status,"
    " a.source_object_key, a.source_size_bytes, a.source_sha256"
    " FROM provider_outputs o"
    " LEFT JOIN assets a ON a.source_provider_output_id = o.id"
    " WHERE ($1::text IS NULL OR o.fetch_status = $1)"
    " AND ($2::text IS NULL OR o.provider_task_id = $2)"
    " ORDER BY o.created_at DESC LIMIT $3"
)


async def tenant_task_with_outputs(
    pool: Pool, tenant_id: int, task_id: uuid.UUID
) -> tuple[asyncpg.Record, list[asyncpg.Record]] | None:
    """The tenant's generation task and its outputs (each with its asset's id, if any) in
    output order; None when the tenant has no such task (then its outputs are not read)."""
    with map_db_errors("reading the generation task"):
        task = await pool.fetchrow(TENANT_TASK_SQL, task_id, tenant_id)
        if task is None:
            return None
        outputs = await pool.fetch(TASK_OUTPUTS_SQL, task_id, tenant_id)
    return task, outputs


async def list_outputs(
    pool: Pool, fetch_status: str | None, provider_task_id: str | None, limit: int
) -> list[asyncpg.Record]:
    """Provider outputs newest first with their assets, of one fetch state and one provider
    task id, or all."""
    with map_db_errors("listing provider outputs"):
        return await pool.fetch(OUTPUTS_LIST_SQL, fetch_status, provider_task_id, limit)
