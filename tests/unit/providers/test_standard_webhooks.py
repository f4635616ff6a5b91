"""Standard Webhooks verification against the published known-answer vector and the edges."""

from __future__ import annotations

import msgspec
import pytest
from multidict import CIMultiDict

from aivedio.errors import ConfigError
from aivedio.providers.hmac_callbacks import CallbackRejected
from aivedio.providers.standard_webhooks import secret_key, sign, verify

# Published in replicate-python's tests (PROVIDERS.md, "Standard Webhooks").
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
MSG_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
TIMESTAMP = "1614265330"
BODY = b'{"test": 2432232314}'
EXPECTED = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
KEY = secret_key(SECRET)


def headers(signature: str = EXPECTED, **extra: str) -> CIMultiDict[str]:
    base = {"Webhook-Id": MSG_ID, "Webhook-Timestamp": TIMESTAMP, "Webhook-Signature": signature}
    base.update(extra)
    return CIMultiDict(base)


def test_the_known_answer_vector() -> None:
    assert sign(KEY, MSG_ID, TIMESTAMP, BODY) == EXPECTED
    assert verify(KEY, headers(), BODY, now=float(TIMESTAMP)) == MSG_ID


def test_any_listed_signature_may_match_during_a_secret_rotation() -> None:
    rotated = f"v1,AAAAbm90IHRoaXMgb25lAAAAAAAAAAAAAAAAAAAAAAA= {EXPECTED}"
    assert verify(KEY, headers(rotated), BODY, now=float(TIMESTAMP)) == MSG_ID


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"body": BODY + b" "}, "does not match"),
        ({"signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE"}, "does not match"),
        ({"signature": "v2," + EXPECTED[3:]}, "does not match"),
        ({"signature": EXPECTED.lower()}, "does not match"),
        ({"now": float(TIMESTAMP) + 301}, "outside"),
        ({"now": float(TIMESTAMP) - 301}, "outside"),
        ({"key": secret_key("whsec_" + "QUJD")}, "does not match"),
    ],
)
def test_changed_deliveries_are_refused(change: dict[str, object], message: str) -> None:
    body = change.get("body", BODY)
    key = change.get("key", KEY)
    now = change.get("now", float(TIMESTAMP))
    signature = str(change.get("signature", EXPECTED))
    with pytest.raises(CallbackRejected, match=message):
        verify(key, headers(signature), body, now=now)  # type: ignore[arg-type]


def test_missing_and_malformed_headers_are_refused() -> None:
    for name in ("Webhook-Id", "Webhook-Timestamp", "Webhook-Signature"):
        partial = headers()
        del partial[name]
        with pytest.raises(CallbackRejected, match="required"):
            verify(KEY, partial, BODY, now=float(TIMESTAMP))
    with pytest.raises(CallbackRejected, match="whole Unix seconds"):
        verify(KEY, headers(**{"Webhook-Timestamp": "1614265330.5"}), BODY)
    with pytest.raises(CallbackRejected, match="printable"):
        verify(KEY, headers(**{"Webhook-Id": "x" * 300}), BODY, now=float(TIMESTAMP))


def test_secrets_must_be_whsec_base64() -> None:
    assert secret_key("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw") == KEY  # the prefix is optional
    for bad in ("whsec_", "whsec_%%%", "whsec_abc"):
        with pytest.raises(ConfigError, match="whsec_"):
            secret_key(bad)


@pytest.mark.parametrize(
    "timestamp", [" 1614265330", "+1614265330", "1_614_265_330", "\u0661614265330"]
)
def test_a_signed_timestamp_that_is_not_whole_ascii_seconds_is_refused(timestamp: str) -> None:
    signed = headers(sign(KEY, MSG_ID, timestamp, BODY), **{"Webhook-Timestamp": timestamp})
    with pytest.raises(CallbackRejected, match="whole Unix seconds"):
        verify(KEY, signed, BODY, now=float(TIMESTAMP))


def test_a_receiver_with_several_secrets_accepts_a_delivery_signed_by_any_of_them() -> None:
    # Gemini: the project's static webhook and a request's dynamic one, each its own secret.
    other = secret_key("whsec_" + "c2Vjb25kLXNlY3JldC1vZi10aGUtcHJvamVjdA==")
    assert verify([other, KEY], headers(), BODY, now=float(TIMESTAMP)) == MSG_ID
    with pytest.raises(CallbackRejected, match="does not match"):
        verify([other], headers(), BODY, now=float(TIMESTAMP))


def test_our_signatures_agree_with_the_reference_library_both_ways() -> None:
    """The ``standardwebhooks`` package (the specification's own library) signs what we
    verify and verifies what we sign."""
    from datetime import UTC, datetime

    from standardwebhooks.webhooks import Webhook

    secret = "whsec_" + "Z2VtaW5pLXByb2plY3Qtd2ViaG9vay1zZWNyZXQ="
    body = b'{"type": "video.generated", "data": {"output_file_uri": "https://x/f"}}'
    stamp = int(datetime.now(UTC).timestamp())
    theirs = Webhook(secret).sign("msg_1", datetime.fromtimestamp(stamp, UTC), body)
    got = CIMultiDict(
        {"webhook-id": "msg_1", "webhook-timestamp": str(stamp), "webhook-signature": theirs}
    )
    assert verify(secret_key(secret), got, body) == "msg_1"
    ours = sign(secret_key(secret), "msg_2", str(stamp), body)
    sent = {"webhook-id": "msg_2", "webhook-timestamp": str(stamp), "webhook-signature": ours}
    assert Webhook(secret).verify(body, sent) == msgspec.json.decode(body)
