"""Provider callback signatures: HMAC over ``timestamp.body`` within a ±300 s window."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from aivedio.errors import AivedioError, PolicyBlockedError, Retry
from aivedio.providers.hmac_callbacks import CallbackRejected, sign, verify_signature

SECRET = b"callback-secret"
NOW = 1_800_000_000.0
TS = "1800000000"
BODY = b'{"id":"evt_1","task_id":"t1","status":"SUCCEEDED"}'
GOOD = sign(SECRET, TS, BODY)


def test_callback_rejected_is_a_never_retried_aivedio_error() -> None:
    assert issubclass(CallbackRejected, AivedioError)
    assert issubclass(CallbackRejected, PolicyBlockedError)
    assert CallbackRejected.error_class == "callback_rejected"
    assert CallbackRejected.retry is Retry.NEVER


def test_sign_is_hex_hmac_sha256_over_timestamp_dot_body() -> None:
    expected = hmac.new(SECRET, TS.encode() + b"." + BODY, hashlib.sha256).hexdigest()
    assert expected == GOOD
    assert sign(SECRET, TS, BODY + b" ") != GOOD


def test_good_signature_passes() -> None:
    verify_signature(SECRET, TS, BODY, GOOD, now=NOW)


@pytest.mark.parametrize(
    "signature",
    [
        f"sha256={GOOD}",
        GOOD.upper(),
        f"SHA256={GOOD.upper()}",
        f"  {GOOD}\n",
    ],
    ids=["prefixed", "uppercase", "prefixed-uppercase", "surrounding-space"],
)
def test_signature_spellings_are_accepted(signature: str) -> None:
    verify_signature(SECRET, TS, BODY, signature, now=NOW)


def _rejected(secret: bytes, timestamp: str, body: bytes, signature: str, **kw: float) -> str:
    with pytest.raises(CallbackRejected) as info:
        verify_signature(secret, timestamp, body, signature, **kw)
    assert info.value.error_class == "callback_rejected"
    return info.value.detail


def test_wrong_secret_is_rejected() -> None:
    detail = _rejected(b"another-secret", TS, BODY, GOOD, now=NOW)
    assert "signature" in detail


def test_tampered_body_is_rejected() -> None:
    tampered = BODY.replace(b"SUCCEEDED", b"FAILED")
    assert "signature" in _rejected(SECRET, TS, tampered, GOOD, now=NOW)


def test_tampered_timestamp_is_rejected_even_inside_the_window() -> None:
    assert "signature" in _rejected(SECRET, "1800000001", BODY, GOOD, now=NOW)


def test_signature_of_another_length_is_rejected() -> None:
    assert "signature" in _rejected(SECRET, TS, BODY, GOOD[:-2], now=NOW)
    assert "signature" in _rejected(SECRET, TS, BODY, "", now=NOW)


@pytest.mark.parametrize("timestamp", ["", "yesterday", "18e8x", "0x6b49d200"])
def test_non_numeric_timestamp_is_rejected(timestamp: str) -> None:
    signature = sign(SECRET, timestamp, BODY)
    assert "not whole Unix seconds" in _rejected(SECRET, timestamp, BODY, signature, now=NOW)


# Each of these is NOW, within the window, and signed: only their form is wrong.
@pytest.mark.parametrize(
    "timestamp",
    [
        "1800000000.123",
        "1800000000.0",
        "1.8e9",
        " 1800000000",
        "1800000000 ",
        "+1800000000",
        "1_800_000_000",
        "\u0661\u0668" + "\u0660" * 8,
    ],
)
def test_a_timestamp_that_is_not_whole_ascii_seconds_is_rejected_though_signed(
    timestamp: str,
) -> None:
    signature = sign(SECRET, timestamp, BODY)
    assert "not whole Unix seconds" in _rejected(SECRET, timestamp, BODY, signature, now=NOW)


@pytest.mark.parametrize("offset", [-301.0, 301.0, -86400.0, 86400.0])
def test_timestamp_outside_the_window_is_rejected_in_both_directions(offset: float) -> None:
    detail = _rejected(SECRET, TS, BODY, GOOD, now=NOW + offset)
    assert "window" in detail


@pytest.mark.parametrize("offset", [-300.0, -1.0, 1.0, 300.0])
def test_timestamp_at_the_edge_of_the_window_passes(offset: float) -> None:
    verify_signature(SECRET, TS, BODY, GOOD, now=NOW + offset)


def test_skew_window_is_configurable() -> None:
    verify_signature(SECRET, TS, BODY, GOOD, now=NOW + 500, skew_seconds=600)
    assert "window" in _rejected(SECRET, TS, BODY, GOOD, now=NOW + 11, skew_seconds=10)


def test_stale_timestamp_is_rejected_before_the_signature_is_checked() -> None:
    detail = _rejected(SECRET, TS, BODY, "not-even-hex", now=NOW + 1000)
    assert "window" in detail


def test_non_finite_timestamp_is_rejected() -> None:
    signature = sign(SECRET, "nan", BODY)
    _rejected(SECRET, "nan", BODY, signature, now=NOW)
