"""Playback tokens as JWTs: what they carry, every way a token is refused, key rotation, the
key set an edge verifies with, and the configuration's faults (``api/tokens.py``,
``api/token_keys.py``, ``config/playback_keys.py``)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import uuid
from pathlib import Path

import jwt
import msgspec
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from aivedio.api.token_keys import PlaybackKey, load_keys
from aivedio.api.tokens import AUDIENCE, ISSUER, Claims, TokenRejected, TokenSigner, signer_from
from aivedio.config.api import ApiConfig, validate_api
from aivedio.config.playback_keys import PlaybackKeyConfig
from aivedio.errors import ConfigError
from aivedio.store.objects.keys import revision_prefix

ASSET = uuid.UUID("00000000-0000-4000-8000-000000000001")


def pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def public_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


@pytest.fixture(scope="module")
def ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def es256(kid: str, key: ec.EllipticCurvePrivateKey) -> PlaybackKey:
    return PlaybackKey(kid, "ES256", key, key.public_key())


def rs256(kid: str, key: rsa.RSAPrivateKey) -> PlaybackKey:
    return PlaybackKey(kid, "RS256", key, key.public_key())


def hs256(kid: str, secret: bytes = b"k" * 32) -> PlaybackKey:
    return PlaybackKey(kid, "HS256", secret, secret)


def test_a_token_is_a_jwt_naming_its_key_and_scoped_to_the_revision(
    ec_key: ec.EllipticCurvePrivateKey,
) -> None:
    signer = TokenSigner([es256("k1", ec_key)])
    token, claims = signer.issue(7, ASSET, 3, 600)
    header = jwt.get_unverified_header(token)
    assert header == {"alg": "ES256", "kid": "k1", "typ": "JWT"}
    # What an edge does: the key from the JWKS by kid, the standard checks, then the prefix.
    jwks = jwt.PyJWKSet.from_dict(signer.jwks())
    payload = jwt.decode(
        token, jwks["k1"].key, algorithms=["ES256"], audience=AUDIENCE, issuer=ISSUER
    )
    assert payload["pfx"] == claims.prefix == revision_prefix(7, ASSET, 3) + "/"
    assert (payload["sub"], payload["tid"], payload["rev"]) == (str(ASSET), 7, 3)
    assert payload["exp"] == claims.expires_at and payload["exp"] - payload["iat"] == 600
    assert signer.verify(token) == claims


@pytest.mark.parametrize("kind", ["HS256", "ES256", "RS256"])
def test_each_algorithm_signs_and_verifies(
    kind: str, ec_key: ec.EllipticCurvePrivateKey, rsa_key: rsa.RSAPrivateKey
) -> None:
    key = {"HS256": hs256("a"), "ES256": es256("a", ec_key), "RS256": rs256("a", rsa_key)}[kind]
    signer = TokenSigner([key])
    token, claims = signer.issue(1, ASSET, 1, 60)
    assert jwt.get_unverified_header(token)["alg"] == kind
    assert signer.verify(token) == claims
    # A secret is never published; a public key is.
    assert [k["kid"] for k in signer.jwks()["keys"]] == ([] if kind == "HS256" else ["a"])
    for jwk in signer.jwks()["keys"]:
        assert "d" not in jwk and "p" not in jwk and jwk["use"] == "sig"


def test_a_rotation_in_three_steps_never_refuses_a_token_it_handed_out(
    ec_key: ec.EllipticCurvePrivateKey,
) -> None:
    old = es256("2026-11", ec_key)
    new = es256("2026-12", ec.generate_private_key(ec.SECP256R1()))
    before = TokenSigner([old])
    first, _ = before.issue(1, ASSET, 1, 600)
    # 1: the new key is added after the old one: it verifies, the old one still signs.
    step1 = TokenSigner([old, new])
    assert jwt.get_unverified_header(step1.issue(1, ASSET, 1, 600)[0])["kid"] == "2026-11"
    assert [k["kid"] for k in step1.jwks()["keys"]] == ["2026-11", "2026-12"]
    # 2: the new key signs; tokens of the old one still open their revision.
    step2 = TokenSigner([new, old])
    second, _ = step2.issue(1, ASSET, 1, 600)
    assert jwt.get_unverified_header(second)["kid"] == "2026-12"
    for signer in (step1, step2):  # a process of step 1 meets tokens of step 2, and back
        assert signer.verify(first).asset_id == ASSET
        assert signer.verify(second).asset_id == ASSET
    # 3: the old key is gone (after the token TTL): its tokens are refused.
    step3 = TokenSigner([new])
    assert step3.verify(second).asset_id == ASSET
    with pytest.raises(TokenRejected, match="key this API does not know"):
        step3.verify(first)


def forge(header: dict[str, object], payload: dict[str, object], key: bytes) -> str:
    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    signing = b64(json.dumps(header).encode()) + "." + b64(json.dumps(payload).encode())
    mac = hmac.new(key, signing.encode(), hashlib.sha256).digest()
    return signing + "." + b64(mac)


def good_payload(**changes: object) -> dict[str, object]:
    payload: dict[str, object] = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": str(ASSET),
        "tid": 1,
        "rev": 1,
        "pfx": revision_prefix(1, ASSET, 1) + "/",
        "iat": 1,
        "exp": 4_000_000_000,
    }
    payload.update(changes)
    return {k: v for k, v in payload.items() if v is not None}


def test_a_token_signed_as_hs256_with_a_public_key_is_refused(rsa_key: rsa.RSAPrivateKey) -> None:
    # Algorithm confusion: the attacker knows the RSA public key (it is in the JWKS) and
    # uses its PEM as an HMAC secret under the RSA key's kid.
    signer = TokenSigner([rs256("r", rsa_key)])
    token = forge({"alg": "HS256", "kid": "r", "typ": "JWT"}, good_payload(), public_pem(rsa_key))
    with pytest.raises(TokenRejected):
        signer.verify(token)
    unsigned = token.rsplit(".", 1)[0] + "."
    none = forge({"alg": "none", "kid": "r"}, good_payload(), b"")
    for bad in (unsigned, none.rsplit(".", 1)[0] + "."):
        with pytest.raises(TokenRejected):
            signer.verify(bad)


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"pfx": revision_prefix(1, ASSET, 2) + "/"}, "prefix"),  # another revision's
        ({"pfx": revision_prefix(1, ASSET, 1).split(str(ASSET))[0]}, "prefix"),  # the tenant's
        ({"pfx": None}, "prefix"),
        ({"tid": True}, "malformed"),
        ({"tid": "1"}, "malformed"),
        ({"rev": 1.0}, "malformed"),
        ({"sub": "not-a-uuid"}, "malformed"),
        ({"aud": "someone-else"}, "malformed"),
        ({"iss": "someone-else"}, "malformed"),
        ({"exp": None}, "malformed"),
        ({"iat": None}, "malformed"),
    ],
)
def test_claims_that_do_not_hold_are_refused(changes: dict[str, object], why: str) -> None:
    secret = b"k" * 32
    signer = TokenSigner([hs256("h", secret)])
    token = forge({"alg": "HS256", "kid": "h", "typ": "JWT"}, good_payload(**changes), secret)
    with pytest.raises(TokenRejected, match=why):
        signer.verify(token)
    # The same forge with good claims passes: the refusal is the claim's.
    fine = forge({"alg": "HS256", "kid": "h", "typ": "JWT"}, good_payload(), secret)
    assert signer.verify(fine).asset_id == ASSET


def test_malformed_oversized_unknown_and_expired_tokens_are_refused() -> None:
    signer = TokenSigner([hs256("h")])
    token, claims = signer.issue(1, ASSET, 1, 60)
    for bad in ("", "a.b.c", "é.é.é", token + "x" * 2048, "..", token.replace("h", "z", 1)):
        with pytest.raises(TokenRejected):
            signer.verify(bad)
    other, _ = TokenSigner([hs256("other")]).issue(1, ASSET, 1, 60)
    with pytest.raises(TokenRejected, match="does not know"):
        signer.verify(other)
    same_kid, _ = TokenSigner([hs256("h", b"z" * 32)]).issue(1, ASSET, 1, 60)
    with pytest.raises(TokenRejected, match="signature"):
        signer.verify(same_kid)
    # Verified once, cached; the expiry is still checked on every use.
    assert signer.verify(token) == claims
    with pytest.raises(TokenRejected, match="expired"):
        signer.verify(token, now=claims.expires_at)


def test_tokens_of_the_format_before_verify_until_they_expire_and_are_never_issued() -> None:
    secret = b"s" * 32
    claims = Claims(1, ASSET, 1, 4_000_000_000)
    body = base64.urlsafe_b64encode(msgspec.json.encode(claims)).rstrip(b"=").decode()
    mac = hmac.new(secret, b"aivedio-playback-v1." + body.encode(), hashlib.sha256).digest()
    legacy = body + "." + base64.urlsafe_b64encode(mac).rstrip(b"=").decode()
    assert TokenSigner.hs256(secret).verify(legacy) == claims
    assert TokenSigner.hs256(secret).issue(1, ASSET, 1, 60)[0].count(".") == 2
    # Without the legacy secret (keys listed, no playback_token_secret) they are refused.
    with pytest.raises(TokenRejected):
        TokenSigner([hs256("h", secret)]).verify(legacy)
    with pytest.raises(TokenRejected):
        TokenSigner.hs256(b"t" * 32).verify(legacy)


# -- configuration ------------------------------------------------------------------------


def api_with(*keys: PlaybackKeyConfig, secret: str = "") -> ApiConfig:
    return ApiConfig(playback_keys=list(keys), playback_token_secret=secret)


def test_keys_are_read_from_their_files_and_the_first_signs(
    tmp_path: Path, ec_key: ec.EllipticCurvePrivateKey, rsa_key: rsa.RSAPrivateKey
) -> None:
    (tmp_path / "new.pem").write_bytes(pem(ec_key))
    (tmp_path / "old.pub").write_bytes(public_pem(rsa_key))
    (tmp_path / "hs").write_text(base64.b64encode(b"x" * 32).decode() + "\n")
    api = api_with(
        PlaybackKeyConfig(kid="new", algorithm="ES256", private_key_file=str(tmp_path / "new.pem")),
        PlaybackKeyConfig(kid="old", algorithm="RS256", public_key_file=str(tmp_path / "old.pub")),
        PlaybackKeyConfig(kid="hs", algorithm="HS256", secret_file=str(tmp_path / "hs")),
    )
    validate_api(api)
    keys = load_keys(api)
    assert [(k.kid, k.algorithm, k.signing is not None) for k in keys] == [
        ("new", "ES256", True),
        ("old", "RS256", False),
        ("hs", "HS256", True),
    ]
    signer = signer_from(api)
    token, _ = signer.issue(1, ASSET, 1, 60)
    assert jwt.get_unverified_header(token)["kid"] == "new"
    # A token of the retired RSA key (its private half elsewhere) still verifies.
    retired = TokenSigner([rs256("old", rsa_key)]).issue(1, ASSET, 1, 60)[0]
    assert signer.verify(retired).asset_id == ASSET
    assert [k["kid"] for k in signer.jwks()["keys"]] == ["new", "old"]


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ([PlaybackKeyConfig(kid="a b", secret_file="x", algorithm="HS256")], "kid"),
        (
            [
                PlaybackKeyConfig(kid="a", algorithm="HS256", secret_file="x"),
                PlaybackKeyConfig(kid="a", algorithm="HS256", secret_file="y"),
            ],
            "listed twice",
        ),
        ([PlaybackKeyConfig(kid="a", algorithm="none", secret_file="x")], "one of HS256"),
        ([PlaybackKeyConfig(kid="a", algorithm="ES256")], "exactly one of"),
        (
            [PlaybackKeyConfig(kid="a", algorithm="ES256", private_key_file="x", secret_file="y")],
            "exactly one of",
        ),
        ([PlaybackKeyConfig(kid="a", algorithm="HS256", private_key_file="x")], "secret_file"),
        ([PlaybackKeyConfig(kid="a", algorithm="ES256", secret_file="x")], "HS256 keys only"),
        ([PlaybackKeyConfig(kid="a", algorithm="ES256", public_key_file="x")], "first key signs"),
    ],
)
def test_a_key_list_of_the_wrong_shape_is_a_config_error(
    keys: list[PlaybackKeyConfig], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        validate_api(api_with(*keys))


def test_key_files_that_are_not_what_they_claim_are_config_errors_that_name_no_bytes(
    tmp_path: Path, ec_key: ec.EllipticCurvePrivateKey
) -> None:
    secret = base64.b64encode(b"y" * 16).decode()
    (tmp_path / "short").write_text(secret)
    (tmp_path / "junk").write_text("not base64 !")
    (tmp_path / "p384.pem").write_bytes(pem(ec.generate_private_key(ec.SECP384R1())))
    (tmp_path / "rsa1024.pem").write_bytes(
        pem(rsa.generate_private_key(public_exponent=65537, key_size=1024))  # noqa: S505 - refused
    )
    (tmp_path / "ec.pem").write_bytes(pem(ec_key))
    (tmp_path / "garbage.pem").write_text("-----BEGIN PRIVATE KEY-----\nAAAA\n")
    cases = [
        ("HS256", "secret_file", "missing", "cannot read"),
        ("HS256", "secret_file", "short", "under 32 bytes"),
        ("HS256", "secret_file", "junk", "not base64"),
        ("ES256", "private_key_file", "p384.pem", "P-256"),
        ("RS256", "private_key_file", "rsa1024.pem", "2048 to 4096 bits"),
        ("RS256", "private_key_file", "ec.pem", "RSA key"),
        ("ES256", "private_key_file", "garbage.pem", "not a PEM key"),
    ]
    for algorithm, field, name, message in cases:
        key = PlaybackKeyConfig(kid="k", algorithm=algorithm, **{field: str(tmp_path / name)})
        with pytest.raises(ConfigError, match=message) as caught:
            load_keys(api_with(key))
        assert "kid 'k'" in str(caught.value)
        assert secret not in str(caught.value) and "AAAA" not in str(caught.value)


def test_without_keys_the_secret_is_the_one_hs256_key_and_its_absence_says_how_to_make_one() -> (
    None
):
    signer = signer_from(api_with(secret=base64.b64encode(b"s" * 32).decode()))
    token, _ = signer.issue(1, ASSET, 1, 60)
    assert jwt.get_unverified_header(token) == {"alg": "HS256", "kid": "default", "typ": "JWT"}
    assert signer.jwks() == {"keys": []}
    with pytest.raises(ConfigError, match="openssl rand"):
        signer_from(api_with())


def test_the_prefix_may_be_an_earlier_revision_of_the_same_asset_only() -> None:
    # An enrichment (revision 2) keeps its files under the revision it enriches (1): its
    # token names that prefix, so an edge reads the right keys.
    signer = TokenSigner([hs256("h")])
    token, claims = signer.issue(1, ASSET, 2, 60, storage_prefix=revision_prefix(1, ASSET, 1) + "/")
    assert jwt.decode(token, options={"verify_signature": False})["pfx"].endswith("/rev/1/")
    assert signer.verify(token) == claims
    other = uuid.UUID("00000000-0000-4000-8000-000000000002")
    for wrong in (
        revision_prefix(1, ASSET, 3) + "/",  # a later revision than the claimed one
        revision_prefix(1, other, 1) + "/",  # another asset's
        revision_prefix(2, ASSET, 1) + "/",  # another tenant's
        revision_prefix(1, ASSET, 1),  # no trailing slash: a prefix of rev/10 too
    ):
        with pytest.raises(ValueError, match="not a revision prefix"):
            signer.issue(1, ASSET, 2, 60, storage_prefix=wrong)
