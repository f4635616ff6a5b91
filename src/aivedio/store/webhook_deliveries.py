"""Webhook deliveries as people see them: a list, and a replay of the dead.

The relay's own statements (claim, record, release) are in ``store/outbox.py``; these are the
operator's (``aivedio webhooks deliveries``). A delivery is named by the event's id (the
``webhook-id`` its receiver saw) and, since one event goes to every webhook that wants it,
optionally its endpoint.

A replay makes a dead delivery due now with a fresh budget (attempts and the retry window
start again) and a pending one, not leased, due now. A delivered one is left alone (a
receiver that lost it asks for it by its own means; sending it again is a resend, not a
repair). A replayed event may reach its receiver after later events of the same asset: the
ordering rule holds back what is still open, and the later ones were not.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Literal

import msgspec

from aivedio.store.database import Pool, map_db_errors

State = Literal["pending", "delivered", "dead"]
STATES: tuple[State, ...] = ("pending", "delivered", "dead")

# $1 state (NULL: any), $2 endpoint (NULL: any), $3 limit.
LIST_DELIVERIES = """
SELECT e.event_id, d.endpoint, e.event_type, e.tenant_id, e.aggregate_id,
       CASE WHEN d.delivered_at IS NOT NULL THEN 'delivered'
            WHEN d.dead_at IS NOT NULL THEN 'dead'
            ELSE 'pending' END AS state,
       d.attempts, d.last_status, d.last_error, d.created_at, d.first_attempt_at,
       CASE WHEN d.delivered_at IS NULL AND d.dead_at IS NULL THEN d.next_attempt_at
       END AS next_attempt_at,
       d.delivered_at, d.dead_at
  FROM outbox_deliveries d
  JOIN outbox_events e ON e.id = d.outbox_event_id
 WHERE ($2::text IS NULL OR d.endpoint = $2)
   AND CASE $1::text
         WHEN 'dead' THEN d.dead_at IS NOT NULL
         WHEN 'delivered' THEN d.delivered_at IS NOT NULL
         WHEN 'pending' THEN d.delivered_at IS NULL AND d.dead_at IS NULL
         ELSE true END
 ORDER BY d.outbox_event_id DESC, d.endpoint
 LIMIT $3
"""

# $1 event ids (NULL: every dead delivery), $2 endpoint (NULL: any). Values in SET read the
# row as it was, so "was it dead" picks a fresh budget or just "due now". No NOTIFY: the
# channel carries events to outside listeners too, and the relay's poll finds these.
REPLAY = """
UPDATE outbox_deliveries d
   SET dead_at = NULL,
       attempts = CASE WHEN d.dead_at IS NOT NULL THEN 0 ELSE d.attempts END,
       first_attempt_at = CASE WHEN d.dead_at IS NOT NULL THEN NULL ELSE d.first_attempt_at END,
       next_attempt_at = now()
  FROM outbox_events e
 WHERE e.id = d.outbox_event_id
   AND ($1::uuid[] IS NULL AND d.dead_at IS NOT NULL OR e.event_id = ANY ($1::uuid[]))
   AND ($2::text IS NULL OR d.endpoint = $2)
   AND d.delivered_at IS NULL
   AND d.lease_token IS NULL
RETURNING e.event_id, d.endpoint
"""


class Delivery(msgspec.Struct, frozen=True, kw_only=True):
    """One event's delivery to one endpoint, as an operator sees it."""

    event_id: uuid.UUID
    endpoint: str
    event_type: str
    tenant_id: int | None
    aggregate_id: uuid.UUID | None
    state: State
    attempts: int
    last_status: int | None
    last_error: str | None
    created_at: datetime
    first_attempt_at: datetime | None
    next_attempt_at: datetime | None
    delivered_at: datetime | None
    dead_at: datetime | None


async def list_deliveries(
    pool: Pool, *, state: State | None = None, endpoint: str | None = None, limit: int = 50
) -> list[Delivery]:
    """Newest event first."""
    with map_db_errors("listing webhook deliveries"):
        rows = await pool.fetch(LIST_DELIVERIES, state, endpoint, limit)
    return [msgspec.convert(dict(r.items()), Delivery) for r in rows]


async def replay(
    pool: Pool, event_ids: Sequence[uuid.UUID] | None, *, endpoint: str | None = None
) -> list[tuple[uuid.UUID, str]]:
    """Make the named deliveries (None: every dead one) due now; the dead with a fresh
    budget. Returns the (event id, endpoint) pairs replayed; a relay's next poll sends them."""
    ids = None if event_ids is None else list(event_ids)
    with map_db_errors("replaying webhook deliveries"):
        rows = await pool.fetch(REPLAY, ids, endpoint)
    return sorted((r["event_id"], r["endpoint"]) for r in rows)


