"""OpenRouter's ``X-OpenRouter-Signature``: HMAC-SHA256 of ``"<ts>,<body>"``, several v1."""

from __future__ import annotations

import hashlib
import hmac

import pytest
from multidict import CIMultiDict

from aivedio.providers.hmac_callbacks import CallbackRejected
from aivedio.providers.openrouter_webhooks import (
    HEADER,
    MAX_SIGNATURES,
    parse_header,
    sign,
    signature_header,
    verify,
)

NOW = 1_800_000_000
STAMP = str(NOW)
KEY = b"or-secret-current"
OLD = b"or-secret-old"
BODY = b'{"type":"video.generation.completed","data":{"id":"job-1","status":"completed"}}'


def headers(value: str) -> CIMultiDict[str]:
    return CIMultiDict({HEADER: value})


def test_the_signature_is_hex_hmac_sha256_of_timestamp_comma_body() -> None:
    expected = hmac.new(KEY, f"{STAMP},".encode() + BODY, hashlib.sha256).hexdigest()
    assert sign(KEY, STAMP, BODY) == expected
    verify([KEY], headers(f"t={STAMP},v1={expected}"), BODY, now=NOW)


def test_during_a_rotation_any_listed_v1_under_any_key_accepts() -> None:
    both = signature_header([OLD, KEY], STAMP, BODY)
    assert both.count("v1=") == 2
    verify([KEY], headers(both), BODY, now=NOW)
    verify([OLD], headers(both), BODY, now=NOW)
    only_old = signature_header([OLD], STAMP, BODY)
    verify([KEY, OLD], headers(only_old), BODY, now=NOW)
    with pytest.raises(CallbackRejected, match="does not match"):
        verify([KEY], headers(only_old), BODY, now=NOW)


@pytest.mark.parametrize(
    ("body", "now", "message"),
    [
        (BODY + b" ", NOW, "does not match"),  # the body changed after signing
        (BODY.replace(b"job-1", b"job-2"), NOW, "does not match"),
        (BODY, NOW + 301, "outside"),  # a captured delivery replayed later
        (BODY, NOW - 301, "outside"),  # a timestamp from the future
    ],
)
def test_changed_late_or_early_deliveries_are_refused(body: bytes, now: int, message: str) -> None:
    with pytest.raises(CallbackRejected, match=message):
        verify([KEY], headers(signature_header([KEY], STAMP, BODY)), body, now=now)


def test_a_signature_over_the_dot_joined_message_does_not_pass() -> None:
    dotted = hmac.new(KEY, f"{STAMP}.".encode() + BODY, hashlib.sha256).hexdigest()
    with pytest.raises(CallbackRejected, match="does not match"):
        verify([KEY], headers(f"t={STAMP},v1={dotted}"), BODY, now=NOW)


@pytest.mark.parametrize(
    "value",
    [
        "",
        "garbage",
        f"v1={'a' * 64}",  # no timestamp
        f"t={STAMP}",  # no signature
        f"t={STAMP},t={STAMP},v1={'a' * 64}",  # two timestamps
        f"t={STAMP},v1={'A' * 64}",  # upper-case hex
        f"t={STAMP},v1={'a' * 63}",
        f"t={STAMP},v1=zz",
        f"t={STAMP}," + ",".join(f"v1={'a' * 64}" for _ in range(MAX_SIGNATURES + 1)),
        f"t={STAMP},v1={'a' * 64}," + "x" * 2000,
    ],
)
def test_a_malformed_header_is_refused_before_any_mac_is_computed(value: str) -> None:
    with pytest.raises(CallbackRejected):
        parse_header(value)
    with pytest.raises(CallbackRejected):
        verify([KEY], headers(value), BODY, now=NOW)


@pytest.mark.parametrize("stamp", [" 1800000000", "+1800000000", "1.8e9", "-1", "1_800_000_000"])
def test_a_timestamp_that_is_not_whole_ascii_seconds_is_refused(stamp: str) -> None:
    value = f"t={stamp},v1={sign(KEY, stamp, BODY)}"
    with pytest.raises(CallbackRejected, match="whole Unix seconds"):
        verify([KEY], headers(value), BODY, now=NOW)


def test_an_unknown_version_is_skipped_not_an_error() -> None:
    value = f"t={STAMP},v2=whatever,v1={sign(KEY, STAMP, BODY)}"
    verify([KEY], headers(value), BODY, now=NOW)
