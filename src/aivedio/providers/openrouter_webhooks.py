"""OpenRouter callback verification: ``X-OpenRouter-Signature: t=<ts>,v1=<hex>[,v1=<hex>…]``.

The signed content is ``"<ts>,<raw body>"`` (a comma, not a dot), HMAC-SHA256 keyed with the
webhook secret's UTF-8 bytes, sent as lowercase hex. Several ``v1`` entries may be listed
(the sender signs with the old and the new secret while one is rotated): any one matching
accepts, and every listed entry is compared, in constant time, against every configured key.
The timestamp (whole Unix seconds) must be within the tolerance of now in either direction.

A delivery's idempotency key is ``<job_id>-<status>``, taken from the verified body by the
adapter (``openrouter.parse_callback``), and accepted once per provider like any event id.
Nothing from the request is parsed before the signature matched, except the header itself,
which is held to a strict grammar and a small size.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import time
from collections.abc import Mapping, Sequence

from aivedio.providers.hmac_callbacks import DEFAULT_SKEW_SECONDS, CallbackRejected, unix_seconds

HEADER = "X-OpenRouter-Signature"
MAX_HEADER_CHARS = 1024
MAX_SIGNATURES = 8
_HEX_SHA256 = re.compile(r"[0-9a-f]{64}")


def sign(key: bytes, timestamp: str, body: bytes) -> str:
    """The hex ``v1`` value of one message (for tests and simulators)."""
    return hmac.new(key, timestamp.encode() + b"," + body, hashlib.sha256).hexdigest()


def signature_header(keys: Sequence[bytes], timestamp: str, body: bytes) -> str:
    return ",".join([f"t={timestamp}", *(f"v1={sign(k, timestamp, body)}" for k in keys)])


def parse_header(value: str) -> tuple[str, list[str]]:
    """``(timestamp, [v1 hex, …])``; CallbackRejected for anything but ``t=`` once and one to
    ``MAX_SIGNATURES`` ``v1=`` entries of 64 lowercase hex digits (unknown versions are
    skipped, as a later scheme may add them)."""
    if not value or len(value) > MAX_HEADER_CHARS:
        raise CallbackRejected(f"{HEADER} is missing or longer than {MAX_HEADER_CHARS}")
    timestamps: list[str] = []
    signatures: list[str] = []
    for entry in value.split(","):
        key, sep, item = entry.strip().partition("=")
        if not sep:
            raise CallbackRejected(f"{HEADER} is not a list of key=value entries")
        if key == "t":
            timestamps.append(item)
        elif key == "v1":
            if not _HEX_SHA256.fullmatch(item):
                raise CallbackRejected(f"{HEADER}: a v1 value is not 64 lowercase hex digits")
            signatures.append(item)
    if len(timestamps) != 1 or not 0 < len(signatures) <= MAX_SIGNATURES:
        raise CallbackRejected(f"{HEADER} needs one t= and one to {MAX_SIGNATURES} v1= entries")
    return timestamps[0], signatures


def verify(
    keys: Sequence[bytes],
    headers: Mapping[str, str],
    body: bytes,
    *,
    now: float | None = None,
    tolerance_seconds: float = DEFAULT_SKEW_SECONDS,
) -> None:
    """Check one delivery; raises ``CallbackRejected``. ``headers`` should be
    case-insensitive (aiohttp's are)."""
    timestamp, signatures = parse_header(headers.get(HEADER, ""))
    sent_at = unix_seconds(timestamp, f"{HEADER} t")
    current = time.time() if now is None else now
    if not math.isfinite(current) or abs(current - sent_at) > tolerance_seconds:
        raise CallbackRejected(f"{HEADER} timestamp outside the ±{tolerance_seconds:g}s window")
    expected = [sign(k, timestamp, body).encode() for k in keys]
    matched = 0
    for signature in signatures:
        matched += sum(hmac.compare_digest(e, signature.encode()) for e in expected)
    if not matched:
        raise CallbackRejected(f"{HEADER} does not match")
