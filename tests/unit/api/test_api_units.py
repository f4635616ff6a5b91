"""Pure parts of the API: playback tokens, key format, range parsing, caching, [api] checks."""

from __future__ import annotations

import base64
import uuid

import pytest

from aivedio.api.media import cache_control, content_type, parse_range
from aivedio.api.problems import ApiError
from aivedio.api.tokens import TokenRejected, TokenSigner
from aivedio.config.api import ApiConfig, require_api_secret, validate_api
from aivedio.errors import ConfigError
from aivedio.logs import redact_text
from aivedio.store.api_keys import _KEY, new_key
from aivedio.store.objects import keys

SIGNER = TokenSigner.hs256(b"s" * 32)


def test_a_token_round_trips_and_names_its_revision_prefix() -> None:
    asset = uuid.uuid4()
    token, claims = SIGNER.issue(7, asset, 3, 60)
    assert SIGNER.verify(token) == claims
    assert claims.prefix == keys.revision_prefix(7, asset, 3) + "/"
    assert "/" not in token and "?" not in token  # it lives in a URL path segment


def test_any_changed_character_is_refused() -> None:
    token, _ = SIGNER.issue(7, uuid.uuid4(), 3, 60)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    for i, ch in enumerate(token):
        if ch == ".":
            continue
        other = alphabet[(alphabet.index(ch) + 1) % len(alphabet)]
        tampered = token[:i] + other + token[i + 1 :]
        with pytest.raises(TokenRejected):
            SIGNER.verify(tampered)


@pytest.mark.parametrize("bad", ["", ".", "abc", "a.b", "a." + "b" * 600, "é.é"])
def test_malformed_tokens_are_refused(bad: str) -> None:
    with pytest.raises(TokenRejected):
        SIGNER.verify(bad)


def test_expired_and_foreign_tokens_are_refused() -> None:
    token, claims = SIGNER.issue(1, uuid.uuid4(), 1, 60)
    with pytest.raises(TokenRejected, match="expired"):
        SIGNER.verify(token, now=claims.expires_at)
    foreign, _ = TokenSigner.hs256(b"t" * 32).issue(1, uuid.uuid4(), 1, 60)
    with pytest.raises(TokenRejected, match="signature"):
        SIGNER.verify(foreign)
    with pytest.raises(ValueError, match="32 bytes"):
        TokenSigner.hs256(b"short")


def test_api_keys_have_the_redacted_shape() -> None:
    prefix, key = new_key()
    assert key.startswith(prefix + "_") and prefix.startswith("av_live_")
    assert _KEY.fullmatch(key) is not None
    assert key not in redact_text(f"using {key} now")
    _, test_key = new_key("test")
    assert test_key.startswith("av_test_") and _KEY.fullmatch(test_key)
    with pytest.raises(ConfigError):
        new_key("prod")


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        ("bytes=0-9", (0, 9)),
        ("bytes=5-", (5, 99)),
        ("bytes=-10", (90, 99)),
        ("bytes=-500", (0, 99)),
        ("bytes=90-500", (90, 99)),
        ("bytes=0-1,5-6", None),  # several ranges: the whole object
        ("items=0-1", None),
        ("bytes=-", None),
    ],
)
def test_range_parsing(header: str | None, expected: tuple[int, int] | None) -> None:
    assert parse_range(header, 100) == expected


@pytest.mark.parametrize("header", ["bytes=100-", "bytes=9-3", "bytes=-0"])
def test_unsatisfiable_ranges(header: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse_range(header, 100)
    assert caught.value.status == 416


def test_types_and_cache_headers() -> None:
    assert content_type("hls/master.m3u8") == "application/vnd.apple.mpegurl"
    assert content_type("hls/v0/seg_1.m4s") == "video/iso.segment"
    assert content_type("sprites/thumbnails.vtt") == "text/vtt"
    assert content_type("x.unknown") == "application/octet-stream"
    assert cache_control("hls/v0/seg_1.m4s", 1000, 400) == "public, max-age=600, immutable"
    assert cache_control("hls/master.m3u8", 1000, 400) == "public, max-age=60"
    assert cache_control("hls/master.m3u8", 1000, 990) == "public, max-age=10"
    assert cache_control("playback.mp4", 1000, 2000) == "public, max-age=0, immutable"


def test_api_config_checks_say_what_to_fix() -> None:
    with pytest.raises(ConfigError, match="playback_token_secret: missing"):
        require_api_secret(ApiConfig())
    with pytest.raises(ConfigError, match="not base64"):
        require_api_secret(ApiConfig(playback_token_secret="%%%"))
    short = base64.b64encode(b"x" * 8).decode()
    with pytest.raises(ConfigError, match="under 32 bytes"):
        require_api_secret(ApiConfig(playback_token_secret=short))
    good = base64.b64encode(b"x" * 32).decode()
    assert require_api_secret(ApiConfig(playback_token_secret=good)) == b"x" * 32
    for bad, match in [
        (ApiConfig(port=70000), "api.port"),
        (ApiConfig(public_base_url="ftp://x"), "public_base_url"),
        (ApiConfig(public_base_url="https://u@x"), "userinfo"),
        (ApiConfig(max_callback_bytes=10), "max_callback_bytes"),
        (ApiConfig(upload_part_size_bytes=1024), "upload_part_size_bytes"),
        (ApiConfig(sse_keepalive_seconds=0), "sse_keepalive_seconds"),
    ]:
        with pytest.raises(ConfigError, match=match):
            validate_api(bad)
