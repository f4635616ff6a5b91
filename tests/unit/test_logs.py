"""Redaction: secrets never reach a log line, ordinary text does unchanged."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

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
        logs.reset()
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


# -- what aiohttp's parser reports quote, and other forms of our own secrets -------------------

KEY = "av_live_074ccae1_w7xWYJXs-4ddWXQAqDIaTaI0h8zXHLsE1VE5MaBIO44"
TOKEN = (
    "WzEsImU2NjhlODZlLTk4NzUtNDUxOC04NDAzLTM3ZWU3NjdhMzc0NyIsMSwxNzk2MjE4ODgxXQ"
    ".JqsfIc6JNkWgGQgvJwwUO6L2YuUJ1lNATjyx_KXWSc0"
)


FULL_WIDTH_DOTS = "\\xef\\xbc\\x8e\\xef\\xbc\\x8e"  # U+FF0E twice, as a bytes repr shows it


def _no_piece_of(out: str, secret: str, width: int = 12) -> bool:
    return not any(secret[i : i + width] in out for i in range(len(secret) - width + 1))


@pytest.mark.parametrize(
    "text",
    [
        # The reports of aiohttp's parser, as they were found in api.log.
        f"Invalid header value char:\n\n  b'Authorization: Bearer {KEY}\\x01'\n      ^",
        f"Got more than 8190 bytes when reading: b'Bearer {KEY[:40]}...'.",
        f"Invalid header token:\n\n  b'X-K\\x7fey: {KEY}'\n       ^",
        f"Invalid char in url path:\n\n  b'GET /media/{TOKEN}/hls/\\x00master.m3u8 HTTP/1.1'",
        f"Invalid char in url path:\n\n  b'GET /media/{TOKEN}/{FULL_WIDTH_DOTS}/x HTTP/1.1'",
        f"Got more than 8190 bytes when reading: bytearray(b'/media/{TOKEN[:90]}...').",
        f"Bad status line:\n  Expected CRLF after version:\n\n  b'GET /media/{TOKEN} HTTP/1.1 x'",
        f"Invalid char in url query:\n\n  b'GET /watch/abc?token={TOKEN}\\x01 HTTP/1.1'",
        f"Invalid char in url query:\n\n  b'GET /v1/assets?api_key={KEY}&x=\\x00 HTTP/1.1'",
    ],
)
def test_parser_reports_lose_the_key_and_the_token(text: str) -> None:
    out = redact_text(text)
    assert _no_piece_of(out, KEY) and _no_piece_of(out, TOKEN), out


@pytest.mark.parametrize(
    "text",
    [
        f"used {KEY} twice",
        f"Bearer%20{KEY}",  # glued to what precedes it
        KEY.replace("_", "%5F"),
        KEY.replace("_", "%5f"),
        KEY.upper(),
        KEY[:20],  # cut short by a parser's 100-byte excerpt
    ],
)
def test_api_keys_in_any_form_are_masked(text: str) -> None:
    out = redact_text(text)
    assert "av_" + MASK in out
    assert not any(part in out for part in ("074ccae1_w7x", "w7xWYJXs", "W7XWYJXS"))


@pytest.mark.parametrize("prefix", [KEY[:16], KEY[:16].replace("live", "test")])
def test_a_keys_public_prefix_alone_stays_readable(prefix: str) -> None:
    """The prefix names a key to operators (``aivedio api-key revoke``, the rate limiter's
    ``rate_limited`` event, whose ``caller`` is the key's prefix): it is no secret, and a
    masked one leaves nobody able to say which key was refused."""
    text = f"rate_limited scope=key caller={prefix} route=/v1/assets"
    assert redact_text(text) == text
    assert redact_text(f"caller={prefix}_w7xW") == f"caller=av_{MASK}"  # more is the key


@pytest.mark.parametrize(
    "text",
    [
        f"playback grant {TOKEN} rejected",
        f"playback grant {TOKEN[:40]}",  # the claims alone, the MAC cut off
        "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl",
    ],
)
def test_tokens_are_masked_by_their_shape(text: str) -> None:
    out = redact_text(text)
    assert out.split()[-1] == MASK or out.endswith(f"{MASK} rejected"), out


def test_the_segment_after_media_is_masked_whatever_it_holds() -> None:
    out = redact_text("GET /media/not-shaped-like-a-token_but_secret/hls/master.m3u8 HTTP/1.1")
    assert out == f"GET /media/{MASK}/hls/master.m3u8 HTTP/1.1"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("GET /watch/abc?token=t0ps3cr3t HTTP/1.1", f"GET /watch/abc?{MASK} HTTP/1.1"),
        ("b'/v1/x?X-Amz-Signature=abc&X-Amz-Credential=AKIA'", f"b'/v1/x?{MASK}'"),
        ("target /p?sig=0123456789&exp=1", f"target /p?{MASK}"),
    ],
)
def test_the_query_of_a_bare_path_is_masked(text: str, expected: str) -> None:
    assert redact_text(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Authorization: HMAC-V2 k=1,s=0123456789", f"Authorization: HMAC-V2 {MASK}"),
        ("authorization=av_whatever_short", f"authorization={MASK}"),
        ("Proxy-Authorization: Basic dXNlcjpwYXNz", f"Proxy-Authorization: Basic {MASK}"),
        ("Cookie: session=abc; theme=dark", f"Cookie: {MASK}"),
        (
            "webhook-signature: v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4=",
            f"webhook-signature: {MASK}",
        ),
        ("X-Aivedio-Signature: t=1764652834,v1=abcdef0123", f"X-Aivedio-Signature: {MASK}"),
        ("X-Fal-Webhook-Signature: 00ff00ff00ff00ff", f"X-Fal-Webhook-Signature: {MASK}"),
        ("b'X-Aivedio-Signature: v1=abc\\x01' next", f"b'X-Aivedio-Signature: {MASK}' next"),
    ],
)
def test_credential_headers_lose_their_whole_value(text: str, expected: str) -> None:
    assert redact_text(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "aivedio.providers.standard_webhooks.WebhookVerificationError",
        'File "/work/.venv/lib/python3.11/site-packages/aiohttp/web_protocol.py", line 446',
        "https://cdn.example.com/videos/clip.mp4",
        "av_log: invalid data found when processing input",
        "Wzorek",
    ],
)
def test_module_paths_files_and_ffmpeg_names_are_left_alone(text: str) -> None:
    assert redact_text(text) == text


@pytest.mark.parametrize(
    "text",
    [f"/media/{TOKEN}/x", TOKEN, KEY.replace("_", "%5F"), "GET /x?sig=abc", "Cookie: a=b"],
)
def test_the_fast_path_lets_every_new_pattern_run(text: str) -> None:
    assert logs._MAY_HOLD_A_SECRET.search(text)
    assert redact_text(text) != text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "could not connect to postgresql://aivedio:hunter2@db:5432/aivedio",
            f"could not connect to postgresql://aivedio:{MASK}@db:5432/aivedio",
        ),
        ("proxy http://:pw0rd@proxy:3128/ refused", f"proxy http://:{MASK}@proxy:3128/ refused"),
        ("postgresql://postgres@127.0.0.1:5432/x", "postgresql://postgres@127.0.0.1:5432/x"),
        ("http://[::1]:8080/a", "http://[::1]:8080/a"),
    ],
)
def test_the_password_of_a_urls_userinfo_is_masked(text: str, expected: str) -> None:
    assert redact_text(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "receiver refused whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "secrets=['whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD']",
        "whsec_MfKQ9r8G",  # cut short
    ],
)
def test_webhook_secrets_are_masked_by_their_prefix(text: str) -> None:
    out = redact_text(text)
    assert "whsec_" + MASK in out
    assert "MfKQ9r8G" not in out
    assert "C2FVsBQI" not in out