# -- a tenant's own receivers' deliveries (GET /v1/webhooks/deliveries) --------------------------

# $1 tenant, $2 receiver (NULL: all of the tenant's), $3 state (NULL: any), $4/$5 the last
# (outbox_event_id, endpoint) of the page before (NULL: the first page), $6 limit.
TENANT_DELIVERIES = """
SELECT d.outbox_event_id, d.endpoint, e.event_id, r.id AS webhook_id, e.event_type,
       CASE WHEN d.delivered_at IS NOT NULL THEN 'delivered'
            WHEN d.dead_at IS NOT NULL THEN 'dead'
            ELSE 'pending' END AS state,
       d.attempts, d.last_status, d.last_error, d.created_at,
       CASE WHEN d.delivered_at IS NULL AND d.dead_at IS NULL THEN d.next_attempt_at
       END AS next_attempt_at,
       d.delivered_at, d.dead_at
  FROM webhook_receivers r
  JOIN outbox_endpoints ep ON ep.receiver_id = r.id
  JOIN outbox_deliveries d ON d.endpoint = ep.name
  JOIN outbox_events e ON e.id = d.outbox_event_id
 WHERE r.tenant_id = $1
   AND ($2::uuid IS NULL OR r.id = $2)
   AND CASE $3::text
         WHEN 'dead' THEN d.dead_at IS NOT NULL
         WHEN 'delivered' THEN d.delivered_at IS NOT NULL
         WHEN 'pending' THEN d.delivered_at IS NULL AND d.dead_at IS NULL
         ELSE true END
   AND ($4::bigint IS NULL OR (d.outbox_event_id, d.endpoint) < ($4::bigint, $5::text))
 ORDER BY d.outbox_event_id DESC, d.endpoint DESC
 LIMIT $6
"""

# $1 tenant, $2 event id: its dead or pending deliveries to the tenant's receivers.
TENANT_REPLAY = """
UPDATE outbox_deliveries d
   SET dead_at = NULL,
       attempts = CASE WHEN d.dead_at IS NOT NULL THEN 0 ELSE d.attempts END,
       first_attempt_at = CASE WHEN d.dead_at IS NOT NULL THEN NULL ELSE d.first_attempt_at END,
       next_attempt_at = now()
  FROM outbox_events e, outbox_endpoints ep, webhook_receivers r
 WHERE e.id = d.outbox_event_id
   AND ep.name = d.endpoint
   AND r.id = ep.receiver_id
   AND r.tenant_id = $1
   AND e.event_id = $2
   AND d.delivered_at IS NULL
   AND d.lease_token IS NULL
RETURNING e.event_id, r.id AS webhook_id
"""


class TenantDelivery(msgspec.Struct, frozen=True, kw_only=True):
    """One event's delivery to one of the tenant's receivers. ``position`` is the keyset
    position (the page's cursor is made of the last one's)."""

    position: tuple[int, str]
    event_id: uuid.UUID
    webhook_id: uuid.UUID
    event_type: str
    state: State
    attempts: int
    last_status: int | None
    last_error: str | None
    created_at: datetime
    next_attempt_at: datetime | None
    delivered_at: datetime | None
    dead_at: datetime | None


async def tenant_deliveries(
    pool: Pool,
    tenant_id: int,
    *,
    webhook_id: uuid.UUID | None = None,
    state: State | None = None,
    after: tuple[int, str] | None = None,
    limit: int = 25,
) -> list[TenantDelivery]:
    """Newest event first, a page at a time (keyset on the event's position and endpoint,
    so a page holds still while deliveries are added)."""
    after_id, after_endpoint = after if after is not None else (None, None)
    with map_db_errors("listing a tenant's webhook deliveries"):
        rows = await pool.fetch(
            TENANT_DELIVERIES, tenant_id, webhook_id, state, after_id, after_endpoint, limit
        )
    out = []
    for r in rows:
        fields = dict(r.items())
        fields["position"] = (fields.pop("outbox_event_id"), fields.pop("endpoint"))
        out.append(msgspec.convert(fields, TenantDelivery))
    return out


async def tenant_replay(
    pool: Pool, tenant_id: int, event_id: uuid.UUID
) -> list[tuple[uuid.UUID, uuid.UUID]]:
    """The event's dead (fresh budget) or pending deliveries to the tenant's receivers, due
    now: the (event id, webhook id) pairs replayed."""
    with map_db_errors("replaying a tenant's webhook deliveries"):
        rows = await pool.fetch(TENANT_REPLAY, tenant_id, event_id)
    return sorted((r["event_id"], r["webhook_id"]) for r in rows)
