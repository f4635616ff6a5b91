"""The rows behind ``Idempotency-Key`` (``api/idempotency.py``): take a key, complete it
with its answer, release it when the request failed, delete the expired ones.

A key is per tenant. ``take`` is one statement: it inserts the key taken (status NULL,
``locked_until`` ahead, a ``holder`` id of this request's), or takes over a key whose first
request died before answering (its lock lapsed) or whose lifetime ended; else it returns
what is there, for the caller to replay, refuse (another request under the same key) or
answer 409 (the first request still running). The holder renews its lock while it runs
(``renew``), and only the holder completes or releases the row: a request that lost its
key to a takeover cannot overwrite or delete the new holder's.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from aivedio.store.database import Pool, map_db_errors

# Deleted per sweeper call; the next call takes the rest.
DELETE_BATCH = 5000


@dataclass(frozen=True, slots=True)
class Held:
    """A key as ``take`` found it. ``taken``: this request holds it and runs."""

    taken: bool
    request_sha256: bytes
    status: int | None = None
    response: bytes | None = None
    content_type: str | None = None
    location: str | None = None


# Inserted, or taken over when its lock lapsed with no answer, or when it expired; the
# row as it is after this statement either way (xmax = 0: the insert happened).
_TAKE = """
INSERT INTO idempotency_keys AS k
    (tenant_id, key, request_sha256, holder, locked_until, expires_at)
VALUES ($1, $2, $3, $6, now() + make_interval(secs => $4), now() + make_interval(secs => $5))
ON CONFLICT (tenant_id, key) DO UPDATE
    SET request_sha256 = EXCLUDED.request_sha256, holder = EXCLUDED.holder,
        status = NULL, response = NULL,
        content_type = NULL, location = NULL, locked_until = EXCLUDED.locked_until,
        created_at = now(), expires_at = EXCLUDED.expires_at
    WHERE k.expires_at <= now()
       OR (k.status IS NULL AND k.locked_until <= now()
           AND k.request_sha256 = EXCLUDED.request_sha256)
RETURNING true AS taken, request_sha256, status, response, content_type, location
"""
_FOUND = (
    "SELECT false AS taken, request_sha256, status, response, content_type, location"
    " FROM idempotency_keys WHERE tenant_id = $1 AND key = $2"
)


async def take(
    pool: Pool,
    tenant_id: int,
    key: str,
    request_sha256: bytes,
    *,
    holder: uuid.UUID,
    lock_seconds: float,
    ttl_seconds: float,
) -> Held | None:
    """Take ``key`` for this request (``holder``), or what holds it; None when it vanished
    between the two statements (expired and deleted: the caller tries again)."""
    with map_db_errors("taking an idempotency key"):
        row = await pool.fetchrow(
            _TAKE, tenant_id, key, request_sha256, lock_seconds, ttl_seconds, holder
        ) or await pool.fetchrow(_FOUND, tenant_id, key)
    if row is None:
        return None
    return Held(
        taken=row["taken"],
        request_sha256=bytes(row["request_sha256"]),
        status=row["status"],
        response=None if row["response"] is None else bytes(row["response"]),
        content_type=row["content_type"],
        location=row["location"],
    )


async def renew(
    pool: Pool, tenant_id: int, key: str, holder: uuid.UUID, lock_seconds: float
) -> bool:
    """Push the holder's lock ``lock_seconds`` ahead; False when the key is no longer its."""
    with map_db_errors("renewing an idempotency key"):
        held = await pool.fetchval(
            "UPDATE idempotency_keys SET locked_until = now() + make_interval(secs => $4)"
            " WHERE tenant_id = $1 AND key = $2 AND holder = $3 AND status IS NULL"
            " RETURNING true",
            tenant_id,
            key,
            holder,
            lock_seconds,
        )
    return bool(held)


async def complete(
    pool: Pool,
    tenant_id: int,
    key: str,
    holder: uuid.UUID,
    status: int,
    response: bytes,
    content_type: str,
    location: str | None,
) -> None:
    """Store the first request's answer (only on the row this request took)."""
    with map_db_errors("storing an idempotency key's answer"):
        await pool.execute(
            "UPDATE idempotency_keys SET status = $4, response = $5, content_type = $6,"
            " location = $7"
            " WHERE tenant_id = $1 AND key = $2 AND holder = $3 AND status IS NULL",
            tenant_id,
            key,
            holder,
            status,
            response,
            content_type,
            location,
        )


async def release(pool: Pool, tenant_id: int, key: str, holder: uuid.UUID) -> None:
    """The request failed without an answer worth keeping (5xx, a dropped connection): the
    key is free again at once (if it is still this holder's)."""
    with map_db_errors("releasing an idempotency key"):
        await pool.execute(
            "DELETE FROM idempotency_keys"
            " WHERE tenant_id = $1 AND key = $2 AND holder = $3 AND status IS NULL",
            tenant_id,
            key,
            holder,
        )


async def delete_expired(pool: Pool, *, now: datetime | None = None) -> int:
    """Delete up to ``DELETE_BATCH`` keys whose lifetime ended; how many."""
    with map_db_errors("deleting expired idempotency keys"):
        status = await pool.execute(
            "DELETE FROM idempotency_keys WHERE ctid = ANY (ARRAY("
            " SELECT ctid FROM idempotency_keys WHERE expires_at <= coalesce($1, now())"
            f" LIMIT {DELETE_BATCH}))",
            now,
        )
    return int(status.split()[-1])


async def count_expired(pool: Pool, *, now: datetime | None = None) -> int:
    """How many keys' lifetimes have ended (a dry run's report)."""
    with map_db_errors("counting expired idempotency keys"):
        count = await pool.fetchval(
            "SELECT count(*) FROM idempotency_keys WHERE expires_at <= coalesce($1, now())", now
        )
    return int(count)
