"""A tenant's own webhook receivers: created, listed, rotated and deleted through the API,
read by the outbox relay, which delivers them beside the configured webhooks.

Each receiver is an outbox endpoint named ``receiver:<id>``, registered in the transaction
that creates the receiver, with its cursor at that moment's horizon: a receiver gets the
events emitted after its creation, and only its tenant's (``store/outbox.py`` materialises
with the tenant as a filter). Deleting it deletes the endpoint and its deliveries and leaves
the row as a tombstone (secrets wiped), so a second DELETE answers as the first did.

Secrets are sealed at rest with the URL cipher (``crypto.UrlCipher``, bound to the
receiver's id, so a ciphertext copied to another row does not open): someone who reads the
database cannot sign as us. The sealed value is a JSON list, the current secret first; a
rotation puts a new secret first and keeps the replaced one signing until
``previous_secret_expires_at``, so receivers have that long to switch.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

import msgspec

from aivedio.config.outbox import new_secret
from aivedio.crypto import UrlCipher
from aivedio.errors import PolicyBlockedError
from aivedio.store.database import Pool, acquired, map_db_errors, transaction

ENDPOINT_PREFIX = "receiver:"
MAX_RECEIVERS_PER_TENANT = 20

_COLUMNS = "id, tenant_id, url, event_types, description, created_at, previous_secret_expires_at"

# One tenant's creations one at a time, so the cap holds under concurrent requests.
LOCK_TENANT = "SELECT pg_advisory_xact_lock(hashtext('webhook_receivers'), $1::int)"
COUNT_FOR_TENANT = """
SELECT count(*) FROM webhook_receivers WHERE tenant_id = $1 AND deleted_at IS NULL
"""

INSERT_RECEIVER = f"""
INSERT INTO webhook_receivers
    (id, tenant_id, url, event_types, description, secrets_ciphertext, secrets_key_id)
VALUES ($1, $2, $3, $4, $5, $6, $7)
RETURNING {_COLUMNS}
"""

REGISTER_RECEIVER_ENDPOINT = """
INSERT INTO outbox_endpoints (name, cursor_xid, receiver_id) VALUES ($1, outbox_horizon(), $2)
"""

LIST_FOR_TENANT = f"""
SELECT {_COLUMNS} FROM webhook_receivers WHERE tenant_id = $1 AND deleted_at IS NULL
 ORDER BY created_at DESC, id DESC
"""

GET_FOR_TENANT = f"""
SELECT {_COLUMNS} FROM webhook_receivers
 WHERE tenant_id = $1 AND id = $2 AND deleted_at IS NULL
"""

LOCK_SECRETS = """
SELECT secrets_ciphertext, secrets_key_id FROM webhook_receivers
 WHERE tenant_id = $1 AND id = $2 AND deleted_at IS NULL FOR UPDATE
"""

ROTATE = f"""
UPDATE webhook_receivers
   SET secrets_ciphertext = $3, secrets_key_id = $4,
       previous_secret_expires_at = now() + make_interval(secs => $5)
 WHERE tenant_id = $1 AND id = $2
RETURNING {_COLUMNS}
"""

# A tombstone: secrets wiped, the endpoint (and with it every delivery) deleted.
DELETE_FOR_TENANT = """
WITH gone AS (
    UPDATE webhook_receivers
       SET deleted_at = coalesce(deleted_at, now()), secrets_ciphertext = '\\x'::bytea
     WHERE tenant_id = $1 AND id = $2
    RETURNING id
), endpoint AS (
    DELETE FROM outbox_endpoints WHERE receiver_id IN (SELECT id FROM gone) RETURNING 1
)
SELECT id, (SELECT count(*) FROM endpoint) AS endpoints FROM gone
"""

# Every receiver, for the relay: whether the replaced secret still signs, by the database's
# clock.
ACTIVE = """
SELECT id, tenant_id, url, event_types, secrets_ciphertext, secrets_key_id,
       coalesce(previous_secret_expires_at > now(), false) AS previous_signs
  FROM webhook_receivers
 WHERE deleted_at IS NULL
 ORDER BY id
