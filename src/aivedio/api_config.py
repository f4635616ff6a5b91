"""The [api] section: what ``aivedio api`` serves and how it signs playback.

Kept apart from ``config.py`` like the other sections only one process reads. The playback
token secret is required only by the API (workers never sign playback), so the check lives
in ``require_api_secret`` and runs when the API starts, not on every config load.
"""

from __future__ import annotations

import base64
import binascii
from urllib.parse import urlsplit

import msgspec

from aivedio.errors import ConfigError

GIB = 1024**3
MIB = 1024**2


class ApiConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    host: str = "127.0.0.1"
    port: int = 8080
    # How clients reach this API (playback and upload URLs are built on it); empty means
    # http://{host}:{port}. Behind a load balancer or CDN, its public origin.
    public_base_url: str = ""
    # Base64 of 32 random bytes: signs playback tokens. Every API process shares it.
    playback_token_secret: str = ""
    playback_token_ttl_seconds: float = 3600.0
    # Provider callbacks: the largest body read, and the clock skew accepted.
    max_callback_bytes: int = 256 * 1024
    callback_skew_seconds: float = 300.0
    # Every body read whole (callbacks, JSON requests) must have arrived by then (else 408).
    body_read_timeout_seconds: float = 30.0
    # Uploads through POST /v1/videos.
    upload_max_bytes: int = 4 * GIB
    upload_session_ttl_seconds: float = 24 * 3600.0
    # S3: uploads larger than this get presigned multipart part URLs of this size.
    upload_part_size_bytes: int = 64 * MIB
    # Playback gateway: answer with a redirect to a presigned object-store URL (S3 only)
    # instead of streaming the bytes through the API.
    media_redirect: bool = False
    presign_ttl_seconds: float = 300.0
    # Server-Sent Events: a comment line this often keeps proxies from closing the stream.
    sse_keepalive_seconds: float = 15.0
    pool_max_size: int = 10


def validate_api(api: ApiConfig) -> None:
    if not 0 <= api.port < 65536:  # 0: any free port (tests, demos)
        raise ConfigError(f"config error: api.port: {api.port} is not a TCP port")
    if api.public_base_url:
        parts = urlsplit(api.public_base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                "config error: api.public_base_url: an http(s) origin, e.g. https://video.example"
            )
        if parts.query or parts.fragment or parts.username:
            raise ConfigError("config error: api.public_base_url: no query, fragment or userinfo")
    for name in (
        "playback_token_ttl_seconds",
        "callback_skew_seconds",
        "body_read_timeout_seconds",
        "upload_session_ttl_seconds",
        "presign_ttl_seconds",
        "sse_keepalive_seconds",
    ):
        if getattr(api, name) <= 0:
            raise ConfigError(f"config error: api.{name}: must be positive")
    if api.max_callback_bytes < 1024:
        raise ConfigError("config error: api.max_callback_bytes: at least 1024")
    if api.upload_max_bytes < 1:
        raise ConfigError("config error: api.upload_max_bytes: must be positive")
    if not 5 * MIB <= api.upload_part_size_bytes <= 5 * GIB:
        raise ConfigError("config error: api.upload_part_size_bytes: between 5 MiB and 5 GiB")
    if api.pool_max_size < 2:
        raise ConfigError("config error: api.pool_max_size: at least 2")


def require_api_secret(api: ApiConfig) -> bytes:
    """The playback token key; a ConfigError that says how to make one when it is missing."""
    hint = (
        "set api.playback_token_secret (or AIVEDIO_PLAYBACK_TOKEN_SECRET) to base64 of 32 "
        "random bytes, e.g. the output of `openssl rand -base64 32`"
    )
    if not api.playback_token_secret:
        raise ConfigError(f"config error: api.playback_token_secret: missing; {hint}")
    try:
        key = base64.b64decode(api.playback_token_secret, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"config error: api.playback_token_secret: not base64; {hint}") from None
    if len(key) < 32:
        raise ConfigError(f"config error: api.playback_token_secret: under 32 bytes; {hint}")
    return key
