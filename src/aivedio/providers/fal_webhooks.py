"""fal.ai webhook verification: ED25519 signatures against fal's published JWKS.

PROVIDERS.md: headers ``X-Fal-Webhook-Request-Id``, ``-User-Id``, ``-Timestamp`` (Unix
seconds) and ``-Signature`` (hex); the signed message is
``request_id \\n user_id \\n timestamp \\n sha256_hex(body)``; timestamps further than 300 s
from now are refused. Any key of the JWKS may have signed (fal rotates keys by publishing
several). The JWKS is given as its JSON document (from config, or fetched through the
guarded fetcher by the adapter); only ``OKP``/``Ed25519`` keys are taken from it.

The scheme's details come from independent implementations (PROVIDERS.md says so); there is
no published known-answer vector, so the tests sign with a key pair of their own.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from aivedio.errors import ConfigError
from aivedio.providers.hmac_callbacks import DEFAULT_SKEW_SECONDS, CallbackRejected, unix_seconds

HEADER = "X-Fal-Webhook-"
MAX_FIELD_CHARS = 256


class _Jwk(msgspec.Struct, frozen=True):
    kty: str = ""
    crv: str = ""
    x: str = ""


class _Jwks(msgspec.Struct, frozen=True):
    keys: list[_Jwk] = msgspec.field(default_factory=list)


def public_keys(jwks: bytes | str) -> list[Ed25519PublicKey]:
    """The Ed25519 keys of a JWKS document (a ConfigError when it has none)."""
    try:
        doc = msgspec.json.decode(jwks, type=_Jwks)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ConfigError(f"fal JWKS is not a JWKS document: {exc}") from None
    keys: list[Ed25519PublicKey] = []
    for jwk in doc.keys:
        if jwk.kty != "OKP" or jwk.crv != "Ed25519":
            continue
        try:
            raw = base64.urlsafe_b64decode(jwk.x + "=" * (-len(jwk.x) % 4))
            keys.append(Ed25519PublicKey.from_public_bytes(raw))
        except (binascii.Error, ValueError):
            raise ConfigError("fal JWKS holds an Ed25519 key that does not decode") from None
    if not keys:
        raise ConfigError("fal JWKS holds no Ed25519 key")
    return keys


def message(request_id: str, user_id: str, timestamp: str, body: bytes) -> bytes:
    return "\n".join([request_id, user_id, timestamp, hashlib.sha256(body).hexdigest()]).encode()


def verify(
    keys: Sequence[Ed25519PublicKey],
    headers: Mapping[str, str],
    body: bytes,
    *,
    now: float | None = None,
    tolerance_seconds: float = DEFAULT_SKEW_SECONDS,
) -> str:
    """Check one delivery; return its request id (the event id to accept once).

    ``headers`` should be case-insensitive (aiohttp's are); raises ``CallbackRejected``."""
    fields: dict[str, Any] = {
        name: headers.get(HEADER + name, "")
        for name in ("Request-Id", "User-Id", "Timestamp", "Signature")
    }
    missing = [HEADER + name for name, value in fields.items() if not value]
    if missing:
        raise CallbackRejected("fal webhook headers missing: " + ", ".join(missing))
    if any(len(v) > MAX_FIELD_CHARS or not v.isprintable() for v in fields.values()):
        raise CallbackRejected("fal webhook headers are not printable fields of at most 256")
    sent_at = unix_seconds(fields["Timestamp"], HEADER + "Timestamp")
    try:
        signature = bytes.fromhex(fields["Signature"])
    except ValueError:
        raise CallbackRejected("fal webhook signature is not hex") from None
    current = time.time() if now is None else now
    if not math.isfinite(current) or abs(current - sent_at) > tolerance_seconds:
        raise CallbackRejected(f"fal webhook timestamp outside the ±{tolerance_seconds:g}s window")
    signed = message(fields["Request-Id"], fields["User-Id"], fields["Timestamp"], body)
    for key in keys:
        try:
            key.verify(signature, signed)
        except InvalidSignature:
            continue
        return str(fields["Request-Id"])
    raise CallbackRejected("fal webhook signature matches no key of the JWKS")
