"""API keys: random, shown once, stored as a SHA-256 hash under a public prefix.

A key reads ``av_live_<8 hex>_<43 url-safe characters>`` (``av_test_`` for test keys). The
part up to the second underscore is its prefix: unique, stored in clear, shown to operators
and used to find the row; the whole key is hashed and compared in constant time. 256 random
bits make a fast hash enough (there is nothing to brute-force), so a lookup costs one
indexed query and no key-stretching. The log redaction in ``logs.py`` masks this shape.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import uuid

import msgspec

from aivedio.errors import ConfigError, NotFoundError
from aivedio.store.database import Connection, Pool, map_db_errors

_KEY = re.compile(r"(av_(?:live|test)_[0-9a-f]{8})_[A-Za-z0-9_-]{43}")


class CreatedKey(msgspec.Struct, frozen=True, kw_only=True):
    id: uuid.UUID
    tenant_id: int
    prefix: str
    key: str  # the only time the whole key exists outside its holder


def _hash(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def new_key(environment: str = "live") -> tuple[str, str]:
    """(prefix, key)."""
    if environment not in ("live", "test"):
        raise ConfigError("an API key's environment is live or test")
    prefix = f"av_{environment}_{secrets.token_hex(4)}"
    return prefix, f"{prefix}_{secrets.token_urlsafe(32)}"


async def create_key(conn: Connection, tenant_id: int, *, environment: str = "live") -> CreatedKey:
    key_id = uuid.uuid4()
    with map_db_errors("creating an API key"):
        while True:
            prefix, key = new_key(environment)
            inserted = await conn.fetchval(
                "INSERT INTO api_keys (id, tenant_id, prefix, key_hash) VALUES ($1, $2, $3, $4)"
                " ON CONFLICT (prefix) DO NOTHING RETURNING 1",
                key_id,
                tenant_id,
                prefix,
                _hash(key),
            )
            if inserted:  # a prefix collision (1 in 4 billion) just draws again
                return CreatedKey(id=key_id, tenant_id=tenant_id, prefix=prefix, key=key)


async def revoke_key(conn: Connection, key_id_or_prefix: str) -> bool:
    """Revoke by id or prefix; False when it was already revoked. Takes effect at once."""
    try:
        key_id: uuid.UUID | None = uuid.UUID(key_id_or_prefix)
    except ValueError:
        key_id = None
    with map_db_errors("revoking an API key"):
        revoked = await conn.fetchval(
            "UPDATE api_keys SET revoked_at = now()"
            " WHERE (id = $1 OR prefix = $2) AND revoked_at IS NULL RETURNING 1",
            key_id,
            key_id_or_prefix,
        )
        if revoked:
            return True
        exists = await conn.fetchval(
            "SELECT 1 FROM api_keys WHERE id = $1 OR prefix = $2", key_id, key_id_or_prefix
        )
    if not exists:
        raise NotFoundError(f"no API key {key_id_or_prefix!r}")
    return False


def key_prefix(key: str) -> str | None:
    """The public prefix of a well-formed key (which names it in logs and rate limits)."""
    match = _KEY.fullmatch(key)
    return None if match is None else match.group(1)


async def tenant_for_key(pool: Pool, key: str) -> int | None:
    """The tenant a presented key belongs to, or None (unknown, malformed or revoked)."""
    match = _KEY.fullmatch(key)
    if match is None:
        return None
    with map_db_errors("checking an API key"):
        row = await pool.fetchrow(
            "SELECT k.tenant_id, k.key_hash FROM api_keys k WHERE k.prefix = $1"
            " AND k.revoked_at IS NULL",
            match.group(1),
        )
    if row is None or not hmac.compare_digest(bytes(row["key_hash"]), _hash(key)):
        return None
    return int(row["tenant_id"])
