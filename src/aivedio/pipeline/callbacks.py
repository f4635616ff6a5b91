"""Provider callback verification: HMAC over ``timestamp.body``, a skew window, no replays.

The API mounts this; ``aivedio ingest`` records an output exactly as a verified callback
would. A signature is compared in constant time; the timestamp must be within
``skew_seconds`` of now (a captured callback cannot be replayed tomorrow); and an event id
is accepted once per provider (a captured callback cannot be replayed within the window).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import time

from aivedio.errors import PolicyBlockedError
from aivedio.store.together import Part

DEFAULT_SKEW_SECONDS = 300.0


class CallbackRejected(PolicyBlockedError):
    """A callback failed verification (bad signature, stale timestamp, replayed id)."""

    error_class = "callback_rejected"


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    return hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def verify_signature(
    secret: bytes,
    timestamp: str,
    body: bytes,
    signature: str,
    *,
    now: float | None = None,
    skew_seconds: float = DEFAULT_SKEW_SECONDS,
) -> None:
    try:
        sent_at = float(timestamp)
    except ValueError:
        raise CallbackRejected("callback timestamp is not a number") from None
    if not math.isfinite(sent_at):
        raise CallbackRejected("callback timestamp is not a number")
    current = time.time() if now is None else now
    if abs(current - sent_at) > skew_seconds:
        raise CallbackRejected(f"callback timestamp outside the ±{skew_seconds:g}s window")
    expected = sign(secret, timestamp, body)
    if not hmac.compare_digest(expected, signature.strip().lower().removeprefix("sha256=")):
        raise CallbackRejected("callback signature does not match")


def receipt_part(provider: str, event_id: str) -> Part:
    """The statement that records a callback's event id: a row when it is new, none when it
    was seen before (a replay or a duplicate)."""
    return Part(
        "INSERT INTO callback_receipts (provider, event_id) VALUES ($1, $2)"
        " ON CONFLICT DO NOTHING RETURNING 1",
        (provider, event_id),
    )
