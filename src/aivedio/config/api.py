"""The [api] section: what ``aivedio api`` serves and how it signs playback.

Kept apart from ``config/load.py`` like the other sections only one process reads. The playback
token secret is required only by the API (workers never sign playback), so the check lives
in ``require_api_secret`` and runs when the API starts, not on every config load.

Every absolute URL the API hands out (playback and watch URLs, the upload URL of
``POST /v1/videos``) starts with ``public_base_url``, never with the request's ``Host``,
``X-Forwarded-Host``, ``X-Forwarded-Proto`` or ``Forwarded``: those are the client's to
write, and a forged one would send another client's token or bytes to the forger. Empty, it
is the listen address (``listen_base_url``), which only loopback clients can use, so a
non-loopback ``host`` without ``public_base_url`` is refused.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import math
from urllib.parse import urlsplit

import msgspec

from aivedio.config.playback_keys import PlaybackKeyConfig, validate_playback_keys
from aivedio.errors import ConfigError

GIB = 1024**3
MIB = 1024**2


class RateLimitConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A token bucket: ``rate_per_second`` sustained, ``burst`` requests at once."""

    rate_per_second: float
    burst: int


def _rate(rate_per_second: float, burst: int) -> RateLimitConfig:
    return RateLimitConfig(rate_per_second=rate_per_second, burst=burst)


class RateLimitsConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """``[api.rate_limits]``: token buckets answering 429 + Retry-After (``api/rate_limits.py``
    says which request is counted where). /healthz, /readyz and /metrics are never limited."""

    enabled: bool = True
    # Routes that need an API key: a bucket per key.
    key: RateLimitConfig = msgspec.field(default_factory=lambda: _rate(100.0, 500))
    # Routes without a key (/watch, /media, /static, /openapi.json): a bucket per client
    # address (an IPv6 client: per /64).
    address: RateLimitConfig = msgspec.field(default_factory=lambda: _rate(100.0, 500))
    # Requests to key routes with a missing, unknown or revoked key: a bucket per address;
    # once empty, that address is refused before its keys are looked up.
    auth_failure: RateLimitConfig = msgspec.field(default_factory=lambda: _rate(5.0, 100))
    # Provider callbacks: a bucket per (provider, client address), so junk sent from
    # elsewhere never drains a provider's own; overrides per provider name.
    callback: RateLimitConfig = msgspec.field(default_factory=lambda: _rate(100.0, 1000))
    callback_providers: dict[str, RateLimitConfig] = msgspec.field(default_factory=dict)
    # Peers (CIDRs) whose X-Forwarded-For names the client; any other peer is the client.
    trusted_proxies: list[str] = msgspec.field(default_factory=list)
    # Buckets kept per scope; past it the least recently seen caller is forgotten.
    max_buckets: int = 50_000


class ApiConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    host: str = "127.0.0.1"
    port: int = 8080
    # How clients reach this API (playback and upload URLs are built on it, never on the
    # request's Host): required when host is not loopback; empty means http://{host}:{port}.
    public_base_url: str = ""
    # Base64 of 32 random bytes: signs playback tokens (HS256) when no playback_keys are
    # listed, and verifies tokens of the format before JWTs. Every API process shares it.
    playback_token_secret: str = ""
    playback_token_ttl_seconds: float = 3600.0
    # The keys of playback tokens, the signing key first (config/playback_keys.py).
    playback_keys: list[PlaybackKeyConfig] = msgspec.field(default_factory=list)
    # Idempotency-Key (api/idempotency.py): how long a key answers with its first answer,
    # and how long a request holds its key before another may take it over.
    idempotency_ttl_seconds: float = 24 * 3600.0
    idempotency_lock_seconds: float = 60.0
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
    # Resumable uploads (tus 1.0, /v1/uploads): an upload nobody has written to for
    # resumable_idle_seconds expires (the sweeper removes what it left); a PATCH holds the
    # upload's writer lease for resumable_lease_seconds at a time, renewed while its body
    # arrives (a writer whose process died frees the upload after that long). On S3 the
    # PATCHes become parts of resumable_part_size_bytes (grown past size/10,000 when a file
    # needs it), at most resumable_writes PATCHes at once stream per API process (more wait
    # answered 503): memory is about part size x 3 per write in flight.
    resumable_idle_seconds: float = 24 * 3600.0
    resumable_lease_seconds: float = 60.0
    resumable_part_size_bytes: int = 8 * MIB
    resumable_writes: int = 16
    # Playback gateway: answer with a redirect to a presigned object-store URL (S3 only)
    # instead of streaming the bytes through the API.
    media_redirect: bool = False
    presign_ttl_seconds: float = 300.0
    # On-demand stills (GET /media/{token}/thumbnail.jpg): the widest one made, and the
    # bucket of each playback token (a render costs a sandboxed ffmpeg).
    thumbnail_max_width: int = 1920
    thumbnail_rate_per_second: float = 2.0
    thumbnail_burst: int = 20
    # Server-Sent Events: a comment line this often keeps proxies from closing the stream.
    sse_keepalive_seconds: float = 15.0
    pool_max_size: int = 10
    # Stopping (SIGTERM): /readyz answers 503 for drain_delay_seconds while everything else
    # is still served, so a load balancer (a Kubernetes Service's endpoints) stops sending
    # new requests before the listener closes; then requests in flight get up to
    # drain_timeout_seconds to finish. A supervisor's grace period must exceed the sum.
    drain_delay_seconds: float = 5.0
    drain_timeout_seconds: float = 10.0
    rate_limits: RateLimitsConfig = msgspec.field(default_factory=RateLimitsConfig)


