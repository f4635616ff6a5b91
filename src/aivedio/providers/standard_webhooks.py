"""Standard Webhooks verification (Replicate, Gemini API webhooks, our own senders).

Headers ``webhook-id``, ``webhook-timestamp`` (Unix seconds) and ``webhook-signature``
(space-separated ``v1,<base64>`` entries; any one matching accepts, which is how a sender
rotates its secret). The signed content is ``{id}.{timestamp}.{raw body}``, HMAC-SHA256 keyed
with the base64-decoded part of the ``whsec_`` secret. Timestamps further than the tolerance
from now, in either direction, are refused, so a captured request cannot be replayed later;
the ``webhook-id`` (stable across the sender's retries) is then accepted once per provider
by ``callbacks.receipt_part`` (written with the callback's record), which refuses a replay
inside the window.

Nothing from the request is parsed before the signature matched, and comparisons are
constant-time.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import math
import time
from collections.abc import Mapping, Sequence

from aivedio.errors import ConfigError
from aivedio.providers.hmac_callbacks import DEFAULT_SKEW_SECONDS, CallbackRejected, unix_seconds

SECRET_PREFIX = "whsec_"  # noqa: S105 - the scheme's prefix, not a secret
MAX_ID_CHARS = 256
MAX_SIGNATURES = 16  # a rotation lists two or three; a long list is only work for us


def secret_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_…`` secret (a ConfigError naming the problem otherwise)."""
    encoded = secret.removeprefix(SECRET_PREFIX)
    try:
        key = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError("a Standard Webhooks secret is whsec_ followed by base64") from None
    if not key:
        raise ConfigError("a Standard Webhooks secret is whsec_ followed by base64")
    return key


def callback_key(secret: str) -> bytes:
    """The key of a generic provider's ``callback_secret`` in this scheme: the base64 part
    of a ``whsec_`` secret, else the secret's UTF-8 bytes (the key the legacy scheme uses,
    so one secret serves both)."""
    if secret.startswith(SECRET_PREFIX):
        return secret_key(secret)
    return secret.encode()


def sign(key: bytes, webhook_id: str, timestamp: str, body: bytes) -> str:
    """The ``v1,<base64>`` signature of one message (for tests and simulators)."""
    content = f"{webhook_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()).decode()


def verify(
    key: bytes | Sequence[bytes],
    headers: Mapping[str, str],
    body: bytes,
    *,
    now: float | None = None,
    tolerance_seconds: float = DEFAULT_SKEW_SECONDS,
) -> str:
    """Check one delivery; return its ``webhook-id`` (the event id to accept once).

    ``key``: one key, or several that may each have signed (a receiver configured with more
    than one secret: Gemini's project webhook and its per-request ones). ``headers`` should
    be case-insensitive (aiohttp's are); raises ``CallbackRejected``."""
    webhook_id = headers.get("webhook-id", "")
    timestamp = headers.get("webhook-timestamp", "")
    signatures = headers.get("webhook-signature", "")
    if not webhook_id or not timestamp or not signatures:
        raise CallbackRejected(
            "webhook-id, webhook-timestamp and webhook-signature headers are required"
        )
    if len(webhook_id) > MAX_ID_CHARS or not webhook_id.isprintable():
        raise CallbackRejected("webhook-id is not a printable id of at most 256 characters")
    sent_at = unix_seconds(timestamp, "webhook-timestamp")
    current = time.time() if now is None else now
    if not math.isfinite(current) or abs(current - sent_at) > tolerance_seconds:
        raise CallbackRejected(f"webhook-timestamp outside the ±{tolerance_seconds:g}s window")
    keys = [key] if isinstance(key, bytes) else list(key)
    expected = [sign(k, webhook_id, timestamp, body).encode() for k in keys]
    for entry in signatures.split()[:MAX_SIGNATURES]:
        version, _, _value = entry.partition(",")
        if version != "v1":
            continue
        # Every comparison made, whichever matches: the time taken says nothing about which.
        if sum(hmac.compare_digest(e, entry.encode()) for e in expected):
            return webhook_id
    raise CallbackRejected("webhook-signature does not match")