"""


class Receiver(msgspec.Struct, frozen=True, kw_only=True):
    """A receiver as its tenant sees it (never its secrets)."""

    id: uuid.UUID
    tenant_id: int
    url: str
    event_types: list[str]
    description: str | None
    created_at: datetime
    previous_secret_expires_at: datetime | None


class ActiveReceiver(msgspec.Struct, frozen=True, kw_only=True):
    """A receiver as the relay delivers to it: its endpoint and the secrets that sign."""

    endpoint: str
    id: uuid.UUID
    tenant_id: int
    url: str
    event_types: list[str]
    secrets: list[str]


def endpoint_name(receiver_id: uuid.UUID) -> str:
    return f"{ENDPOINT_PREFIX}{receiver_id}"


def _bound_to(receiver_id: uuid.UUID) -> str:
    return f"webhook_receiver:{receiver_id}"


class WebhookReceiverStore:
    def __init__(self, pool: Pool, cipher: UrlCipher) -> None:
        self.pool = pool
        self.cipher = cipher

    def _seal(self, receiver_id: uuid.UUID, secrets: Sequence[str]) -> tuple[bytes, str]:
        plain = msgspec.json.encode(list(secrets)).decode()
        return self.cipher.encrypt(plain, bound_to=_bound_to(receiver_id))

    def _open(self, receiver_id: uuid.UUID, blob: bytes, key_id: str) -> list[str]:
        plain = self.cipher.decrypt(blob, key_id, bound_to=_bound_to(receiver_id))
        return msgspec.json.decode(plain, type=list[str])

    async def create(
        self, tenant_id: int, url: str, event_types: Sequence[str], description: str | None
    ) -> tuple[Receiver, str]:
        """The new receiver and its secret (shown once). PolicyBlockedError
        ``too_many_webhooks`` past ``MAX_RECEIVERS_PER_TENANT``."""
        receiver_id = uuid.uuid4()
        secret = new_secret()
        sealed, key_id = self._seal(receiver_id, [secret])
        with map_db_errors("creating a webhook receiver"):
            async with acquired(self.pool) as conn, transaction(conn):
                await conn.execute(LOCK_TENANT, tenant_id)
                count = await conn.fetchval(COUNT_FOR_TENANT, tenant_id)
                if count >= MAX_RECEIVERS_PER_TENANT:
                    raise PolicyBlockedError(
                        f"too_many_webhooks: a tenant has at most {MAX_RECEIVERS_PER_TENANT}"
                    )
                row = await conn.fetchrow(
                    INSERT_RECEIVER,
                    receiver_id,
                    tenant_id,
                    url,
                    list(event_types),
                    description,
                    sealed,
                    key_id,
                )
                await conn.execute(
                    REGISTER_RECEIVER_ENDPOINT, endpoint_name(receiver_id), receiver_id
                )
        assert row is not None
        return msgspec.convert(dict(row.items()), Receiver), secret

    async def list_for(self, tenant_id: int) -> list[Receiver]:
        with map_db_errors("listing webhook receivers"):
            rows = await self.pool.fetch(LIST_FOR_TENANT, tenant_id)
        return [msgspec.convert(dict(r.items()), Receiver) for r in rows]

    async def get(self, tenant_id: int, receiver_id: uuid.UUID) -> Receiver | None:
        with map_db_errors("reading a webhook receiver"):
            row = await self.pool.fetchrow(GET_FOR_TENANT, tenant_id, receiver_id)
        return None if row is None else msgspec.convert(dict(row.items()), Receiver)

    async def delete(self, tenant_id: int, receiver_id: uuid.UUID) -> bool:
        """False when the tenant never had it; True again for one already deleted."""
        with map_db_errors("deleting a webhook receiver"):
            found = await self.pool.fetchval(DELETE_FOR_TENANT, tenant_id, receiver_id)
        return found is not None

    async def rotate(
        self, tenant_id: int, receiver_id: uuid.UUID, previous_valid_seconds: float
    ) -> tuple[Receiver, str] | None:
        """A new current secret (returned, shown once); the one it replaces keeps signing
        for ``previous_valid_seconds``. None when there is no such receiver."""
        secret = new_secret()
        with map_db_errors("rotating a webhook receiver's secret"):
            async with acquired(self.pool) as conn, transaction(conn):
                locked = await conn.fetchrow(LOCK_SECRETS, tenant_id, receiver_id)
                if locked is None:
                    return None
                current = self._open(
                    receiver_id, locked["secrets_ciphertext"], locked["secrets_key_id"]
                )
                sealed, key_id = self._seal(receiver_id, [secret, current[0]])
                row = await conn.fetchrow(
                    ROTATE,
                    tenant_id,
                    receiver_id,
                    sealed,
                    key_id,
                    float(previous_valid_seconds),
                )
        assert row is not None
        return msgspec.convert(dict(row.items()), Receiver), secret

    async def active(self) -> list[ActiveReceiver]:
        """Every receiver with the secrets that sign now."""
        with map_db_errors("reading webhook receivers"):
            rows = await self.pool.fetch(ACTIVE)
        out: list[ActiveReceiver] = []
        for r in rows:
            secrets = self._open(r["id"], r["secrets_ciphertext"], r["secrets_key_id"])
            out.append(
                ActiveReceiver(
                    endpoint=endpoint_name(r["id"]),
                    id=r["id"],
                    tenant_id=r["tenant_id"],
                    url=r["url"],
                    event_types=list(r["event_types"]),
                    secrets=secrets if r["previous_signs"] else secrets[:1],
                )
            )
        return out