def validate_api(api: ApiConfig) -> None:
    if not 0 <= api.port < 65536:  # 0: any free port (tests, demos)
        raise ConfigError(f"config error: api.port: {api.port} is not a TCP port")
    validate_playback_keys(api.playback_keys)
    if api.thumbnail_max_width < 16:
        raise ConfigError("config error: api.thumbnail_max_width: at least 16")
    if api.thumbnail_rate_per_second <= 0 or api.thumbnail_burst < 1:
        raise ConfigError(
            "config error: api.thumbnail_rate_per_second and thumbnail_burst: positive"
        )
    require_public_base_url(api, api.host)
    for name in (
        "playback_token_ttl_seconds",
        "idempotency_ttl_seconds",
        "idempotency_lock_seconds",
        "callback_skew_seconds",
        "body_read_timeout_seconds",
        "upload_session_ttl_seconds",
        "resumable_idle_seconds",
        "resumable_lease_seconds",
        "presign_ttl_seconds",
        "sse_keepalive_seconds",
        "drain_timeout_seconds",
    ):
        if getattr(api, name) <= 0:
            raise ConfigError(f"config error: api.{name}: must be positive")
    if api.drain_delay_seconds < 0:
        raise ConfigError("config error: api.drain_delay_seconds: must not be negative")
    if api.max_callback_bytes < 1024:
        raise ConfigError("config error: api.max_callback_bytes: at least 1024")
    if api.upload_max_bytes < 1:
        raise ConfigError("config error: api.upload_max_bytes: must be positive")
    if not 5 * MIB <= api.upload_part_size_bytes <= 5 * GIB:
        raise ConfigError("config error: api.upload_part_size_bytes: between 5 MiB and 5 GiB")
    if not 5 * MIB <= api.resumable_part_size_bytes <= 5 * GIB:
        raise ConfigError("config error: api.resumable_part_size_bytes: between 5 MiB and 5 GiB")
    if api.resumable_writes < 1:
        raise ConfigError("config error: api.resumable_writes: at least 1")
    if api.pool_max_size < 2:
        raise ConfigError("config error: api.pool_max_size: at least 2")
    validate_rate_limits(api.rate_limits)


def validate_rate_limits(limits: RateLimitsConfig) -> None:
    where = "api.rate_limits"
    named = {
        "key": limits.key,
        "address": limits.address,
        "auth_failure": limits.auth_failure,
        "callback": limits.callback,
        **{f"callback_providers.{name}": rate for name, rate in limits.callback_providers.items()},
    }
    for name, rate in named.items():
        if not (rate.rate_per_second > 0 and math.isfinite(rate.rate_per_second)):
            raise ConfigError(f"config error: {where}.{name}.rate_per_second: must be positive")
        if rate.burst < 1:
            raise ConfigError(f"config error: {where}.{name}.burst: at least 1")
    for cidr in limits.trusted_proxies:
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            raise ConfigError(
                f"config error: {where}.trusted_proxies: {cidr!r} is not an address or CIDR"
            ) from None
    if limits.max_buckets < 1:
        raise ConfigError(f"config error: {where}.max_buckets: at least 1")


def require_public_base_url(api: ApiConfig, host: str) -> None:
    """``public_base_url`` is well formed, and set unless the API listens on loopback."""
    if api.public_base_url:
        _validate_public_base_url(api.public_base_url)
    elif not is_loopback_host(host):
        raise ConfigError(
            f"config error: api.public_base_url: required when api.host ({host!r}) is not "
            "loopback: the origin clients reach this API at, e.g. https://video.example"
        )


def _validate_public_base_url(url: str) -> None:
    # Refuse, never trim: a value urlsplit would quietly clean up is not what was meant.
    if any(c.isspace() or not c.isprintable() for c in url):
        raise ConfigError("config error: api.public_base_url: no whitespace or control characters")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            "config error: api.public_base_url: an absolute http(s) URL, e.g. https://video.example"
        )
    if parts.query or parts.fragment or parts.username is not None or "@" in parts.netloc:
        raise ConfigError("config error: api.public_base_url: no query, fragment or userinfo")
    if url.endswith(("?", "#")):
        raise ConfigError("config error: api.public_base_url: no query, fragment or userinfo")
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number in range
    except ValueError:
        raise ConfigError("config error: api.public_base_url: the port is not a TCP port") from None


def is_loopback_host(host: str) -> bool:
    """Whether only this machine can reach ``host`` (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listen_base_url(host: str, port: int) -> str:
    """``http://host:port`` of the address the API listens on (IPv6 in brackets)."""
    try:
        literal = f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        literal = host
    return f"http://{literal}:{port}"


def legacy_token_secret(api: ApiConfig) -> bytes | None:
    """``playback_token_secret``'s key when it is set (it verifies tokens of the format
    before JWTs), else None."""
    return require_api_secret(api) if api.playback_token_secret else None


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
