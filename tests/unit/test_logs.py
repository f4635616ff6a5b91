"""Redaction: secrets never reach a log line, ordinary text does unchanged."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
import structlog

from aivedio import logs
from aivedio.logs import MASK, redact_processor, redact_text, url_for_log

PRESIGNED = (
    "https://bucket.s3.us-east-1.amazonaws.com/outputs/clip.mp4"
    "?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAEXAMPLE%2F20240501"
    "&X-Amz-Expires=900&X-Amz-Signature=0123456789abcdef0123456789abcdef"
)
PEM_BODY = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj"
PEM = f"-----BEGIN PRIVATE KEY-----\n{PEM_BODY}\nQWERTYZZ12=\n-----END PRIVATE KEY-----"


def test_presigned_url_query_is_masked_but_location_kept() -> None:
    out = redact_text(f"fetching {PRESIGNED} now")
    assert out == f"fetching https://bucket.s3.us-east-1.amazonaws.com/outputs/clip.mp4?{MASK} now"
    assert "X-Amz-Signature" not in out
    assert "0123456789abcdef" not in out


@pytest.mark.parametrize("scheme", ["http", "https", "s3", "wss", "HTTPS"])
def test_query_string_of_any_url_scheme_is_masked(scheme: str) -> None:
    out = redact_text(f"'{scheme}://host/p?token=abc123xyz&x=1'")
    assert "abc123xyz" not in out
    assert out == f"'{scheme}://host/p?{MASK}'"


def test_bearer_token_is_masked() -> None:
    out = redact_text("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2ln")
    assert out == f"Authorization: Bearer {MASK}"


@pytest.mark.parametrize(
    "text",
    [
        "api_key=sk_live_0123456789",
        "API-KEY: sk_live_0123456789",
        "password=sk_live_0123456789",
        "client_secret = sk_live_0123456789",
    ],
)
def test_secret_named_pairs_are_masked(text: str) -> None:
    out = redact_text(text)
    assert "sk_live_0123456789" not in out
    assert out.endswith(MASK)


def test_pairs_inside_a_sentence_keep_the_rest() -> None:
    out = redact_text("retrying with api_key=abcd1234, attempt 2")
    assert out == f"retrying with api_key={MASK}, attempt 2"


def test_our_own_api_keys_are_masked() -> None:
    out = redact_text("tenant 7 used av_live_0123456789ABCDEFxyz for the call")
    assert out == f"tenant 7 used av_{MASK} for the call"


def test_pem_private_key_is_masked_whole() -> None:
    out = redact_text(f"loaded\n{PEM}\ndone")
    assert out == f"loaded\n{MASK}\ndone"
    assert PEM_BODY not in out


def test_pem_private_key_is_masked_whatever_its_base64_contains() -> None:
    pem = f"-----BEGIN PRIVATE KEY-----\n{PEM_BODY}\nQWERTYkeyZZ12=\n-----END PRIVATE KEY-----"
    out = redact_text(pem)
    assert PEM_BODY not in out
    assert out == MASK


def test_json_encoded_secret_in_text_is_masked() -> None:
    out = redact_text('provider said {"access_token": "abcd1234efgh5678", "ok": false}')
    assert "abcd1234efgh5678" not in out


@pytest.mark.parametrize(
    "text",
    [
        "job 42 stored 1048576 bytes in 0.8s",
        "asset 7: PROCESSING -> PLAYABLE",
        "https://cdn.example.com/videos/clip.mp4",
        "claimed 16 jobs for 3 tenants; lane=fetch slots=16",
        "",
    ],
)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert logs.redact_text(text) == text


@pytest.mark.parametrize(
    "field", ["token", "Authorization", "url_encryption_key", "s3_secret_access_key", "api_key"]
)
def test_processor_masks_fields_named_like_secrets(field: str) -> None:
    event: dict[str, Any] = {"event": "fetch_started", field: "plain-looking-value"}
    out = redact_processor(None, "info", event)
    assert out[field] == MASK
    assert out["event"] == "fetch_started"


def test_processor_masks_nested_values_and_keeps_others() -> None:
    event: dict[str, Any] = {
        "event": "fetch_failed",
        "attempt": 3,
        "headers": {"Authorization": "Basic dXNlcjpwYXNz", "Accept": "video/mp4"},
        "urls": [PRESIGNED, "https://cdn.example.com/a.mp4"],
        "context": {"inner": {"password": "hunter2", "note": "Bearer abcdefghijklmnop"}},
    }
    out = redact_processor(None, "error", event)
    assert out["attempt"] == 3
    assert out["headers"] == {"Authorization": MASK, "Accept": "video/mp4"}
    assert out["urls"][0].endswith(f"?{MASK}")
    assert out["urls"][1] == "https://cdn.example.com/a.mp4"
    assert out["context"]["inner"] == {"password": MASK, "note": f"Bearer {MASK}"}
    assert "hunter2" not in json.dumps(out)


def test_configured_logger_never_prints_secrets() -> None:
    stream = io.StringIO()
    logs.configure("info", "json", stream=stream)
    try:
        logs.get_logger("test").info("fetching", url=PRESIGNED, token="t0ps3cr3t-value")
    finally:
        structlog.reset_defaults()
    line = json.loads(stream.getvalue())
    assert line["event"] == "fetching"
    assert line["token"] == MASK
    assert "X-Amz-Signature" not in stream.getvalue()
    assert "t0ps3cr3t-value" not in stream.getvalue()


@pytest.mark.parametrize(
    ("url", "prefix"),
    [
        (PRESIGNED, "https://bucket.s3.us-east-1.amazonaws.com/#"),
        (
            "https://user:pw@cdn.example.com:8443/secret/path.mp4?sig=abc",
            "https://cdn.example.com:8443/#",
        ),
        ("http://cdn.example.com/secret/path.mp4", "http://cdn.example.com/#"),
    ],
)
def test_url_for_log_keeps_scheme_host_port_only(url: str, prefix: str) -> None:
    out = url_for_log(url)
    assert out.startswith(prefix)
    for leaked in ("secret", "path.mp4", "outputs", "clip", "sig", "X-Amz", "pw", "user", "?"):
        assert leaked not in out


def test_url_for_log_hash_tells_paths_apart_and_is_stable() -> None:
    a = url_for_log("https://h.example/a.mp4")
    assert a == url_for_log("https://h.example/a.mp4")
    assert a != url_for_log("https://h.example/b.mp4")
    assert a != url_for_log("https://h.example/a.mp4?v=2")


@pytest.mark.parametrize(
    "text",
    ["basic information about the job", "token refreshed successfully", "monkey: banana"],
)
def test_ordinary_prose_is_not_redacted(text: str) -> None:
    assert logs.redact_text(text) == text


def test_url_for_log_keeps_ipv6_brackets() -> None:
    assert logs.url_for_log("https://[::1]:8443/a/b?sig=x").startswith("https://[::1]:8443/#")


@pytest.mark.parametrize(
    "text",
    [
        "https://cdn.example/v.mp4?X-Amz-Signature=abc123def456",
        "Authorization: Bearer abcdefghijklmnopqrstuvwxyz",
        '{"api_key": "sk-1234567890"}',
        "token=abcdefgh1234",
        "av_live_abcdefghijklmnopqrstuvwx",
        "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----",
        "plain-identifier-without-anything",
        "3f2b9c1e-1d2a-4b7c-9e8f-123456789abc",
    ],
)
def test_the_fast_path_skips_only_text_no_pattern_could_match(text: str) -> None:
    # Every pattern applied, as if there were no fast path: the same answer.
    slow = text
    for pattern, replacement in logs._PATTERNS:
        slow = pattern.sub(replacement, slow)
    assert redact_text(text) == slow
    if not logs._MAY_HOLD_A_SECRET.search(text):
        assert all(not pattern.search(text) for pattern, _ in logs._PATTERNS)
