"""Provider URLs at rest: AES-256-GCM with a key id stored beside each ciphertext.

A signed provider URL is a bearer credential for hours or days. It is encrypted before it
reaches PostgreSQL and decrypted only by the stage that fetches it; job payloads carry ids.
The key id travels with the ciphertext, so keys rotate without re-encrypting: the current key
encrypts, any configured key decrypts. The record id is bound in as associated data, so a
ciphertext copied onto another row does not decrypt.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from aivedio.errors import ConfigError

NONCE_BYTES = 12


class UrlCipher:
    def __init__(self, current_key_id: str, keys: Mapping[str, bytes]) -> None:
        if current_key_id not in keys:
            raise ConfigError(f"url encryption key id {current_key_id!r} has no key")
        for key_id, key in keys.items():
            if len(key) != 32:
                raise ConfigError(f"url encryption key {key_id!r} must be 32 bytes")
        self.current_key_id = current_key_id
        self._aead = {key_id: AESGCM(key) for key_id, key in keys.items()}

    @classmethod
    def from_base64(
        cls, current_key_id: str, current_key: str, previous: Mapping[str, str] | None = None
    ) -> UrlCipher:
        keys = {k: base64.b64decode(v) for k, v in (previous or {}).items()}
        keys[current_key_id] = base64.b64decode(current_key)
        return cls(current_key_id, keys)

    def encrypt(self, url: str, *, bound_to: str) -> tuple[bytes, str]:
        """Return (nonce || ciphertext, key id)."""
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._aead[self.current_key_id].encrypt(nonce, url.encode(), bound_to.encode())
        return nonce + sealed, self.current_key_id

    def decrypt(self, blob: bytes, key_id: str, *, bound_to: str) -> str:
        aead = self._aead.get(key_id)
        if aead is None:
            raise ConfigError(f"no url encryption key with id {key_id!r} is configured")
        try:
            plain = aead.decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], bound_to.encode())
        except InvalidTag:
            raise ConfigError(
                f"url ciphertext does not decrypt with key {key_id!r} (wrong key or record)"
            ) from None
        return plain.decode()
