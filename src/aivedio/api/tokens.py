"""Playback tokens: one token opens one published revision's prefix, until it expires.

Seed 002 §11.7.7 and §11.12.5: a token covers a resource prefix (not one URL per segment),
is bound to the tenant and expires. The token travels in the URL path
(``/media/{token}/hls/master.m3u8``), so the relative URIs inside playlists resolve under it
and a CDN can cache by path; the prefix is the revision's own, so caches never mix versions.

Format: a JWT (RFC 7519), as players, CDNs and their libraries know it. The header names
the key (``kid``) and its algorithm (HS256, ES256 or RS256: ``[[api.playback_keys]]``,
``api/token_keys.py``); the claims are the issuer ``aivedio``, the audience
``aivedio-playback``, ``sub`` the video (asset) id, ``tid`` the tenant, ``rev`` the revision,
``pfx`` the object-key prefix the token opens, ``iat`` and ``exp``. An edge (a CDN worker)
verifies an ES256 or RS256 token with the public keys of ``/.well-known/jwks.json`` and
serves any path under ``/media/{token}/`` whose key starts with ``pfx``.

What verification refuses: a token longer than ``MAX_TOKEN_CHARS``, a ``kid`` not in the key
set, any algorithm but that key's own (no ``none``, no HS256 under an RSA key's public PEM),
a bad signature, a missing claim, a wrong issuer or audience, a ``pfx`` that is not a
revision prefix of the claimed tenant's asset (at most the claimed revision: an
enrichment's files live under the revision it enriches), and an expired token. The header
and claims are parsed by PyJWT; ours are read only after the signature checked.

What an edge that verifies tokens itself cannot know: a video deleted after its token was
issued still plays there until ``exp`` (the API's own gateway checks the asset on every
request); an edge fetches the JWKS again when it meets a ``kid`` it does not know.

Tokens of the format before (``base64url(json claims) "." base64url(HMAC-SHA256)``, two
parts) are still verified with ``playback_token_secret`` until they expire, and never issued.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
import uuid
from collections import OrderedDict
from typing import Any

import jwt
import msgspec

from aivedio.api.token_keys import DEFAULT_KID, MIN_SECRET_BYTES, PlaybackKey, load_keys
from aivedio.config.api import ApiConfig, legacy_token_secret
from aivedio.errors import AivedioError, Retry
from aivedio.store.objects.keys import asset_prefix, revision_prefix

ISSUER = "aivedio"
AUDIENCE = "aivedio-playback"
# An RS256 token of a 4096-bit key is about 900 characters.
MAX_TOKEN_CHARS = 2048
# Verified tokens kept per process (each HLS segment request carries the same token).
CACHE_SIZE = 4096
_REQUIRED = ["iss", "aud", "sub", "exp", "iat"]
_LEGACY_CONTEXT = b"aivedio-playback-v1."


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


class TokenSigner:
    """Issues with the first key, verifies with any (by the header's ``kid``)."""

    def __init__(self, keys: list[PlaybackKey], *, legacy_secret: bytes | None = None) -> None:
        if not keys or keys[0].signing is None:
            raise ValueError("the first playback key signs: it needs its private half")
        self.keys = list(keys)
        self._by_kid = {key.kid: key for key in keys}
        self._legacy = legacy_secret
        self._verified: OrderedDict[str, Claims] = OrderedDict()

    @classmethod
    def hs256(cls, secret: bytes, *, kid: str = DEFAULT_KID) -> TokenSigner:
        """One HS256 key (the single-process default); it also verifies tokens of the
        format before JWTs."""
        if len(secret) < MIN_SECRET_BYTES:
            raise ValueError(f"a playback token key has at least {MIN_SECRET_BYTES} bytes")
        return cls([PlaybackKey(kid, "HS256", secret, secret)], legacy_secret=secret)

    def jwks(self) -> dict[str, Any]:
        """The public keys an edge verifies with (HS256 secrets are never in it)."""
        return {"keys": [jwk for key in self.keys if (jwk := key.jwk()) is not None]}

    def issue(
        self,
        tenant_id: int,
        asset_id: uuid.UUID,
        revision: int,
        ttl_seconds: float,
        *,
        storage_prefix: str | None = None,
    ) -> tuple[str, Claims]:
        """``storage_prefix``: where the revision's files are (an enrichment's live under
        the revision it enriches: ``api/published.py``), for an edge to read them; by
        default the revision's own prefix."""
        now = int(time.time())
        claims = Claims(tenant_id, asset_id, revision, int(now + ttl_seconds))
        pfx = storage_prefix or claims.prefix
        if not _prefix_of_asset(pfx, claims):
            raise ValueError(f"{pfx!r} is not a revision prefix of asset {asset_id}")
        key = self.keys[0]
        payload = {
            "iss": ISSUER,
            "aud": AUDIENCE,
            "sub": str(asset_id),
            "tid": tenant_id,
            "rev": revision,
            "pfx": pfx,
            "iat": now,
            "exp": claims.expires_at,
        }
        token = jwt.encode(payload, key.signing, algorithm=key.algorithm, headers={"kid": key.kid})
        return token, claims

    def verify(self, token: str, *, now: float | None = None) -> Claims:
        now = time.time() if now is None else now
        claims = self._verified.get(token)
        if claims is None:
            claims = self._verify_signed(token)
            self._verified[token] = claims
            if len(self._verified) > CACHE_SIZE:
                self._verified.popitem(last=False)
        if claims.expires_at <= now:
            raise TokenRejected("playback token has expired")
        return claims

    def _verify_signed(self, token: str) -> Claims:
        if len(token) > MAX_TOKEN_CHARS or not token.isascii():
            raise TokenRejected("playback token is malformed")
        if token.count(".") == 1:
            return self._verify_legacy(token)
        try:
            kid = jwt.get_unverified_header(token).get("kid")
        except jwt.PyJWTError:
            raise TokenRejected("playback token is malformed") from None
        key = self._by_kid.get(kid) if isinstance(kid, str) else None
        if key is None:
            raise TokenRejected("playback token is signed with a key this API does not know")
        try:
            payload = jwt.decode(
                token,
                key.verifying,
                algorithms=[key.algorithm],
                audience=AUDIENCE,
                issuer=ISSUER,
                # The expiry is checked by ``verify`` against its clock, on every use.
                options={"require": _REQUIRED, "verify_exp": False, "verify_iat": False},
            )
        except jwt.InvalidSignatureError:
            raise TokenRejected("playback token signature does not match") from None
        except jwt.PyJWTError:
            raise TokenRejected("playback token is malformed") from None
        return _claims(payload)

    def _verify_legacy(self, token: str) -> Claims:
        """A token of the format before JWTs, verified until it expires."""
        if self._legacy is None:
            raise TokenRejected("playback token is malformed")
        body, _, mac = token.partition(".")
        expected = hmac.new(self._legacy, _LEGACY_CONTEXT + body.encode(), hashlib.sha256)
        if not body or not hmac.compare_digest(_b64(expected.digest()).encode(), mac.encode()):
            raise TokenRejected("playback token signature does not match")
        try:
            return msgspec.json.decode(_unb64(body), type=Claims)
        except (binascii.Error, ValueError, msgspec.DecodeError):
            raise TokenRejected("playback token is malformed") from None


def _claims(payload: dict[str, Any]) -> Claims:
    """Our claims of a verified payload: their types, and ``pfx`` agreeing with them."""
    tid, rev, exp = payload.get("tid"), payload.get("rev"), payload.get("exp")
    if not all(type(v) is int for v in (tid, rev, exp)):
        raise TokenRejected("playback token is malformed")
    try:
        asset_id = uuid.UUID(str(payload["sub"]))
    except ValueError:
        raise TokenRejected("playback token is malformed") from None
    assert isinstance(tid, int) and isinstance(rev, int) and isinstance(exp, int)
    claims = Claims(tid, asset_id, rev, exp)
    pfx = payload.get("pfx")
    if not isinstance(pfx, str) or not _prefix_of_asset(pfx, claims):
        raise TokenRejected("playback token's prefix does not match its claims")
    return claims


def _prefix_of_asset(pfx: str, claims: Claims) -> bool:
    """``pfx`` is one revision prefix of the claimed tenant's asset (``…/rev/N/``, N at
    most the claimed revision: an enrichment's files live under the revision it enriches)."""
    root = asset_prefix(claims.tenant_id, claims.asset_id) + "/rev/"
    number = pfx.removeprefix(root).removesuffix("/")
    return (
        pfx.startswith(root)
        and pfx.endswith("/")
        and number.isascii()
        and number.isdigit()
        and 0 < int(number) <= claims.revision
    )


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def signer_from(api: ApiConfig) -> TokenSigner:
    """The API's signer: ``[[api.playback_keys]]`` (or the HS256 key of
    ``playback_token_secret``), and that secret for tokens of the format before JWTs."""
    return TokenSigner(load_keys(api), legacy_secret=legacy_token_secret(api))
