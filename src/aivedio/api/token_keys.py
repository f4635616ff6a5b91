"""The playback token keys, read from their files when the API starts.

``load_keys`` turns ``[[api.playback_keys]]`` (``config/playback_keys.py`` says what each
entry means and how a rotation goes) into ``PlaybackKey`` objects, or the single HS256 key
of ``playback_token_secret`` when none are listed. Every fault is a ``ConfigError`` that
names the key and the file, never the key's bytes.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from aivedio.config.api import ApiConfig, require_api_secret
from aivedio.config.playback_keys import PlaybackKeyConfig
from aivedio.errors import ConfigError

# The kid of the key made from ``playback_token_secret`` when no keys are listed.
DEFAULT_KID = "default"
MIN_RSA_BITS = 2048
# A 4096-bit signature makes a token of about 900 characters; a larger key's tokens would
# pass MAX_TOKEN_CHARS (api/tokens.py) and every one of them be refused.
MAX_RSA_BITS = 4096
MIN_SECRET_BYTES = 32


@dataclass(frozen=True, slots=True)
class PlaybackKey:
    kid: str
    algorithm: str  # HS256 | ES256 | RS256
    signing: Any  # the private key or the HMAC secret; None: verifies only
    verifying: Any  # the public key or the HMAC secret

    def jwk(self) -> dict[str, Any] | None:
        """The public JWK an edge verifies with; None for an HS256 secret (never published)."""
        if self.algorithm == "HS256":
            return None
        to_jwk = ECAlgorithm.to_jwk if self.algorithm == "ES256" else RSAAlgorithm.to_jwk
        jwk: dict[str, Any] = to_jwk(self.verifying, as_dict=True)
        return {**jwk, "kid": self.kid, "alg": self.algorithm, "use": "sig"}


def load_keys(api: ApiConfig) -> list[PlaybackKey]:
    """The API's key list, the signing key first."""
    if not api.playback_keys:
        secret = require_api_secret(api)
        return [PlaybackKey(DEFAULT_KID, "HS256", secret, secret)]
    return [_load(index, key) for index, key in enumerate(api.playback_keys)]


def _load(index: int, key: PlaybackKeyConfig) -> PlaybackKey:
    where = f"config error: api.playback_keys[{index}] (kid {key.kid!r})"
    path = Path(key.private_key_file or key.public_key_file or key.secret_file)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {path}: {exc.strerror}") from None
    if key.algorithm == "HS256":
        try:
            secret = base64.b64decode(data.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise ConfigError(f"{where}: {path} is not base64") from None
        if len(secret) < MIN_SECRET_BYTES:
            raise ConfigError(f"{where}: {path} holds under {MIN_SECRET_BYTES} bytes")
        return PlaybackKey(key.kid, "HS256", secret, secret)
    private: Any = None
    try:
        if key.private_key_file:
            private = serialization.load_pem_private_key(data, password=None)
            public: Any = private.public_key()
        else:
            public = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        # The message names the format problem, never the bytes.
        raise ConfigError(f"{where}: {path} is not a PEM key without a password: {exc}") from None
    if key.algorithm == "ES256":
        if not (isinstance(public, ec.EllipticCurvePublicKey) and public.curve.name == "secp256r1"):
            raise ConfigError(f"{where}: {path} is not a P-256 (secp256r1) key, as ES256 needs")
    elif not isinstance(public, rsa.RSAPublicKey) or not (
        MIN_RSA_BITS <= public.key_size <= MAX_RSA_BITS
    ):
        raise ConfigError(
            f"{where}: {path} is not an RSA key of {MIN_RSA_BITS} to {MAX_RSA_BITS} bits"
        )
    return PlaybackKey(key.kid, key.algorithm, private, public)
