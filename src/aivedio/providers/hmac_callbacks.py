"""Provider callback verification: HMAC over ``timestamp.body``, a skew window, no replays.

The API mounts this; ``aivedio ingest`` records an output exactly as a verified callback
would. A signature is compared in constant time; the timestamp must be within
``skew_seconds`` of now (a captured callback cannot be replayed tomorrow); and an event id
is accepted once per provider (a captured callback cannot be replayed within the window).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time

from aivedio.errors import PolicyBlockedError

DEFAULT_SKEW_SECONDS = 300.0
# Whole Unix seconds in ASCII digits: no sign, fraction, exponent, space, "_" or other
# script's digits, all of which float() and int() would take.
_UNIX_SECONDS = re.compile(r"[0-9]{1,12}")


class CallbackRejected(PolicyBlockedError):
    """A callback failed verification (bad signature, stale timestamp, replayed id)."""

    error_class = "callback_rejected"


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    return hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def unix_seconds(timestamp: str, header: str) -> int:
    """A signature timestamp header's value: an integer count of seconds, nothing else."""
    if not _UNIX_SECONDS.fullmatch(timestamp):
        raise CallbackRejected(f"{header} is not whole Unix seconds")
    return int(timestamp)


def verify_signature(
    secret: bytes,
    timestamp: str,
    body: bytes,
    signature: str,
    *,
    now: float | None = None,
    skew_seconds: float = DEFAULT_SKEW_SECONDS,
) -> None:
    sent_at = unix_seconds(timestamp, "callback timestamp")
    current = time.time() if now is None else now
    if abs(current - sent_at) > skew_seconds:
        raise CallbackRejected(f"callback timestamp outside the ±{skew_seconds:g}s window")
    expected = sign(secret, timestamp, body)
    if not hmac.compare_digest(expected, signature.strip().lower().removeprefix("sha256=")):
        raise CallbackRejected("callback signature does not match")
