"""The outbox: events written with the state change they report, delivered later.

``emit`` takes the caller's connection, so an event exists exactly when the change it
announces committed (and its NOTIFY, sent by a trigger, is heard only then). The relay
(``pipeline/upkeep/outbox_relay.py``) does the delivering through ``OutboxStore``; the rules its
statements keep are these.

* **Endpoints from config, deliveries made lazily.** A webhook is a name in the config. The
  first relay that sees a name registers it with a cursor at the current horizon (see
  ``0003_outbox.sql``), so a webhook added later receives events from then on, not the
  whole history. Each pass turns events past the cursor into delivery rows when their type
  matches the webhook's ``event_types`` and moves the cursor past them either way; so a
  changed filter applies to events from then on. A webhook removed from the config keeps
  its cursor and its undelivered rows: if it comes back, it resumes where it stopped.
* **One sender at a time.** A claim takes due rows with ``FOR UPDATE SKIP LOCKED`` in one
  short statement and leases them (``lease_token``, and ``next_attempt_at`` pushed to the
  lease's end); the HTTP request happens outside any transaction; the result is recorded
  only if the lease is still this claim's. A sender that dies leaves a lease that runs out.
* **Ordered per aggregate.** A delivery is not claimable while an earlier event (smaller
  id) of the same aggregate is still open for the same endpoint: undelivered and not dead,
  or not yet turned into deliveries at all. A dead event no longer holds the next back.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import msgspec

from aivedio.config.outbox import EVENT_TYPES
from aivedio.store.database import Connection, Pool, map_db_errors
from aivedio.store.together import Part
from aivedio.supervision import RowGuard, error_class

__all__ = ["EVENT_TYPES", "NOTIFY_CHANNEL", "Claimed", "OutboxStore", "Poisoned", "emit"]

# The channel the insert trigger in 0003_outbox.sql notifies (fixed there, so here too).
NOTIFY_CHANNEL = "aivedio_events"

INSERT_EVENT = """
INSERT INTO outbox_events (event_id, event_type, tenant_id, aggregate_id, payload, passthrough)
VALUES ($1, $2, $3, $4, $5::text::jsonb, aivedio_passthrough($4)) RETURNING id
"""

REGISTER_ENDPOINTS = """
INSERT INTO outbox_endpoints (name, cursor_xid)
SELECT name, outbox_horizon() FROM unnest($1::text[]) AS n(name)
ON CONFLICT (name) DO NOTHING
"""

# $1 endpoint, $2 event types (empty: all), $3 how many events to walk, $4 the only tenant
# whose events it receives (NULL: every event; a tenant's own receiver gives its tenant).
MATERIALISE = """
WITH endpoint AS (
    SELECT name, cursor_xid, cursor_id FROM outbox_endpoints WHERE name = $1
    FOR UPDATE SKIP LOCKED
), horizon AS MATERIALIZED (
    SELECT outbox_horizon() AS xid
), batch AS MATERIALIZED (
    SELECT e.id, e.xid, e.event_type, e.aggregate_id, e.tenant_id
      FROM endpoint, horizon, outbox_events e
     WHERE (e.xid, e.id) > (endpoint.cursor_xid, endpoint.cursor_id)
       AND e.xid < horizon.xid
     ORDER BY e.xid, e.id
     LIMIT $3
), created AS (
    INSERT INTO outbox_deliveries (endpoint, outbox_event_id, aggregate_id)
    SELECT $1, id, aggregate_id FROM batch
     WHERE (cardinality($2::text[]) = 0 OR event_type = ANY ($2::text[]))
       AND ($4::bigint IS NULL OR tenant_id = $4)
    ON CONFLICT DO NOTHING
    RETURNING 1
), advanced AS (
    UPDATE outbox_endpoints o
       SET cursor_xid = last.xid, cursor_id = last.id, advanced_at = now()
      FROM (SELECT xid, id FROM batch ORDER BY xid DESC, id DESC LIMIT 1) AS last
     WHERE o.name = $1
    RETURNING 1
)
SELECT (SELECT count(*) FROM batch) AS walked,
       (SELECT count(*) FROM created) AS created,
       (SELECT count(*) FROM advanced) AS advanced
