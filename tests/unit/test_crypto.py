"""UrlCipher: signed provider URLs at rest (AES-256-GCM, key id beside the ciphertext)."""

from __future__ import annotations

import base64

import pytest

from aivedio.crypto import NONCE_BYTES, UrlCipher
from aivedio.errors import ConfigError

URL = "https://cdn.provider.test/files/t1/0?exp=1900000000&sig=deadbeefSECRET"
RECORD = "7b0c1a52-93a4-4f5e-9a43-0e4d7f6c2b11"
K1 = b"1" * 32
K2 = b"2" * 32


def test_encrypted_url_decrypts_to_the_original() -> None:
    cipher = UrlCipher("k1", {"k1": K1})
    blob, key_id = cipher.encrypt(URL, bound_to=RECORD)
    assert key_id == "k1"
    assert cipher.decrypt(blob, key_id, bound_to=RECORD) == URL


def test_each_encryption_uses_a_fresh_nonce_and_never_shows_the_url() -> None:
    cipher = UrlCipher("k1", {"k1": K1})
    blobs = [cipher.encrypt(URL, bound_to=RECORD)[0] for _ in range(3)]
    assert len(set(blobs)) == 3
    assert len({blob[:NONCE_BYTES] for blob in blobs}) == 3
    for blob in blobs:
        assert URL.encode() not in blob
        assert b"SECRET" not in blob
        assert b"sig=" not in blob


def test_ciphertext_copied_to_another_record_does_not_decrypt() -> None:
    cipher = UrlCipher("k1", {"k1": K1})
    blob, key_id = cipher.encrypt(URL, bound_to=RECORD)
    with pytest.raises(ConfigError, match="wrong key or record"):
        cipher.decrypt(blob, key_id, bound_to="another-record")


def test_tampered_ciphertext_does_not_decrypt() -> None:
    cipher = UrlCipher("k1", {"k1": K1})
    blob, key_id = cipher.encrypt(URL, bound_to=RECORD)
    tampered = blob[:-1] + bytes([blob[-1] ^ 1])
    with pytest.raises(ConfigError):
        cipher.decrypt(tampered, key_id, bound_to=RECORD)


def test_rotation_keeps_old_ciphertexts_readable_and_encrypts_with_the_new_key() -> None:
    old = UrlCipher("k1", {"k1": K1})
    old_blob, old_id = old.encrypt(URL, bound_to=RECORD)

    rotated = UrlCipher.from_base64(
        "k2", base64.b64encode(K2).decode(), {"k1": base64.b64encode(K1).decode()}
    )
    assert rotated.decrypt(old_blob, old_id, bound_to=RECORD) == URL

    new_blob, new_id = rotated.encrypt(URL, bound_to=RECORD)
    assert new_id == "k2"
    assert UrlCipher("k2", {"k2": K2}).decrypt(new_blob, "k2", bound_to=RECORD) == URL
    with pytest.raises(ConfigError):
        old.decrypt(new_blob, "k1", bound_to=RECORD)


def test_unknown_key_id_is_a_config_error_naming_it() -> None:
    cipher = UrlCipher("k1", {"k1": K1})
    blob, _ = cipher.encrypt(URL, bound_to=RECORD)
    with pytest.raises(ConfigError, match="'k9'"):
        cipher.decrypt(blob, "k9", bound_to=RECORD)


def test_current_key_id_without_a_key_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="'k2'"):
        UrlCipher("k2", {"k1": K1})


@pytest.mark.parametrize("length", [0, 16, 31, 33, 64])
def test_key_of_wrong_length_is_a_config_error(length: int) -> None:
    with pytest.raises(ConfigError, match="32 bytes"):
        UrlCipher("k1", {"k1": b"x" * length})


def test_wrong_length_previous_key_is_rejected_too() -> None:
    with pytest.raises(ConfigError, match="'old'"):
        UrlCipher.from_base64(
            "k1", base64.b64encode(K1).decode(), {"old": base64.b64encode(b"short").decode()}
        )
