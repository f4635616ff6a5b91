"""``[[api.playback_keys]]``: the keys that sign and verify playback tokens (JWTs).

The FIRST key signs every token the API issues; every key listed verifies. A rotation is
three rolling deploys, so that no API process ever meets a token it cannot verify:

1. add the new key AFTER the current one (it verifies, nothing is signed with it yet);
2. once every edge has fetched the new key set (``/.well-known/jwks.json`` is cacheable
   for ``api/jwks.py``'s ``MAX_AGE_SECONDS``, 5 minutes), move it first (it signs; the old
   key still verifies the tokens already handed out);
3. once ``playback_token_ttl_seconds`` has passed, remove the old key.

Key material lives in files (a Kubernetes Secret mounted as a volume, a systemd credential),
never in the TOML: ``private_key_file`` (PEM; ES256: a P-256 key, RS256: RSA of at least 2048
bits; signs and verifies), ``public_key_file`` (PEM; verifies only: a key retired from
signing whose private half is gone), ``secret_file`` (HS256: base64 of at least 32 random
bytes). The public halves of ES256 and RS256 keys are served as a JWKS
(``/.well-known/jwks.json``) so an edge can verify tokens without calling the API; an HS256
key can only be verified by whoever holds the secret, so it is never published.

With no ``playback_keys``, tokens are HS256 under ``playback_token_secret`` (kid
``default``): the single-process default.
"""

from __future__ import annotations

import re

import msgspec

from aivedio.errors import ConfigError

ALGORITHMS = ("HS256", "ES256", "RS256")
# A kid travels in every token's header and names a key in the JWKS: short and plain.
KID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class PlaybackKeyConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    kid: str
    algorithm: str = "ES256"
    private_key_file: str = ""
    public_key_file: str = ""
    secret_file: str = ""


def validate_playback_keys(keys: list[PlaybackKeyConfig]) -> None:
    """The key list's shape (the files are read when the API starts: ``api/token_keys.py``)."""
    seen: set[str] = set()
    for index, key in enumerate(keys):
        where = f"config error: api.playback_keys[{index}]"
        if not KID.match(key.kid):
            raise ConfigError(f"{where}.kid: 1 to 64 of A-Z a-z 0-9 . _ -")
        if key.kid in seen:
            raise ConfigError(f"{where}.kid: {key.kid!r} is listed twice")
        seen.add(key.kid)
        if key.algorithm not in ALGORITHMS:
            raise ConfigError(f"{where}.algorithm: one of {', '.join(ALGORITHMS)}")
        files = [f for f in (key.private_key_file, key.public_key_file, key.secret_file) if f]
        if len(files) != 1:
            raise ConfigError(
                f"{where}: exactly one of private_key_file, public_key_file, secret_file"
            )
        if key.algorithm == "HS256" and not key.secret_file:
            raise ConfigError(f"{where}: an HS256 key is a secret_file")
        if key.algorithm != "HS256" and key.secret_file:
            raise ConfigError(f"{where}: a secret_file is for HS256 keys only")
    if keys and keys[0].public_key_file:
        raise ConfigError(
            "config error: api.playback_keys[0]: the first key signs, so it needs its"
            " private_key_file (or secret_file), not a public key alone"
        )
