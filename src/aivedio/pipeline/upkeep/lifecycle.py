"""Deletion and cancellation: the two user decisions that race the pipeline.

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
from aivedio.store import lifecycle_records as records
from aivedio.store import outbox
from aivedio.store.database import Connection, Pool, map_db_errors
from aivedio.store.records import transition

log = get_logger("aivedio.lifecycle")


async def delete_asset(pool: Pool, asset_id: uuid.UUID, *, reason: str = "deleted") -> bool:
    """Delete an asset; False when it was already deleted. Idempotent."""
    with map_db_errors("deleting the asset"):
        async with pool.acquire() as conn, conn.transaction():
            row = await records.lock_asset(conn, asset_id)
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
    with map_db_errors("cancelling the generation task"):
        async with pool.acquire() as conn, conn.transaction():
            task = await records.lock_task(conn, provider, provider_task_id)
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
            await records.bump_task_cancel_version(conn, task["id"])
            assets = await records.lock_task_assets(conn, task["id"])
            retired = []
            retain = datetime.now(UTC) + timedelta(days=retain_days)
            for asset in assets:
                await records.bump_asset_cancel_version(conn, asset["id"], retain)
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


async def is_cancelled(conn: Connection, asset_id: uuid.UUID) -> bool:
    """Whether the asset's generation task was cancelled (assets from uploads never are)."""
    status = await records.task_status_of_asset(conn, asset_id)
    return bool(status == "CANCELLED")


async def _retire(
    conn: Connection, asset_id: uuid.UUID, row: Any, reason: str, *, error_class: str | None
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
    await records.bump_delete_version(conn, asset_id)
    for revision in await records.building_revisions(conn, asset_id):
        await transition(
            conn,
            Entity.REVISION,
            (asset_id, revision),
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
    with map_db_errors("retiring a cancelled asset"):
        async with pool.acquire() as conn, conn.transaction():
            if not await is_cancelled(conn, asset_id):
                return False
            row = await records.lock_asset(conn, asset_id)
            if row is None or row["status"] == "DELETED":
                return row is not None
            retain = datetime.now(UTC) + timedelta(days=retain_days)
            await records.set_source_retain_until(conn, asset_id, retain)
            await _retire(conn, asset_id, row, "cancelled", error_class="cancelled")
    log.info("asset_retired_cancelled", asset_id=str(asset_id))
    return True
