"""fal.ai webhook verification: ED25519 over the documented message, keys from a JWKS."""

from __future__ import annotations

import base64

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from multidict import CIMultiDict

from aivedio.errors import ConfigError
from aivedio.providers.fal_webhooks import message, public_keys, verify
from aivedio.providers.hmac_callbacks import CallbackRejected

NOW = 1_800_000_000
BODY = b'{"request_id": "req-1", "status": "OK"}'


def jwk(private: Ed25519PrivateKey) -> dict[str, str]:
    raw = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return {
        "kty": "OKP",
        "crv": "Ed25519",
        "x": base64.urlsafe_b64encode(raw).rstrip(b"=").decode(),
    }


OLD, CURRENT, STRANGER = (Ed25519PrivateKey.generate() for _ in range(3))
JWKS = msgspec.json.encode(
    {"keys": [{"kty": "RSA", "n": "x", "e": "AQAB"}, jwk(OLD), jwk(CURRENT)]}
)
KEYS = public_keys(JWKS)


def delivery(
    signer: Ed25519PrivateKey = CURRENT, body: bytes = BODY, at: int = NOW, **extra: str
) -> CIMultiDict[str]:
    signature = signer.sign(message("req-1", "user-9", str(at), body)).hex()
    headers = {
        "X-Fal-Webhook-Request-Id": "req-1",
        "X-Fal-Webhook-User-Id": "user-9",
        "X-Fal-Webhook-Timestamp": str(at),
        "X-Fal-Webhook-Signature": signature,
    }
    headers.update(extra)
    return CIMultiDict(headers)


def test_a_delivery_signed_by_any_published_key_is_accepted() -> None:
    assert len(KEYS) == 2  # the RSA key is not fal's kind and is skipped
    assert verify(KEYS, delivery(), BODY, now=NOW) == "req-1"
    assert verify(KEYS, delivery(OLD), BODY, now=NOW + 299) == "req-1"


def test_forged_changed_and_stale_deliveries_are_refused() -> None:
    cases = [
        (delivery(STRANGER), BODY, NOW, "matches no key"),
        (delivery(), BODY + b" ", NOW, "matches no key"),
        (delivery(**{"X-Fal-Webhook-User-Id": "user-10"}), BODY, NOW, "matches no key"),
        (delivery(at=NOW - 301), BODY, NOW, "outside"),
        (delivery(at=NOW + 301), BODY, NOW, "outside"),
        (delivery(**{"X-Fal-Webhook-Signature": "zz"}), BODY, NOW, "not hex"),
        (delivery(**{"X-Fal-Webhook-Timestamp": "soon"}), BODY, NOW, "whole Unix seconds"),
    ]
    for headers, body, now, why in cases:
        with pytest.raises(CallbackRejected, match=why):
            verify(KEYS, headers, body, now=now)
    partial = delivery()
    del partial["X-Fal-Webhook-Signature"]
    with pytest.raises(CallbackRejected, match="missing: X-Fal-Webhook-Signature"):
        verify(KEYS, partial, BODY, now=NOW)


def test_a_jwks_without_usable_keys_is_a_config_error() -> None:
    for bad in (
        b"not json",
        b'{"keys": []}',
        b'{"keys": [{"kty": "RSA"}]}',
        b'{"keys": [{"kty": "OKP", "crv": "Ed25519", "x": "abc"}]}',
    ):
        with pytest.raises(ConfigError, match="JWKS"):
            public_keys(bad)


@pytest.mark.parametrize("timestamp", [f"{NOW}.5", f"+{NOW}", f" {NOW}", "1_800_000_000"])
def test_a_signed_timestamp_that_is_not_whole_ascii_seconds_is_refused(timestamp: str) -> None:
    signature = CURRENT.sign(message("req-1", "user-9", timestamp, BODY)).hex()
    headers = delivery(
        **{"X-Fal-Webhook-Timestamp": timestamp, "X-Fal-Webhook-Signature": signature}
    )
    with pytest.raises(CallbackRejected, match="whole Unix seconds"):
        verify(KEYS, headers, BODY, now=NOW)