"""

# $1 endpoints, $2 limit, $3 lease token, $4 lease seconds.
CLAIM = """
WITH due AS (
    SELECT d.endpoint, d.outbox_event_id
      FROM outbox_deliveries d
      JOIN outbox_endpoints ep ON ep.name = d.endpoint
     WHERE d.endpoint = ANY ($1::text[])
       AND d.delivered_at IS NULL AND d.dead_at IS NULL
       AND d.next_attempt_at <= now()
       AND NOT (d.aggregate_id IS NOT NULL AND (
             EXISTS (SELECT 1 FROM outbox_deliveries p
                      WHERE p.endpoint = d.endpoint
                        AND p.aggregate_id = d.aggregate_id
                        AND p.outbox_event_id < d.outbox_event_id
                        AND p.delivered_at IS NULL AND p.dead_at IS NULL)
          OR EXISTS (SELECT 1 FROM outbox_events e
                      WHERE e.aggregate_id = d.aggregate_id
                        AND e.id < d.outbox_event_id
                        AND (e.xid, e.id) > (ep.cursor_xid, ep.cursor_id))))
     ORDER BY d.next_attempt_at, d.outbox_event_id
     LIMIT $2
       FOR UPDATE OF d SKIP LOCKED
)
UPDATE outbox_deliveries d
   SET attempts = d.attempts + 1,
       lease_token = $3,
       next_attempt_at = now() + make_interval(secs => $4),
       first_attempt_at = coalesce(d.first_attempt_at, now())
  FROM due, outbox_events e
 WHERE d.endpoint = due.endpoint
   AND d.outbox_event_id = due.outbox_event_id
   AND e.id = d.outbox_event_id
RETURNING d.endpoint, d.outbox_event_id, d.attempts, e.event_id, e.event_type,
          e.created_at, e.tenant_id, e.aggregate_id, e.payload::text AS payload,
          e.passthrough,
          extract(epoch FROM now() - coalesce(d.first_attempt_at, now()))::float8
              AS retrying_seconds
"""

MARK_DELIVERED = """
UPDATE outbox_deliveries
   SET delivered_at = now(), lease_token = NULL, last_status = $4, last_error = NULL
 WHERE endpoint = $1 AND outbox_event_id = $2 AND lease_token = $3
RETURNING 1
"""

# $4 the delay, from now (the attempt's end); $7 the retry window, from the first attempt's
# start: the next attempt is due after the delay, and never past the window's end however
# long this attempt took. Returns the seconds until it is due.
MARK_RETRY = """
UPDATE outbox_deliveries
   SET next_attempt_at = least(now() + make_interval(secs => $4),
                               first_attempt_at + make_interval(secs => $7)),
       lease_token = NULL, last_status = $5, last_error = $6
 WHERE endpoint = $1 AND outbox_event_id = $2 AND lease_token = $3
RETURNING greatest(extract(epoch FROM next_attempt_at - now()), 0)::float8
"""

MARK_DEAD = """
UPDATE outbox_deliveries
   SET dead_at = now(), lease_token = NULL, last_status = $4, last_error = $5
 WHERE endpoint = $1 AND outbox_event_id = $2 AND lease_token = $3
RETURNING 1
"""

# Hand back what a stopping relay claimed but did not finish: due at once, attempt refunded.
RELEASE = """
UPDATE outbox_deliveries d
   SET lease_token = NULL, next_attempt_at = now(), attempts = greatest(d.attempts - 1, 0)
  FROM unnest($1::text[], $2::bigint[]) AS r(endpoint, outbox_event_id)
 WHERE d.endpoint = r.endpoint AND d.outbox_event_id = r.outbox_event_id
   AND d.lease_token = $3
"""


async def emit(
    conn: Connection,
    event_type: str,
    *,
    tenant_id: int | None,
    aggregate_id: uuid.UUID | None,
    payload: dict[str, Any],
) -> uuid.UUID:
    """Write an event in the caller's transaction; its id is what every delivery carries.

    Events of one ``aggregate_id`` are delivered in the order they were emitted, provided the
    emitting transactions serialise on that aggregate (as every CAS on its row does)."""
    part = event_part(event_type, tenant_id=tenant_id, aggregate_id=aggregate_id, payload=payload)
    with map_db_errors(f"writing the {event_type} outbox event"):
        await conn.execute(part.sql, *part.args)
    return uuid.UUID(str(part.args[0]))


def event_part(
    event_type: str,
    *,
    tenant_id: int | None,
    aggregate_id: uuid.UUID | None,
    payload: dict[str, Any],
) -> Part:
    """The statement ``emit`` runs, for a caller that writes it together with others."""
    if event_type not in EVENT_TYPES:
        raise ValueError(f"unknown outbox event type {event_type!r}; known: {sorted(EVENT_TYPES)}")
    # Encoded here, not by the connection's jsonb codec, so any connection can emit.
    body = msgspec.json.encode(payload).decode()
    return Part(INSERT_EVENT, (uuid.uuid4(), event_type, tenant_id, aggregate_id, body))


class Claimed(msgspec.Struct, frozen=True, kw_only=True):
    """One leased delivery: the endpoint, the event, and the attempt this is (1 for the first)."""

    endpoint: str
    outbox_event_id: int
    attempts: int
    event_id: uuid.UUID
    event_type: str
    created_at: datetime
    tenant_id: int | None
    aggregate_id: uuid.UUID | None
    payload: dict[str, Any]
    # The video's or task's passthrough, as it was when the event was emitted.
    passthrough: str | None = None
    # Since this delivery's first attempt, by the database's clock (0 for the first).
    retrying_seconds: float = 0.0


class Poisoned(msgspec.Struct, frozen=True, kw_only=True):
    """A leased delivery whose row could not be decoded (isolated by the claim): the relay
    marks it dead with ``error`` rather than claim it again at every lease's end."""

    endpoint: str
    outbox_event_id: int
    error: str


