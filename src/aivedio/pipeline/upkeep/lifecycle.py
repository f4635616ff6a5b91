"""Deletion and cancellation (seed 002 §11.8.2): the two user decisions that race the pipeline.

Both bump a version in the same transaction that records the decision; the publish
transaction compares those versions with the ones its revision started with, so a worker that
finishes afterwards can never publish (and never move a state back to READY).

* **delete**: the asset becomes DELETED at once (playback closes: the pointer no longer
  serves), building revisions are ABANDONED, ``asset.deleted`` goes out; the objects are left
  to the sweeper, which removes them after the grace period.
* **cancel**: the generation task becomes CANCELLED. A fetch in flight keeps going (the
  provider's URL is about to expire and the cost is paid: the bytes are rescued for audit),
  but nothing from the task is published: its assets' ``cancel_version`` moves, and an asset
  that is not published yet is retired (DELETED, ``last_error_class = 'cancelled'``) with its
  source kept in quarantine for the retention period. Money facts stay in the ledger.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from aivedio.errors import NotFoundError, StaleStateError
from aivedio.logs import get_logger
from aivedio.states import LIVE_ASSET_STATES, Entity
from aivedio.store import outbox
from aivedio.store.database import Pool
from aivedio.store.records import transition

log = get_logger("aivedio.lifecycle")


async def delete_asset(pool: Pool, asset_id: uuid.UUID, *, reason: str = "deleted") -> bool:
    """Delete an asset; False when it was already deleted. Idempotent."""
    async with pool.acquire() as conn, conn.transaction():
        row = await conn.fetchrow(
            "SELECT status, tenant_id, version FROM assets WHERE id = $1 FOR UPDATE", asset_id
        )
        if row is None:
            raise NotFoundError(f"no asset {asset_id}")
        if row["status"] == "DELETED":
            return False
        await _retire(conn, asset_id, row, reason, error_class=None)
    log.info("asset_deleted", asset_id=str(asset_id), reason=reason)
    return True


async def cancel_task(
    pool: Pool, provider: str, provider_task_id: str, *, retain_days: float = 30.0
) -> dict[str, Any]:
    """Cancel a generation task: nothing of it is published; bytes already paid for are kept."""
    async with pool.acquire() as conn, conn.transaction():
        task = await conn.fetchrow(
            "SELECT id, provider_status FROM generation_tasks WHERE provider = $1"
            " AND provider_task_id = $2 FOR UPDATE",
            provider,
            provider_task_id,
        )
        if task is None:
            raise NotFoundError(f"no generation task {provider}/{provider_task_id}")
        if task["provider_status"] != "CANCELLED":
            await transition(
                conn,
                Entity.GENERATION_TASK,
                (task["id"],),
                expected=task["provider_status"],
                new="CANCELLED",
            )
        await conn.execute(
            "UPDATE generation_tasks SET cancel_version = cancel_version + 1 WHERE id = $1",
            task["id"],
        )
        assets = await conn.fetch(
            "SELECT a.id, a.status, a.tenant_id, a.version FROM assets a"
            " JOIN provider_outputs o ON a.source_provider_output_id = o.id"
            " WHERE o.generation_task_id = $1 FOR UPDATE OF a",
            task["id"],
        )
        retired = []
        retain = datetime.now(UTC) + timedelta(days=retain_days)
        for asset in assets:
            await conn.execute(
                "UPDATE assets SET cancel_version = cancel_version + 1,"
                " source_retain_until = greatest(source_retain_until, $2) WHERE id = $1",
                asset["id"],
                retain,
            )
            if asset["status"] in ("QUARANTINED", "PROBING", "PROCESSING"):
                await _retire(conn, asset["id"], asset, "cancelled", error_class="cancelled")
                retired.append(str(asset["id"]))
    log.info(
        "task_cancelled",
        provider=provider,
        provider_task_id=provider_task_id,
        retired_assets=retired,
    )
    return {"task_id": str(task["id"]), "retired_assets": retired}


async def is_cancelled(conn: Any, asset_id: uuid.UUID) -> bool:
    """Whether the asset's generation task was cancelled (assets from uploads never are)."""
    status = await conn.fetchval(
        "SELECT g.provider_status FROM assets a JOIN provider_outputs o"
        " ON a.source_provider_output_id = o.id JOIN generation_tasks g"
        " ON g.id = o.generation_task_id WHERE a.id = $1",
        asset_id,
    )
    return bool(status == "CANCELLED")


async def _retire(
    conn: Any, asset_id: uuid.UUID, row: Any, reason: str, *, error_class: str | None
) -> None:
    if row["status"] not in LIVE_ASSET_STATES and row["status"] not in (
        "REJECTED",
        "PROCESSING_FAILED",
        "INVALID_MEDIA",
    ):
        return
    try:
        await transition(
            conn,
            Entity.ASSET,
            (asset_id,),
            expected=row["status"],
            new="DELETED",
            values={"last_error_class": error_class, "last_error_detail": reason},
        )
    except StaleStateError:
        return
    await conn.execute(
        "UPDATE assets SET delete_version = delete_version + 1, deleted_at = now() WHERE id = $1",
        asset_id,
    )
    building = await conn.fetch(
        "SELECT revision FROM asset_revisions WHERE asset_id = $1 AND status = 'BUILDING'",
        asset_id,
    )
    for revision in building:
        await transition(
            conn,
            Entity.REVISION,
            (asset_id, revision["revision"]),
            expected="BUILDING",
            new="ABANDONED",
        )
    await outbox.emit(
        conn,
        "asset.deleted",
        tenant_id=row["tenant_id"],
        aggregate_id=asset_id,
        payload={"asset_id": str(asset_id), "reason": reason},
    )


async def retire_if_cancelled(pool: Pool, asset_id: uuid.UUID, *, retain_days: float) -> bool:
    """For an asset created after its task was cancelled (the fetch rescued the bytes): retire
    it without processing, keeping the source for the retention period. True if retired."""
    async with pool.acquire() as conn, conn.transaction():
        if not await is_cancelled(conn, asset_id):
            return False
        row = await conn.fetchrow(
            "SELECT status, tenant_id, version FROM assets WHERE id = $1 FOR UPDATE", asset_id
        )
        if row is None or row["status"] == "DELETED":
            return row is not None
        retain = datetime.now(UTC) + timedelta(days=retain_days)
        await conn.execute(
            "UPDATE assets SET source_retain_until = $2 WHERE id = $1", asset_id, retain
        )
        await _retire(conn, asset_id, row, "cancelled", error_class="cancelled")
    log.info("asset_retired_cancelled", asset_id=str(asset_id))
    return True
