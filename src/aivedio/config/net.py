"""The [net], [providers.NAME] and [fetch] sections: the guarded fetch's policy and limits,
each provider (which may only narrow [net]), and the fetch stage's part sizes and breaker.

Kept apart from ``config/load.py`` because they are checked together: a provider's hosts,
ports and byte cap are valid only inside [net]'s, and the fetch's parts only within its
limits. The loader decodes them like every other section and calls ``validate_net``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Protocol
from urllib.parse import urlsplit

import msgspec

from aivedio.config.hosts import check_host_suffixes, host_suffix_within
from aivedio.errors import ConfigError


class NetConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The guarded fetch's policy and limits; [providers.NAME] sections may narrow them."""

    allowed_schemes: list[str] = msgspec.field(default_factory=lambda: ["https"])
    allowed_ports: list[int] = msgspec.field(default_factory=lambda: [443])
    # Empty: any public host. Otherwise "name" allows that host exactly and ".name" its
    # subdomains only (docs/security.md).
    allowed_host_suffixes: list[str] = msgspec.field(default_factory=list)
    # The only exception to the deny table (for tests and labs): e.g. ["127.0.0.0/8"].
    allow_cidrs: list[str] = msgspec.field(default_factory=list)
    # DNS servers as "ip" or "ip:port"; empty: the system's resolv.conf.
    nameservers: list[str] = msgspec.field(default_factory=list)
    # Extra CA bundle (PEM) trusted for provider TLS, besides the system store.
    ca_file: str = ""
    max_bytes: int = 4 * 1024**3
    max_redirects: int = 5
    connect_timeout_seconds: float = 10.0
    header_timeout_seconds: float = 30.0
    idle_read_timeout_seconds: float = 30.0
    total_timeout_seconds: float = 3600.0
    per_host_connections: int = 8
    # Further requests for one body after it was cut short (0: never resume).
    max_resumes: int = 5
    # Wait before the second resume of a fetch, doubled for each further one.
    resume_backoff_seconds: float = 1.0


# The vendor adapters (src/aivedio/providers/); "generic" is the configurable one below.
ADAPTER_KINDS = frozenset(
    {
        "generic",
        "runway",
        "openai",
        "veo_gemini",
        "veo_vertex",
        "replicate",
        "fal",
        "luma",
        "kling",
        "minimax",
        "openrouter",
        "seedance",
        "wan",
    }
)


class ProviderConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One provider. Unset net keys fall back to [net]; set ones may only narrow it.

    ``adapter`` picks the vendor's adapter (docs/providers.md); an unset ``api_base_url``
    means the vendor's public API. Vendor credentials (``api_key``, Kling's key pair) are
    secrets: sent to the vendor's own API origin (and its download origin where the
    vendor requires it), never across a redirect to another host, never logged."""

    adapter: str = "generic"
    api_base_url: str = ""
    task_path: str = "/v1/tasks/{task_id}"
    refresh_path: str = "/v1/tasks/{task_id}/outputs/{output_index}/refresh"
    auth_header: str = ""  # secret, e.g. "Bearer …"; sent to this provider's hosts only
    callback_secret: str = ""  # secret for HMAC-signed callbacks
    # The tenant a callback for a task we never saw belongs to (one provider account per
    # tenant); a callback for a known task always keeps that task's tenant.
    tenant: str = ""
    default_url_ttl_seconds: float = 3600.0
    allowed_host_suffixes: list[str] | None = None
    allowed_ports: list[int] | None = None
    max_bytes: int | None = None
    # Vendor adapters. api_key: Replicate, Runway, Luma, MiniMax, OpenRouter, Seedance, Wan
    # bearer (OpenAI's, for records made before its shutdown); Gemini API key; Vertex access
    # token (also sent to download_base_url for GCS); fal "Key" auth.
    api_key: str = ""
    access_key: str = ""  # Kling: the JWT issuer
    secret_key: str = ""  # Kling: the JWT's HMAC key (secret)
    # Standard Webhooks "whsec_..." (Replicate, the Gemini API's project webhook) or
    # OpenRouter's callback secret.
    webhook_secret: str = ""
    # Further secrets a delivery may be signed with (secret): the Gemini API's per-request
    # (dynamic) webhooks, or a new secret while one is rotated.
    extra_webhook_secrets: list[str] = msgspec.field(default_factory=list)
    jwks: str = ""  # fal: the JWKS document itself, or
    jwks_url: str = ""  # fal: where to fetch it (through the guarded fetcher), cached
    jwks_cache_seconds: float = 3600.0
    app_id: str = ""  # fal: the app's queue path, e.g. "fal-ai/pika"
    task_type: str = "text2video"  # Kling: the {type} of /v1/videos/{type}/{task_id}
    download_base_url: str = ""  # Gemini files / GCS download origin (default: the vendor's)
    # Polling: None means the vendor's documented cadence (or our assumption, docs/providers.md).
    poll_interval_seconds: float | None = None
    poll_jitter_seconds: float | None = None
    poll_requests_per_second: float = 2.0  # per worker process, for this provider
    watch_max_seconds: float = 2 * 86400.0  # give a watched task up after this long
    # A source without a valid C2PA manifest (missing, or failing validation) is
    # INVALID_MEDIA (provenance_missing, provenance_invalid) instead of published.
    require_provenance: bool = False


class FetchConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    pipeline_version: int = 1
    part_size_bytes: int = 8 * 1024**2
    # Memory per fetch is about part_size_bytes x (parts_in_flight + 1); two in flight
    # keep the store busy while the next part fills (see docs/benchmarks.md).
    parts_in_flight: int = 2
    # A 404 right after success may be a CDN not yet filled: retried this many times, then
    # treated like an expired URL (refresh).
    not_yet_available_attempts: int = 3
    # Per-provider circuit breaker on 5xx and connection failures.
    breaker_failures: int = 5
    breaker_open_seconds: float = 30.0
    estimated_bytes_per_second: float = 20 * 1024**2


class NetSections(Protocol):
    """The sections ``validate_net`` reads (``config.load.Config`` has them)."""

    @property
    def net(self) -> NetConfig: ...

    @property
    def providers(self) -> Mapping[str, ProviderConfig]: ...

    @property
    def fetch(self) -> FetchConfig: ...


def validate_net(config: NetSections) -> None:
    """Semantic checks of [net], every [providers.NAME] and the fetch limits that types
    alone cannot express. Each names the key it is about."""
    net = config.net
    sections = [("net", net.allowed_host_suffixes)]
    sections += [
        (f"providers.{n}", pc.allowed_host_suffixes or []) for n, pc in config.providers.items()
    ]
    for where, entries in sections:
        try:
            check_host_suffixes(entries)
        except ValueError as exc:
            raise ConfigError(f"config error: {where}.allowed_host_suffixes: {exc}") from None
    for scheme in net.allowed_schemes:
        if scheme not in {"https", "http"}:
            raise ConfigError(f"config error: net.allowed_schemes: {scheme!r} is not http(s)")
    for cidr in net.allow_cidrs:
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            raise ConfigError(f"config error: net.allow_cidrs: {cidr!r} is not a CIDR") from None
    for name, positive in (
        ("net.max_bytes", net.max_bytes),
        ("net.connect_timeout_seconds", net.connect_timeout_seconds),
        ("net.header_timeout_seconds", net.header_timeout_seconds),
        ("net.idle_read_timeout_seconds", net.idle_read_timeout_seconds),
        ("net.total_timeout_seconds", net.total_timeout_seconds),
        ("net.per_host_connections", net.per_host_connections),
        ("fetch.parts_in_flight", config.fetch.parts_in_flight),
    ):
        if positive <= 0:
            raise ConfigError(f"config error: {name}: must be positive")
    for name, value in (
        ("net.max_resumes", net.max_resumes),
        ("net.resume_backoff_seconds", net.resume_backoff_seconds),
    ):
        if value < 0:
            raise ConfigError(f"config error: {name}: must not be negative")
    if config.fetch.part_size_bytes < 5 * 1024**2:
        raise ConfigError("config error: fetch.part_size_bytes: S3 needs at least 5 MiB parts")
    for provider, pc in config.providers.items():
        where = f"providers.{provider}"
        if pc.adapter not in ADAPTER_KINDS:
            raise ConfigError(
                f"config error: {where}.adapter: one of {', '.join(sorted(ADAPTER_KINDS))}"
            )
        if pc.poll_requests_per_second <= 0 or pc.watch_max_seconds <= 0:
            raise ConfigError(
                f"config error: {where}.poll_requests_per_second and watch_max_seconds: "
                "must be positive"
            )
        for key in ("api_base_url", "download_base_url", "jwks_url"):
            value = getattr(pc, key)
            if value and urlsplit(value).scheme not in net.allowed_schemes:
                raise ConfigError(f"config error: {where}.{key}: scheme not in net.allowed_schemes")
        if pc.allowed_ports is not None and not set(pc.allowed_ports) <= set(net.allowed_ports):
            raise ConfigError(
                f"config error: {where}.allowed_ports: may only narrow net.allowed_ports"
            )
        if pc.allowed_host_suffixes is not None and net.allowed_host_suffixes:
            for suffix in pc.allowed_host_suffixes:
                if not host_suffix_within(suffix, net.allowed_host_suffixes):
                    raise ConfigError(
                        f"config error: {where}.allowed_host_suffixes: {suffix!r} is not "
                        "inside net.allowed_host_suffixes (a provider may only narrow it; "
                        '"name" is that host only, ".name" its subdomains)'
                    )
        if pc.max_bytes is not None and not 0 < pc.max_bytes <= net.max_bytes:
            raise ConfigError(f"config error: {where}.max_bytes: must be in 1..net.max_bytes")
        # An expiry derived from it must fit the window of a time from outside (untrusted.py).
        if not 0 < pc.default_url_ttl_seconds <= 400 * 86400:
            raise ConfigError(
                f"config error: {where}.default_url_ttl_seconds: must be in (0, 34560000] "
                "(400 days)"
            )