class OutboxStore:
    """The relay's statements over ``outbox_endpoints`` and ``outbox_deliveries``."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    async def register(self, endpoints: Sequence[str]) -> None:
        """Create a cursor for each endpoint not seen before, at the current horizon."""
        with map_db_errors("registering outbox endpoints"):
            await self.pool.execute(REGISTER_ENDPOINTS, list(endpoints))

    async def materialise(
        self, endpoint: str, event_types: Sequence[str], limit: int, tenant_id: int | None = None
    ) -> tuple[int, int]:
        """Walk up to ``limit`` events past the endpoint's cursor: (walked, deliveries made),
        only of ``tenant_id`` if given. (0, 0) also when another relay is doing it now."""
        with map_db_errors("creating outbox deliveries"):
            row = await self.pool.fetchrow(
                MATERIALISE, endpoint, list(event_types), limit, tenant_id
            )
        assert row is not None
        return int(row["walked"]), int(row["created"])

    async def claim(
        self,
        endpoints: Sequence[str],
        limit: int,
        lease_token: uuid.UUID,
        lease_seconds: float,
        rows: RowGuard | None = None,
    ) -> list[Claimed | Poisoned]:
        """Lease up to ``limit`` due deliveries. Each row is decoded alone (``rows``): one
        that cannot be is returned as Poisoned, never an error for the whole claim."""
        guard = rows or RowGuard()
        with map_db_errors("claiming outbox deliveries"):
            found = await self.pool.fetch(
                CLAIM, list(endpoints), limit, lease_token, float(lease_seconds)
            )
        claimed: list[Claimed | Poisoned] = []
        for row in found:
            with guard.row("outbox_relay", row["outbox_event_id"]) as decoding:
                fields = dict(row.items())
                fields["payload"] = msgspec.json.decode(fields["payload"])
                claimed.append(msgspec.convert(fields, Claimed))
            if decoding.error is not None:
                error = f"undecodable: {error_class(decoding.error)}: {decoding.error}"[:500]
                poisoned = Poisoned(
                    endpoint=row["endpoint"], outbox_event_id=row["outbox_event_id"], error=error
                )
                claimed.append(poisoned)
        claimed.sort(key=lambda c: c.outbox_event_id)
        return claimed

    async def delivered(self, c: Claimed, lease_token: uuid.UUID, status: int) -> bool:
        """False when the lease was lost meanwhile (another sender owns the row now)."""
        with map_db_errors("recording an outbox delivery"):
            done = await self.pool.fetchval(
                MARK_DELIVERED, c.endpoint, c.outbox_event_id, lease_token, status
            )
        return done is not None

    async def retry(
        self,
        c: Claimed,
        lease_token: uuid.UUID,
        *,
        delay_seconds: float,
        window_seconds: float,
        status: int | None,
        error: str,
    ) -> float | None:
        """Due again after ``delay_seconds`` from now, but no later than ``window_seconds``
        after the first attempt started. The seconds until it is due; None when the lease was
        lost meanwhile."""
        with map_db_errors("recording an outbox delivery retry"):
            due_in: float | None = await self.pool.fetchval(
                MARK_RETRY,
                c.endpoint,
                c.outbox_event_id,
                lease_token,
                float(delay_seconds),
                status,
                error,
                float(window_seconds),
            )
        return due_in

    async def dead(
        self, c: Claimed, lease_token: uuid.UUID, *, status: int | None, error: str
    ) -> bool:
        with map_db_errors("recording a dead outbox delivery"):
            done = await self.pool.fetchval(
                MARK_DEAD, c.endpoint, c.outbox_event_id, lease_token, status, error
            )
        return done is not None

    async def bury(
        self, endpoint: str, outbox_event_id: int, lease_token: uuid.UUID, error: str
    ) -> bool:
        """Dead, with ``error``, if the lease is still this claim's: an isolated delivery."""
        with map_db_errors("recording a dead outbox delivery"):
            done = await self.pool.fetchval(
                MARK_DEAD, endpoint, outbox_event_id, lease_token, None, error
            )
        return done is not None

    async def release(self, claimed: Sequence[Claimed], lease_token: uuid.UUID) -> None:
        with map_db_errors("releasing outbox deliveries"):
            await self.pool.execute(
                RELEASE,
                [c.endpoint for c in claimed],
                [c.outbox_event_id for c in claimed],
                lease_token,
            )
