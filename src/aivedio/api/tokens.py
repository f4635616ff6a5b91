"""Playback tokens: one token opens one published revision's prefix, until it expires.

Seed 002 §11.7.7 and §11.12.5: a token covers a resource prefix (not one URL per segment),
is bound to the tenant and expires. The token travels in the URL path
(``/media/{token}/hls/master.m3u8``), so the relative URIs inside playlists resolve under it
and a CDN can cache by path; the prefix is the revision's own, so caches never mix versions.

Format: ``base64url(json claims) "." base64url(HMAC-SHA256(key, "aivedio-playback-v1." +
claims))``. The claims are checked after the MAC, so nothing an attacker wrote is parsed
before it is authenticated.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
import uuid

import msgspec

from aivedio.errors import AivedioError, Retry
from aivedio.store.objects.keys import revision_prefix

_CONTEXT = b"aivedio-playback-v1."


class TokenRejected(AivedioError):
    """A playback token is malformed, tampered with or expired."""

    error_class = "token_rejected"
    retry = Retry.NEVER


class Claims(msgspec.Struct, frozen=True, array_like=True):
    tenant_id: int
    asset_id: uuid.UUID
    revision: int
    expires_at: int  # unix seconds

    @property
    def prefix(self) -> str:
        """The object-key prefix this token opens, with its trailing slash."""
        return revision_prefix(self.tenant_id, self.asset_id, self.revision) + "/"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class TokenSigner:
    def __init__(self, key: bytes) -> None:
        if len(key) < 32:
            raise ValueError("a playback token key has at least 32 bytes")
        self._key = key

    def _mac(self, body: str) -> str:
        return _b64(hmac.new(self._key, _CONTEXT + body.encode(), hashlib.sha256).digest())

    def issue(
        self, tenant_id: int, asset_id: uuid.UUID, revision: int, ttl_seconds: float
    ) -> tuple[str, Claims]:
        claims = Claims(tenant_id, asset_id, revision, int(time.time() + ttl_seconds))
        body = _b64(msgspec.json.encode(claims))
        return f"{body}.{self._mac(body)}", claims

    def verify(self, token: str, *, now: float | None = None) -> Claims:
        body, dot, mac = token.partition(".")
        if not dot or not body or not mac or len(token) > 512:
            raise TokenRejected("playback token is malformed")
        if not hmac.compare_digest(self._mac(body).encode(), mac.encode()):
            raise TokenRejected("playback token signature does not match")
        try:
            claims = msgspec.json.decode(_unb64(body), type=Claims)
        except (binascii.Error, ValueError, msgspec.DecodeError):
            raise TokenRejected("playback token is malformed") from None
        if claims.expires_at <= (time.time() if now is None else now):
            raise TokenRejected("playback token has expired")
        return claims
